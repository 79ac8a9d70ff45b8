"""Fixtures the CPU tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def engine(cpu_lite0):
    """The CPU tests' engine: the real Lite0 on ONNX Runtime's CPU EP (tests/conftest.py's cpu_lite0)."""
    return cpu_lite0
