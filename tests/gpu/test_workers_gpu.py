"""A WorkerPool over two GPUs: eight names for bikes.mp4 shared out over a worker per GPU must each give the
single-process cuda:0 run's frames, in order, with the same top-1; each source stays on one GPU, four per GPU; and
each worker holds a CUDA context on its own GPU only (the worker for cuda:1 used to open one on GPU 0 as well).
Also: a GPU index past the last is refused by name. Skipped without the gpu extra and PyAV; the pool test without
two NVIDIA GPUs. Where the context check cannot be made (nvidia-smi lists no process) it fails instead of printing;
the pinned variant fails unless each worker is pinned (skipped, with the reason, only where the GPUs' NUMA node holds
every CPU, so there is nothing to pin to)."""

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


def _apps_per_gpu() -> dict[str, list[int]]:
    """nvidia-smi's compute processes per GPU uuid (PIDs as nvidia-smi sees them: the host's, in a container)."""
    out: dict[str, list[int]] = defaultdict(list)
    for row in _smi("compute-apps=pid,gpu_uuid"):
        if len(row) == 2 and row[0].isdigit():  # "No running processes found" is one field
            out[row[1]].append(int(row[0]))
    return out


def _local_cpus(index: int) -> set[int] | None:
    """GPU ``index``'s NUMA-local CPUs from sysfs, read here independently of engines.video.workers."""
    out = subprocess.run([shutil.which("nvidia-smi") or "nvidia-smi", f"--id={index}", "--query-gpu=pci.bus_id",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    if ":" not in out:
        return None
    try:
        text = open(f"/sys/bus/pci/devices/{out.lower()[-12:]}/local_cpulist").read().strip()
    except OSError:
        return None
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def check_contexts(before: dict, during: dict, own_pids: dict[int, str], uuid: dict[int, str]) -> None:
    """Each worker holds a CUDA context on its own GPU only. Where nvidia-smi's PIDs are this container's (the
    workers' PIDs appear), by PID; where they are the host's (a separate PID namespace), by count: the pool's start
    added exactly one process to each worker's GPU (a worker for cuda:1 that also opened GPU 0 adds two there).
    Where nvidia-smi lists no process at all the check cannot be made: that fails, it is not printed and passed."""
    listed = {pid for pids in during.values() for pid in pids}
    if set(own_pids) & listed:
        for pid, device in own_pids.items():
            held = {u for u, pids in during.items() if pid in pids}
            assert held == {uuid[int(device.split(":")[1])]}, f"the worker for {device} holds contexts on {held}"
        return
    assert listed, ("nvidia-smi lists no compute process while the workers run: the per-GPU context check cannot "
                    "be made here (run the container with --pid=host, or where nvidia-smi sees its processes)")
    want: dict[str, int] = defaultdict(int)
    for device in own_pids.values():
        want[uuid[int(device.split(":")[1])]] += 1
    added = {u: len(set(during.get(u, [])) - set(before.get(u, []))) for u in set(during) | set(before)}
    added = {u: n for u, n in added.items() if n}
    assert added == dict(want), (f"new compute processes per GPU while the pool ran: {added}; one per worker's "
                                 f"GPU expected: {dict(want)} (another program starting on these GPUs also "
                                 "breaks this count)")


@pytest.mark.parametrize("pin", [False, True], ids=["unpinned", "pinned"])
def test_two_gpu_workers_agree_with_one_process(lite0_onnx, bikes, tmp_path, pin):
    if len(gpus()["devices"]) < 2:
        pytest.skip("needs two NVIDIA GPUs")
    import os

    import engines
    from engines.video import WorkerPool, classify

    allowed = os.sched_getaffinity(0)
    if pin:
        local = [_local_cpus(i) for i in (0, 1)]
        if any(cpus is not None and (cpus & allowed) == allowed for cpus in local):
            pytest.skip("needs two NVIDIA GPUs on different NUMA nodes: here a GPU's local CPUs are all the CPUs "
                        "allowed, so pinning has nothing to choose")
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
    before = _apps_per_gpu()  # this process's own context on GPU 0 (the reference run) is there already
    with WorkerPool(model, devices=["cuda:0", "cuda:1"], pin_cpus=pin) as pool:
        run = pool.classify(names, batch=32)
        for p in run:
            got[p.source].append((p.frame, p.indices[0]))
            on[p.source].add(p.device)
        assert not run.problems
        # the workers' contexts are alive until the pool closes
        during = _apps_per_gpu()
        uuid = {int(i): u for i, u in _smi("gpu=index,uuid")}
        workers = {w.process.pid: w.device for w in pool.workers}
        pinned = [w.pinned for w in pool.workers]
        affinity = {w.device: os.sched_getaffinity(w.process.pid) for w in pool.workers}
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
    check_contexts(before, during, workers, uuid)
    if pin:  # pinned, and the kernel says so: each worker runs on its GPU's local CPUs, a strict subset
        assert all(n.startswith("pinned to ") for n in pinned), pinned
        for device, cpus in affinity.items():
            local = _local_cpus(int(device.split(":")[1]))
            assert cpus and cpus < allowed, f"the worker for {device} may run on {len(cpus)} of {len(allowed)} CPUs"
            assert local is None or cpus == local & allowed, f"the worker for {device} runs on {sorted(cpus)}"
    else:
        assert pinned == ["not pinned", "not pinned"]
        assert all(cpus == allowed for cpus in affinity.values()), affinity


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
