"""FP16 and INT8 Lite0 on the GPU machine: ONNX Runtime's CUDA EP gives the same agreement as the CPU check, and
TensorRT (or TensorRT-RTX) parses and builds both graphs (which shows it accepts our FP16 casts and Q/DQ).
TensorRT-RTX 1.7 cannot *run* engines on compute capability 9.0 (H100/H200): it builds ahead of time for SM89
here, and nothing is executed with it."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from engines.manifest import read_manifest
from tests.conftest import needs_export
from toolchain.parity import compare

pytestmark = [needs_export, pytest.mark.slow]


def _trt():
    for name in ("tensorrt", "tensorrt_bindings", "tensorrt_rtx", "tensorrt_rtx_bindings"):
        try:
            return importlib.import_module(name), name
        except ImportError:
            continue
    pytest.skip("needs TensorRT or TensorRT-RTX (pip install \"trtc[rtx]\")")


def _check_data(report, photos, bikes):
    """The samples quantize checked on, rebuilt the way quantize_onnx chose them."""
    from toolchain.precision import calibration as cal

    m = read_manifest(report.output)
    dims = [1, 3, *m.preprocess.size]
    if report.precision == "fp16":
        d = cal.load_data([*map(str, photos), str(bikes)], m.preprocess, dims, "input", want=256, seed=1)
        return d.x
    pool = cal.load_data([str(bikes)], m.preprocess, dims, "input", want=64 + 256, seed=0)
    _, held = cal.split(pool, 64, 0)
    return held.subset(range(1, len(held), 2)).x


def _logits(engine, x):
    return np.concatenate([engine.infer(x[i:i + 16])[0] for i in range(0, len(x), 16)])


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["fp16", "int8"])
def test_cuda_ep_agreement_matches_cpu(which, lite0_fp16, lite0_int8, lite0_onnx, photos, bikes):
    from engines.onnxruntime_engine import OnnxRuntimeEngine

    report = lite0_fp16 if which == "fp16" else lite0_int8
    x = _check_data(report, photos, bikes)
    assert len(x) == report.check["samples"]
    ref = _logits(OnnxRuntimeEngine(lite0_onnx[0], device="cpu"), x)
    cuda = OnnxRuntimeEngine(report.output, device="cuda:0")
    assert cuda.session.get_providers()[0] == "CUDAExecutionProvider"
    p = compare(ref, _logits(cuda, x))
    cpu = report.check
    print(f"\n{which}: CUDA EP top-1 {p.top1_agreement:.2%} (decisive {p.decisive_agreement:.2%}) vs CPU "
          f"{cpu['top1_agreement']:.2%} (decisive {cpu['decisive_agreement']:.2%}) on {len(x)} samples; "
          f"cosine {p.cosine:.5f}")
    # the same agreement within two samples' worth (near-ties may fall either way on other kernels)
    assert abs(p.top1_agreement - cpu["top1_agreement"]) <= 2.0 / len(x) + 1e-9
    assert p.cosine > (0.9999 if which == "fp16" else 0.99)


@pytest.mark.tensorrt
@pytest.mark.parametrize("which", ["fp32", "fp16", "int8"])
def test_tensorrt_parses_and_builds(which, lite0_fp16, lite0_int8, lite0_onnx):
    trt, module = _trt()
    path = {"fp32": lite0_onnx[0], "fp16": lite0_fp16.output, "int8": lite0_int8.output}[which]
    log = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(log)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED") and "rtx" not in module:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, log)
    ok = parser.parse_from_file(str(path))
    errors = [parser.get_error(i).desc() for i in range(parser.num_errors)]
    assert ok, errors
    config = builder.create_builder_config()
    if "rtx" in module:  # RTX has no SM90 target: build ahead of time for Ada (SM89); nothing runs here
        config.num_compute_capabilities = 1
        config.set_compute_capability(trt.ComputeCapability.SM89, 0)
    profile = builder.create_optimization_profile()
    name = network.get_input(0).name
    profile.set_shape(name, (1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None and plan.nbytes > 1_000_000
    types = {network.get_layer(i).type.name for i in range(network.num_layers)}
    print(f"\n{module} {trt.__version__}: {which} parsed ({network.num_layers} layers; {sorted(types)[:8]}...) and "
          f"built a {plan.nbytes / 1e6:.1f} MB plan")
    if which == "int8":
        assert "QUANTIZE" in types and "DEQUANTIZE" in types
