"""Damage is counted the same for H.264 and HEVC on the CPU path: packets in against frames out, and every picture
the decoder says is damaged.

FFmpeg's HEVC decoder drops a picture it cannot decode without raising and without flagging anything, and gives
out a picture it found errors in as if whole unless told to refuse it (trtc tells it, and withholds that picture
when it comes out); H.264's, decoding on one thread, conceals the errors and flags the picture corrupt. At 256x144
(the GPU test's size) slice threads let both decoders give such pictures out unsaid. Damaged copies of a short clip in each codec (bytes flipped or zeroed inside the MP4's
media data, a fixed seed; :mod:`tests.damage`) are read by trtc's CPU reader and compared with FFmpeg's own count of
packets, frames and decoder errors (the ``ffprobe`` program, or an independent PyAV decode without them):

- wherever FFmpeg reports a decoder error, or decodes fewer frames than packets, or trtc gives fewer frames than
  packets, trtc reports the source as damaged;
- every packet is then either a classified frame or counted as damaged (exactly);
- a copy nobody finds damaged gives every frame, with no report.

One copy goes through ``trtc run`` with the real Lite0: exit 1, the source in problems, its ``damaged`` count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import damage

pytestmark = pytest.mark.skipif(not __import__("importlib").util.find_spec("av"), reason="needs PyAV")


@pytest.fixture(scope="module")
def damaged(tmp_path_factory, bikes):
    folder = tmp_path_factory.mktemp("damage")
    clips = damage.make_clips(Path(bikes), folder)
    return {codec: [(what, path, damage.reference(path)) for what, path in damage.damaged_copies(clip, folder)]
            for codec, clip in clips.items()}


def _read(path: Path):
    from engines.video.sources import PyAVSource, SourceError

    src = PyAVSource(str(path))
    n, problem = 0, None
    try:
        for _ in src.frames():
            n += 1
    except SourceError as exc:
        problem = str(exc)
    return n, src.damaged, problem


WITHHELD = "the decoder reported damaged, their frame(s) not classified"  # a refused packet whose picture came out
COUNTED = "gave no frame"  # packets that only the count of packets against frames shows
FLAGGED = "damaged frame(s) not classified"  # pictures the decoder concealed errors in and flagged


def test_every_codec_counts_packets_in_against_frames_out(damaged):
    seen = {"h264": 0, "hevc": 0}
    how = {WITHHELD: 0, COUNTED: 0, FLAGGED: 0}
    for codec, cases in damaged.items():
        for what, path, ref in cases:
            n, count, problem = _read(path)
            if ref.damaged or n < ref.packets:
                assert problem is not None, f"{what}: FFmpeg {ref}, trtc {n} frames: not reported"
                assert n + count == ref.packets, f"{what}: {n} classified + {count} damaged != {ref.packets} packets"
                seen[codec] += 1
                how.update({k: v + (k in problem) for k, v in how.items()})
            else:
                assert problem is None and count == 0 and n == ref.packets == ref.frames, (what, problem, n, ref)
    print(f"damaged copies reported: {seen}; by what showed the damage: {how}")
    assert seen["h264"] >= 3 and seen["hevc"] >= 3 and all(how.values()), (seen, how)


def _hevc_copy(damaged, shown: str, alone: bool = False) -> Path:
    """The first damaged HEVC copy whose report says ``shown`` (``alone``: and nothing but that)."""
    for _what, path, _ref in damaged["hevc"]:
        problem = _read(path)[2] or ""
        kinds = [k for k in ("skipped", COUNTED, FLAGGED, WITHHELD) if k in problem]
        if shown in kinds and (not alone or kinds == [shown]):
            return path
    raise AssertionError(f"no damaged HEVC copy reported as {shown!r}")


def test_run_reports_a_damaged_hevc_file_as_h264s(damaged, lite0_onnx, tmp_path):
    """An HEVC copy with pictures only the packet count shows lost: exit 1, a problem naming it, its count."""
    from click.testing import CliRunner

    from toolchain.cli import cli

    path = _hevc_copy(damaged, COUNTED)
    n, count, _ = _read(path)
    out, summary = tmp_path / "preds.jsonl", tmp_path / "summary.json"
    r = CliRunner().invoke(cli, ["run", str(path), "--model", str(lite0_onnx[0]), "--device", "cpu", "--top-k", "1",
                                 "-o", str(out), "--summary", str(summary)])
    assert r.exit_code == 1, r.output
    report = json.loads(summary.read_text())
    assert [p["source"] for p in report["problems"]] == [str(path)]
    assert "gave no frame" in report["problems"][0]["reason"]
    entry = report["by_source"][str(path)]
    assert entry["damaged"] == count > 0 and entry["classified"] == n == len(out.read_text().splitlines())
    assert "gave no frame" in entry["status"]


def test_bad_sources_among_good_ones_are_problems_and_the_good_one_runs(damaged, lite0_onnx, tmp_path):
    """The rule `run --help` states, as the library keeps it: a missing, an empty and a damaged file beside a good
    one are each a problem with a one-line reason naming the file; the good one gives all its frames. The damaged
    one is the HEVC copy whose one damaged picture the decoder gives out, said only by its refusing the packet."""
    import engines
    from engines.video import classify

    good = damaged["h264"][0][1].with_name("clip_h264.mp4")
    missing, empty = tmp_path / "missing.mp4", tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    bad = _hevc_copy(damaged, WITHHELD, alone=True)
    with engines.open_engine(lite0_onnx[0], device="cpu") as eng:
        run = classify([str(good), str(missing), str(empty), str(bad)], eng, top_k=1, stride=8)
        frames = [p.frame for p in run if p.source == str(good)]
    assert frames == list(range(0, damage.CLIP_FRAMES, 8))
    reasons = {p.source: p.reason for p in run.problems}
    assert set(reasons) == {str(missing), str(empty), str(bad)}, reasons
    assert "no such file" in reasons[str(missing)] and "empty file (0 bytes)" in reasons[str(empty)]
    assert all("\n" not in r for r in reasons.values()) and WITHHELD in reasons[str(bad)]
