"""Fixtures the CPU tests share."""

from __future__ import annotations

import pytest

from tests import rtsp_server


@pytest.fixture(scope="module")
def engine(cpu_lite0):
    """The CPU tests' engine: the real Lite0 on ONNX Runtime's CPU EP (tests/conftest.py's cpu_lite0)."""
    return cpu_lite0


@pytest.fixture(scope="session")
def rtsp():
    """The server module, where gst-rtsp-server runs (CI installs it: .ci/run); the live tests' cameras."""
    why = rtsp_server.available()
    if why:
        pytest.skip(why)
    return rtsp_server
