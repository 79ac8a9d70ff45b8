"""Fixtures the GPU tests share: the real Lite0 opened on the GPU (once per test module); the CPU one, cpu_lite0,
is in tests/conftest.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cuda_lite0(lite0_onnx):
    import engines

    # no quick start: these tests compare scores across runs within 1e-4, and a batch that ran on the quick session
    # (cuDNN's default algorithms, the first second or two of a new batch size) differs by up to 3.7e-3 in the top-1
    # score (the same top-1; H100, 2026-11-26). tests/gpu/test_ort_tuning_gpu.py tests the quick start itself.
    with engines.open_engine(lite0_onnx[0], device="cuda:0", quick_start=False) as eng:
        yield eng
