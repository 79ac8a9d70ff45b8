"""Issue 29 item 5: on the edge install (no PyAV) the stream's colour matrix and range come from PyNvVideoCodec's
demuxer (ColorSpace() / ColorRange(), enums named as in its 2.2.4 module: BT_601, BT_709, UNSPEC; MPEG, JPEG, UDEF),
and what it leaves unsaid is assumed and said once per process per assumption, with the --colorspace fix. The
demuxer here is a stand-in (NOT the real library): its enum values are objects with a ``name``, as pybind11's are."""

from __future__ import annotations

import logging
import types

import pytest

from engines.preprocess import ColorSpace
from engines.video import sources


class Demuxer:
    def __init__(self, space="UNSPEC", rng="UDEF", broken=False):
        self.space, self.rng, self.broken = space, rng, broken

    def ColorSpace(self):  # noqa: N802 - PyNvVideoCodec's name
        if self.broken:
            raise AttributeError("no ColorSpace in this PyNvVideoCodec")
        return types.SimpleNamespace(name=self.space)

    def ColorRange(self):  # noqa: N802
        return types.SimpleNamespace(name=self.rng)


@pytest.fixture()
def edge(monkeypatch, tmp_path):
    """No PyAV, a fresh record of what was said, a file to name."""
    real = sources.is_installed
    monkeypatch.setattr(sources, "is_installed", lambda m: False if m == "av" else real(m))
    monkeypatch.setattr(sources, "_ASSUMED", set())
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"")
    return str(clip)


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_demuxer_colour_info_is_used_without_pyav(edge, caplog):
    with caplog.at_level(logging.WARNING, logger="trtc"):
        assert sources.probe_colorspace(edge, 1080, None, Demuxer("BT_601", "JPEG")) == ColorSpace("bt601", "full")
        assert sources.probe_colorspace(edge, 480, None, Demuxer("BT_709", "MPEG")) == ColorSpace("bt709", "limited")
        assert sources.probe_colorspace(edge, 480, "bt709:full", Demuxer("BT_601", "MPEG")) == \
            ColorSpace("bt709", "full")  # --colorspace wins
    assert warnings(caplog) == []


def test_what_is_assumed_is_said_once_per_process_with_the_fix(edge, caplog):
    with caplog.at_level(logging.WARNING, logger="trtc"):
        for _ in range(3):
            assert sources.probe_colorspace(edge, 1080, None, Demuxer()) == ColorSpace("bt709", "limited")
        assert sources.probe_colorspace(edge, 480, None, Demuxer(broken=True)) == ColorSpace("bt601", "limited")
        assert sources.probe_colorspace(edge, 720, None, None) == ColorSpace("bt709", "limited")
        assert sources.probe_colorspace(edge, 480, None, Demuxer("BT_601", "UDEF")) == ColorSpace("bt601", "limited")
    said = warnings(caplog)
    assert said == [
        f"{edge}: the stream's colour matrix and range are not known here (no PyAV, and the demuxer does not say): "
        "assuming the BT.709 matrix (BT.709 for 720 rows or more, BT.601 below) and limited range (said once); if "
        "colours look wrong, give --colorspace, e.g. --colorspace bt709:full",
        f"{edge}: the stream's colour matrix and range are not known here (no PyAV, and the demuxer does not say): "
        "assuming the BT.601 matrix (BT.709 for 720 rows or more, BT.601 below) and limited range (said once); if "
        "colours look wrong, give --colorspace, e.g. --colorspace bt709:full",
        f"{edge}: the stream's colour range is not known here (no PyAV, and the demuxer does not say): assuming "
        "limited range (said once); if colours look wrong, give --colorspace, e.g. --colorspace bt709:full"], said
