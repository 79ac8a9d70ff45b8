"""The live-fault table on the GPU path: every test of tests/cpu/test_live_faults.py (a real RTSP server behind the
fault-injecting proxy, `trtc run` asserting what the operator needs for each fault) run again with `--device cuda:0`,
so frames are decoded by NVDEC and classified on the GPU. The server is gst-rtsp-server where it runs, else
aio-rtsp-toolkit's (the GPU machine's image; tests/rtsp_server.py). Each run must have decoded with NVDEC: a silent
fall-back to the CPU decoder fails the test. Skipped without an NVIDIA GPU and the gpu extra."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.cpu import test_live_faults as cpu_table
from tests.cpu.test_live_faults import (  # noqa: F401 (the CPU tests, collected here again for the GPU)
    camera,
    test_bandwidth_below_the_bitrate_shows_lag_and_bounds_it,
    test_camera_returning_at_another_resolution_goes_on,
    test_camera_unreachable_from_the_start_says_so_early,
    test_read_timeout_5_fires_at_5_s,
    test_reconnect_attempts_running_out_names_that_option,
    test_stall_on_an_open_connection_is_lost_at_read_timeout_then_back_near_live,
    test_video_muted_while_rtsp_answers_is_one_disconnected_then_gave_up,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("cupy", "PyNvVideoCodec", "av")),
                                 reason="needs the gpu extra (cupy, PyNvVideoCodec) and PyAV")]


@pytest.fixture(autouse=True)
def on_the_gpu(monkeypatch, tmp_path):
    """Every `trtc run` of the table on cuda:0; afterwards, a summary with frames in it names NVDEC."""
    monkeypatch.setattr(cpu_table.Run, "device", "cuda:0")
    yield
    summary = tmp_path / "summary.json"
    if summary.exists() and json.loads(summary.read_text())["frames"]:
        s = json.loads(summary.read_text())
        assert s["device"] == "cuda:0" and s["decoder"] == "nvdec", (s["device"], s["decoder"])
