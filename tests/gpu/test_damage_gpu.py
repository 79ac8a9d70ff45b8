"""NVDEC counts damage as the CPU path does: the damaged H.264 and HEVC copies of :mod:`tests.damage` (bytes flipped
or zeroed inside the MP4's media data, a fixed seed), read by the GPU path through the SimpleDecoder (MP4) and the
packet loop (the same packets remuxed to MPEG-TS, where FFmpeg's muxer takes them), are reported wherever FFmpeg's
own decode (ffprobe, or an independent PyAV decode) reports an error or gives fewer frames than packets, and
wherever trtc classifies fewer frames than packets. Skipped without an NVIDIA GPU."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest

from tests import damage

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("cupy", "PyNvVideoCodec", "av")),
                                 reason="needs the gpu extra (cupy, PyNvVideoCodec) and PyAV")]


def _classify(path: Path, engine, timeout: float = 120.0):
    """(frames classified, the problems' reasons, the damaged count) of one classify() call on NVDEC."""
    from engines.video import classify

    box = {}

    def work():
        run = classify([str(path)], engine, batch=16, top_k=1, decoder="nvdec")
        box["n"] = sum(1 for _ in run)
        box["problems"] = [p.reason for p in run.problems]
        box["damaged"] = run.stats.damaged.get(str(path), 0)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{path.name}: classify hung"
    return box["n"], box["problems"], box["damaged"]


def test_nvdec_reports_what_ffmpeg_and_the_packet_count_report(bikes, cuda_lite0, tmp_path):
    clips = damage.make_clips(Path(bikes), tmp_path, damage.GPU_CLIP_SIZE)
    rows, unsaid, false = [], [], []
    for codec, clip in clips.items():
        n, problems, _ = _classify(clip, cuda_lite0)
        assert n == damage.CLIP_FRAMES and not problems, (clip.name, n, problems)
        for what, mp4 in damage.damaged_copies(clip, tmp_path):
            ref = damage.reference(mp4)
            for path in (mp4, damage.as_transport_stream(mp4)):
                if path is None:
                    continue
                n, problems, count = _classify(path, cuda_lite0)
                rows.append((f"{what} ({path.suffix})", ref.packets, ref.frames, len(ref.errors), n, count,
                             bool(problems)))
                if (ref.damaged or n < ref.packets) and not problems:
                    unsaid.append(rows[-1])
                if problems and count == 0 and not any("stopped while reading" in x for x in problems):
                    false.append(rows[-1])  # damage reported without a count (a demuxer's failure has none)
    for row in rows:
        print(row)
    assert not unsaid, f"damage FFmpeg or the packet count shows, not reported by the GPU path: {unsaid}"
    assert not false, false
