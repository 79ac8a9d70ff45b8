"""trtc's default INT8 graph form on the GPU machine (issue 13): Q/DQ with FP32 scales, a Cast to FP16 after each
DequantizeLinear and a Cast to FP32 before each QuantizeLinear that reads an FP16 tensor.

- ONNX Runtime's CUDA EP in a *default* session (no trtc session options) agrees with the CPU check.
- TensorRT 10/11 (strongly typed) or TensorRT-RTX fuses DQ -> Cast -> Conv: the quantized convolutions run INT8
  and the rest FP16. Read from the strongly typed network everywhere (what TensorRT must compute), and from the
  built engine's inspector where this TensorRT can deserialize the plan here (TensorRT-RTX 1.7 cannot on compute
  capability 9.0: that test then skips and says so)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.conftest import needs_export
from tests.gpu.test_precision_gpu import _check_data
from toolchain.parity import compare

pytestmark = [needs_export, pytest.mark.slow]


def _backend() -> str:
    if any(importlib.util.find_spec(m) for m in ("tensorrt", "tensorrt_bindings")):
        return "tensorrt"
    if any(importlib.util.find_spec(m) for m in ("tensorrt_rtx", "tensorrt_rtx_bindings")):
        return "tensorrt-rtx"
    pytest.skip("needs TensorRT 10/11 or TensorRT-RTX (pip install \"trtc[rtx]\")")


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["fp16", "int8"])
def test_cuda_ep_default_session_agrees(which, lite0_fp16, lite0_int8, lite0_onnx, photos, bikes):
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("ONNX Runtime here has no CUDA execution provider")
    report = lite0_fp16 if which == "fp16" else lite0_int8
    x = _check_data(report, photos, bikes)
    ref = ort.InferenceSession(str(lite0_onnx[0]), providers=["CPUExecutionProvider"])
    plain = ort.InferenceSession(str(report.output), providers=["CUDAExecutionProvider"])
    assert plain.get_providers()[0] == "CUDAExecutionProvider"

    def run(s):
        name = s.get_inputs()[0].name
        return np.concatenate([s.run(None, {name: x[i:i + 16]})[0] for i in range(0, len(x), 16)])

    p = compare(run(ref), run(plain))
    cpu = report.check
    print(f"\n{which}: default CUDA EP session top-1 {p.top1_agreement:.2%} vs the CPU check "
          f"{cpu['top1_agreement']:.2%} on {len(x)} samples; cosine {p.cosine:.5f}")
    assert abs(p.top1_agreement - cpu["top1_agreement"]) <= 2.0 / len(x) + 1e-9
    assert p.cosine > (0.9999 if which == "fp16" else 0.99)


@pytest.mark.gpu
@pytest.mark.tensorrt
def test_int8_plan_has_the_onnx_int8_layer_count_and_no_fp32_compute_layer(lite0_int8, tmp_path):
    """Parse + build (RTX: ahead of time for SM89); the network's compute layers by type."""
    from toolchain.build import build_engine

    backend = _backend()
    kw = {"compute_capability": ["SM89"]} if backend == "tensorrt-rtx" else {}
    r = build_engine(lite0_int8.output, tmp_path / "lite0.int8.plan", backend=backend, **kw)
    counts = r.layers["counts"]
    print(f"\n{r.backend}: compute layers {counts} ({r.layers['source']}; {r.layers.get('note')})")
    assert counts.get("int8") == lite0_int8.layers["int8"]
    assert counts.get("int8", 0) + counts.get("fp16", 0) == lite0_int8.layers["total"]  # no FP32 compute layer


@pytest.mark.gpu
@pytest.mark.tensorrt
def test_int8_engine_inspector_shows_int8_convs_fp16_rest(lite0_int8, tmp_path):
    """The built engine's own layer information: what TensorRT fused and in which precision it runs."""
    from toolchain.build import build_engine
    from toolchain.errors import BuildError

    backend = _backend()
    try:
        r = build_engine(lite0_int8.output, tmp_path / "lite0.int8.plan", backend=backend)
    except BuildError as exc:
        if "cannot build for this GPU" in str(exc):
            pytest.skip(f"{exc}: the engine inspector needs a GPU {backend} runs on")
        raise
    if r.layers["source"] != "engine inspector":
        pytest.skip(f"engine not inspected here: {r.layers.get('note')}")
    counts = r.layers["counts"]
    print(f"\n{r.backend}: engine inspector compute layers {counts}")
    assert counts.get("int8") == lite0_int8.layers["int8"]
    assert counts.get("fp32", 0) == 0 and counts.get("?", 0) == 0
