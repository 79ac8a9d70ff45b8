"""Issue 16 item 13: real-model tests must not skip silently. The photos fixture raises instead of skipping, and
with TRTC_REQUIRE_REAL=1 (.ci/run) a skipped test that uses a real-model fixture is reported as a failure."""

from __future__ import annotations

import types

from tests import conftest


def _report(skipped=True, reason="needs the export extra"):
    return types.SimpleNamespace(skipped=skipped, longrepr=("f.py", 1, f"Skipped: {reason}"))


def _item(fixtures, keywords=()):
    return types.SimpleNamespace(fixturenames=list(fixtures), keywords=set(keywords))


def test_a_skipped_real_model_test_fails_in_ci(monkeypatch):
    monkeypatch.setenv("TRTC_REQUIRE_REAL", "1")
    why = conftest.real_model_skip(_item(["tmp_path", "lite0_onnx"]), _report())
    assert why and "lite0_onnx" in why and "needs the export extra" in why


def test_other_skips_and_runs_outside_ci_stay_skips(monkeypatch):
    monkeypatch.setenv("TRTC_REQUIRE_REAL", "1")
    assert conftest.real_model_skip(_item(["tmp_path"]), _report()) is None  # no real-model fixture
    assert conftest.real_model_skip(_item(["bikes"], {"gpu"}), _report()) is None  # GPU tests skip on CPU CI
    assert conftest.real_model_skip(_item(["bikes"]), _report(skipped=False)) is None
    monkeypatch.delenv("TRTC_REQUIRE_REAL")
    assert conftest.real_model_skip(_item(["bikes"]), _report()) is None


def test_the_photos_fixture_does_not_turn_errors_into_skips(monkeypatch):
    import pytest

    import toolchain.datasets

    def broken():
        raise OSError("scikit-image data folder unreadable")

    monkeypatch.setattr(toolchain.datasets, "sample_photos", broken)
    with pytest.raises(OSError, match="unreadable"):  # was: pytest.skip(...), i.e. Skipped
        conftest.photos.__wrapped__()
