"""The quick session's copy of the real EfficientNet-Lite0 (FP32 export and trtc's FP16 copy), its 16 depthwise
convolutions as multiply-adds (engines._quick_model), against the model itself under ONNX Runtime's CPU EP, on the
real photos and frames of bikes.mp4: the copy is what the first batches of `trtc run` are answered with on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from engines.manifest import read_manifest
from tests.conftest import needs_export

pytestmark = needs_export


def _data(model, photos, bikes):
    import onnxruntime as ort

    from toolchain.precision.calibration import load_data

    inp = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).get_inputs()[0]
    spec = read_manifest(model).preprocess
    return load_data([*map(str, photos), str(bikes)], spec, [1, 3, 224, 224], inp.name, 40).x


def _depthwise_count(path) -> int:
    """Conv nodes whose weights are [C, 1, k, k] with group C, counted with onnx alone."""
    import onnx
    from onnx import helper

    m = onnx.load(str(path))
    dims = {t.name: list(t.dims) for t in m.graph.initializer}
    n = 0
    for node in m.graph.node:
        if node.op_type == "Conv":
            group = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "group"), 1)
            w = dims.get(node.input[1])
            n += bool(w and group > 1 and w[1] == 1 and group == w[0])
    return n


@pytest.mark.parametrize("which", ["fp32", "fp16"])
def test_the_quick_copy_of_lite0_answers_as_lite0(which, lite0_onnx, lite0_fp16, photos, bikes):
    import onnxruntime as ort

    from engines._quick_model import depthwise_as_taps

    model = lite0_onnx[0] if which == "fp32" else lite0_fp16.output
    assert _depthwise_count(model) == 16
    copy = depthwise_as_taps(model)
    assert copy is not None and b"trtc_taps15_" in copy and b"trtc_taps16_" not in copy
    x = _data(model, photos, bikes)
    assert len(x) >= 40
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(copy, providers=["CPUExecutionProvider"])
    name = want.get_inputs()[0].name
    a = want.run(None, {name: x})[0].astype(np.float32)
    b = got.run(None, {name: x})[0].astype(np.float32)
    diff = float(np.abs(a - b).max())
    print(f"\nLite0 {which}: quick copy vs model on {len(x)} real inputs: max|d| {diff:.3g}, "
          f"top-1 {np.mean(a.argmax(1) == b.argmax(1)):.0%}")
    assert (a.argmax(1) == b.argmax(1)).all()
    # FP32: the same sums in another order; FP16: the copy's depthwise sums run in FP32, the model's in FP16 kernels
    assert diff < (1e-3 if which == "fp32" else 2e-2) * max(1.0, float(np.abs(a).max()))


def test_a_model_without_depthwise_convolutions_gets_no_copy(resnet18_onnx, lite0_onnx):
    """ResNet-18's convolutions all carry group=1: the quick session opens the file itself."""
    from engines._quick_model import depthwise_as_taps

    assert depthwise_as_taps(resnet18_onnx[0]) is None and depthwise_as_taps(lite0_onnx[0]) is not None


def test_a_quantized_graph_gets_no_float_rewrite(lite0_int8, lite0_fp16):
    """INT8 Lite0 (Q/DQ, accuracy-aware: some convolutions kept in FP16 read their weights through DequantizeLinear
    and Cast): neither the quick copy nor ONNX Runtime's NHWC layout and conv-bias fusion, which are made for float
    graphs; FP16 Lite0 gets all three. The float test reads the file's bytes, without onnx."""
    from engines._quick_model import depthwise_as_taps
    from engines.manifest import is_float_graph
    from engines.onnxruntime_engine import TUNED_CUDA_OPTIONS, tuned_cuda_options

    assert not is_float_graph(lite0_int8.output) and is_float_graph(lite0_fp16.output)
    assert depthwise_as_taps(lite0_int8.output) is None
    assert depthwise_as_taps(lite0_fp16.output) is not None
    assert tuned_cuda_options(lite0_int8.output) == {"cudnn_conv_algo_search": "HEURISTIC"}
    assert tuned_cuda_options(lite0_fp16.output) == TUNED_CUDA_OPTIONS
    # the manifest's precision mode decides without a scan; a file without one is scanned
    assert tuned_cuda_options(lite0_fp16.output, {"mode": "int8"}) == tuned_cuda_options(lite0_int8.output)
    assert tuned_cuda_options(lite0_int8.output, {"mode": "fp16"}) == TUNED_CUDA_OPTIONS
