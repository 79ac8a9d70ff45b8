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
    monkeypatch.setattr("engines._gpu.gpus", lambda: TWO)
    assert parse_devices("cuda:0,cuda:1") == ["cuda:0", "cuda:1"]
    assert parse_devices("cuda:all") == ["cuda:0", "cuda:1"]
    assert parse_devices("cpu,cpu") == ["cpu", "cpu"]
    with pytest.raises(UsageProblem, match=r"no GPU cuda:2 here \(GPUs: cuda:0 \(NVIDIA H100\), cuda:1 \(NVIDIA L4\)\)"):
        parse_devices("cuda:0,cuda:2")
    with pytest.raises(UsageProblem, match="unknown device 'gpu1'"):
        parse_devices("gpu1")
    monkeypatch.setattr("engines._gpu.gpus", lambda: {"devices": [], "reason": "nvidia-smi not found"})
    with pytest.raises(UsageProblem, match="cuda:all: no NVIDIA GPU found here"):
        parse_devices("cuda:all")


def test_a_plan_is_refused_on_the_gpus_it_was_not_built_for(monkeypatch, tmp_path):
    from toolchain.run import check_devices_can_run

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
