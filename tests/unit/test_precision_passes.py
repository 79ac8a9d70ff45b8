"""The FP16 and Q/DQ passes on small hand-built graphs, where every tensor can be checked; the real models are in
tests/cpu/test_quantize_real.py."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from toolchain.errors import QuantizeError, UsageProblem  # noqa: E402
from toolchain.precision import calibration as cal  # noqa: E402
from toolchain.precision import fp16, graph, int8  # noqa: E402


def _model(opset=17):
    """x(N,3,8,8) -> Conv(4) -> Relu -> Resize(x2) -> GlobalAveragePool -> Flatten -> Gemm(5) -> Softmax"""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    fw = numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "fw")
    fb = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "fb")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Resize", ["r", "", "scales"], ["up"], mode="linear", name="resize"),
        helper.make_node("GlobalAveragePool", ["up"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1, name="softmax"),
    ]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 5])],
                          [w, b, fw, fb, scales])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _run(model, x):
    o = ort.SessionOptions()
    o.log_severity_level = 3
    o.add_session_config_entry("session.disable_quant_qdq", "1")
    return ort.InferenceSession(model.SerializeToString(), o).run(None, {"x": x})[0]


X = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)


def test_fp16_keeps_io_fp32_and_the_keep_list_fp32():
    m = _model()
    ref = _run(m, X)
    keep_ops, keep_names = fp16.resolve_keep(m, [])
    res = fp16.convert_fp16(m, keep_ops, keep_names)
    graph.check_model(m, "fp16")
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert m.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    types = {i.name: i.data_type for i in m.graph.initializer}
    assert types["w"] == TensorProto.FLOAT16 and types["fw"] == TensorProto.FLOAT16
    assert types["scales"] == TensorProto.FLOAT  # Resize scales must stay float32
    assert [k["op"] for k in res.kept] == ["Softmax"]
    softmax = next(n for n in m.graph.node if n.op_type == "Softmax")
    producer = next(n for n in m.graph.node if softmax.input[0] in n.output)
    assert producer.op_type == "Cast" and producer.attribute[0].i == TensorProto.FLOAT  # FP32 into the Softmax
    out = _run(m, X)
    assert out.dtype == np.float32 and np.abs(out - ref).max() < 2e-3


def test_keep_fp32_by_node_name_and_unknown_item():
    m = _model()
    keep_ops, keep_names = fp16.resolve_keep(m, ["conv"])
    assert "conv" in keep_names
    fp16.convert_fp16(m, keep_ops, keep_names)
    assert {i.name: i.data_type for i in m.graph.initializer}["w"] == TensorProto.FLOAT
    with pytest.raises(UsageProblem, match="neither an op type nor a node name"):
        fp16.resolve_keep(_model(), ["Convolution"])


def test_weights_beyond_fp16_range_keep_their_node_fp32():
    m = _model()
    big = next(i for i in m.graph.initializer if i.name == "fw")
    big.CopyFrom(numpy_helper.from_array(np.full((5, 4), 1e6, np.float32), "fw"))
    res = fp16.convert_fp16(m, set(), set())
    assert any("exceeds FP16 range" in k["reason"] for k in res.kept)
    assert {i.name: i.data_type for i in m.graph.initializer}["fw"] == TensorProto.FLOAT


def test_qdq_structure_symmetric_per_channel():
    m = graph.upgrade_opset(_model(), 19)
    layers = int8.find_layers(m)
    assert [(layer.op, layer.axis, layer.first, layer.last) for layer in layers] == \
        [("Conv", 0, True, False), ("Gemm", 0, False, True)]
    ranges = {t: 3.0 for t in int8.activation_tensors(layers)}
    res = int8.insert_qdq(m, layers, ranges, exclude={"fc"})
    graph.check_model(m, "int8")
    assert res.quantized == ["conv"] and res.excluded == ["fc"]
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    assert inits["w_int8"].dtype == np.int8 and np.abs(inits["w_int8"]).max() == 127
    assert inits["w_wscale"].shape == (4,) and not np.any(inits["w_wzp"])
    assert inits["x_scale"] == pytest.approx(3.0 / 127) and inits["x_zp"] == 0
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "w_int8")
    assert helper.get_attribute_value(dq.attribute[0]) == 0  # per-channel along the output channels
    assert "w" not in inits  # the FP32 weight is gone: only INT8 + scales are stored
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("QuantizeLinear") == 1  # only the Conv input; the excluded Gemm gets none
    out, ref = _run(m, X), _run(_model(), X)
    assert np.abs(out - ref).max() < 0.05


def test_weight_quantization_error_is_bounded_by_half_a_step():
    w = np.random.default_rng(2).standard_normal((8, 3, 3, 3)).astype(np.float32)
    q, scale = int8.quantize_weight(w, 0)
    err = np.abs(q * scale[:, None, None, None] - w)
    assert np.all(err <= scale[:, None, None, None] / 2 + 1e-7)
    zero_q, zero_s = int8.quantize_weight(np.zeros((2, 2), np.float32), 0)
    assert not zero_q.any() and np.all(zero_s == 1.0)


def test_range_methods_on_known_histograms():
    hist = np.zeros(cal.HIST_BINS, np.int64)
    hist[:1000] = 1000
    hist[2047] = 1  # one outlier at the far end
    assert cal.percentile_amax(hist, 10.0, 99.99) == pytest.approx(1000 * 10.0 / cal.HIST_BINS, rel=0.01)
    # a bell-shaped activation with one far outlier: entropy clips well inside the outlier, beyond the bulk
    v = np.abs(np.random.default_rng(0).standard_normal(200_000))
    v[0] = 20.0
    h, _ = np.histogram(v, bins=cal.HIST_BINS, range=(0, 20.0))
    e = cal.entropy_amax(h, 20.0)
    assert 2.5 < e < 10.0
    assert cal.entropy_amax(np.zeros(cal.HIST_BINS), 0.0) == 0.0


def test_refuses_reduced_models():
    m = graph.upgrade_opset(_model(), 19)
    layers = int8.find_layers(m)
    int8.insert_qdq(m, layers, {t: 1.0 for t in int8.activation_tensors(layers)}, set())
    with pytest.raises(QuantizeError, match="already quantized"):
        graph.refuse_reduced(m, "m.onnx")
    h = _model()
    fp16.convert_fp16(h, set(), set())
    h.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(QuantizeError, match="FP16"):
        graph.refuse_reduced(h, "h.onnx")


def test_constant_folding_finds_reshaped_weights():
    """The MNIST model computes its MatMul weight as Reshape(initializer): folding makes it a weight."""
    w = numpy_helper.from_array(np.ones((2, 3, 4), np.float32), "w3")
    shape = numpy_helper.from_array(np.array([6, 4], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["w3", "shape"], ["w2"]),
             helper.make_node("MatMul", ["x", "w2"], ["y"], name="mm")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w, shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert graph.fold_constants(m) == 1
    (layer,) = int8.find_layers(m)
    assert layer.weight == "w2" and layer.axis == 1 and layer.activations == ["x"]


def test_fp16_scales_are_exact_positive_and_never_clip():
    s = np.array([1e-9, 3e-5, 0.0123456, 0.5, 1 / 127], np.float32)
    h = int8.fp16_scale(s)
    assert np.all(h >= s) and np.all(h >= 2.0 ** -14)
    assert np.array_equal(h.astype(np.float16).astype(np.float32), h)  # stored in FP16 without change
    w = np.random.default_rng(3).standard_normal((6, 4)).astype(np.float32) * np.array([1e-6, 1e-3, 1, 1, 10, 100],
                                                                                       np.float32)[:, None]
    q, scale = int8.quantize_weight(w, 0, fp16_scales=True)
    assert np.all(scale > 0) and np.abs(q).max() <= 127
    assert np.all(np.abs(q * scale[:, None] - w) <= scale[:, None] / 2 + 1e-9)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_bias_shift_is_the_output_change_for_the_mean_input(groups):
    """For an input that is its per-channel mean everywhere, a weight error dw moves each output channel by exactly
    bias_shift (no padding, so every output pixel sees a full window)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 4 // groups, 3, 3)).astype(np.float32)
    dw = (rng.standard_normal(w.shape) * 0.01).astype(np.float32)
    mean = rng.standard_normal(4).astype(np.float32)
    x = np.broadcast_to(mean[None, :, None, None], (1, 4, 6, 6)).astype(np.float32).copy()

    def conv(weights):
        node = helper.make_node("Conv", ["x", "w"], ["y"], group=groups, name="c")
        g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]

    actual = (conv(w + dw) - conv(w)).mean(axis=(0, 2, 3))
    predicted = int8.bias_shift(helper.make_node("Conv", ["x", "w"], ["y"], group=groups), "Conv", dw, mean, onnx)
    assert np.allclose(predicted, actual, atol=1e-5)


def test_bias_correction_is_applied_to_quantized_layers_only():
    m = graph.upgrade_opset(_model(), 19)
    layers = int8.find_layers(m)
    tensors = int8.activation_tensors(layers)
    means = {"x": [0.1, -0.2, 0.3], "f": [0.5, 0.1, 0.0, 0.2]}
    res = int8.insert_qdq(m, layers, {t: 3.0 for t in tensors}, exclude={"fc"}, means=means)
    assert res.bias_corrected == 1
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")
    assert conv.input[2] == "conv_bias_corrected" and gemm.input[2] == "fb"


def test_int8_default_form_qdq_fp32_with_casts_runs_the_same_fused_and_op_by_op():
    """The default INT8 form (issue 13): Q/DQ and scales FP32 at opset 13, Casts to and from the FP16 rest; a
    default ONNX Runtime session (QDQ fusion on) computes what the op-by-op run computes."""
    m = _model(13)
    layers = int8.find_layers(m)
    ranges = {t: 4.0 for t in int8.activation_tensors(layers)}
    int8.insert_qdq(m, layers, ranges, set())
    keep_ops, keep_names = fp16.resolve_keep(m, [])
    fp16.convert_fp16(m, keep_ops | {"QuantizeLinear", "DequantizeLinear"}, keep_names)
    graph.check_model(m, "int8")
    producers = {o: n for n in m.graph.node for o in n.output}
    inits = {i.name: i for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type in ("Conv", "Gemm"):
            for t in n.input[:2]:
                assert producers[t].op_type == "Cast" and producers[producers[t].input[0]].op_type == "DequantizeLinear"
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert inits[n.input[1]].data_type == TensorProto.FLOAT
    default = ort.InferenceSession(m.SerializeToString()).run(None, {"x": X})[0]
    np.testing.assert_allclose(default, _run(m, X), atol=2e-3)


def test_qdq_fusion_rule_and_runtime_warning_follow_the_manifest():
    from engines.manifest import qdq_fusion_ok, runtime_warning

    assert qdq_fusion_ok({"mode": "int8", "high_precision": "fp16", "scales": "fp32"})
    assert not qdq_fusion_ok({"mode": "int8", "high_precision": "fp16", "scales": "fp16"})
    assert not qdq_fusion_ok({"mode": "int8", "high_precision": "fp16"})  # written before `scales` existed
    assert qdq_fusion_ok({"mode": "int8", "high_precision": "fp32"}) and qdq_fusion_ok({"mode": "fp16"})
    assert runtime_warning({"runtimes": ["onnxruntime", "tensorrt"]}, "onnxruntime") is None
    assert runtime_warning({}, "onnxruntime") is None
    w = runtime_warning({"runtimes": ["tensorrt", "tensorrt-rtx"], "target": "tensorrt"}, "onnxruntime")
    assert "--target tensorrt" in w and "op by op" in w
