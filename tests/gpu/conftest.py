"""Fixtures the GPU tests share: the real Lite0 opened on the GPU (once per test module); the CPU one, cpu_lite0,
is in tests/conftest.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cuda_lite0(lite0_onnx):
    import engines

    with engines.open_engine(lite0_onnx[0], device="cuda:0") as eng:
        yield eng
