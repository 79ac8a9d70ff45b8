"""Fixtures the GPU tests share: the real Lite0 opened on the GPU and on the CPU (once per test module)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cuda_lite0(lite0_onnx):
    import engines

    with engines.open_engine(lite0_onnx[0], device="cuda:0") as eng:
        yield eng


@pytest.fixture(scope="module")
def cpu_lite0(lite0_onnx):
    import engines

    with engines.open_engine(lite0_onnx[0], device="cpu") as eng:
        yield eng
