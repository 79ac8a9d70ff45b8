"""examples/bench_cpu_decode.py, the benchmark behind docs/BENCHMARKS.md's "The CPU path's file decoding", run on
bikes.mp4: every reader (PyAV's three threading modes and trtc's file reader) decodes every frame, and the JSON has
the rows and the ratios the docs quote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_reader_decodes_every_frame_and_the_ratios_are_against_slice_threads(bikes, tmp_path):
    out = tmp_path / "cpu_decode.json"
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "bench_cpu_decode.py"), str(bikes), "--repeat", "1",
                        "--json-out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["reader"] for row in rows] == ["NONE", "SLICE", "FRAME", "trtc"]
    assert all(row["frames"] == 250 and row["fps"] > 0 for row in rows), rows
    slice_fps = next(row["fps"] for row in rows if row["reader"] == "SLICE")
    assert all(abs(row["vs_slice"] - row["fps"] / slice_fps) < 0.02 for row in rows), rows
    assert r.stdout.splitlines()[-1].split()[1] == "trtc"  # the table is printed last
