"""trtc on Ray with two GPUs: two engine actors (num_gpus=1 each) on a local Ray instance, sixteen copies of
bikes.mp4 shared out; every copy must give the single-process cuda:0 run's frames in order with the same top-1
(examples/ray_two_gpus.py does the work and prints the throughput, kept in the test's output). Then a cluster
started by `ray start --head`: a kept engine service's second job runs on warm GPU actors with the same results.
Skipped without two NVIDIA GPUs, the gpu extra, PyAV and Ray."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engines._gpu import gpus
from toolchain._env import checkout_env

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
                       env=checkout_env())
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["agreement"]["every_frame_in_order"] and report["agreement"]["top1"] >= 0.99
    assert len(report["ray"]["frames_per_actor"]) == 2  # both GPUs worked
    assert report["ray"]["frames"] == 16 * 250


def test_kept_gpu_actors_on_a_running_cluster_are_warm_and_agree(lite0_onnx, bikes, tmp_path):
    """`ray start --head` with the host's GPUs, then `trtc run --ray auto --ray-keep` twice on eight copies of
    bikes.mp4 (four at a time per actor): the first job opens an engine in each GPU actor, the second finds them warm (no
    engine-open phase); both write every frame of one process on cuda:0 with the same top-1."""
    from tests.ray_head import RayHead

    if len(gpus()["devices"]) < 2:
        pytest.skip("needs two NVIDIA GPUs")
    copies = []
    for i in range(8):
        copies.append(tmp_path / f"copy{i}.mp4")
        copies[-1].symlink_to(bikes)
    common = ["--model", str(lite0_onnx[0]), "--batch", "32"]

    def trtc(env, *args):
        r = subprocess.run([sys.executable, "-m", "toolchain", "-v", *map(str, args)], capture_output=True,
                           text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        return r

    def lines(path):
        return {(d["source"], d["frame"]): d["top_k"][0]["index"] for d in map(json.loads, path.open()) if "frame" in d}

    env = checkout_env()
    trtc(env, "run", *copies, "--device", "cuda:0", *common, "-o", tmp_path / "one.jsonl")
    with RayHead(num_cpus=8, num_gpus=None) as head:
        runs = []
        for i in range(2):
            out, summary = tmp_path / f"kept{i}.jsonl", tmp_path / f"kept{i}.json"
            r = trtc(head.env, "run", *copies, "--ray", "auto", "--ray-keep", "lite0-gpu", "--device", "cuda",
                     "--ray-streams", "4", *common, "-o", out, "--summary", summary)
            print(r.stderr[-1500:])
            runs.append((json.loads(summary.read_text())["ray"], lines(out)))
        trtc(head.env, "run", "--ray", "auto", "--ray-stop", "lite0-gpu")
    (cold, cold_lines), (warm, warm_lines) = runs
    assert len(cold["actors"]) == 2 and cold["service"]["warm"] is False and warm["service"]["warm"] is True
    assert "engine_open" in cold["startup"]["phases"] and "engine_open" not in warm["startup"]["phases"]
    one = lines(tmp_path / "one.jsonl")
    assert len(one) == 8 * 250 and set(cold_lines) == set(one) == set(warm_lines)
    assert len(set(cold["placement"].values())) == 2  # both GPUs worked
    # a source may run on the other GPU the second time: the same top-1 up to near-ties
    for got in (cold_lines, warm_lines):
        assert sum(one[k] == got[k] for k in one) / len(one) >= 0.99
