"""A WorkerPool over two GPUs: eight names for bikes.mp4 shared out over a worker per GPU must each give the
single-process cuda:0 run's frames, in order, with the same top-1; each source stays on one GPU, four per GPU; and
each worker holds a CUDA context on its own GPU only (the worker for cuda:1 used to open one on GPU 0 as well).
Also: a GPU index past the last is refused by name. Skipped without the gpu extra and PyAV; the pool test without
two NVIDIA GPUs."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections import defaultdict

import numpy as np
import pytest

from engines._gpu import gpus

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("cupy", "PyNvVideoCodec", "av")),
                                 reason="needs the gpu extra (cupy, PyNvVideoCodec) and PyAV")]


def _smi(query: str) -> list[list[str]]:
    out = subprocess.run([shutil.which("nvidia-smi") or "nvidia-smi", f"--query-{query}", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout
    return [[x.strip() for x in line.split(",")] for line in out.strip().splitlines() if line.strip()]


@pytest.mark.parametrize("pin", [False, True], ids=["unpinned", "pinned"])
def test_two_gpu_workers_agree_with_one_process(lite0_onnx, bikes, tmp_path, pin):
    if len(gpus()["devices"]) < 2:
        pytest.skip("needs two NVIDIA GPUs")
    import engines
    from engines.video import WorkerPool, classify

    model = str(lite0_onnx[0])
    names = []
    for i in range(8):
        p = tmp_path / f"cam{i}.mp4"
        p.symlink_to(bikes)
        names.append(str(p))
    with engines.open_engine(model, device="cuda:0") as eng:
        ref = np.array([p.indices[0] for p in classify([str(bikes)], eng, batch=32)])

    got: dict[str, list] = defaultdict(list)
    on: dict[str, set] = defaultdict(set)
    with WorkerPool(model, devices=["cuda:0", "cuda:1"], pin_cpus=pin) as pool:
        run = pool.classify(names, batch=32)
        for p in run:
            got[p.source].append((p.frame, p.indices[0]))
            on[p.source].add(p.device)
        assert not run.problems
        # the workers' contexts are alive until the pool closes ("No running processes found" is one field)
        apps = [row for row in _smi("compute-apps=pid,gpu_uuid") if len(row) == 2]
        uuid = {int(i): u for i, u in _smi("gpu=index,uuid")}
        workers = {w.process.pid: w.device for w in pool.workers}
        pinned = [w.pinned for w in pool.workers]
        print(f"\npinning: {pinned}")
    for name in names:
        frames = [f for f, _ in got[name]]
        assert frames == list(range(len(ref))), f"{name}: frames missing, repeated or out of order"
        agree = float(np.mean(np.array([t for _, t in got[name]]) == ref))
        assert agree >= 0.99, f"{name}: top-1 agrees with the single-process run on {agree:.1%} of frames"
        assert len(on[name]) == 1, f"{name} was classified on {on[name]}"
    per_device = defaultdict(int)
    for name in names:
        per_device[next(iter(on[name]))] += 1
    assert per_device == {"cuda:0": 4, "cuda:1": 4}
    seen = {int(pid): u for pid, u in apps if pid.isdigit() and int(pid) in workers}
    if not seen:
        print("nvidia-smi lists no process of this container (separate PID namespace): context check not possible")
    for pid, device in workers.items():
        held = {u for p, u in apps if p.isdigit() and int(p) == pid}
        if seen:
            assert held == {uuid[int(device.split(":")[1])]}, f"the worker for {device} holds contexts on {held}"
    if pin:  # pinned, or a reason why not (e.g. one NUMA node: its CPUs are all the CPUs there are)
        assert all(n.startswith(("pinned to ", "not pinned: ")) for n in pinned), pinned
    else:
        assert pinned == ["not pinned", "not pinned"]


def test_a_gpu_that_is_not_there_is_refused_by_name(lite0_onnx, bikes, tmp_path):
    """One past the last GPU, alone and in a list: a usage error naming the GPUs there are (exit code 2), not CuPy's
    or ONNX Runtime's own error, and no output file."""
    from click.testing import CliRunner

    import engines
    from engines.errors import UsageProblem
    from toolchain.cli import cli

    n = len(gpus()["devices"])
    model = str(lite0_onnx[0])
    with pytest.raises(UsageProblem, match=rf"no GPU cuda:{n} here \(GPUs: cuda:0 \("):
        engines.open_engine(model, device=f"cuda:{n}")
    for device in (f"cuda:{n}", f"cuda:0,cuda:{n}"):
        res = CliRunner().invoke(cli, ["run", str(bikes), "--model", model, "--device", device,
                                        "-o", str(tmp_path / "p.jsonl")])
        assert res.exit_code == 2 and f"no GPU cuda:{n} here" in res.output, (device, res.output)
        assert not (tmp_path / "p.jsonl").exists()
