"""The service's health and metrics endpoints (toolchain.serve.http), read over real HTTP on 127.0.0.1 and, for the
page, by a real headless Chromium: /readyz turns 503 within a camera's read timeout of its going dark and names it,
/metrics counts what the state was told per camera and forgets a removed one, /healthz follows the loop, and the
page shows each camera's row."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.cpu.test_report_html import CHROMIUM, needs_chromium

pytest.importorskip("prometheus_client")

from toolchain.serve.http import ServiceState, StatusServer  # noqa: E402


def _get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def served():
    state = ServiceState(loop_timeout=0.5)
    state.add_camera("door", read_timeout=1.0)
    state.add_camera("dock", read_timeout=1.0)
    state.add_camera("yard", enabled=False)
    server = StatusServer(state, port=0).start()
    yield state, server.port
    server.stop()


def test_readiness_follows_the_engine_and_every_enabled_camera(served):
    state, port = served
    code, body = _get(port, "/readyz")
    assert code == 503 and json.loads(body)["reasons"] == ["the engine is not open yet", "door: no frame yet",
                                                           "dock: no frame yet"]
    state.engine_open = True
    state.camera_frame("door", 0.1, "unicycle", 0.6)
    state.camera_frame("dock", 0.2, "jinrikisha", 0.3)
    went_dark = time.monotonic()  # dock's last frame
    assert _get(port, "/readyz")[0] == 200  # yard is disabled: not waited for
    while True:  # door keeps delivering, dock goes dark
        state.camera_frame("door", 0.1, "unicycle", 0.6)
        code, body = _get(port, "/readyz")
        if code == 503:
            break
        assert time.monotonic() - went_dark < 2.0, "readyz still 200 a second past dock's read timeout"
        time.sleep(0.05)
    assert 1.0 <= time.monotonic() - went_dark <= 2.0
    (reason,) = json.loads(body)["reasons"]
    assert reason.startswith("dock: no frame for ") and reason.endswith("(read timeout 1 s)")


def test_health_follows_the_loop_and_metrics_count_per_camera(served):
    state, port = served
    state.beat()
    assert _get(port, "/healthz")[0] == 200
    time.sleep(0.7)
    assert _get(port, "/healthz")[0] == 503  # the loop has not turned for longer than loop_timeout
    for _ in range(7):
        state.camera_frame("door", 0.25, "unicycle", 0.6)
    state.camera_event("door", "disconnected")
    state.camera_event("door", "reconnected")
    state.metrics.count("dropped", "door", reason="lag")
    state.metrics.count("reloads", result="refused")
    code, text = _get(port, "/metrics")
    assert code == 200
    assert 'trtc_frames_classified_total{camera="door"} 7.0' in text
    assert 'trtc_frames_dropped_total{camera="door",reason="lag"} 1.0' in text
    assert 'trtc_reconnects_total{camera="door"} 1.0' in text
    assert 'trtc_config_reloads_total{result="refused"} 1.0' in text
    assert 'trtc_end_to_end_lag_seconds_count{camera="door"} 7.0' in text
    assert 'trtc_camera_up{camera="door"} 1.0' in text and 'trtc_camera_up{camera="dock"} 0.0' in text
    assert "process_resident_memory_bytes" in text
    state.remove_camera("door")
    assert 'camera="door"' not in _get(port, "/metrics")[1]
    status = json.loads(_get(port, "/status")[1])
    assert sorted(status["cameras"]) == ["dock", "yard"]


@needs_chromium
def test_the_page_shows_each_cameras_row_in_chromium(served, tmp_path):
    state, port = served
    state.engine_open = True
    state.camera_frame("door", 0.12, "unicycle", 0.61)
    state.camera_event("dock", "disconnected")
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    dom = subprocess.run([*common, "--dump-dom", f"http://127.0.0.1:{port}/"], capture_output=True, text=True,
                         timeout=90).stdout
    for row in ("<td>door</td><td>up</td>", "<td>dock</td><td>down</td>", "<td>unicycle (0.61)</td>",
                "<td>disconnected</td>", "<td>yard</td><td>starting</td>"):
        assert row in dom, (row, dom[-2000:])
    shot = tmp_path / "page.png"
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=900,400", f"http://127.0.0.1:{port}/"],
                   capture_output=True, timeout=90)
    assert shot.exists() and shot.stat().st_size > 5000
