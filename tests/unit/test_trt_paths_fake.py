"""TensorRT paths that would break on a real TensorRT (issue 16 items 1-5), against the strict recording fake
(tests/fake_tensorrt.py, itself checked against the real bindings by test_trt_real_bindings.py): version-compatible
plans and the lean runtime, same-cc plans, the inspector's JSON per version, the manifest's strong typing, old
TensorRT refused, and TensorRT's failure returns turned into clear errors."""

from __future__ import annotations

import shutil

import pytest

from engines.errors import EngineError, ManifestError
from engines.manifest import read_manifest
from tests import fake_tensorrt
from tests.conftest import needs_quant
from toolchain.errors import BuildError, UsageProblem

pytestmark = needs_quant
IO = [("input", "INPUT", "float32", (-1, 1, 28, 28)), ("logits", "OUTPUT", "float32", (-1, 10))]


@pytest.fixture()
def model(mnist, tmp_path):
    shutil.copy(mnist[0], tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


def names(fake):
    return [c[0] for c in fake.calls]


def test_a_version_compatible_plan_loads_only_with_host_code_allowed(monkeypatch, model):
    """Item 1: TensorRT refuses a version-compatible plan unless Runtime.engine_host_code_allowed is set."""
    from engines.tensorrt_engine import load_plan
    from toolchain.build import build_engine

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), fake_tensorrt.H100)
    report = build_engine(model, version_compatible=True)
    assert report.flags["version_compatible"] and not report.flags["exclude_lean_runtime"]
    newer = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.14.1", engine_io=IO), fake_tensorrt.H100)
    _, runtime, engine, _ = load_plan(model.with_name("m.plan"))
    assert engine is not None and runtime.engine_host_code_allowed is True
    assert names(newer).index("Runtime.engine_host_code_allowed") < names(newer).index("Runtime.deserialize_cuda_engine")
    # the fake models TensorRT's refusal: without the flag the same plan does not deserialize
    from engines._trt import make_logger

    rt = newer.Runtime(make_logger(newer))
    assert rt.deserialize_cuda_engine(model.with_name("m.plan").read_bytes()) is None


def test_the_post_build_check_allows_host_code_for_a_version_compatible_plan(monkeypatch):
    from engines._trt import make_logger
    from toolchain.build import InspectorUnreadable, engine_precisions

    fake = fake_tensorrt.make("10.13.0", engine_io=IO)
    rt = fake.Runtime(make_logger(fake))
    plan = b"P" + fake_tensorrt._VC_MARK
    with pytest.raises(InspectorUnreadable):  # the fake engine's inspector lists no layer: deserialization got there
        engine_precisions(fake, rt, plan, "10.13.0", version_compatible=True)
    assert ("EngineInspector.get_engine_information", "JSON") in fake.calls
    assert rt.engine_host_code_allowed is True


def test_the_lean_runtime_loads_version_compatible_plans_when_full_tensorrt_is_absent(monkeypatch, model):
    """Issue 13 part 2: an edge box with only tensorrt_lean runs a --version-compatible plan, and says why not
    for any other plan."""
    from engines.tensorrt_engine import load_plan
    from toolchain.build import build_engine

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("11.3.0"), fake_tensorrt.H100)
    build_engine(model, version_compatible=True, exclude_lean_runtime=True, output=model.with_name("vc.plan"))
    build_engine(model, output=model.with_name("plain.plan"))
    assert read_manifest(model.with_name("vc.plan")).builder["flags"]["exclude_lean_runtime"] is True
    lean = fake_tensorrt.runtime_only(fake_tensorrt.make("11.4.0", engine_io=IO))
    fake_tensorrt.install(monkeypatch, lean, fake_tensorrt.H100)
    backend, runtime, engine, _ = load_plan(model.with_name("vc.plan"))
    assert backend.flavor == "tensorrt-lean" and engine is not None and "Runtime.deserialize_cuda_engine" in names(lean)
    from toolchain.inspect_artifact import inspect_artifact

    info = inspect_artifact(model.with_name("vc.plan"))  # trtc inspect: the same runtime choice as load_plan
    assert info["runs_here"] is True and "no EngineInspector binding" in info["layer_precisions"]["error"]
    with pytest.raises(ManifestError, match=r"without --version-compatible; TensorRT lean runtime 11.4.0 "
                                            r"\(tensorrt_lean\) only runs") as err:
        load_plan(model.with_name("plain.plan"))
    assert "trtc build m.onnx -o plain.plan --force --version-compatible" in err.value.fix
    older = fake_tensorrt.runtime_only(fake_tensorrt.make("11.2.0", engine_io=IO))
    fake_tensorrt.install(monkeypatch, older, fake_tensorrt.H100)
    with pytest.raises(ManifestError, match="is older, and only the same or a newer runtime") as err:
        load_plan(model.with_name("vc.plan"))
    # the fix an edge box can follow (issue 29 item 2): a newer lean runtime, or a plan from an older TensorRT
    assert err.value.fix == ("upgrade the lean runtime (pip install tensorrt-lean-cu13-bindings==11.3.0 "
                             "tensorrt-lean-cu13-libs==11.3.0) or build with TensorRT <= 11.2 --version-compatible "
                             "(trtc build m.onnx -o vc.plan --force --backend tensorrt --version-compatible "
                             "--exclude-lean-runtime)"), err.value.fix
    dispatch = fake_tensorrt.runtime_only(fake_tensorrt.make("11.4.0", engine_io=IO), "dispatch")
    fake_tensorrt.install(monkeypatch, dispatch, fake_tensorrt.H100)
    with pytest.raises(ManifestError, match="--exclude-lean-runtime; TensorRT dispatch runtime") as err:
        load_plan(model.with_name("vc.plan"))
    assert err.value.fix == ('install the lean runtime (pip install "trtc[edge]"), or on a machine with TensorRT '
                             "(and the target's GPU): trtc build m.onnx -o vc.plan --force --backend tensorrt "
                             "--version-compatible, then copy the plan and its .json here"), err.value.fix


def test_plan_fixes_on_an_edge_box_never_say_build_here(monkeypatch, model):
    """Issue 29 item 2: with only the lean runtime (no builder) a fix is one the edge box can follow: a valid plan
    without a GPU needs a GPU, not a rebuild; a plan from a newer TensorRT needs a newer lean runtime or an older
    TensorRT; a TensorRT-RTX plan is told what the edge extra runs; another GPU is rebuilt elsewhere."""
    from engines.tensorrt_engine import load_plan
    from toolchain.build import build_engine
    from toolchain.inspect_artifact import inspect_artifact

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("11.4.0.106"), fake_tensorrt.H100)
    build_engine(model, version_compatible=True, output=model.with_name("vc.plan"))
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("11.5.0.1"), fake_tensorrt.H100)
    build_engine(model, version_compatible=True, output=model.with_name("new.plan"))
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("1.7.1.116", rtx=True), fake_tensorrt.RTX4090)
    build_engine(model, backend="tensorrt-rtx", output=model.with_name("rtx.plan"))

    lean = fake_tensorrt.runtime_only(fake_tensorrt.make("11.4.0.106", engine_io=IO))
    fake_tensorrt.install(monkeypatch, lean, None)  # an edge box's lean runtime, and no GPU
    with pytest.raises(ManifestError, match=r"vc.plan cannot run here: no NVIDIA GPU found here \(fix") as err:
        load_plan(model.with_name("vc.plan"))
    assert err.value.fix == ("run it on a machine with an NVIDIA GPU of compute capability 9.0 (it was built on "
                             "NVIDIA H100 80GB HBM3): the plan needs no rebuild"), err.value.fix
    assert inspect_artifact(model.with_name("vc.plan"))["rebuild"] == err.value.fix

    fake_tensorrt.install(monkeypatch, lean, fake_tensorrt.H100)
    with pytest.raises(ManifestError, match=r"built with tensorrt 11.5.0.1; TensorRT lean runtime 11.4.0.106 "
                                            r"\(tensorrt_lean\) is older") as err:
        load_plan(model.with_name("new.plan"))
    assert err.value.fix == ("upgrade the lean runtime (pip install tensorrt-lean-cu13-bindings==11.5.0.1 "
                             "tensorrt-lean-cu13-libs==11.5.0.1) or build with TensorRT <= 11.4 --version-compatible "
                             "(trtc build m.onnx -o new.plan --force --backend tensorrt --version-compatible)")
    with pytest.raises(ManifestError, match=r"built with TensorRT-RTX 1.7.1.116; TensorRT lean runtime 11.4.0.106 "
                                            r"\(tensorrt_lean\) runs only TensorRT version-compatible plans") as err:
        load_plan(model.with_name("rtx.plan"))
    assert err.value.fix.startswith('the edge extra runs only TensorRT version-compatible plans: pip install '
                                    '"trtc[rtx]" to run TensorRT-RTX plans, or on a machine with TensorRT (and the '
                                    "target's GPU): trtc build m.onnx -o rtx.plan --force --backend tensorrt "
                                    "--version-compatible, then copy"), err.value.fix

    fake_tensorrt.install(monkeypatch, lean, fake_tensorrt.RTX4090)  # a valid plan for another GPU
    with pytest.raises(ManifestError, match="compute capability 9.0") as err:
        load_plan(model.with_name("vc.plan"))
    assert err.value.fix == ("on a machine with TensorRT (and the target's GPU): trtc build m.onnx -o vc.plan --force "
                             "--backend tensorrt --version-compatible, then copy the plan and its .json here")
    for fix in (inspect_artifact(model.with_name(p)).get("rebuild") for p in ("vc.plan", "new.plan", "rtx.plan")):
        assert "(on this machine)" not in fix and "to build it again" not in fix, fix


def test_exclude_lean_runtime_needs_version_compatible(monkeypatch, model):
    from toolchain.build import build_engine

    fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("11.4.0"), fake_tensorrt.H100)
    with pytest.raises(UsageProblem, match="only applies to --version-compatible"):
        build_engine(model, exclude_lean_runtime=True)
    build_engine(model, version_compatible=True, exclude_lean_runtime=True)
    assert [c[1] for c in fake.calls if c[0] == "IBuilderConfig.set_flag"] == ["VERSION_COMPATIBLE",
                                                                               "EXCLUDE_LEAN_RUNTIME"]


def test_a_same_cc_plan_does_not_pass_the_load_check_on_another_gpu(monkeypatch, model):
    """Item 3."""
    from engines.tensorrt_engine import load_plan
    from toolchain.build import build_engine

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), fake_tensorrt.H100)
    build_engine(model, hardware_compatibility="same-cc")
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), fake_tensorrt.RTX4090)
    with pytest.raises(ManifestError, match=r"same-compute-capability plan built on 9\.0 .*compute capability 8\.9"):
        load_plan(model.with_name("m.plan"))
    same_cc = dict(fake_tensorrt.H100, name="NVIDIA H200")
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0", engine_io=IO), same_cc)
    assert load_plan(model.with_name("m.plan"))[2] is not None  # another GPU of the same compute capability


# what TensorRT's inspector writes per version (10.x: one "Format/Datatype" string; 11.x: split fields)
INSPECTOR_10 = {"Layers": [
    {"Name": "conv1", "LayerType": "CaskConvolution",
     "Inputs": [{"Name": "x", "Format/Datatype": "Thirty-two wide channel vectorized row major Int8 format"}]},
    {"Name": "conv2", "LayerType": "CaskConvolution",
     "Inputs": [{"Name": "y", "Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}]},
    {"Name": "fc", "LayerType": "CaskGemmMatrixMultiply", "Inputs": [{"Name": "z", "Format/Datatype":
                                                                        "Row major linear FP32"}]},
    {"Name": "relu", "LayerType": "PointWiseV2", "Inputs": [{"Name": "z", "Format/Datatype": "Row major linear FP32"}]},
]}
INSPECTOR_11 = {"Layers": [
    {"Name": "conv1", "LayerType": "CaskConvolution", "Inputs": [{"Name": "x", "Format": "kCHW32", "Datatype": "INT8"}]},
    {"Name": "conv2", "LayerType": "CaskConvolution", "Inputs": [{"Name": "y", "Format": "kHWC8", "Data Type": "Half"}]},
    {"Name": "fc", "LayerType": "gemm", "Inputs": [{"Name": "z", "Format": "kLINEAR", "Datatype": "kFLOAT"}]},
]}


@pytest.mark.parametrize("info", [INSPECTOR_10, INSPECTOR_11], ids=["10.x", "11.x"])
def test_the_inspector_json_of_each_version_is_read(info):
    """Item 2: the old parser read "Format/Datatype" for "Int8"/"Half"/"Float" and left 10.x's "FP16"/"FP32"
    and 11.x's split fields as "?"."""
    from toolchain.build import parse_inspector

    rows = parse_inspector(info, "x")["layers"]
    assert [(r["layer"], r["precision"]) for r in rows] == [("conv1", "int8"), ("conv2", "fp16"), ("fc", "fp32")]


def test_no_precision_read_is_a_failure_never_a_pass():
    from toolchain.build import InspectorUnreadable, parse_inspector

    unknown = {"Layers": [{"Name": "conv1", "LayerType": "CaskConvolution",
                           "Inputs": [{"Name": "x", "Format": "kCHW32", "Precision": "qint8"}]}]}
    with pytest.raises(InspectorUnreadable, match="1 compute layer.*'conv1'.*precision is unverified"):
        parse_inspector(unknown, "11.9")
    with pytest.raises(InspectorUnreadable, match="no compute layer"):
        parse_inspector({"Layers": ["conv1", "fc"]}, "11.9")  # ONELINE-like names only: nothing read


@pytest.mark.parametrize("version,typed", [("10.13.0", True), ("11.4.0", True)])
def test_the_manifest_records_strong_typing_as_the_network_has_it(monkeypatch, model, version, typed):
    """Item 4: read back from the network (10.x), not written as a constant."""
    from toolchain.build import build_engine

    fake = fake_tensorrt.make(version)
    fake_tensorrt.install(monkeypatch, fake, fake_tensorrt.H100)
    assert build_engine(model).flags["strongly_typed"] is typed
    # a 10.x builder that dropped the creation flag: recorded as false, with a warning
    real_create = fake.Builder.create_network
    monkeypatch.setattr(fake.Builder, "create_network", lambda self, flags=0: real_create(self, 0))
    r = build_engine(model, force=True)
    assert r.flags["strongly_typed"] is (version.startswith("11"))
    assert any("not make the network strongly typed" in w for w in r.warnings) is (not version.startswith("11"))


def test_tensorrt_older_than_10_is_refused(monkeypatch, model):
    from engines._trt import load_backend

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("8.6.1"), fake_tensorrt.H100)
    with pytest.raises(UsageProblem, match="TensorRT 8.6.1 .* is too old: trtc needs TensorRT 10"):
        load_backend("auto")


def test_the_fake_is_strict_about_builder_config_attributes():
    """Item 5: a typo on the builder config is an AttributeError (as in pybind11), not a recorded call."""
    fake = fake_tensorrt.make("10.13.0")
    config = fake.Builder(fake.ILogger()).create_builder_config()
    with pytest.raises(AttributeError, match="builder_optimisation_level"):
        config.builder_optimisation_level = 3
    with pytest.raises(AttributeError):  # TensorRT 10/11 builds for the GPU present: RTX-only member
        config.num_compute_capabilities = 1
    with pytest.raises(ValueError, match="unknown failures"):
        fake_tensorrt.make("10.13.0", fail=("execute_async_v4",))


def test_a_rejected_optimization_profile_is_a_build_error(monkeypatch, model):
    from toolchain.build import build_engine

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0", fail=("add_optimization_profile",)),
                          fake_tensorrt.H100)
    with pytest.raises(BuildError, match="rejected the optimization profile"):
        build_engine(model)
    assert not model.with_name("m.plan").exists()


def test_a_timing_cache_from_elsewhere_is_replaced(monkeypatch, model, tmp_path):
    from toolchain.build import build_engine

    cache = tmp_path / "t.cache"
    cache.write_bytes(b"another GPU's cache")
    fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0", fail=("set_timing_cache",)),
                                 fake_tensorrt.H100)
    build_engine(model, timing_cache=cache)
    assert [c[1] for c in fake.calls if c[0] == "IBuilderConfig.set_timing_cache"] == [False, True]


@pytest.mark.parametrize("failure,match", [("set_input_shape", "outside m.plan's profile"),
                                           ("execute_async_v3", "failed to enqueue m.plan"),
                                           ("create_execution_context", "could not create an execution context")])
def test_runtime_failures_are_errors(monkeypatch, model, failure, match):
    from engines import open_engine
    from tests import fake_cupy
    from toolchain.build import build_engine

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), fake_tensorrt.H100)
    build_engine(model)
    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0", engine_io=IO, fail=(failure,)),
                          fake_tensorrt.H100)
    cp = fake_cupy.install(monkeypatch)
    eng = open_engine(model.with_name("m.plan"), device="cuda:0")
    with pytest.raises(EngineError, match=match):
        eng.infer(cp.empty((2, 1, 28, 28)))


def test_the_rtx_runtime_config_path(monkeypatch, model):
    """TensorRT-RTX with cuda_graph: a runtime config with WHOLE_GRAPH_CAPTURE, contexts made from it."""
    from engines import open_engine
    from tests import fake_cupy
    from toolchain.build import build_engine

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("1.7.1.116", rtx=True), fake_tensorrt.RTX4090)
    build_engine(model)
    fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("1.7.1.116", rtx=True, engine_io=IO),
                                 fake_tensorrt.RTX4090)
    cp = fake_cupy.install(monkeypatch)
    eng = open_engine(model.with_name("m.plan"), device="cuda:0", cuda_graph=True)
    eng.infer(cp.empty((2, 1, 28, 28)))
    assert ("IRuntimeConfig.cuda_graph_strategy", "WHOLE_GRAPH_CAPTURE") in fake.calls
    assert names(fake).index("engine.create_runtime_config") < names(fake).index("engine.create_execution_context")
    assert fake_cupy.Graph.launches == []  # RTX captures its own graphs


def _engine(monkeypatch, model, cuda_graph=False):
    from engines import open_engine
    from tests import fake_cupy
    from toolchain.build import build_engine

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0"), fake_tensorrt.H100)
    build_engine(model)
    fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0", engine_io=IO), fake_tensorrt.H100)
    cp = fake_cupy.install(monkeypatch)
    return fake, cp, fake_cupy, open_engine(model.with_name("m.plan"), device="cuda:0", cuda_graph=cuda_graph)


def test_the_cuda_graph_cache_is_bounded(monkeypatch, model):
    """Item 6: graphs are keyed by raw addresses; fresh output buffers every call must not grow the cache forever."""
    fake, cp, fcp, eng = _engine(monkeypatch, model, cuda_graph=True)
    x, s = cp.empty((2, 1, 28, 28)), cp.cuda.Stream()
    kept = [eng.infer(x, stream=s) for _ in range(eng.MAX_GRAPHS + 10)]  # live outputs: a new address each call
    assert len({o[0].data.ptr for o in kept}) == eng.MAX_GRAPHS + 10
    assert len(eng._graphs) == eng.MAX_GRAPHS


def test_returning_to_an_earlier_shape_does_not_replay_a_stale_graph(monkeypatch, model):
    fake, cp, fcp, eng = _engine(monkeypatch, model, cuda_graph=True)
    s = cp.cuda.Stream()
    a, b = cp.empty((2, 1, 28, 28)), cp.empty((4, 1, 28, 28))
    oa, ob = cp.empty((2, 10)), cp.empty((4, 10))
    eng.infer(a, outputs=[oa], stream=s)  # run + capture A
    eng.infer(a, outputs=[oa], stream=s)  # replay A
    assert len(fcp.Graph.launches) == 2
    eng.infer(b, outputs=[ob], stream=s)  # shape change: run + capture B
    runs = len([c for c in fake.calls if c[0] == "ctx.execute_async_v3"])
    eng.infer(a, outputs=[oa], stream=s)  # back to A: TensorRT must re-plan; a normal run and a new capture
    assert len([c for c in fake.calls if c[0] == "ctx.execute_async_v3"]) - runs == 2
    assert [k[1][0][1] for k in eng._graphs] == [(2, 1, 28, 28)]


def test_threads_sharing_a_stream_take_turns_on_its_context(monkeypatch, model):
    """Item 6: two threads on one stream share one context; its use must be serialised."""
    import sys
    import threading

    fake, cp, fcp, eng = _engine(monkeypatch, model)
    s = cp.cuda.Stream()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=lambda: [eng.infer(cp.empty((2, 1, 28, 28)), stream=s)
                                                    for _ in range(200)]) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert len([c for c in fake.calls if c[0] == "ctx.execute_async_v3"]) == 400
    assert not [c for c in fake.calls if c[0] == "ctx.race"]


def test_validate_and_bench_run_a_plan_behind_the_same_parity_gate(monkeypatch, mnist, tmp_path):
    """Item 7: a plan is run (not refused) and judged like any candidate. The fake plan computes with the real
    ONNX on ORT's CPU provider (right answers), then with its classes reversed (wrong answers: must fail)."""
    import json

    from click.testing import CliRunner

    import engines.onnxruntime_engine as oe
    from tests import fake_cupy
    from toolchain.cli import cli

    npz = mnist[1]
    sess, i_name, o_name, io = fake_tensorrt.mnist_plan(monkeypatch, mnist, tmp_path)

    def right(feeds):
        return {o_name: sess.run(None, {i_name: feeds[i_name]})[0]}

    def wrong(feeds):
        return {o_name: right(feeds)[o_name][:, ::-1].copy()}

    cpu_engine = oe.OnnxRuntimeEngine  # the reference runs on ORT's CPU provider (no GPU here)
    monkeypatch.setattr(oe, "OnnxRuntimeEngine", lambda spec, device="cpu", **kw: cpu_engine(spec, device="cpu", **kw))
    args = ["validate", "--reference", str(tmp_path / "m.onnx"), "--candidate", str(tmp_path / "m.plan"),
            "--data", str(npz), "--count", "64", "--device", "cuda:0", "--json", "-"]
    for compute, code in ((right, 0), (wrong, 1)):
        fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make("10.13.0", engine_io=io, compute=compute),
                                     fake_tensorrt.H100)
        fake_cupy.install(monkeypatch)
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == code, r.output
        assert len([c for c in fake.calls if c[0] == "ctx.execute_async_v3"]) == 64  # batch 1, every sample
        c = json.loads(r.stdout[r.stdout.index("{"):])["candidates"][0]
        assert c["kind"] == "plan" and (c["metrics"]["top1_agreement"] == 1.0) is (code == 0)
    r = CliRunner().invoke(cli, ["bench", str(tmp_path / "m.plan"), "--device", "cuda:0", "--batch", "1,8",
                                 "--iterations", "3", "--warmup", "1", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout[r.stdout.index("{"):])["rows"]
    assert [(row["kind"], row["batch"]) for row in rows] == [("plan", 1)]


def test_a_version_compatible_build_says_which_lean_runtime_runs_it(monkeypatch, model):
    """Issue 29 items 3 and 6: `trtc build --version-compatible` records in the manifest which lean runtime will run
    the plan and warns, with the fix, when the edge extra's (EDGE_LEAN_VERSION) is too old; `trtc inspect` shows
    whether a plan is version-compatible and whether its lean runtime was excluded."""
    import json

    from click.testing import CliRunner

    from engines._trt import EDGE_LEAN_VERSION
    from toolchain.build import build_engine
    from toolchain.cli import cli
    from toolchain.inspect_artifact import inspect_artifact

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make(EDGE_LEAN_VERSION), fake_tensorrt.H100)
    report = build_engine(model, version_compatible=True, exclude_lean_runtime=True, output=model.with_name("vc.plan"))
    assert not [w for w in report.warnings if "edge" in w], report.warnings
    lean = read_manifest(model.with_name("vc.plan")).builder["lean_runtime"]
    assert lean == {"needs": f"TensorRT lean runtime {EDGE_LEAN_VERSION} or newer", "min_version": EDGE_LEAN_VERSION,
                    "edge_extra": EDGE_LEAN_VERSION, "edge_extra_runs_it": True}
    plain = build_engine(model, output=model.with_name("plain.plan"))
    assert plain.lean_runtime is None and "lean_runtime" not in read_manifest(model.with_name("plain.plan")).builder

    fake_tensorrt.install(monkeypatch, fake_tensorrt.make("11.5.0.1"), fake_tensorrt.H100)
    report = build_engine(model, version_compatible=True, output=model.with_name("new.plan"))
    assert [w for w in report.warnings if "edge" in w] == [
        f"the edge extra (trtc[edge]) cannot run this plan: its lean runtime {EDGE_LEAN_VERSION} is older than "
        "TensorRT 11.5.0.1 (tensorrt), and only the same or a newer runtime loads a version-compatible plan (fix: on "
        "the edge box, pip install tensorrt-lean-cu13-bindings==11.5.0.1 tensorrt-lean-cu13-libs==11.5.0.1; or build "
        "with TensorRT <= 11.4)"]
    assert report.lean_runtime["edge_extra_runs_it"] is False
    assert read_manifest(model.with_name("new.plan")).builder["lean_runtime"]["needs"] == (
        "TensorRT lean runtime 11.5.0.1 or newer (or the dispatch runtime of that version or newer: the plan carries "
        "its lean runtime)")

    info = {p: inspect_artifact(model.with_name(p)) for p in ("vc.plan", "plain.plan", "new.plan")}
    assert [(i["version_compatible"], i["lean_runtime_excluded"]) for i in info.values()] == [
        (True, True), (False, False), (True, False)]
    assert info["vc.plan"]["runtimes"] == (
        f"version-compatible: TensorRT or its lean runtime {EDGE_LEAN_VERSION} or newer loads it; built with the lean "
        "runtime excluded (--exclude-lean-runtime): the dispatch runtime cannot load it; trtc[edge] (lean runtime "
        f"{EDGE_LEAN_VERSION}) runs it")
    assert info["plain.plan"]["runtimes"].startswith("not version-compatible: only TensorRT 11.4.0.106 loads it")
    assert info["new.plan"]["runtimes"].endswith(f"trtc[edge]'s lean runtime {EDGE_LEAN_VERSION} is older and "
                                                 "cannot run it")
    shown = CliRunner().invoke(cli, ["inspect", str(model.with_name("vc.plan"))], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    text = " ".join(" ".join(ln.strip("│ ") for ln in shown.output.splitlines()).split())
    assert "built with the lean runtime excluded (--exclude-lean-runtime)" in text, shown.output
    as_json = json.loads(CliRunner().invoke(cli, ["inspect", str(model.with_name("vc.plan")), "--json"]).output)
    assert as_json["version_compatible"] is True and as_json["lean_runtime_excluded"] is True
