"""trtc on Ray with two GPUs: two engine actors (num_gpus=1 each) on a local Ray instance, sixteen copies of
bikes.mp4 shared out; every copy must give the single-process cuda:0 run's frames in order with the same top-1
(examples/ray_two_gpus.py does the work and prints the throughput, kept in the test's output). Skipped without
two NVIDIA GPUs, the gpu extra, PyAV and Ray."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engines._gpu import gpus

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("cupy", "PyNvVideoCodec", "av", "ray")),
                                 reason="needs the gpu and ray extras and PyAV")]

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "ray_two_gpus.py"


def test_two_gpu_actors_agree_with_one_process(lite0_onnx, bikes, tmp_path):
    if len(gpus()["devices"]) < 2:
        pytest.skip("needs two NVIDIA GPUs")
    out = tmp_path / "ray-2gpu.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--model", str(lite0_onnx[0]), "--video", str(bikes),
                        "--streams", "16", "--gpus", "2", "--batch", "32", "--json", str(out)],
                       capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SCRIPT.parents[1]),
                                                                                    os.environ.get("PYTHONPATH")]))))
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["agreement"]["every_frame_in_order"] and report["agreement"]["top1"] >= 0.99
    assert len(report["ray"]["frames_per_actor"]) == 2  # both GPUs worked
    assert report["ray"]["frames"] == 16 * 250
