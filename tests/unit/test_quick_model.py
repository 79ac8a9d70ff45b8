"""The quick session's copy of a model (engines._quick_model): each depthwise convolution rewritten as shifted
multiply-adds must compute what ONNX Runtime's own Conv computes, for strides, dilations, asymmetric pads, 5x5 and
3x5 kernels, with and without bias, FP32 and FP16; anything else is left as it was."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from engines._quick_model import depthwise_as_taps, rewrite_depthwise  # noqa: E402
from engines.manifest import is_float_graph  # noqa: E402

RNG = np.random.default_rng(7)


def _model(c, kernel, strides, dilations, pads, bias, dtype, group=None, w_in=1, auto_pad=None, opset=17):
    """x (2, c*w_in... ) -> Conv -> Relu; the weights [c, w_in, kh, kw] are initializers."""
    tp = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    group = c if group is None else group
    cin = w_in * group
    w = RNG.standard_normal((c, w_in, *kernel)).astype(dtype)
    inits, inputs = [numpy_helper.from_array(w, "w")], ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(c).astype(dtype), "b"))
        inputs.append("b")
    attrs = dict(group=group, strides=strides, dilations=dilations, kernel_shape=list(kernel))
    attrs.update(pads=pads) if auto_pad is None else attrs.update(auto_pad=auto_pad)
    nodes = [helper.make_node("Conv", inputs, ["y"], **attrs), helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", tp, [2, cin, 19, 23])],
                              [helper.make_tensor_value_info("z", tp, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model_or_bytes, x):
    data = model_or_bytes if isinstance(model_or_bytes, bytes) else model_or_bytes.SerializeToString()
    s = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0].astype(np.float32)


CASES = [  # channels, kernel, strides, dilations, pads (top, left, bottom, right), bias
    (8, (3, 3), [1, 1], [1, 1], [1, 1, 1, 1], True),
    (8, (3, 3), [2, 2], [1, 1], [1, 1, 1, 1], False),
    (6, (5, 5), [2, 1], [1, 1], [2, 1, 3, 2], True),
    (4, (3, 5), [1, 2], [2, 1], [0, 2, 1, 0], True),
    (5, (5, 5), [2, 2], [1, 1], [2, 2, 2, 2], False),
    (3, (1, 1), [1, 1], [1, 1], [0, 0, 0, 0], True),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES)
def test_a_depthwise_convolution_as_taps_computes_what_ort_s_conv_does(case, dtype):
    model = _model(*case, dtype)
    x = RNG.standard_normal((2, case[0], 19, 23)).astype(dtype)
    want = _run(model, x)
    assert rewrite_depthwise(model) == 1
    assert "Conv" not in {n.op_type for n in model.graph.node}
    got = _run(model, x)
    assert got.shape == want.shape
    # FP32: the same sums in another order; FP16: the copy sums in FP32 and rounds once at the end
    tol = 1e-5 if dtype == np.float32 else 2e-2
    assert np.abs(got - want).max() <= tol * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("kind", ["dense", "grouped", "auto_pad", "weights from a node"])
def test_other_convolutions_are_left_as_they_are(kind):
    if kind == "dense":
        model = _model(4, (3, 3), [1, 1], [1, 1], [1, 1, 1, 1], True, np.float32, group=1, w_in=4)
    elif kind == "grouped":  # two input channels a group: not depthwise
        model = _model(4, (3, 3), [1, 1], [1, 1], [1, 1, 1, 1], True, np.float32, group=2, w_in=2)
    elif kind == "auto_pad":
        model = _model(4, (3, 3), [1, 1], [1, 1], None, False, np.float32, auto_pad="SAME_UPPER")
    else:
        model = _model(4, (3, 3), [1, 1], [1, 1], [1, 1, 1, 1], False, np.float32)
        w = model.graph.initializer[0]
        w.name = "w0"
        model.graph.node.insert(0, helper.make_node("Identity", ["w0"], ["w"]))
    before = model.SerializeToString()
    assert rewrite_depthwise(model) == 0
    assert model.SerializeToString() == before


def test_the_copy_is_made_only_where_there_is_a_depthwise_convolution(tmp_path):
    depthwise = _model(8, (3, 3), [1, 1], [1, 1], [1, 1, 1, 1], True, np.float32)
    dense = _model(4, (3, 3), [1, 1], [1, 1], [1, 1, 1, 1], True, np.float32, group=1, w_in=4)
    for name, model in (("dw.onnx", depthwise), ("dense.onnx", dense)):
        onnx.save(model, tmp_path / name)
    (tmp_path / "cut.onnx").write_bytes((tmp_path / "dw.onnx").read_bytes()[:40])
    assert depthwise_as_taps(tmp_path / "cut.onnx") is None  # unreadable: the file itself
    assert depthwise_as_taps(tmp_path / "dense.onnx") is None  # nothing to rewrite
    out = depthwise_as_taps(tmp_path / "dw.onnx")
    x = RNG.standard_normal((2, 8, 19, 23)).astype(np.float32)
    assert np.abs(_run(out, x) - _run(depthwise, x)).max() < 1e-5


def test_external_data_and_a_quantized_graph_are_left_alone(tmp_path):
    """Weights in external data are out of reach; a Q/DQ graph is the quantizer's (and no float graph)."""
    model = _model(8, (3, 3), [1, 1], [1, 1], [1, 1, 1, 1], True, np.float32)
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    assert depthwise_as_taps(tmp_path / "ext.onnx") is None
    scale = numpy_helper.from_array(np.float32(0.1), "s")
    model.graph.initializer.append(scale)
    model.graph.node.insert(0, helper.make_node("QuantizeLinear", ["x", "s"], ["xq"]))
    model.graph.node.insert(1, helper.make_node("DequantizeLinear", ["xq", "s"], ["xd"]))
    model.graph.node[2].input[0] = "xd"
    onnx.save(model, tmp_path / "q.onnx")
    assert depthwise_as_taps(tmp_path / "q.onnx") is None and not is_float_graph(tmp_path / "q.onnx")
    assert is_float_graph(tmp_path / "ext.onnx") and not is_float_graph(tmp_path / "missing.onnx")


def test_an_opset_below_11_is_left_alone(tmp_path):
    path = tmp_path / "old.onnx"
    onnx.save(_model(8, (3, 3), [1, 1], [1, 1], [1, 1, 1, 1], True, np.float32, opset=10), path)
    assert depthwise_as_taps(path) is None
