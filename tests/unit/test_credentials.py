"""Where a source's credentials come from and how it is named (engines/video/credentials.py): no I/O but a
temporary netrc file."""

from __future__ import annotations

import pickle

import pytest

from engines.errors import UsageProblem
from engines.video.credentials import Address, read_credentials, redact, scrub, source_address, url_of


def test_user_info_in_a_url_is_hidden_and_kept_for_the_open():
    s = source_address("rtsp://admin:p%40ss@cam1.local:554/live")
    assert str(s) == "rtsp://***@cam1.local:554/live" and url_of(s) == "rtsp://admin:p%40ss@cam1.local:554/live"
    assert f"{s}" == str(s) and repr(s) == repr("rtsp://***@cam1.local:554/live")
    again = pickle.loads(pickle.dumps(s))  # a worker process opens it too
    assert isinstance(again, Address) and again.url == s.url and str(again) == str(s)
    # FFmpeg's texts name the URL it was given, encoded or not
    text = "Server returned 401 Unauthorized: 'rtsp://admin:p%40ss@cam1.local:554/live' (p@ss)"
    assert "p@ss" not in scrub(s, text) and "p%40ss" not in scrub(s, text) and "admin" not in scrub(s, text)


def test_a_name_names_a_url_and_plain_sources_stay_plain():
    s = source_address("door=rtsp://cam/live")
    assert str(s) == "door" and url_of(s) == "rtsp://cam/live"
    assert source_address("rtsp://cam/live") == "rtsp://cam/live" and type(source_address("rtsp://cam/live")) is str
    assert type(source_address("clip=1.mp4")) is str  # a file name with '=' is a file
    assert redact("a rtsp://u:p@h/x b http://x@y/z") == "a rtsp://***@h/x b http://***@y/z"
    assert redact("'rtsp://u:p@ss@h/x@y'") == "'rtsp://***@h/x@y'"  # an unencoded @ in the password


def test_credentials_come_per_host_from_the_environment_then_the_file_then_for_every_host(tmp_path):
    f = tmp_path / "cams.netrc"
    f.write_text("machine cam1.local login fileuser password filepw\ndefault login anyuser password anypw\n")
    table = read_credentials(f)
    env = {"TRTC_RTSP_USER_CAM1_LOCAL": "envuser", "TRTC_RTSP_PASSWORD_CAM1_LOCAL": "env pw/1"}
    assert url_of(source_address("rtsp://cam1.local/a", table, env)) == "rtsp://envuser:env%20pw%2F1@cam1.local/a"
    assert url_of(source_address("rtsp://cam1.local/a", table, {})) == "rtsp://fileuser:filepw@cam1.local/a"
    generic = {"TRTC_RTSP_USER": "g", "TRTC_RTSP_PASSWORD": "gpw"}
    assert url_of(source_address("rtsp://10.0.0.7/a", table, generic)) == "rtsp://g:gpw@10.0.0.7/a"
    assert url_of(source_address("rtsp://10.0.0.7/a", table, {})) == "rtsp://anyuser:anypw@10.0.0.7/a"
    assert url_of(source_address("rtsp://u:p@cam1.local/a", table, env)) == "rtsp://u:p@cam1.local/a"  # URL wins
    assert str(source_address("rtsp://cam1.local/a", table, env)) == "rtsp://cam1.local/a"
    assert url_of(source_address("http://cam1.local/a", table, env)) == "http://cam1.local/a"  # RTSP only
    with pytest.raises(UsageProblem, match="TRTC_RTSP_PASSWORD is set without TRTC_RTSP_USER"):
        source_address("rtsp://h/a", None, {"TRTC_RTSP_PASSWORD": "x"})
    bad = tmp_path / "bad.netrc"
    bad.write_text("machine h login u pasword s3cret\n")
    with pytest.raises(UsageProblem) as got:
        read_credentials(bad)
    assert "cannot be read as netrc (line 1)" in got.value.reason and "s3cret" not in str(got.value)
    with pytest.raises(UsageProblem, match="not found"):
        read_credentials(tmp_path / "none")
