"""`trtc bench` on real models (a few iterations: this checks the report, not the speed)."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from tests.conftest import needs_quant
from toolchain.cli import cli

pytestmark = needs_quant


def run(args):
    return CliRunner().invoke(cli, args)


def test_bench_side_by_side_json(mnist, tmp_path):
    from toolchain.quantize import quantize_onnx

    model, npz, _, _ = mnist
    shutil.copy(model, tmp_path / "mnist.onnx")
    quantize_onnx(tmp_path / "mnist.onnx", precision="fp16", check=[str(npz)], check_count=16)
    r = run(["bench", str(tmp_path / "mnist.onnx"), str(tmp_path / "mnist.fp16.onnx"), "--batch", "1,8",
             "--iterations", "5", "--warmup", "1", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    rows = rep["rows"]
    assert [(row["precision"], row["batch"]) for row in rows] == [("fp32", 1), ("fp16", 1)]  # fixed batch of 1
    # speedup is defined as throughput / the first model's throughput at the same batch: exactly that, not just > 0
    assert rows[0]["speedup"] == 1.0
    assert rows[1]["speedup"] == pytest.approx(rows[1]["throughput"] / rows[0]["throughput"], rel=1e-12)
    for row in rows:
        assert row["iterations"] == 5 and 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert abs(row["throughput"] - 1000.0 / row["mean_ms"]) < 1e-6 * row["throughput"]
    assert rep["transfers"] == "none (CPU)" and rep["cuda_graphs"].startswith("off")
    assert any("fixed batch of 1" in w for w in rep["warnings"])
    r = run(["bench", str(tmp_path / "mnist.onnx"), "--batch", "1", "--iterations", "2"])
    assert r.exit_code == 0 and "p50 ms" in r.output and "mnist.onnx" in r.output


def test_bench_bad_input(tmp_path):
    r = run(["bench", str(tmp_path / "none.onnx")])
    assert r.exit_code == 2 and "model not found" in r.output
    r = run(["bench", "x.onnx", "--batch", "0,2"])
    assert r.exit_code == 2 and "at least 1" in r.output
