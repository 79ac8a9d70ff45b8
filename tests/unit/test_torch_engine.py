"""The compiled PyTorch engine's parts that need no real model: the compile cache (keys, files, corrupt or
mismatched ones ignored), the FP16 keep-list's mapping to aten operators and the graph pass, INT8 and a missing
torch refused with their fixes, and importing it without loading torch."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import threading

import pytest

from engines import torch_engine as te
from engines.errors import MissingDependency, UsageProblem

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch (the torch or export extra)")
SHA = "ab" * 32


def _key(**kw):
    args = dict(device="H100-sm90", torch_version="2.11.0+cu130", batch=64, precision="fp16", layout="nchw",
                dtype="float16", model_sha=SHA, math="tf32c1m0")
    args.update(kw)
    return te.cache_key(**args)


def test_cache_key_names_everything_the_compiled_code_depends_on():
    key = _key()
    assert key.startswith("H100-sm90-torch2.11.0-cu130-py")
    assert "-tf32c1m0-b64-fp16-nchw-float16-" + SHA[:12] in key
    others = [_key(batch=32), _key(precision="fp32"), _key(device="H200-sm90"), _key(torch_version="2.12.0"),
              _key(layout="nhwc"), _key(dtype="float32"), _key(model_sha="cd" * 32), _key(math="tf32c0m0"),
              _key(math="tf32c1m1")]
    assert len({key, *others}) == 1 + len(others), "two different compilations would share a cache file"
    assert "/" not in _key(device="A/B c") and " " not in _key(device="A/B c")


def test_cache_file_round_trip_and_what_is_ignored(tmp_path, caplog):
    key, payload = _key(), b"\x00compiled\xffbytes"
    written = te.write_cache([tmp_path / "m.pt2.inductor"], key, payload)
    assert written == tmp_path / "m.pt2.inductor" / f"{key}.bin"
    assert te.read_cache(written, key) == payload
    assert te.read_cache(tmp_path / "nothing.bin", key) is None  # missing: silently none
    with caplog.at_level(logging.INFO, logger="trtc"):
        assert te.read_cache(written, _key(batch=8)) is None  # another key's file (a renamed or copied one)
        assert "not" in caplog.text and "b8" in caplog.text
        caplog.clear()
        written.write_bytes(written.read_bytes()[:-3])  # cut short
        assert te.read_cache(written, key) is None
        assert "ignored the compile cache" in caplog.text
        written.write_bytes(b"garbage")
        assert te.read_cache(written, key) is None
        written.write_bytes(te.CACHE_MAGIC + b"{not json\n" + payload)
        assert te.read_cache(written, key) is None


def test_cache_falls_back_to_the_next_folder(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the model's cache folder would go")
    fallback = tmp_path / "user-cache"
    with caplog.at_level(logging.INFO, logger="trtc"):
        written = te.write_cache([blocked / "m.pt2.inductor", fallback], _key(), b"x")
    assert written == fallback / f"{_key()}.bin"
    assert "cannot keep the compile cache" in caplog.text
    with caplog.at_level(logging.WARNING, logger="trtc"):
        assert te.write_cache([blocked / "a", blocked / "b"], _key(), b"x") is None
    assert "compiles again" in caplog.text


def test_cache_dirs_beside_the_model_then_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    dirs = te.cache_dirs(tmp_path / "m.pt2", SHA)
    assert dirs == [tmp_path / "m.pt2.inductor", tmp_path / "xdg" / "trtc" / "inductor" / SHA[:16]]


def test_int8_is_refused_with_the_runtimes_that_run_it():
    with pytest.raises(UsageProblem) as e:
        te.check_precision("int8")
    assert "TensorRT or ONNX Runtime" in e.value.reason
    assert "trtc quantize MODEL.onnx --precision int8" in e.value.fix
    with pytest.raises(UsageProblem):
        te.check_precision("bf16")
    assert te.check_precision(None) == "fp32" and te.check_precision("FP16") == "fp16"


def test_int8_refused_before_torch_is_needed(tmp_path, monkeypatch):
    """open_engine(..., precision="int8") says what to do even where torch is missing."""
    import engines

    model = tmp_path / "m.pt2"
    model.write_bytes(b"not opened")
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(UsageProblem, match="INT8 needs TensorRT or ONNX Runtime"):
        engines.open_engine(model, precision="int8")


def test_missing_torch_names_the_extra(tmp_path, monkeypatch):
    import engines

    model = tmp_path / "m.pt2"
    model.write_bytes(b"not opened")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(MissingDependency) as e:
        engines.open_engine(model)
    assert e.value.fix == 'pip install "trtc[torch]"'
    assert "compiled PyTorch engine" in e.value.reason


def test_prefix_on_a_file_that_is_not_a_program(tmp_path):
    import engines

    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"x")
    with pytest.raises(UsageProblem, match=r"torch-fp16: runs torch.export programs \(.pt2\), not m.onnx"):
        engines.open_engine(f"torch-fp16:{onnx}")
    assert engines.split_engine(f"torch-fp16:{onnx}") == ("torch-fp16", str(onnx), {"precision": "fp16"})


def test_keep_list_maps_every_onnx_op_of_trtc_quantize():
    """Every op type on trtc quantize's FP16 keep-list has its aten operators here (a new one added there must be
    mapped here too)."""
    from toolchain.precision.fp16 import DEFAULT_KEEP_FP32

    assert set(DEFAULT_KEEP_FP32) <= set(te.KEEP_FP32_ATEN)
    ops = te.keep_fp32_ops()
    assert {"softmax", "_softmax", "log_softmax", "layer_norm", "native_layer_norm", "group_norm", "sum", "exp",
            "pow", "topk", "cumsum"} <= ops
    assert not ops & {"conv2d", "convolution", "linear", "addmm", "relu", "hardtanh", "batch_norm", "mean",
                      "adaptive_avg_pool2d", "add"}
    assert te.keep_fp32_ops(["Softmax"]) == {"softmax", "_softmax", "_safe_softmax"}


def _tiny_program(batch=4):
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.norm = torch.nn.LayerNorm(8)
            self.fc = torch.nn.Linear(8, 5)

        def forward(self, x):
            y = self.fc(self.norm(torch.relu(self.conv(x)).mean((2, 3))))
            return y + torch.softmax(y, -1)

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(batch, 3, 8, 8)
    return net, x, torch.export.export(net, (x,))


@needs_torch
def test_fp16_graph_keeps_the_listed_operators_in_fp32():
    import torch

    net, x, program = _tiny_program()
    with torch.no_grad():
        ref = net(x)  # before the pass: the program's module shares the model's parameters, which it casts
    gm = program.module()
    kept = te.fp16_graph(gm)
    assert any("layer_norm" in k for k in kept) and any("softmax" in k for k in kept), kept
    for node in gm.graph.nodes:
        if node.op == "call_function" and te._op_name(node) in ("softmax", "_softmax", "layer_norm"):
            ups = [a for a in node.all_input_nodes if a.target is torch.ops.aten._to_copy.default]
            assert ups and all(a.kwargs["dtype"] is torch.float32 for a in ups), node.format_node()
            assert all(u.kwargs.get("dtype") is torch.float16 for u in node.users), node.format_node()
    assert all(p.dtype is torch.float16 for p in gm.parameters())
    with torch.no_grad():
        got = gm(x.half()).float()
    assert float((ref - got).abs().max()) < 2e-2  # FP16 arithmetic on logits of magnitude ~1


def test_layouts():
    assert te._layout((2, 3, 4, 5), (60, 20, 5, 1)) == "nchw"
    assert te._layout((2, 3, 4, 5), (60, 1, 15, 3)) == "nhwc"
    assert te._layout((1, 3, 4, 5), (999, 20, 5, 1)) == "nchw"  # a batch of one: its stride does not matter
    with pytest.raises(UsageProblem, match="neither NCHW nor channels_last"):
        te._layout((2, 3, 4, 5), (60, 20, 1, 4))


def test_importing_the_engine_loads_no_torch():
    code = "import sys, engines, engines.torch_engine; print([m for m in ('torch', 'cupy') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_quantize_refuses_a_program_with_the_way_to_each_precision(tmp_path):
    from click.testing import CliRunner

    from toolchain.cli import cli

    pt2 = tmp_path / "m.pt2"
    pt2.write_bytes(b"x")
    r = CliRunner().invoke(cli, ["quantize", str(pt2), "--precision", "int8", "--calib", "random"])
    assert r.exit_code == 2 and "INT8 needs TensorRT or ONNX Runtime" in r.output
    assert "trtc quantize m.onnx --precision int8" in r.output
    r = CliRunner().invoke(cli, ["quantize", str(pt2), "--precision", "fp16"])
    assert r.exit_code == 2 and "torch-fp16:m.pt2" in r.output


def test_program_key_names_what_the_plain_copy_depends_on():
    key = te.program_key("2.11.0+cu130", "fp16", SHA)
    assert key.startswith("program-torch2.11.0-cu130-py") and key.endswith("-fp16-" + SHA[:12])
    others = [te.program_key("2.12.0", "fp16", SHA), te.program_key("2.11.0+cu130", "fp32", SHA),
              te.program_key("2.11.0+cu130", "fp16", "cd" * 32)]
    assert len({key, *others}) == 4 and not any(k == _key() for k in (key, *others))


@needs_torch
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_plain_program_round_trip_computes_the_same(tmp_path, precision):
    """The program's plain copy (code and tensors) written as a cache file and read back builds a module that computes
    exactly what the program's module does, FP16 casts included; a damaged file is ignored."""
    import torch

    _, x, program = _tiny_program()
    gm = program.module()
    kept = te.fp16_graph(gm) if precision == "fp16" else []
    x = x.half() if precision == "fp16" else x
    with torch.no_grad():
        ref = gm(x)
    plain = te.plain_program(gm, kept)
    assert plain is not None and plain["kept"] == kept
    key = te.program_key(torch.__version__, precision, SHA)
    written = te.write_cache([tmp_path], key, te.plain_bytes(plain), suffix=".program")
    back = te.read_plain(written, key)
    dtype = torch.float16 if precision == "fp16" else torch.float32
    model = te._model_class(torch)(te.module_from_plain(back), dtype)
    with torch.no_grad():
        got = model(x)
    assert got.dtype is torch.float32 and torch.equal(got, ref.float())
    assert type(model.gm).__module__ == "engines.torch_program"  # found again by name when a saved function loads
    assert getattr(sys.modules["engines.torch_program"], type(model.gm).__name__) is type(model.gm)
    assert te.read_plain(written, te.program_key(torch.__version__, "fp32" if precision == "fp16" else "fp16",
                                                 SHA)) is None  # another precision's key
    raw = written.read_bytes()
    written.write_bytes(raw[:-40] + b"\x00" * 40)  # same length, damaged bytes
    assert te.read_plain(written, key) is None


class _Cudnn:
    benchmark = False


def _fake_torch():
    import types

    return types.SimpleNamespace(backends=types.SimpleNamespace(cudnn=_Cudnn()))


@pytest.mark.parametrize("callers", [False, True])
def test_cudnn_benchmark_is_on_only_inside_and_the_callers_setting_comes_back(callers):
    torch = _fake_torch()
    cudnn = torch.backends.cudnn
    cudnn.benchmark = callers
    with te.cudnn_benchmark_on(torch):
        assert cudnn.benchmark is True
        with te.cudnn_benchmark_on(torch):  # nested (another engine warming up meanwhile)
            assert cudnn.benchmark is True
        assert cudnn.benchmark is True, "the inner block ended the outer one's benchmark mode"
    assert cudnn.benchmark is callers
    with pytest.raises(RuntimeError):
        with te.cudnn_benchmark_on(torch):
            raise RuntimeError("capture failed")
    assert cudnn.benchmark is callers
    with te.cudnn_benchmark_on(torch, enabled=False):
        assert cudnn.benchmark is callers


def test_cudnn_benchmark_blocks_in_two_threads_restore_once_both_end():
    import threading

    torch = _fake_torch()
    cudnn = torch.backends.cudnn
    cudnn.benchmark = False
    entered, release = threading.Barrier(2), threading.Event()
    seen = []

    def warm_up():
        with te.cudnn_benchmark_on(torch):
            entered.wait()
            release.wait()
            seen.append(cudnn.benchmark)

    a = threading.Thread(target=warm_up, daemon=True)
    a.start()
    try:
        with te.cudnn_benchmark_on(torch):
            entered.wait(timeout=30)
        during = cudnn.benchmark
    finally:
        release.set()
        a.join(timeout=30)
    assert during is True, "the first block to end turned benchmark mode off under the other"
    assert seen == [True] and cudnn.benchmark is False


def test_cudnn_benchmark_is_off_unless_asked():
    """The engine leaves cuDNN's benchmark mode off by default: on an H100 it ran ResNet-50 FP16 slower than
    PyTorch's heuristics (docs/TORCH.md) and cost seconds at each start."""
    import inspect

    assert inspect.signature(te.TorchEngine).parameters["cudnn_benchmark"].default is False


def test_the_load_at_open_takes_the_newest_whole_function_of_this_model_gpu_torch_and_precision(tmp_path, monkeypatch):
    """_start_preload: of the precompiled functions beside the model, the most recently used one for this GPU, torch
    and precision (any batch size or layout), skipping a damaged newer one; nothing of another model, precision or
    GPU index; nothing where the engine does not warm beside the load. The loader is not run here (no torch)."""
    import os
    import types

    started = []
    monkeypatch.setattr(te._PrecompiledLoader, "start", lambda self: started.append(self))
    fake_torch = types.SimpleNamespace(__version__="2.11.0+cu130",
                                       compiler=types.SimpleNamespace(load_compiled_function=None),
                                       backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(allow_tf32=True),
                                                                      cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(
                                                                          allow_tf32=False))))
    model = tmp_path / "m.pt2"
    folder = te.cache_dirs(model, SHA)[0]
    eng = object.__new__(te.CompiledProgram)
    eng.path, eng._sha, eng.precision, eng.device_id = model, SHA, "fp16", None
    eng.warm_beside_load = eng.compile = eng.cache = eng.precompile = True
    eng._go = threading.Event()  # quick start: the load waits for the first eager batch
    label = te.device_label(None)

    def preload():
        """The key whose load _start_preload began (None: none began)."""
        eng._loaders, started[:] = {}, []
        eng._start_preload(fake_torch)
        assert list(eng._loaders.values()) == started and len(started) <= 1
        return started[0].key if started else None

    def kept(age: int, **kw):
        args = dict(device=label, torch_version=fake_torch.__version__, batch=64, precision="fp16", layout="nhwc",
                    dtype="float16", model_sha=SHA, math="tf32c1m0")
        args.update(kw)
        key = te.cache_key(**args)
        path = te.write_cache([folder], key, f"function {key}".encode(), suffix=".aot")
        os.utime(path, (1_000_000 - age, 1_000_000 - age))
        return key, path

    assert preload() is None  # nothing kept yet
    b32, _ = kept(30, batch=32)
    b64, _ = kept(20)
    kept(10, precision="fp32")  # newer, but another precision
    kept(5, model_sha="cd" * 32)  # another model
    kept(1, batch=8, torch_version="2.12.0")  # another torch
    kept(3, math="tf32c0m0")  # newer, but compiled under other TF32 settings
    other_gpu = te.write_cache([folder], te.cache_key(label, fake_torch.__version__, 16, "fp16", "nhwc", "float16",
                                                      SHA, "tf32c1m0"), b"x", suffix=".cuda1.aot")  # another GPU index's
    os.utime(other_gpu, (2_000_000, 2_000_000))
    assert preload() == b64
    (loader,) = started
    assert [p.name for p, _ in loader.payloads] == [f"{b64}.aot"]
    assert loader.payloads[0][1] == f"function {b64}".encode()
    assert not loader.daemon  # the interpreter waits for a load in progress before it finalises
    assert loader.go is eng._go
    _, damaged = kept(0, batch=16)  # the newest, but cut short: the next newest whole one is taken
    damaged.write_bytes(damaged.read_bytes()[:-4])
    assert preload() == b64
    os.utime(folder / f"{b32}.aot", (1_500_000, 1_500_000))  # batch 32 used last
    assert preload() == b32
    eng.warm_beside_load = False
    assert preload() is None


def test_timed_and_compared_opens_of_a_program_ask_for_no_quick_start(tmp_path, monkeypatch):
    """trtc bench VIDEO's timed engine and trtc validate's (and trtc bench's engine rows, which share validate's
    Runner) open a program without the quick start, so no batch they time or compare runs eagerly; ONNX models
    keep their own options."""
    import engines
    from toolchain import bench_video, validate

    assert bench_video.program_options("torch-fp16:m.pt2") == {"quick_start": False}
    assert bench_video.program_options(str(tmp_path / "m.pt2")) == {"quick_start": False}
    assert bench_video.program_options(str(tmp_path / "m.onnx")) == {}
    opened = []

    class Opened:
        inputs = [engines.TensorSpec("x", "float32", (None, 3, 8, 8))]
        batch_range = (1, 8)

    monkeypatch.setattr(engines, "open_engine", lambda spec, **kw: opened.append(kw) or Opened())
    ref = validate.ModelRef(str(tmp_path / "m.pt2"), "torch", "fp32", None)
    validate.Runner(ref, "cuda:0")
    assert opened == [{"device": "cuda:0", "quick_start": False}]


class _Graph:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def replay(self):
        self.log.append(("replay", self.name))


class _Input:
    """What TorchEngine._forward reads of a CUDA tensor: shape, strides, dtype and its address."""

    def __init__(self, ptr, n=4):
        self.ptr, self.shape, self.dtype = ptr, (n, 3, 8, 8), "torch.float16"

    def stride(self):
        return (3 * 64, 64, 8, 1)

    def data_ptr(self):
        return self.ptr


class _StaticIn:
    def __init__(self, log):
        self.log = log

    def copy_(self, x):
        self.log.append(("copy", x.ptr))


def _routing_engine(log, slots: int = 0, loading=None):
    """A TorchEngine with no GPU behind it: one batch-4 run whose slots, copying graph and function are fakes, the
    engine's own thread a recorder of what is sent there, and captures recorded with the thread they ran on."""
    import threading

    eng = te.TorchEngine.__new__(te.TorchEngine)
    eng.cuda_graph = True
    run = te._Run(lambda x: log.append(("fn", x.ptr)) or "eager", _StaticIn(log), _Graph("copying", log), "copied",
                  loading=loading)
    for i in range(slots):
        run.slots[1000 + i] = (_Graph(f"slot{1000 + i}", log), f"out{1000 + i}")
    eng._runs = {(4, "torch.float16", "nchw"): run}
    eng._run_for = lambda xt, layout: run

    def capture(fn, xt):
        log.append(("capture", xt.ptr, threading.current_thread().name))
        return _Graph(f"slot{xt.ptr}", log), f"out{xt.ptr}"

    eng._capture = capture
    eng._in_context = lambda fn, *args: fn(*args)
    eng.program = object.__new__(te.CompiledProgram)
    eng.program._go, eng.program._loaders = threading.Event(), {}
    one = te.OneThread("trtc-test-own")
    eng._one = one
    return eng, run, one


def test_replays_stay_on_the_callers_thread_and_the_function_runs_on_the_engines_own():
    log = []
    eng, run, one = _routing_engine(log)
    assert eng._forward(_Input(7)) == "out7"  # a new slot: captured (on the engine's thread), then replayed
    assert log == [("capture", 7, log[0][2]), ("replay", "slot7")] and log[0][2].startswith("trtc-test-own")
    log.clear()
    sent = []
    real_call = one.call
    one.call = lambda *a: sent.append(a) or real_call(*a)
    assert eng._forward(_Input(7)) == "out7" and log == [("replay", "slot7")] and sent == []  # a replay, here
    assert eng._forward(_Input(9), bind=False) == "copied"  # the host path's temporary input: the copying graph
    assert log[1:] == [("copy", 9), ("replay", "copying")] and sent == []
    one.close()


def test_a_full_set_of_slots_copies_in_and_a_loading_function_runs_eagerly():
    log = []
    eng, run, one = _routing_engine(log, slots=te.MAX_SLOT_GRAPHS)
    assert eng._forward(_Input(5)) == "copied"  # no slot graph left: the copying graph, no capture
    assert log == [("copy", 5), ("replay", "copying")]
    assert eng._forward(_Input(1000)) == "out1000" and log[-1] == ("replay", "slot1000")
    one.close()
    log = []
    eng, run, one = _routing_engine(log, loading=object())  # its precompiled function still loads
    assert eng._forward(_Input(7)) == "eager" and log == [("fn", 7)] and not run.slots
    one.close()


def test_a_quick_start_s_load_waits_for_the_first_eager_batch():
    """With the quick start, the precompiled function's load (seconds of Python holding the interpreter lock) begins
    only once the first eager batch has run, so it does not slow that first result; replays and captures do not let
    it go, wait_ready() and close() do, and a load waits no longer than LOAD_HOLD_S for a batch that does not come."""
    log = []
    eng, run, one = _routing_engine(log, slots=1)
    assert eng._forward(_Input(1000)) == "out1000" and not eng.program._go.is_set()  # a replay
    assert eng._forward(_Input(7)) == "out7" and not eng.program._go.is_set()  # a capture of the compiled function
    one.close()
    eng, run, one = _routing_engine(log, loading=object())
    assert not eng.program._go.is_set()
    assert eng._forward(_Input(7)) == "eager" and eng.program._go.is_set()
    one.close()
    for let_go in ("wait_ready", "close"):
        eng, run, one = _routing_engine(log, loading=object())
        eng.stream, eng._runs = None, {}
        getattr(eng, let_go)()
        assert eng.program._go.is_set(), let_go
        one.close()


def test_a_held_load_begins_at_go_or_after_the_hold(monkeypatch):
    import time

    began = []
    monkeypatch.setattr(te._PrecompiledLoader, "_load_all", lambda self, torch: began.append(time.perf_counter()))
    go = threading.Event()
    loader = te._PrecompiledLoader(None, "k", [], None, go)
    t0 = time.perf_counter()
    loader.start()
    time.sleep(0.3)
    assert began == [] and loader.is_alive()  # held: not begun, but alive (the engine's batches run eagerly)
    go.set()
    loader.join(5)
    assert len(began) == 1 and began[0] - t0 >= 0.3 and loader.held_s >= 0.3
    monkeypatch.setattr(sys.modules["engines.torch_compiled"], "LOAD_HOLD_S", 0.4)
    loader = te._PrecompiledLoader(None, "k", [], None, threading.Event())  # no batch comes: it goes after the hold
    t0 = time.perf_counter()
    loader.start()
    loader.join(5)
    assert len(began) == 2 and 0.4 <= began[1] - t0 < 3 and 0.4 <= loader.held_s < 3
    loader = te._PrecompiledLoader(None, "k", [], None)  # no quick start: no hold
    loader.start()
    loader.join(5)
    assert len(began) == 3 and loader.held_s == 0.0


def test_the_device_label_keeps_the_whole_gpu_name_and_the_math_label_reads_tf32_now(monkeypatch):
    """Two GPUs of one architecture whose names share their first words (RTX 4080 and RTX 4090, both sm89) get two
    labels; the TF32 settings are read when the key is made, not at import."""
    import types

    names = {0: "NVIDIA GeForce RTX 4080", 1: "NVIDIA GeForce RTX 4090", 2: "NVIDIA H100 80GB HBM3"}
    cuda = types.SimpleNamespace(get_device_name=names.__getitem__, get_device_capability=lambda i: (8, 9) if i < 2
                                 else (9, 0))
    backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(allow_tf32=True),
                                     cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=False)))
    fake = types.SimpleNamespace(cuda=cuda, backends=backends)
    monkeypatch.setattr(sys.modules["engines.torch_compiled"], "require_torch", lambda *a, **k: fake)
    assert [te.device_label(i) for i in names] == ["GeForce-RTX-4080-sm89", "GeForce-RTX-4090-sm89",
                                                   "H100-80GB-HBM3-sm90"]
    assert te.math_label(fake) == "tf32c1m0"
    backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32 = False, True
    assert te.math_label(fake) == "tf32c0m1"
