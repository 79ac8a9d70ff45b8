"""`trtc build`, `trtc inspect` and the plan check, against a RECORDING FAKE of TensorRT (tests/fake_tensorrt.py).

The fake is not TensorRT: these tests check our configuration, profiles, version dispatch, manifest and error
paths, and the sequence and arguments of our calls against TensorRT's documented Python API. Real builds are in
tests/gpu/test_build_gpu.py (TensorRT-RTX on the GPU machine)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from engines.errors import ManifestError
from engines.manifest import read_manifest
from tests import fake_tensorrt
from tests.conftest import needs_export, needs_quant
from toolchain.cli import cli
from toolchain.errors import BuildError, UsageProblem

pytestmark = needs_quant


def run(args):
    return CliRunner().invoke(cli, args)


@pytest.fixture()
def lite0(lite0_onnx, tmp_path):
    for suffix in ("", ".json"):
        shutil.copy(f"{lite0_onnx[0]}{suffix}", tmp_path / f"lite0.onnx{suffix}")
    return tmp_path / "lite0.onnx"


def calls_named(fake, name):
    return [c for c in fake.calls if c[0] == name]


@needs_export
@pytest.mark.parametrize("version,flags", [("10.13.0", 1 << 1), ("11.4.0", 0)])
def test_strongly_typed_network_per_version_and_profile_from_manifest(monkeypatch, lite0, version, flags):
    from toolchain.build import build_engine

    fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make(version), fake_tensorrt.H100)
    report = build_engine(lite0, workspace="2G", opt_level=4)
    # TensorRT 10 opts in to strong typing; 11 is always strongly typed and gets no flag
    assert calls_named(fake, "Builder.create_network") == [("Builder.create_network", flags)]
    assert calls_named(fake, "IOptimizationProfile.set_shape") == [
        ("IOptimizationProfile.set_shape", "input", (1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224))]
    assert ("IBuilderConfig.set_memory_pool_limit", "WORKSPACE", 2 << 30) in fake.calls
    assert ("IBuilderConfig.builder_optimization_level", 4) in fake.calls
    order = [c[0] for c in fake.calls]
    assert order.index("OnnxParser.parse_from_file") < order.index("IBuilderConfig.add_optimization_profile") \
        < order.index("Builder.build_serialized_network")
    plan = lite0.with_name("lite0.plan")
    assert plan.read_bytes() == b"FAKE-PLAN\x00\x01"  # the plan is written untouched
    m = read_manifest(plan)
    assert m.kind == "plan" and m.builder["flavor"] == "tensorrt" and m.builder["version"] == version
    assert m.builder["gpu"] == {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    assert m.builder["cuda"] == "13.0" and m.builder["driver"] == "580.159.04"
    assert m.builder["flags"]["opt_level"] == 4 and m.builder["flags"]["workspace"] == 2 << 30
    assert m.builder["profiles"][0]["input"]["max"] == [32, 3, 224, 224]
    src = read_manifest(lite0)
    assert m.parent["sha256"] == src.artifact["sha256"] and m.preprocess == src.preprocess
    assert m.labels == src.labels and m.batch.max == 32
    assert report.layers["counts"] == {"fp32": 50}  # 49 Conv + 1 Gemm, FP32, from the network (fake: no engine)


@needs_export
def test_batch_override_timing_cache_and_flags(monkeypatch, lite0, tmp_path):
    from toolchain.build import build_engine

    fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), fake_tensorrt.H100)
    cache = tmp_path / "tc.bin"
    build_engine(lite0, tmp_path / "a.plan", batch="2:4:16", timing_cache=cache, version_compatible=True,
                 hardware_compatibility="ampere+")
    assert calls_named(fake, "IOptimizationProfile.set_shape")[0][2:] == \
        ((2, 3, 224, 224), (4, 3, 224, 224), (16, 3, 224, 224))
    assert ("IBuilderConfig.create_timing_cache", b"") in fake.calls and cache.read_bytes().startswith(b"TC:")
    assert ("IBuilderConfig.set_flag", "VERSION_COMPATIBLE") in fake.calls
    hw = [c for c in fake.calls if c[0] == "IBuilderConfig.hardware_compatibility_level"]
    assert hw and hw[0][1].name == "AMPERE_PLUS"
    fake.calls.clear()
    build_engine(lite0, tmp_path / "b.plan", timing_cache=cache)  # the second build loads the saved cache
    assert ("IBuilderConfig.create_timing_cache", cache.read_bytes()) in fake.calls or \
        any(c[0] == "IBuilderConfig.create_timing_cache" and c[1].startswith(b"TC:") for c in fake.calls)


def test_fp16_and_int8_build_quantize_first_and_the_fake_tensorrt_reports_their_layer_precision(monkeypatch, mnist, tmp_path):
    from toolchain.build import build_engine

    model, npz, _, _ = mnist
    shutil.copy(model, tmp_path / "mnist.onnx")
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("11.4.0"), fake_tensorrt.H100)
    r16 = build_engine(tmp_path / "mnist.onnx", precision="fp16")
    assert r16.onnx.endswith("mnist.fp16.onnx") and r16.layers["counts"] == {"fp16": 3}
    r8 = build_engine(tmp_path / "mnist.onnx", precision="int8",
                      quantize={"calib": [str(npz)], "calib_count": 100, "calib_cache": False})
    assert r8.onnx.endswith("mnist.int8.onnx") and r8.layers["counts"] == {"int8": 3}
    m = read_manifest(tmp_path / "mnist.int8.plan")
    assert m.precision["mode"] == "int8" and m.precision["calibration"] == "percentile"
    assert m.parent["file"] == "mnist.int8.onnx" and m.batch.min == m.batch.max == 1
    assert r8.quantize["check"]["samples"] > 0
    assert m.preprocess.channels == 1 and read_manifest(tmp_path / "mnist.fp16.plan").preprocess.channels == 1


def test_an_engine_is_not_called_fp16_when_its_layers_are_not(monkeypatch, mnist, tmp_path):
    from toolchain.build import build_engine

    model, _, _, _ = mnist
    shutil.copy(model, tmp_path / "mnist.onnx")
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("11.4.0", force_dtype="FLOAT"), fake_tensorrt.H100)
    with pytest.raises(BuildError, match=r"not FP16: 3 compute layer\(s\).*Convolution28"):
        build_engine(tmp_path / "mnist.onnx", precision="fp16")
    assert not (tmp_path / "mnist.fp16.plan").exists()


def test_parser_rejection_names_node_and_op(monkeypatch, mnist, tmp_path):
    model, _, _, _ = mnist
    shutil.copy(model, tmp_path / "m.onnx")
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0", unsupported=("MaxPool",)), fake_tensorrt.H100)
    r = run(["build", str(tmp_path / "m.onnx")])
    assert r.exit_code == 1 and "rejected m.onnx" in r.output and "(MaxPool)" in r.output
    assert "No importer registered for op: MaxPool" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_failed_build_says_workspace(monkeypatch, mnist, tmp_path):
    model, _, _, _ = mnist
    shutil.copy(model, tmp_path / "m.onnx")
    fake = fake_tensorrt.make("10.13.0", build_fails_with="Requested amount of GPU memory could not be allocated")
    fake_tensorrt.install(monkeypatch, fake, fake_tensorrt.H100)
    r = run(["build", str(tmp_path / "m.onnx"), "--workspace", "1M"])
    assert r.exit_code == 1 and "could not build the engine" in r.output and "raise --workspace" in r.output
    assert not (tmp_path / "m.plan").exists()


def test_no_gpu_and_no_tensorrt(monkeypatch, mnist, tmp_path):
    model, _, _, _ = mnist
    shutil.copy(model, tmp_path / "m.onnx")
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), None)
    r = run(["build", str(tmp_path / "m.onnx")])
    assert r.exit_code == 1 and "has no NVIDIA GPU" in r.output and "--backend tensorrt-rtx" in r.output
    import sys

    for name in ("tensorrt", "tensorrt_bindings", "tensorrt_rtx", "tensorrt_rtx_bindings"):
        monkeypatch.setitem(sys.modules, name, None)
    r = run(["build", str(tmp_path / "m.onnx")])
    assert r.exit_code == 1 and "neither is installed" in r.output and 'pip install "trtc[rtx]"' in r.output


def test_dynamic_dims_without_a_profile(monkeypatch, tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H", "W"])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "dyn.onnx")
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("11.4.0"), fake_tensorrt.H100)
    r = run(["build", str(tmp_path / "dyn.onnx"), "--batch", "1:2:4"])
    assert r.exit_code == 1 and "dynamic dimension 2" in r.output and "--input-size" in r.output
    r = run(["build", str(tmp_path / "dyn.onnx"), "--batch", "1:2:4", "--input-size", "64"])
    assert r.exit_code == 0, r.output
    r = run(["build", str(tmp_path / "dyn.onnx"), "-o", str(tmp_path / "b.plan"), "--input-size", "64"])
    assert r.exit_code == 1 and "no batch range" in r.output


def test_rtx_compute_capabilities(monkeypatch, mnist, tmp_path):
    from toolchain.build import build_engine

    model, _, _, _ = mnist
    shutil.copy(model, tmp_path / "m.onnx")
    fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("1.7.1.116", rtx=True), fake_tensorrt.H100)
    with pytest.raises(BuildError, match=r"cannot build for this GPU .*9\.0.*SM89"):
        build_engine(tmp_path / "m.onnx")  # CURRENT on an H100: RTX 1.7 has no SM90
    with pytest.raises(UsageProblem, match="no version- or hardware-compatible"):
        build_engine(tmp_path / "m.onnx", version_compatible=True)
    with pytest.raises(UsageProblem, match="cannot build for SM90"):
        build_engine(tmp_path / "m.onnx", compute_capability=["SM90"])
    r = build_engine(tmp_path / "m.onnx", compute_capability=["SM89", "8.6"], timing_cache=tmp_path / "tc")
    assert ("IBuilderConfig.num_compute_capabilities", 2) in fake.calls
    assert ("IBuilderConfig.set_compute_capability", "SM89", 0) in fake.calls
    assert ("IBuilderConfig.set_compute_capability", "SM86", 1) in fake.calls
    assert any("ignores timing caches" in w for w in r.warnings) and not (tmp_path / "tc").exists()
    assert "Runtime.deserialize_cuda_engine" not in [c[0] for c in fake.calls]  # cannot run on 9.0: not inspected
    m = read_manifest(tmp_path / "m.plan")
    assert m.builder["flavor"] == "tensorrt-rtx" and m.builder["compute_capabilities"] == ["SM89", "SM86"]
    assert "does not run on compute capability 9.0" in m.builder["layer_precisions"]["note"]


def test_loading_checks_the_manifest_before_deserializing(monkeypatch, mnist, tmp_path):
    from engines.tensorrt_engine import load_plan
    from toolchain.build import build_engine

    model, _, _, _ = mnist
    shutil.copy(model, tmp_path / "m.onnx")
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), fake_tensorrt.H100)
    build_engine(tmp_path / "m.onnx")
    plan = tmp_path / "m.plan"
    # another TensorRT version here: both versions named, and the rebuild command
    newer = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.14.1"), fake_tensorrt.H100)
    with pytest.raises(ManifestError) as err:
        load_plan(plan)
    assert "built with tensorrt 10.13.0; this machine has tensorrt 10.14.1" in err.value.reason
    assert "trtc build m.onnx -o m.plan --force" in err.value.fix
    assert "Runtime.deserialize_cuda_engine" not in [c[0] for c in newer.calls]
    # another GPU
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), fake_tensorrt.RTX4090)
    with pytest.raises(ManifestError, match=r"compute capability 9\.0 .*H100.*this one is 8\.9"):
        load_plan(plan)
    # the same version and GPU: deserialization is attempted (and the fake's None becomes a clear error)
    same = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), fake_tensorrt.H100)
    with pytest.raises(Exception, match="could not deserialize m.plan: fake: no engine"):
        load_plan(plan)
    assert "Runtime.deserialize_cuda_engine" in [c[0] for c in same.calls]


def test_inspect_plan_and_onnx(monkeypatch, mnist, tmp_path):
    from toolchain.build import build_engine

    model, _, _, _ = mnist
    shutil.copy(model, tmp_path / "m.onnx")
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("1.7.1.116", rtx=True), fake_tensorrt.H100)
    build_engine(tmp_path / "m.onnx", compute_capability=["SM89"])
    r = run(["inspect", str(tmp_path / "m.plan"), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["kind"] == "plan" and info["runs_here"] is False
    assert any("cannot run on compute capability 9.0" in w for w in info["why_not"])
    assert any("built for SM89; this GPU" in w for w in info["why_not"])
    assert "build for this GPU with TensorRT" in info["rebuild"]
    r = run(["inspect", str(tmp_path / "m.plan")])
    assert r.exit_code == 0 and "runs here" in r.output and "no" in r.output
    r = run(["inspect", str(tmp_path / "m.onnx"), "--json"])  # a bare ONNX from elsewhere: what its graph says
    info = json.loads(r.stdout)
    assert r.exit_code == 0 and info["kind"] == "onnx (no manifest)" and info["operators"]["Conv"] == 2
    assert info["inputs"] == [{"name": "Input3", "dtype": "float32", "shape": [1, 1, 28, 28]}]
    r = run(["inspect", str(tmp_path / "m.onnx")])
    assert r.exit_code == 0 and "runs here" in r.output


def test_tensorrt_engine_calls_per_stream_contexts_addresses_and_graphs(monkeypatch, mnist, tmp_path):
    """TensorRTEngine against the recording fake (and a host-memory stand-in for CuPy): the plan's manifest is
    checked, one execution context per CUDA stream, set_input_shape + set_tensor_address with our buffers'
    pointers, execute_async_v3 on the caller's stream; with cuda_graph, one normal run, then capture and replay."""
    from engines import open_engine
    from tests import fake_cupy
    from toolchain.build import build_engine

    model, _, _, _ = mnist
    shutil.copy(model, tmp_path / "m.onnx")
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), fake_tensorrt.H100)
    build_engine(tmp_path / "m.onnx")
    io = [("input", "INPUT", "float32", (-1, 3, 8, 8)), ("logits", "OUTPUT", "float32", (-1, 10))]
    fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0", engine_io=io), fake_tensorrt.H100)
    cp = fake_cupy.install(monkeypatch)
    eng = open_engine(tmp_path / "m.plan", device="cuda:0")
    assert type(eng).__name__ == "TensorRTEngine"
    assert [(s.name, s.dtype, s.shape) for s in eng.inputs] == [("input", "float32", ("batch", 3, 8, 8))]
    x = cp.empty((4, 3, 8, 8))
    s1, s2 = cp.cuda.Stream(), cp.cuda.Stream()
    out = eng.infer(x, stream=s1)[0]
    assert out.shape == (4, 10)
    eng.infer(x, stream=s2)
    eng.infer(x, stream=s1)
    runs = calls_named(fake, "ctx.execute_async_v3")
    assert [(c[1], c[2]) for c in runs] == [(0, s1.ptr), (1, s2.ptr), (0, s1.ptr)]  # a context per stream
    assert len(calls_named(fake, "engine.create_execution_context")) == 2
    addr = {c[2]: c[3] for c in calls_named(fake, "ctx.set_tensor_address")[:2]}
    assert addr == {"input": x.data.ptr, "logits": out.data.ptr}
    assert calls_named(fake, "ctx.set_input_shape")[0][2:] == ("input", (4, 3, 8, 8))
    # wrong dtype and a host batch
    with pytest.raises(UsageProblem, match="float32"):
        eng.infer(cp.empty((4, 3, 8, 8), "float16"))
    host = eng.infer(np.zeros((2, 3, 8, 8), np.float32))[0]
    assert isinstance(host, np.ndarray) and host.shape == (2, 10)
    # CUDA graph: first a normal run (flushes shape changes), then capture once, replay afterwards
    g = open_engine(tmp_path / "m.plan", device="cuda:0", cuda_graph=True)
    before = len(calls_named(fake, "ctx.execute_async_v3"))
    g.infer(x, stream=s1)
    g.infer(x, stream=s1)
    assert len(calls_named(fake, "ctx.execute_async_v3")) - before == 2  # normal + the captured one, not a third
    assert fake_cupy.Graph.launches == [s1.ptr, s1.ptr]
    with pytest.raises(UsageProblem, match="runs on a GPU"):
        open_engine(tmp_path / "m.plan", device="cpu")


def test_inspect_of_an_rtx_plan_built_without_a_gpu(monkeypatch, mnist, tmp_path):
    """Issue 25 item 9: inspect showed 'on None (cc None), CUDA None, driver None' and a rebuild command without
    --compute-capability, which a machine without a GPU refuses (exit 2)."""
    model, _, _, _ = mnist
    shutil.copy(model, tmp_path / "m.onnx")
    fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("1.7.1.116", rtx=True), None)
    r = run(["build", str(tmp_path / "m.onnx"), "--backend", "tensorrt-rtx", "--compute-capability", "SM89",
             "--compute-capability", "SM86"])
    assert r.exit_code == 0, r.output
    shown = run(["inspect", str(tmp_path / "m.plan")])
    assert shown.exit_code == 0, shown.output
    text = " ".join(" ".join(ln.strip("│ ") for ln in shown.output.splitlines()).split())
    assert "None" not in shown.output, shown.output
    assert "tensorrt-rtx 1.7.1.116 without a GPU, for SM89, SM86" in text, shown.output
    rebuild = json.loads(run(["inspect", str(tmp_path / "m.plan"), "--json"]).output)["rebuild"]
    cmd = ("trtc build m.onnx -o m.plan --force --backend tensorrt-rtx --compute-capability SM89 "
           "--compute-capability SM86")
    assert rebuild == f"run it on a machine with an NVIDIA GPU it was built for (SM89, SM86); to build it again: {cmd}"
    # the suggested command works on this same machine (run from the plan's folder, as its relative names say)
    monkeypatch.chdir(tmp_path)
    fake.calls.clear()
    again = run(cmd.split()[1:])
    assert again.exit_code == 0, again.output
    assert ("IBuilderConfig.set_compute_capability", "SM86", 1) in fake.calls
