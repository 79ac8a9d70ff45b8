"""The job row (toolchain.bench_job): fresh processes of `trtc run` and of classify() on the real Lite0 and the 250
frames of bikes.mp4, each prediction line stamped as it arrives."""

from __future__ import annotations

import json

import pytest

from tests.conftest import needs_export


@needs_export
def test_a_job_row_times_first_and_last_result_of_both_ways(lite0_onnx, bikes, tmp_path):
    from toolchain.bench_job import main

    out = tmp_path / "job.json"
    assert main([str(bikes), "--model", str(lite0_onnx[0]), "--device", "cpu", "--runs", "1", "--json",
                 str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["way"] for r in rows] == ["run", "classify"]
    for r in rows:
        assert r["predictions"] == 250 and len(r["each"]) == 1
        # lines come as the batches do (the child writes unbuffered), not all at its exit
        assert 0 < r["first_s"] < r["last_s"] - 0.1 and r["last_s"] <= r["exit_s"]


def test_a_failing_job_is_one_error_with_its_reason(tmp_path, capsys):
    from toolchain.bench_job import job_rows, main

    missing = tmp_path / "none.onnx"
    assert main([str(tmp_path / "clip.mp4"), "--model", str(missing), "--runs", "1", "--way", "classify"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: classify: clip.mp4 with none.onnx failed (exit 1)") and "model not found" in err
    from toolchain.errors import UsageProblem

    with pytest.raises(UsageProblem, match="at least 1"):
        job_rows("clip.mp4", [str(missing)], "cpu", runs=0)
