"""`trtc bench` on real models (a few iterations: this checks the report, not the speed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import needs_quant
from toolchain.cli import cli

pytestmark = needs_quant
ROOT = Path(__file__).resolve().parents[2]


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
    import onnxruntime

    assert rep["versions"]["onnxruntime"] == onnxruntime.__version__  # the module that ran, not a package's metadata
    # in a fresh process an ONNX Runtime bench imports no torch, so it names no torch version (installed or not)
    out = subprocess.run([sys.executable, "-m", "toolchain", "bench", str(tmp_path / "mnist.onnx"), "--batch", "1",
                          "--iterations", "2", "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["versions"] == {"onnxruntime": onnxruntime.__version__}
    assert any("fixed batch of 1" in w for w in rep["warnings"])
    r = run(["bench", str(tmp_path / "mnist.onnx"), "--batch", "1", "--iterations", "2"])
    assert r.exit_code == 0 and "p50 ms" in r.output and "mnist.onnx" in r.output


def test_bench_bad_input(tmp_path):
    r = run(["bench", str(tmp_path / "none.onnx")])
    assert r.exit_code == 2 and "model not found" in r.output
    r = run(["bench", "x.onnx", "--batch", "0,2"])
    assert r.exit_code == 2 and "at least 1" in r.output


def test_ort_tuning_both_opens_each_onnx_model_twice_with_its_tuning(mnist, tmp_path, monkeypatch):
    """--ort-tuning both: a row per tuning, the options going to engines.open_engine for ONNX Runtime models only
    (the recorder stands in for the engine's `tuning` option and opens the real model without it)."""
    import engines

    real, seen = engines.open_engine, []

    def open_engine(path, device="cpu", **options):
        seen.append((str(path), options))
        return real(path, device=device)

    monkeypatch.setattr(engines, "open_engine", open_engine)
    shutil.copy(mnist[0], tmp_path / "mnist.onnx")
    model = str(tmp_path / "mnist.onnx")
    r = run(["bench", model, f"opencv:{model}", "--batch", "1", "--iterations", "3", "--warmup", "1",
             "--ort-tuning", "both", "--json"])
    assert r.exit_code == 0, r.output
    # tuned is the engine's default tuning (none passed); untuned passes tuning="off"; timed rows never quick-start
    assert [(p, o) for p, o in seen if p == model] == [(model, {"quick_start": False}),
                                                       (model, {"tuning": "off", "quick_start": False})]
    assert [o for p, o in seen if p != model] == [{}]  # OpenCV dnn: no tuning keyword
    rows = json.loads(r.stdout)["rows"]
    assert [row["backend"] for row in rows] == ["onnxruntime", "onnxruntime (untuned)", "opencv"]
    assert rows[0]["vs_untuned"] == round(rows[0]["throughput"] / rows[1]["throughput"], 3)
    assert all(row["img_s"] == round(row["throughput"], 1) and row["input"] == "host" for row in rows)
    seen.clear()
    r = run(["bench", model, "--batch", "1", "--iterations", "2", "--ort-tuning", "off", "--json"])
    assert r.exit_code == 0 and seen == [(model, {"tuning": "off", "quick_start": False})], r.output
    assert [row["backend"] for row in json.loads(r.stdout)["rows"]] == ["onnxruntime (untuned)"]


def test_reference_row_on_the_cpu_from_the_manifests_source(lite0_onnx, mnist, tmp_path):
    """--reference torch-eager on the CPU (torch.compile is for the GPU run): the PyTorch model of the manifest's
    source, timed in the same run; each engine row's ratio divides by the reference row of its batch. A foreign ONNX
    (no manifest) gets one warning and no row."""
    shutil.copy(mnist[0], tmp_path / "mnist.onnx")
    r = run(["bench", str(lite0_onnx[0]), str(tmp_path / "mnist.onnx"), "--batch", "1", "--iterations", "3",
             "--warmup", "1", "--reference", "torch-eager", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    lite0, ref, mn = rep["rows"]  # each model's reference row follows its rows
    assert ref["role"] == "reference" and ref["backend"] == "torch eager" and ref["precision"] == "fp32"
    assert ref["model"] == lite0["reference"] == "pretrained:efficientnet-lite0 (fp32)" and ref["batch"] == 1
    assert ref["ratio_to_reference"] == 1.0 and ref["input"] == "host" and rep["reference"] == "torch-eager"
    assert ref["layout"] == "NHWC" and lite0["layout"] == "NCHW"  # the reference runs channels_last, as a user does
    assert lite0["ratio_to_reference"] == round(lite0["throughput"] / ref["throughput"], 3) > 0
    assert mn["reference"] is None and mn["ratio_to_reference"] is None
    assert [w for w in rep["warnings"] if "reference row" in w] == [
        "no torch eager reference row for mnist.onnx: it has no trtc manifest (export it from a PyTorch source, or "
        f"put its torch.export program at {tmp_path / 'mnist.pt2'})"]
    r = run(["bench", str(lite0_onnx[0]), "--batch", "1", "--iterations", "2", "--reference", "torch-eager"])
    assert r.exit_code == 0 and "vs ref" in r.output and "torch eager" in r.output, r.output


def test_device_input_refusals(mnist):
    r = run(["bench", str(mnist[0]), "--input", "device"])
    assert r.exit_code == 2 and "--device cpu is not a GPU" in r.output and "fix: give --device cuda:0" in r.output
    assert len([line for line in r.output.splitlines() if line.startswith("error:")]) == 1


def test_bench_video_on_the_cpu_has_engine_only_the_limit_and_time_to_first_result(lite0_onnx, bikes, tmp_path):
    """`trtc bench VIDEO --device cpu` with the real Lite0 and 40 frames of bikes.mp4: the engine-only row ran the
    trtc run's batches (as many, the same frames), trtc's row names the lower ceiling and divides by it, and the
    time to first result was measured in two fresh processes."""
    from tests.clips import encode_clip

    clip = encode_clip(bikes, tmp_path / "short.mp4", "libx264", (320, 136), frames=40)
    r = run(["bench", str(clip), "--model", str(lite0_onnx[0]), "--device", "cpu", "--streams", "2", "--batch", "8",
             "--repeat", "1", "--latency-frames", "0", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    dec, ours, only = rep["rows"]
    assert dec["pipeline"].startswith("decode-only (PyAV") and dec["frames"] == 80
    assert ours["pipeline"].startswith("trtc (PyAV") and ours["frames"] == 80
    assert only["pipeline"].startswith("engine-only (bs 8, host numpy input") and only["frames"] == 80
    assert only["batches"] == ours["batches"] >= 10  # 80 frames in batches of at most 8
    assert ours["limited_by"] == ("decode" if dec["fps"] <= only["fps"] else "engine")
    assert ours["vs_limit"] == round(ours["fps"] / min(dec["fps"], only["fps"]), 3)
    assert ours["vs_decode"] == round(ours["fps"] / dec["fps"], 3)
    first = rep["first_result"]
    assert first["batch"] == 8 and first["device"] == "cpu" and len(first["runs"]) == 2
    for one in first["runs"]:
        assert 0 < one["import_s"] < 60 and 0 < one["open_s"] < one["first_result_s"] < 120
    assert any("no usual pipeline on the CPU" in w for w in rep["warnings"])


def test_bench_video_with_a_baseline_runs_it_in_the_same_runs(lite0_onnx, lite0_fp16, bikes, tmp_path):
    """`trtc bench VIDEO --model lite0.onnx --baseline lite0.fp16.onnx` on the CPU, 2 interleaved runs: the
    baseline's trtc and engine-only rows follow the model's, on the same frames, and the model's trtc row divides
    by the baseline's ("vs baseline", also in the table); a baseline that cannot take the batch is refused naming
    it."""
    from tests.clips import encode_clip

    clip = encode_clip(bikes, tmp_path / "short.mp4", "libx264", (320, 136), frames=24)
    args = ["bench", str(clip), "--model", str(lite0_onnx[0]), "--device", "cpu", "--streams", "2", "--batch", "8",
            "--latency-frames", "0", "--no-first-result"]
    r = run([*args, "--repeat", "2", "--baseline", str(lite0_fp16.output), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["baseline"] == {"model": str(lite0_fp16.output), "tuning": "auto"}
    dec, ours, only, base, base_only = rep["rows"]
    assert ours["pipeline"] == "trtc (PyAV + numpy + engine, bs 8)"
    assert base["pipeline"] == "trtc (PyAV + numpy + engine, bs 8, baseline lite0.fp16.onnx)"
    assert base_only["pipeline"].startswith("engine-only (bs 8, host numpy input, no decode, baseline lite0.fp16")
    assert ours["frames"] == base["frames"] == only["frames"] == base_only["frames"] == 48
    # each row is its own median run (engine-only rows are ceilings: the faster middle run), so a row's batch count
    # is that run's: 48 frames in batches of at most 8, partial ones as the wait allowed
    assert 6 <= base["batches"] <= 48 and 6 <= base_only["batches"] <= 48
    for row in (dec, ours, base):
        assert len(row["fps_runs"]) == 2  # interleaved: each pipeline ran in both runs
    assert ours["vs_baseline"] == round(ours["fps"] / base["fps"], 3)
    assert base["vs_baseline"] is None and base["vs_decode"] == round(base["fps"] / dec["fps"], 3)
    # the table's words for the baseline, from one run (the two runs' interleaving is checked above)
    r = run([*args, "--repeat", "1", "--baseline", str(lite0_fp16.output), "--baseline-tuning", "off"])
    assert r.exit_code == 0, r.output
    assert "vs baseline" in r.output and "lite0.fp16.onnx (ONNX Runtime tuning off) in the same runs" in r.output
    assert "baseline lite0.fp16.onnx, onnxruntime untuned" in r.output
    small = tmp_path / "small" / "lite0.onnx"  # the same model, its manifest saying batches of at most 4
    small.parent.mkdir()
    shutil.copy(lite0_onnx[0], small)
    doc = json.loads(Path(f"{lite0_onnx[0]}.json").read_text())
    doc["batch"] = {"min": 1, "opt": 4, "max": 4}
    Path(f"{small}.json").write_text(json.dumps(doc))
    r = run([*args, "--repeat", "1", "--baseline", str(small)])
    assert r.exit_code == 2, r.output
    assert "error: the baseline lite0.onnx: --batch 8 is above the model's largest batch (4)" in r.output
    assert "fix: use --batch 4 or less, or a --baseline that takes it" in r.output
