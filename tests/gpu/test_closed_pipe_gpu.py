"""A closed pipe stops the GPU path at once. While NVDEC decodes a file, fd 1 goes through native_out's tap (it counts
NVDEC's error lines); the tap used to swallow every write error, so a process printing its results to stdout went on
classifying to the end of the file after the reader had gone. Real processes, real pipes (`| head -3`), a long
looped clip. Skipped without an NVIDIA GPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("cupy", "PyNvVideoCodec", "av")),
                                 reason="needs the gpu extra (cupy, PyNvVideoCodec) and PyAV")]

ROOT = Path(__file__).resolve().parents[2]
LOOPS = 20  # bikes.mp4 x 20: 5000 frames

APP = textwrap.dedent("""
    import sys
    import engines
    from engines.video import classify
    n = 0
    with engines.open_engine(sys.argv[1], device="cuda:0") as eng:
        try:
            for p in classify([sys.argv[2]], eng, top_k=1, loop=%d, decoder="nvdec"):
                print(p.source, p.frame, p.indices[0], flush=True)  # through fd 1, the tap's pipe meanwhile
                n += 1
        except BrokenPipeError:
            sys.stderr.write(f"stopped after {n}\\n")
            sys.exit(141)
    sys.stderr.write(f"all {n}\\n")
""" % LOOPS)


def test_an_app_printing_results_stops_when_its_reader_goes(lite0_onnx, bikes):
    p = subprocess.run(["bash", "-c", 'set -o pipefail; "$0" -c "$1" "$2" "$3" | head -3', sys.executable, APP,
                        str(lite0_onnx[0]), str(bikes)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 141, p.stderr
    assert len(p.stdout.splitlines()) == 3
    stopped = int(p.stderr.rsplit("stopped after ", 1)[1].split()[0])
    assert stopped < 250 * LOOPS // 2, p.stderr  # well before the end


def test_trtc_run_into_head_stops_early_with_141(lite0_onnx, bikes, tmp_path):
    summary = tmp_path / "summary.json"
    p = subprocess.run(["bash", "-c", 'set -o pipefail; "$0" -m toolchain -q run "$1" --model "$2" --device cuda:0 '
                        f'--loop {LOOPS} --summary "$3" | head -3', sys.executable, str(bikes), str(lite0_onnx[0]),
                        str(summary)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 141, p.stderr
    assert len(p.stdout.splitlines()) == 3
    for bad in ("internal error", "Traceback", "BrokenPipe", "Exception ignored"):
        assert bad not in p.stderr, p.stderr
    if summary.exists():  # where the run wrote its summary, it says it stopped early
        import json

        assert json.loads(summary.read_text())["frames"] < 250 * LOOPS // 2
