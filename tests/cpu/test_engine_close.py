"""Closing an ONNX Runtime engine while another thread runs it (a service reloading its cameras does this): the
session goes when that run ends, the run's answer is whole, and the closed engine refuses later batches. Bad
expect() arguments are refused before any session or worker exists. Real EfficientNet-Lite0 on the CPU EP."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.conftest import needs_export

pytestmark = needs_export


def test_a_close_during_a_run_lets_the_session_go_when_the_run_ends(lite0_onnx):
    from engines import EngineError
    from engines.onnxruntime_engine import OnnxRuntimeEngine

    engine = OnnxRuntimeEngine(lite0_onnx[0], threads=1)
    x = np.random.default_rng(0).standard_normal((16, 3, 224, 224)).astype(np.float32)
    want = engine.infer(x[:2])[0]
    got = []
    runner = threading.Thread(target=lambda: got.append(engine.infer(x)[0]))
    runner.start()
    deadline = time.monotonic() + 30
    while engine._lock.acquire(blocking=False):  # wait until the run holds the session's lock
        engine._lock.release()
        assert time.monotonic() < deadline and runner.is_alive(), "the run never took the lock"
        time.sleep(0.005)
    engine.close()  # cannot take the lock: the run has it
    assert engine.session is not None  # still running on it
    runner.join(60)
    assert got and got[0].shape == (16, 1000)
    np.testing.assert_allclose(got[0][:2], want, atol=1e-4)  # the run's answer is whole
    assert engine.session is None  # let go by the run that held it
    with pytest.raises(EngineError, match="this engine is closed"):
        engine.infer(x[:1])


@pytest.mark.parametrize("said", [{"form": "gpu"}, {"batch": 0}, {"batch": [8, "x"]}, {"batch": "8"}])
def test_bad_expected_shapes_are_refused_before_a_session_is_made(lite0_onnx, monkeypatch, said):
    import onnxruntime as ort

    from engines import UsageProblem
    from engines.onnxruntime_engine import OnnxRuntimeEngine

    def no_session(*args, **kwargs):
        raise AssertionError("a session was made before the arguments were checked")

    monkeypatch.setattr(ort, "InferenceSession", no_session)
    with pytest.raises(UsageProblem):
        OnnxRuntimeEngine(lite0_onnx[0], **said)
