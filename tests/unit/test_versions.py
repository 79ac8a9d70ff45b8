"""Releases of optional packages: OpenCV's dnn engines found by the constants each release defines (4.x, 5.0, 5.1, a
future one that renames them again), the tested ranges, and the messages for a release outside them: named as
unsupported at the point of use, by `trtc doctor`, and in place of "a bug in trtc" when something fails under it.
The real OpenCV of the lock runs in tests/cpu/test_opencv_engine.py; these stand-ins give the other releases'
cv2.dnn constants only (the values are OpenCV's own)."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from engines import _deps
from engines.errors import UnsupportedVersion


def _cv2(version: str, build: str = "", **constants) -> types.SimpleNamespace:
    return types.SimpleNamespace(__version__=version, dnn=types.SimpleNamespace(**constants),
                                 getBuildInformation=lambda: build)


OPENCV4 = _cv2("4.10.0")
OPENCV50 = _cv2("5.0.0", ENGINE_CLASSIC=1, ENGINE_NEW=2, ENGINE_AUTO=3)
OPENCV51 = _cv2("5.1.0", "  ONNX Runtime:                  NO", ENGINE_AUTO=0, ENGINE_OPENCV=1, ENGINE_ORT=2)
OPENCV51_ORT = _cv2("5.1.0", "  ONNX Runtime:                  YES (ver 1.22.0)", ENGINE_AUTO=0, ENGINE_OPENCV=1,
                    ENGINE_ORT=2)
FUTURE = _cv2("5.3.0", ENGINE_AUTO=0, ENGINE_GRAPH=1)


def test_dnn_engines_are_found_by_the_constants_each_release_defines():
    from engines.opencv_engine import dnn_engines

    assert dnn_engines(OPENCV4) == {"auto": None, "classic": None}  # one engine, no argument to readNetFromONNX
    assert dnn_engines(OPENCV50) == {"auto": 3, "new": 2, "classic": 1}
    assert dnn_engines(OPENCV51) == {"auto": 0, "new": 1}  # ENGINE_ORT without ONNX Runtime built in: not offered
    assert dnn_engines(OPENCV51_ORT) == {"auto": 0, "new": 1, "ort": 2}
    assert dnn_engines(FUTURE) == {}


def test_an_opencv_whose_engines_trtc_does_not_know_is_refused_by_release_with_the_fix():
    from engines.opencv_engine import check_opencv

    assert check_opencv(OPENCV51) is OPENCV51
    with pytest.raises(UnsupportedVersion) as err:
        check_opencv(FUTURE)
    assert err.value.reason.startswith("OpenCV 5.3.0 is not supported by this trtc; supported: 4.10 to 5.1.x")
    assert err.value.fix == 'pip install "opencv-python-headless>=4.10,<5.2"'


def test_tested_ranges_and_release_numbers():
    assert _deps.version_tuple("2.14.1+cu130") == (2, 14, 1)
    assert _deps.version_tuple("5.1.0.95") == (5, 1, 0, 95)
    assert _deps.version_tuple("1.0rc1") == (1, 0)
    assert _deps.is_tested("cv2", "5.1.0") and _deps.is_tested("cv2", "4.10.0")
    assert not _deps.is_tested("cv2", "5.2.0") and not _deps.is_tested("cv2", "4.9.0")
    assert _deps.is_tested("torch", "2.14.1+cu130") and not _deps.is_tested("torch", "2.15.0")
    assert _deps.is_tested("not-in-the-table", "0.1")


def test_an_untested_release_is_warned_about_once_at_import(monkeypatch, caplog):
    fake = types.ModuleType("timm")
    fake.__version__ = "9.0.0"
    monkeypatch.setitem(sys.modules, "timm", fake)
    monkeypatch.setattr(_deps, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="trtc"):
        assert _deps.require("timm", "Loading timm models") is fake
        _deps.require("timm", "Loading timm models")
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["timm 9.0.0 is outside the releases this trtc is tested with (1.0 to 1.0.x); it may work; "
                        'if something fails: pip install "timm>=1.0,<1.1"'], warnings
    assert ("timm", "9.0.0") in _deps.untested_imports()


def test_an_unexpected_error_under_an_untested_release_names_the_release_before_calling_it_a_bug(monkeypatch):
    from click.testing import CliRunner

    import toolchain.cli as cli_module

    fake = types.ModuleType("onnxruntime")
    fake.__version__ = "1.40.0"

    def broken(*args, **kwargs):
        raise AttributeError("module 'onnxruntime' has no attribute 'InferenceSession'")

    monkeypatch.setitem(sys.modules, "onnxruntime", fake)
    # only ONNX Runtime's range counts here (.ci/latest runs this under untested releases of other packages too)
    monkeypatch.setattr(_deps, "TESTED", {"onnxruntime": _deps.TESTED["onnxruntime"]})
    monkeypatch.setattr("toolchain.doctor.diagnose", broken)
    r = CliRunner().invoke(cli_module.cli, ["doctor", "--json"])
    assert r.exit_code == 1
    assert "internal error: AttributeError" in r.output
    assert ("ONNX Runtime 1.40.0 is outside the releases this trtc is tested with (1.20 to 1.32.x): "
            'pip install "onnxruntime>=1.20,<1.33"; then run again. If it fails the same way, this is a bug in trtc'
            in r.output.replace("\n", " ").replace("  ", " ")), r.output
    monkeypatch.delitem(sys.modules, "onnxruntime")
    r = CliRunner().invoke(cli_module.cli, ["doctor", "--json"])
    assert "fix: this is a bug in trtc" in r.output  # nothing untested imported: a bug


def test_doctor_names_an_untested_release_with_the_install_line():
    from toolchain.doctor import _tested

    info = {"version": "5.2.0", "note": "dnn CUDA: no (0 devices)"}
    _tested("cv2", info)
    assert info["tested"] is False and info["tested_range"] == "4.10 to 5.1.x"
    assert info["note"].startswith("OpenCV 5.2.0 is outside the releases this trtc is tested with (4.10 to 5.1.x): "
                                   'pip install "opencv-python-headless>=4.10,<5.2"; dnn CUDA: no')
    info = {"version": "5.1.0"}
    _tested("cv2", info)
    assert info["tested"] is True and "note" not in info
