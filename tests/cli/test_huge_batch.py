"""A --batch too large for the model or the machine is a one-line usage error before anything is allocated or
timed (issue 25, item 5: 'internal error: MemoryError', bench ran 64 over a manifest's largest batch of 32, and
built its input in float64 first)."""

from __future__ import annotations

import json
import shutil
import tracemalloc

import numpy as np
from click.testing import CliRunner

from toolchain.cli import cli


def run(args):
    return CliRunner().invoke(cli, args)


def _errors(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


def test_bench_refuses_a_batch_above_the_manifest_before_timing(lite0_onnx):
    r = run(["bench", str(lite0_onnx[0]), "--batch", "8,64", "--iterations", "1"])
    assert r.exit_code == 2, r.output
    assert _errors(r.output) == ["error: --batch 64 is above the batch range of lite0.onnx, 1..32 (its manifest's "
                                 "1:8:32)"], r.output
    assert "  fix: give --batch sizes from 1 to 32, or export it again with --batch 1:8:64" in r.output
    assert "timing" not in r.output and "p50" not in r.output


def test_bench_times_the_default_sizes_the_model_takes(lite0_onnx, tmp_path):
    model = tmp_path / "lite0.onnx"
    shutil.copyfile(lite0_onnx[0], model)
    m = json.loads(open(f"{lite0_onnx[0]}.json").read())
    m["batch"] = {"min": 1, "opt": 2, "max": 4}  # the manifest's range; the file itself is unchanged (same sha256)
    open(f"{model}.json", "w").write(json.dumps(m))
    r = run(["bench", str(model), "--iterations", "1", "--warmup", "0", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert [row["batch"] for row in rep["rows"]] == [1]
    assert "lite0.onnx takes batches 1..4 (its manifest): 8, 32 not timed" in rep["warnings"]


def test_bench_refuses_a_batch_larger_than_memory(lite0_onnx, tmp_path, monkeypatch):
    bare = tmp_path / "bare.onnx"  # no manifest: no batch range, only the machine limits it
    shutil.copyfile(lite0_onnx[0], bare)
    r = run(["bench", str(bare), "--batch", str(10**8), "--iterations", "1"])  # 60 TB of input
    assert r.exit_code == 2, r.output
    err = _errors(r.output)
    assert len(err) == 1, r.output
    assert err[0].startswith(f"error: --batch {10**8} is too large for this machine: timing bare.onnx at batch "
                             f"{10**8} needs 54.8 TiB for its input alone"), r.output
    assert "MemoryError" not in r.output and "internal error" not in r.output
    # the limit follows the memory this machine has: with 1 GiB available, 1/16 of it holds 111 Lite0 inputs
    import toolchain.resources as res

    monkeypatch.setattr(res, "available_memory", lambda: 2**30)
    r = run(["bench", str(bare), "--batch", "112", "--iterations", "1"])
    assert r.exit_code == 2 and "  fix: give --batch 111 or less" in r.output, r.output


def test_export_refuses_a_batch_larger_than_memory(tmp_path):
    out = tmp_path / "big.onnx"
    r = run(["export", "pretrained:efficientnet-lite0", "-o", str(out), "--batch", str(10**8)])
    assert r.exit_code == 2, r.output
    err = _errors(r.output)
    assert len(err) == 1 and err[0].startswith(f"error: --batch {10**8} is too large for this machine: exporting "
                                               "pretrained:efficientnet-lite0 at batch 100000000 needs "), r.output
    assert f"  fix: --batch 1:8:{10**8} keeps {10**8} as the largest batch but traces and checks at 8" in r.output
    assert list(tmp_path.iterdir()) == []


def test_bench_input_is_made_in_the_model_dtype():
    from toolchain.bench import _random_input

    rng = np.random.default_rng(0)
    tracemalloc.start()
    try:
        x = _random_input(rng, (64, 3, 224, 224), np.float32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert x.dtype == np.float32
    assert peak < 1.2 * x.nbytes  # no float64 copy first (that was 3x the input's size at the peak)
    assert _random_input(rng, (2, 3), np.float16).dtype == np.float16
