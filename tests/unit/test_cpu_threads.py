"""TRTC_CPU_THREADS: the CPU threads of every ONNX Runtime session trtc opens (a shared machine, a CPU quota)."""

from __future__ import annotations

import pytest

from engines.errors import UsageProblem

ort = pytest.importorskip("onnxruntime")


def test_the_variable_sets_each_sessions_threads_and_an_explicit_count_wins(monkeypatch):
    from engines.ort_session import session_options

    monkeypatch.delenv("TRTC_CPU_THREADS", raising=False)
    assert session_options(ort).intra_op_num_threads == 0  # ONNX Runtime's own default: one per core
    monkeypatch.setenv("TRTC_CPU_THREADS", "3")
    assert session_options(ort).intra_op_num_threads == 3
    assert session_options(ort, threads=5).intra_op_num_threads == 5


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_value_that_is_not_a_count_is_refused_with_the_fix(monkeypatch, value):
    from engines.ort_session import session_options

    monkeypatch.setenv("TRTC_CPU_THREADS", value)
    with pytest.raises(UsageProblem, match=r"TRTC_CPU_THREADS=.* is not a number of threads") as err:
        session_options(ort)
    assert "whole number of 1 or more" in err.value.fix
