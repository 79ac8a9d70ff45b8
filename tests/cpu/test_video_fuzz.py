"""Video inputs under fault: `trtc run` on the CPU pipeline with damaged copies of bikes.mp4 and of an HEVC
MPEG-TS clip made here. Damage: the file truncated, a range of bytes cut out, bytes flipped; offsets from a fixed
seed, a bounded number of cases, each with a timeout.

Per case: no crash and no hang; every frame whose bytes all lie before the damage is classified, with the same
top-1 class and score as from the intact file; damage that changed anything is reported for that source and the
exit code is 1. Damage that changed nothing (bytes the decoder never reads) may exit 0, and then every frame must
be exactly as from the intact file. An MP4 keeps its index at the end, so a truncated or cut MP4 has no frames
"before the damage": it must be reported as unreadable.

A small real model (a convolution, pooling and a linear layer, exported through `trtc export`) keeps the cases
fast: the work is the decoding.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import needs_export

pytestmark = needs_export

SEED = 20261123
CASES_PER_KIND = 4  # x 3 kinds x 2 clips = 24 cases
TIMEOUT_S = 60.0

SMALL = '''
import torch

def build(num_classes=10):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(8, num_classes))
'''


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    from toolchain.export import export_onnx

    d = tmp_path_factory.mktemp("fuzz-model")
    (d / "net.py").write_text(SMALL)
    out = d / "small.onnx"
    export_onnx(f"{d / 'net.py'}:build", out, input_size=64, resize=72, batch="1:8:16", check_samples=2)
    return out


@pytest.fixture(scope="module")
def hevc_ts(tmp_path_factory, bikes):
    """60 frames of bikes.mp4 re-encoded as HEVC (x265, with B-frames) in MPEG-TS at 320x136."""
    from tests.clips import encode_clip

    path = tmp_path_factory.mktemp("fuzz-hevc") / "bikes_hevc.ts"
    return encode_clip(bikes, path, "libx265", (320, 136), frames=60, fmt="mpegts",
                       options={"x265-params": "log-level=error:keyint=30"})


def _packet_ends(path: Path, ts: bool) -> dict[int, int]:
    """{pts: last byte + 1} of each frame's packet. In MPEG-TS a packet's payload is spread over the
    188-byte transport packets that follow its position, up to where the next one starts (one video stream)."""
    import av

    rows = []
    with av.open(str(path)) as c:
        for p in c.demux(video=0):
            if p.size and p.pts is not None and p.pos is not None and p.pos >= 0:
                rows.append([p.pts, p.pos, p.pos + p.size])
    if ts:
        by_pos = sorted(rows, key=lambda r: r[1])
        for r, nxt in zip(by_pos, [*by_pos[1:], None]):
            r[2] = nxt[1] if nxt is not None else path.stat().st_size
    return {pts: end for pts, _pos, end in rows}


def _run(source: Path, model: Path, out: Path):
    """trtc run in a thread, so that a hang fails the case instead of the whole session."""
    from toolchain.cli import cli

    box = {}

    def target():
        box["r"] = CliRunner().invoke(cli, ["run", str(source), "--model", str(model), "--device", "cpu",
                                            "--top-k", "1", "--batch", "8", "-o", str(out), "--force",
                                            "--summary", str(out.with_suffix(".summary.json"))])

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(TIMEOUT_S)
    assert not t.is_alive(), f"trtc run hung on {source.name} (more than {TIMEOUT_S:.0f} s)"
    r = box["r"]
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "bug in trtc" not in r.output and "internal error" not in r.output, r.output
    preds = {}
    if out.exists():
        for line in out.read_text().splitlines():
            d = json.loads(line)
            # keyed by pts: "frame" counts decoded frames, so after a lost frame the later ones shift
            preds[d["pts"]] = (d["top_k"][0]["index"], d["top_k"][0]["score"])
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    return r.exit_code, preds, summary


def _cases(data: bytes, rng) -> list[tuple[str, int, bytes]]:
    n = len(data)
    out = []
    for _ in range(CASES_PER_KIND):
        at = int(rng.integers(n // 20, n - 1))
        out.append((f"truncated at byte {at}", at, data[:at]))
    for _ in range(CASES_PER_KIND):
        a = int(rng.integers(n // 20, n * 9 // 10))
        b = min(n, a + int(rng.integers(188, 30_000)))
        out.append((f"bytes {a}-{b} cut out", a, data[:a] + data[b:]))
    for _ in range(CASES_PER_KIND):
        a = int(rng.integers(n // 20, n - 16))
        d = bytearray(data)
        k = int(rng.integers(1, 16))
        for j in range(k):
            d[a + j] ^= int(rng.integers(1, 256))
        out.append((f"{k} byte(s) flipped at {a}", a, bytes(d)))
    return out


def test_damaged_videos_are_reported_and_good_frames_kept(small_model, bikes, hevc_ts, tmp_path):
    rng = np.random.default_rng(SEED)
    ran = reported = 0
    harmless: list[str] = []
    silent: list[str] = []
    for clip, ts in ((Path(bikes), False), (hevc_ts, True)):
        clean_code, clean, _ = _run(clip, small_model, tmp_path / f"clean-{clip.stem}.jsonl")
        assert clean_code == 0 and len(clean) > 50
        ends = _packet_ends(clip, ts)
        assert len(ends) == len(clean)
        data = clip.read_bytes()
        for i, (what, at, damaged) in enumerate(_cases(data, rng)):
            bad = tmp_path / f"{clip.stem}-{i}{clip.suffix}"
            bad.write_bytes(damaged)
            code, preds, summary = _run(bad, small_model, tmp_path / f"{clip.stem}-{i}.jsonl")
            ran += 1
            where = f"{clip.name} {what}"
            index_lost = not ts and not what.endswith(f"flipped at {at}")  # an MP4 cut short loses its index
            good = set() if index_lost else {pts for pts, end in ends.items() if end <= at}
            missing = sorted(good - set(preds))
            assert not missing, f"{where}: good frames not classified: {missing[:10]}"
            changed = [f for f in good if preds[f] != clean[f]]
            assert not changed, f"{where}: good frames classified differently: {changed[:10]}"
            if code == 0 and preds == clean:
                harmless.append(where)  # bytes the decoder never needed
                continue
            if code == 0:
                # a wrong but valid-looking picture: H.264/HEVC slices carry no checksum, and FFmpeg neither
                # fails nor flags the frame (err_detect=careful/aggressive/explode did not see it either). No frame
                # may be lost without a report, and only frames after the damage may differ.
                assert set(preds) == set(clean), f"{where}: frames lost without a report"
                assert summary["problems"] == []
                silent.append(where)
                continue
            assert code == 1, f"{where}: exit {code}"
            assert [p["source"] for p in summary["problems"]] == [str(bad)], f"{where}: {summary['problems']}"
            reported += 1
    print(f"video fuzz: {ran} cases (seed {SEED}): {reported} reported with exit 1, {len(harmless)} harmless {harmless}, "
          f"{len(silent)} changed pictures that no decoder check sees: {silent}")
    assert ran == 6 * CASES_PER_KIND and reported >= ran // 2
    assert all("flipped" in w for w in silent)  # a cut or truncated file is always reported
