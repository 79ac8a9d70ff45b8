"""Device lists for `trtc run --device cuda:0,cuda:1|cuda:all` and the plan-per-GPU check, with nvidia-smi's
answer replaced (no GPU here)."""

from __future__ import annotations

import types

import pytest

from engines.errors import UsageProblem
from engines.video.workers import parse_devices

TWO = {"devices": [{"name": "NVIDIA H100", "compute_capability": "9.0", "memory_mib": "81559"},
                   {"name": "NVIDIA L4", "compute_capability": "8.9", "memory_mib": "23034"}], "driver": "580"}


def test_parse_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("engines._gpu.gpus", lambda: TWO)
    assert parse_devices("cuda:0,cuda:1") == ["cuda:0", "cuda:1"]
    assert parse_devices("cuda:all") == ["cuda:0", "cuda:1"]
    assert parse_devices("cpu,cpu") == ["cpu", "cpu"]
    with pytest.raises(UsageProblem, match=r"no GPU cuda:2 here \(GPUs: cuda:0 \(NVIDIA H100\), cuda:1 \(NVIDIA L4\)\)"):
        parse_devices("cuda:0,cuda:2")
    with pytest.raises(UsageProblem, match="unknown device 'gpu1'"):
        parse_devices("gpu1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert parse_devices("cuda:all") == ["cuda:0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5d7c")  # not mapped: nvidia-smi's list as it is
    assert parse_devices("cuda:all") == ["cuda:0", "cuda:1"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr("engines._gpu.gpus", lambda: {"devices": [], "reason": "nvidia-smi not found"})
    with pytest.raises(UsageProblem, match="cuda:all: no NVIDIA GPU found here"):
        parse_devices("cuda:all")
    # a GPU index with no GPU at all: --device cpu is the fix (it used to say "(GPUs: none)", "give one listed")
    with pytest.raises(UsageProblem, match=r"^cuda:0: no NVIDIA GPU found here \(fix") as err:
        parse_devices("cpu,cuda:0")
    assert err.value.fix == "use --device cpu"
    with pytest.raises(UsageProblem, match="unknown device 'cuda:x'"):
        parse_devices("cpu,cuda:x")


def test_a_plan_is_refused_on_the_gpus_it_was_not_built_for(monkeypatch, tmp_path):
    from toolchain.run import check_devices_can_run

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("engines._gpu.gpus", lambda: TWO)
    plan = types.SimpleNamespace(kind="plan", precision={}, builder={
        "flavor": "tensorrt", "version": "10.13.0", "gpu": {"name": "NVIDIA H100", "compute_capability": "9.0"},
        "flags": {"hardware_compatibility": "none"}})
    monkeypatch.setattr("engines.manifest.read_manifest_if_any", lambda *a, **k: plan)
    check_devices_can_run(tmp_path / "m.plan", ["cuda:0"])  # the GPU it was built on
    with pytest.raises(UsageProblem) as err:
        check_devices_can_run(tmp_path / "m.plan", ["cuda:0", "cuda:1"])
    assert "cannot run on cuda:1" in str(err.value) and "8.9" in str(err.value)
    assert err.value.fix == "use the devices that can run it: cuda:0"
    plan.builder["flags"]["hardware_compatibility"] = "ampere+"
    check_devices_can_run(tmp_path / "m.plan", ["cuda:0", "cuda:1"])  # both are Ampere or newer
    onnx = types.SimpleNamespace(kind="onnx")
    monkeypatch.setattr("engines.manifest.read_manifest_if_any", lambda *a, **k: onnx)
    check_devices_can_run(tmp_path / "m.onnx", ["cuda:0", "cuda:1"])  # ONNX runs anywhere
    plan.builder["flags"]["hardware_compatibility"] = "none"
    monkeypatch.setattr("engines.manifest.read_manifest_if_any", lambda *a, **k: plan)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # this process's cuda:0 is the L4
    with pytest.raises(UsageProblem, match="cannot run on cuda:0.*8.9"):
        check_devices_can_run(tmp_path / "m.plan", ["cuda:0"])


def test_each_gpu_worker_sees_only_its_gpu():
    """A worker for cuda:N sets CUDA_VISIBLE_DEVICES=N before any CUDA library loads and opens cuda:0: without it
    the cuda:1 worker also made a 518 MiB context on GPU 0 (2-GPU H200 host), time-sharing it with that GPU's
    worker. CPU workers are left alone."""
    from engines.video.workers import _visible_device

    assert _visible_device("cuda:1") == ("1", "cuda:0")
    assert _visible_device("cuda:0") == ("0", "cuda:0")
    assert _visible_device("cpu") == (None, "cpu")
    # a parent that itself runs under CUDA_VISIBLE_DEVICES=2,3: its cuda:1 is physical GPU 3
    assert _visible_device("cuda:1", "2,3") == ("3", "cuda:0")
    assert _visible_device("cuda:0", "GPU-abc, GPU-def") == ("GPU-abc", "cuda:0")


class _Shares:
    """WorkerPool.share without starting worker processes."""

    def __init__(self, k):
        from engines.video.workers import WorkerPool

        self.share = WorkerPool.share.__get__(types.SimpleNamespace(workers=[None] * k))


def test_sources_are_shared_by_count_then_by_pixel_rate(bikes):
    from engines.video.sources import pixel_rate

    assert pixel_rate(str(bikes)) == 640 * 272 * 25  # read from the container, nothing decoded
    assert pixel_rate("/no/such/file.mp4") is None and pixel_rate("rtsp://cam/1") is None
    two = _Shares(2).share
    assert two(list("abcde")) == [["a", "c", "e"], ["b", "d"]]  # no weights: round robin
    uhd, hd = 3840 * 2160 * 30.0, 1280 * 720 * 30.0
    # round robin would give one worker both 4K streams; balanced, each gets one, and each share keeps its order
    assert two(["4k-a", "hd-a", "4k-b", "hd-b"], [uhd, hd, uhd, hd]) == [["4k-a", "hd-a"], ["4k-b", "hd-b"]]
    # the count comes first: three light sources do not go all to one worker to offset one heavy source
    shares = two(["4k", "hd1", "hd2", "hd3"], [uhd, hd, hd, hd])
    assert sorted(len(s) for s in shares) == [2, 2]
    # an unknown weight (a URL) counts as the median, and nothing is lost or repeated
    names = [f"s{i}" for i in range(7)]
    shares = _Shares(3).share(names, [uhd, None, hd, hd, uhd, None, hd])
    assert sorted(sum(shares, [])) == names and sorted(len(s) for s in shares) == [2, 2, 3]


def test_a_pinned_worker_keeps_to_its_gpus_cpus(monkeypatch):
    import engines.video.workers as w

    assert w._parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    pinned = []
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(16)))
    monkeypatch.setattr("os.sched_setaffinity", lambda _pid, cpus: pinned.append(set(cpus)))
    monkeypatch.setattr(w, "_gpu_local_cpus", lambda _gpu: set(range(8, 24)))  # node 1 of a 2 x 16-CPU host
    assert w._pin_to_gpu("1") == "pinned to 8 CPUs near GPU 1" and pinned == [set(range(8, 16))]
    monkeypatch.setattr(w, "_gpu_local_cpus", lambda _gpu: set(range(32)))  # one node: nothing to gain
    assert w._pin_to_gpu("0").startswith("not pinned: its local CPUs leave 16 of the 16")
    monkeypatch.setattr(w, "_gpu_local_cpus", lambda _gpu: None)
    assert w._pin_to_gpu("0") == "not pinned: the GPU's local CPUs are unknown" and len(pinned) == 1


UUIDS = [{**d, "uuid": u} for d, u in zip(TWO["devices"], ("GPU-aaaa-1111", "GPU-bbbb-2222"))]


def test_cuda_n_is_numbered_as_cuda_visible_devices_says(monkeypatch):
    """cuda:N is the N-th GPU CUDA shows this process: a worker or Ray actor runs under CUDA_VISIBLE_DEVICES=1 and
    opens cuda:0, which must then be the L4 (nvidia-smi's GPU 1) for the plan check, the memory reading and the
    GPU index check."""
    import engines._gpu as g

    monkeypatch.setattr(g, "_listed", lambda: (UUIDS, "580", None))
    monkeypatch.setattr(g, "gpus", lambda: {"devices": UUIDS, "driver": "580", "cuda": "13.0"})

    def names(_env):
        found = g.visible_gpus()
        return None if found is None else [d["name"] for d in found]

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert names(None) == ["NVIDIA H100", "NVIDIA L4"]
    for env, want in [("1", ["NVIDIA L4"]), ("1,0", ["NVIDIA L4", "NVIDIA H100"]), ("GPU-bbbb", ["NVIDIA L4"]),
                      ("0,7,1", ["NVIDIA H100"]), ("", []), ("-1", []),  # CUDA stops at a missing index
                      ("GPU-", None), ("MIG-5d7c", None), ("GPU-cccc", None)]:  # cannot be mapped: not checked
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
        assert names(env) == want, env
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert g.device(0)["name"] == "NVIDIA L4" and g.device(0)["compute_capability"] == "8.9"
    assert g.device(1) is None
    assert g._smi_id(0) == "GPU-bbbb-2222"  # nvidia-smi --id for the memory reading
    g.check_gpu_index(0)
    with pytest.raises(UsageProblem, match=r"no GPU cuda:1 here with CUDA_VISIBLE_DEVICES='1' "
                                           r"\(GPUs: cuda:0 \(NVIDIA L4\)\)") as err:
        g.check_gpu_index(1)
    assert err.value.fix == "give one of the GPUs listed"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UsageProblem, match="cuda:0: no NVIDIA GPU found here with CUDA_VISIBLE_DEVICES=''") as err:
        g.check_gpu_index(0)
    assert err.value.fix == "unset CUDA_VISIBLE_DEVICES, or use --device cpu"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert g._smi_id(1) == "1"
    with pytest.raises(UsageProblem, match=r"no GPU cuda:2 here \(GPUs: cuda:0 \(NVIDIA H100\), cuda:1 \(NVIDIA L4\)\)"):
        g.check_gpu_index(2)
    monkeypatch.setattr(g, "_listed", lambda: ([], None, "nvidia-smi not found"))
    g.check_gpu_index(5)  # nothing to go by: CUDA itself will say
    monkeypatch.setattr(g, "_listed", lambda: (UUIDS, "580", None))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5d7c")
    g.check_gpu_index(0)  # a MIG instance: not refused on a guess
    assert g.device(0)["name"] == "NVIDIA H100"  # and nvidia-smi's order stands for cuda:N, as before


def test_an_engine_on_a_missing_gpu_is_a_usage_problem(monkeypatch, lite0_onnx):
    """`trtc run --device cuda:1` on a one-GPU machine: refused by name before CuPy or ONNX Runtime's CUDA EP fail
    with errors of their own (CuPy's surfaced as an internal error)."""
    import engines._gpu as g
    import engines.onnxruntime_engine as ort_engine

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(g, "_listed", lambda: (UUIDS[:1], "580", None))
    monkeypatch.setattr(ort_engine, "providers_for",
                        lambda device: [("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"])
    with pytest.raises(UsageProblem, match=r"no GPU cuda:1 here \(GPUs: cuda:0 \(NVIDIA H100\)\)"):
        ort_engine.OnnxRuntimeEngine(lite0_onnx[0], device="cuda:1")


def test_a_gpu_cuda_shows_passes_without_asking_nvidia_smi(monkeypatch):
    """At every engine open on cuda:N: when CuPy (or torch) is already imported, CUDA's own device count decides
    whether cuda:N exists, and nvidia-smi (a process of its own, on the way to the first result) is not run; an
    index past that count, or a CUDA that cannot count, still gets nvidia-smi's answer naming the GPUs."""
    import sys

    import engines._gpu as g

    asked = []

    def listed():
        asked.append(1)
        return UUIDS, "580", None

    monkeypatch.setattr(g, "_listed", listed)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    count = {"n": 2}

    def get_device_count():
        if isinstance(count["n"], Exception):
            raise count["n"]
        return count["n"]

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        getDeviceCount=get_device_count)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    g.check_gpu_index(0)
    g.check_gpu_index(1)
    assert asked == []
    with pytest.raises(UsageProblem, match=r"no GPU cuda:2 here \(GPUs: cuda:0 \(NVIDIA H100\), cuda:1 \(NVIDIA L4\)\)"):
        g.check_gpu_index(2)
    assert asked == [1]
    count["n"] = RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    with pytest.raises(UsageProblem, match=r"no GPU cuda:2 here"):
        g.check_gpu_index(2)
    g.check_gpu_index(1)  # nvidia-smi lists it
    assert asked == [1, 1, 1]
