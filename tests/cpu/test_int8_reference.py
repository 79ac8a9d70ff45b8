"""The integer reference of trtc's INT8 models (engines.int8_reference): what an INT8 engine computes, checked on the
CPU against two routes that share none of its code. PyTorch's float64 convolution of the same integers gives each
quantized layer's exact sum (the reference must equal it, scaled, to one FP16 rounding); ONNX Runtime running the
Q/DQ model as written (dequantize, round to FP16, convolve in floating point) must agree within the bound the
arithmetic gives. Real models and data: the MNIST CNN on its digits, EfficientNet-Lite0 on frames of bikes.mp4."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import needs_export

pytestmark = needs_export

U16 = 2.0 ** -11  # FP16's unit roundoff


def _with_outputs(src, names, dst):
    """``src`` with the tensors ``names`` as extra graph outputs (their types from onnx's shape inference)."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(src)))
    known = {v.name: v for v in [*model.graph.value_info, *model.graph.output]}
    for name in names:
        model.graph.output.append(known[name])
    onnx.save(model, str(dst))
    return dst


def _ort(path, feeds):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _conv_bound(qx, qw, sx, sw, y, pads, k):
    """|ONNX Runtime - integer reference| for one quantized convolution, from the arithmetic: each of the K products
    of dequantized FP16 values carries two FP16 roundings (x and w), the sum at most K roundings of its partial sums
    (FP16 accumulation, the worst a kernel may do), and each side one FP16 rounding of the result."""
    import torch

    terms = torch.nn.functional.conv2d(torch.from_numpy(np.pad(np.abs(qx), pads).astype(np.float64)),
                                       torch.from_numpy(np.abs(qw).astype(np.float64))).numpy()
    scale = (sx * sw).reshape(1, -1, 1, 1)
    return terms * scale * (2 * U16 + k * U16) + 2 * U16 * np.abs(y) + 1e-6


@pytest.fixture(scope="module")
def mnist_int8(mnist, tmp_path_factory):
    """The MNIST CNN quantized to INT8 by trtc (calibrated on 256 of its digits), and the digits."""
    import shutil

    from toolchain.quantize import quantize_onnx

    model, npz, x, labels = mnist
    folder = tmp_path_factory.mktemp("mnist_int8")
    shutil.copy(model, folder / "mnist.onnx")
    quantize_onnx(folder / "mnist.onnx", folder / "mnist.int8.onnx", precision="int8", calib=[str(npz)],
                  calib_count=256, calib_cache=False)
    return folder / "mnist.onnx", folder / "mnist.int8.onnx", x, labels


def test_mnist_layers_sum_exactly_in_integers_and_agree_with_the_qdq_graph_within_the_bound(mnist_int8, tmp_path):
    import onnx
    import torch
    from onnx import numpy_helper

    from engines.int8_reference import Int8Reference

    _, int8, x, _ = mnist_int8
    ref = Int8Reference(int8)
    assert ref.quantized_layers == ["Convolution28", "Convolution110", "Times212"]
    consts = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(int8)).graph.initializer}
    sx, qw, sw = consts["Input3_scale"], consts["Parameter5_int8"], consts["Parameter5_wscale"]
    bias = consts["Convolution28_bias_corrected"].astype(np.float32)
    digits = x[:16]
    got = ref.run({"Input3": digits[:1]}, keep=["Convolution28_Output_0"])[1]
    qx = np.clip(np.rint(digits[:1] / sx), -128, 127).astype(np.float64)  # ONNX QuantizeLinear: round half to even, saturate
    pads = ((0, 0), (0, 0), (2, 2), (2, 2))  # SAME_UPPER, 5x5
    acc = torch.nn.functional.conv2d(torch.from_numpy(np.pad(qx, pads)), torch.from_numpy(qw.astype(np.float64)))
    want = (acc.numpy() * (sx * sw).reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)).astype(np.float16)
    assert got.dtype == np.float16 and got.shape == want.shape == (1, 8, 28, 28)
    ulp = np.abs(want.astype(np.float32)) * 2 * U16 + 1e-6  # the same sum, one FP16 rounding apart at most
    assert np.all(np.abs(got.astype(np.float32) - want.astype(np.float32)) <= ulp)
    # ONNX Runtime running the Q/DQ graph as written: within what its FP16 roundings can add
    extra = _with_outputs(int8, ["Convolution28_Output_0"], tmp_path / "extra.onnx")
    ort_y = _ort(extra, {"Input3": digits[:1]})[1].astype(np.float32)
    bound = _conv_bound(qx, qw, sx, sw, want.astype(np.float32), pads, 25)
    diff = np.abs(ort_y - got.astype(np.float32))
    assert np.all(diff <= bound), f"worst {float((diff - bound).max()):.3g} over the bound"
    assert diff.max() > 0  # the two routes do differ: the check is not comparing a route with itself


def test_mnist_end_to_end_agrees_with_onnx_runtime_and_keeps_its_accuracy(mnist_int8):
    from engines.int8_reference import Int8Reference

    fp32, int8, x, labels = mnist_int8
    ref = Int8Reference(int8)
    n = 300
    ours = np.concatenate([ref.run({"Input3": x[i:i + 1]})[0] for i in range(n)])
    theirs = np.concatenate([_ort(int8, {"Input3": x[i:i + 1]})[0] for i in range(n)])
    floats = np.concatenate([_ort(fp32, {"Input3": x[i:i + 1]})[0] for i in range(n)])
    assert (ours.argmax(1) == theirs.argmax(1)).mean() >= 0.99
    rel = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert rel < 0.02, f"largest logit difference {rel:.3%} of the largest logit"
    acc = lambda out: float((out.argmax(1) == labels[:n]).mean())  # noqa: E731
    assert abs(acc(ours) - acc(floats)) <= 0.01, (acc(ours), acc(floats))


def test_lite0_int8_runs_every_layer_in_integers_and_agrees_with_the_qdq_graph(lite0_int8_plain, bikes):
    """All 50 of plain INT8 Lite0's convolutions and its classifier in integers, on 4 frames of bikes.mp4."""
    from engines.int8_reference import Int8Reference
    from engines.manifest import read_manifest
    from toolchain.precision.calibration import load_data

    model = lite0_int8_plain.output
    ref = Int8Reference(model)
    assert len(ref.quantized_layers) == 50
    x = load_data([str(bikes)], read_manifest(model).preprocess, [1, 3, 224, 224], "input", 4).x
    ours, theirs = ref.run({"input": x})[0].astype(np.float64), _ort(model, {"input": x})[0].astype(np.float64)
    cos = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cos.min() > 0.99, cos
    assert (ours.argmax(1) == theirs.argmax(1)).all()
