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


def test_require_gpu_turns_gpu_skips_into_failures(monkeypatch):
    """Issue 32: with TRTC_REQUIRE_GPU=1 (the GPU runs in docs/VERIFIED.md) a GPU test that skips fails, so a broken gpu
    extra cannot turn the GPU suite into a row of skips; skips for hardware or packages outside the extra stay."""
    monkeypatch.delenv("TRTC_REQUIRE_REAL", raising=False)
    monkeypatch.setenv("TRTC_REQUIRE_GPU", "1")
    gpu = _item(["bikes"], {"gpu"})
    why = conftest.gpu_skip(gpu, _report(reason="needs the gpu extra (cupy, PyNvVideoCodec) and PyAV"))
    assert why and "TRTC_REQUIRE_GPU=1" in why and "cupy" in why
    assert conftest.gpu_skip(gpu, _report(reason="needs an NVIDIA GPU (run on the GPU machine)"))
    assert conftest.gpu_skip(gpu, _report(reason="needs two NVIDIA GPUs")) is None
    assert conftest.gpu_skip(_item([], {"gpu", "tensorrt"}), _report(reason="no TensorRT")) is None
    assert conftest.gpu_skip(gpu, _report(skipped=False)) is None
    assert conftest.gpu_skip(_item(["bikes"]), _report()) is None  # not a GPU test
    monkeypatch.delenv("TRTC_REQUIRE_GPU")
    assert conftest.gpu_skip(gpu, _report()) is None


def test_require_gpu_fails_a_real_run_without_a_gpu(tmp_path):
    """End to end: a GPU-marked test, collected on this machine (no GPU: skipped) with TRTC_REQUIRE_GPU=1, fails."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "tests").mkdir()
    shutil.copy(root / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "test_g.py").write_text(
        "import pytest\n\n@pytest.mark.gpu\ndef test_g():\n    pytest.skip('needs the gpu extra (cupy)')\n")
    env = {**os.environ, "TRTC_REQUIRE_GPU": "1", "PYTHONPATH": str(root)}
    env.pop("TRTC_REQUIRE_REAL", None)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "markers=gpu: gpu",
            "--rootdir", str(tmp_path), str(tmp_path / "tests" / "test_g.py")]
    r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "TRTC_REQUIRE_GPU=1" in r.stdout, r.stdout
    env.pop("TRTC_REQUIRE_GPU")
    r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout
