"""Fixtures the GPU tests share: the real Lite0 opened on the GPU (once per test module; the CPU one, cpu_lite0,
is in tests/conftest.py), and the RTSP server of the live tests."""

from __future__ import annotations

import pytest

from tests import rtsp_server


@pytest.fixture(scope="session")
def rtsp():
    """tests/rtsp_server.py where a server runs: gst-rtsp-server, else aio-rtsp-toolkit (the GPU image's)."""
    why = rtsp_server.available()
    if why:
        pytest.skip(f"no RTSP server: {why}")
    return rtsp_server


@pytest.fixture(scope="module")
def cuda_lite0(lite0_onnx):
    import engines

    # no quick start: these tests compare scores across runs within 1e-4, and a batch that ran on the quick session
    # (cuDNN's default algorithms, the first second or two of a new batch size) differs by up to 3.7e-3 in the top-1
    # score (the same top-1; H100, 2026-11-26). tests/gpu/test_ort_tuning_gpu.py tests the quick start itself.
    with engines.open_engine(lite0_onnx[0], device="cuda:0", quick_start=False) as eng:
        yield eng


@pytest.fixture
def own_gpu_memory():
    """A function giving (MiB, what): GPU memory held by this process, from nvidia-smi's list of compute
    processes, or the whole GPU's (``what`` says which) where this process is not listed (another PID namespace).
    The whole GPU's figure counts the other test workers' engines too, which come and go under ``-n``."""
    import os
    import shutil
    import subprocess

    from engines._gpu import memory_used_mib

    def measure() -> tuple[float | None, str]:
        smi = shutil.which("nvidia-smi")
        if smi:
            try:
                text = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                      capture_output=True, text=True, timeout=10, check=True).stdout
            except (OSError, subprocess.SubprocessError):
                text = ""
            mine = [float(used) for pid, used in (line.split(",") for line in text.splitlines() if "," in line)
                    if pid.strip() == str(os.getpid()) and used.strip().replace(".", "", 1).isdigit()]
            if mine:
                return sum(mine), "this process"
        return memory_used_mib(0), "whole GPU"

    return measure
