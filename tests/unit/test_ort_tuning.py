"""ONNX Runtime tuned for trtc's fixed shapes: the CUDA EP options a tuned session is opened with, the reopen
unfused when cuDNN refuses a fused convolution, the one owner of the tuned session, and the quick start.

No GPU here: the session is a recorder standing in for ONNX Runtime's CUDA session (its input and output
descriptions come from the real Lite0 export), and CuPy is tests/fake_cupy.py. What runs on the GPU is checked in
tests/gpu/test_ort_tuning_gpu.py."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import engines.onnxruntime_engine as oe
from engines.errors import EngineError, UsageProblem


class Binding:
    def __init__(self, owner=None):
        self.inputs, self.outputs = {}, {}
        self.owner = owner  # the session that made it: ONNX Runtime's IOBinding belongs to one session

    def bind_input(self, name, device, device_id, dtype, shape, ptr):
        self.inputs[name] = (ptr, tuple(shape))

    def bind_output(self, name, device, device_id, dtype, shape, ptr):
        self.outputs[name] = (ptr, tuple(shape))


class Session:
    """Records each run's graph id and bindings; "computes" by filling the bound output with the run's number."""

    def __init__(self, real, registry: dict, providers=None):
        self.real, self.registry, self.runs = real, registry, []
        self.options = providers[0][1] if providers else {}
        self.gate = None  # a threading.Event the quick start's preparing thread waits on (tests of quick start)
        self.fail = None  # a message every run raises (a session cuDNN refuses)
        self.use = None  # {"active": n, "overlaps": [...], "hold": s}: shared by the tuned sessions of one engine

    def _using(self):
        """A run's span: with ``use`` set, an overlap with another run of a tuned session is recorded (and each run
        lasts ``hold`` seconds, so that a missing lock shows)."""
        import contextlib

        use = self.use

        @contextlib.contextmanager
        def span():
            if use is None:
                yield
                return
            with use["lock"]:
                use["active"] += 1
                if use["active"] > 1:
                    use["overlaps"].append(threading.current_thread().name)
            try:
                time.sleep(use["hold"])
                yield
            finally:
                with use["lock"]:
                    use["active"] -= 1

        return span()

    def get_inputs(self):
        return self.real.get_inputs()

    def get_outputs(self):
        return self.real.get_outputs()

    def io_binding(self):
        return Binding(self)

    def run(self, names, feeds, ro=None):  # host arrays: ONNX Runtime's own copies
        if self.fail:
            raise RuntimeError(self.fail)
        graph_id = ro.get_run_config_entry("gpu_graph_id") if ro is not None else None
        with self._using():
            self.runs.append((graph_id, {k: (None, v.shape) for k, v in feeds.items()}, None))
        return [np.full((len(next(iter(feeds.values()))), 1000), len(self.runs), np.float32)]

    def run_with_iobinding(self, io, ro):
        try:
            graph_id = ro.get_run_config_entry("gpu_graph_id") if ro is not None else None
        except RuntimeError:  # ONNX Runtime's answer for an entry never set
            graph_id = None
        if self.gate is not None and threading.current_thread().name == "trtc-ort-prepare":
            assert self.gate.wait(10), "the test never opened the gate"
            if getattr(self.gate, "fail", None):
                raise RuntimeError(self.gate.fail)
        if self.fail:
            raise RuntimeError(self.fail)
        assert io.owner is self, "a binding of another session"
        with self._using():
            self.runs.append((graph_id, dict(io.inputs), id(io)))
            for ptr, _shape in io.outputs.values():
                self.registry[ptr].host[...] = len(self.runs)


@pytest.fixture
def cuda_engine(monkeypatch, lite0_onnx, tmp_path):
    """open(tuning=...) -> (engine, providers each session was asked for, session)."""
    import onnxruntime as ort

    from tests import fake_cupy

    cp = fake_cupy.install(monkeypatch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the quick session's cache folder
    registry = {}
    real_empty = cp.empty

    def empty(shape, dtype=np.float32):
        a = real_empty(shape, dtype)
        registry[a.data.ptr] = a
        return a

    cp.empty = empty
    real = ort.InferenceSession(str(lite0_onnx[0]), providers=["CPUExecutionProvider"])
    asked = []
    sessions = []

    def open_(tuning="auto", device_buffers=True, quick_start=False, gate=None,
              refuse_fusion=None, path=None, refuse_quick=None, batch="manifest", form=None):
        """refuse_fusion: the message every run of a session with fuse_conv_bias raises; path: the model opened
        (default: the FP32 Lite0 export; the fake's inputs and outputs are that export's either way); batch: the
        batch announced at open ("manifest": the manifest's default batch, as classify() announces it)."""
        def session(self, ort_, opts, providers, model=None):
            asked.append(providers[0][1].copy())
            if refuse_quick and providers[0][1].get("cudnn_conv_algo_search") == "DEFAULT":
                raise EngineError(f"ONNX Runtime cannot load m.onnx: {refuse_quick}")
            s = Session(real, registry, providers)
            if providers[0][1].get("fuse_conv_bias") == "1":
                s.fail = refuse_fusion
            s.gate = gate if providers[0][1].get("cudnn_conv_algo_search") != "DEFAULT" else None
            if providers[0][1].get("cudnn_conv_algo_search") != "DEFAULT":
                s.use = open_.use
            s.model = model  # None: the engine's file
            sessions.append(s)
            return s

        monkeypatch.setattr(oe.OnnxRuntimeEngine, "_session", session)
        monkeypatch.setattr("engines._gpu.check_gpu_index", lambda i: None)
        monkeypatch.setattr(oe, "providers_for", lambda d: [("CUDAExecutionProvider", {"device_id": 0}),
                                                            "CPUExecutionProvider"])
        model = path or lite0_onnx[0]
        if batch == "manifest":
            batch = _manifest_batch(model) if (Path(str(model) + ".json")).exists() else None
        eng = oe.OnnxRuntimeEngine(model, device="cuda:0", tuning=tuning, device_buffers=device_buffers,
                                   quick_start=quick_start, batch=batch, form=form)
        opened.append(eng)
        return eng, asked, eng.session

    opened = []
    open_.cp = cp
    open_.use = None  # set to watch the tuned sessions for overlapping runs (see Session._using)
    open_.registry = registry
    open_.sessions = sessions
    yield open_
    # every engine closed and its worker ended while this test's fake is in place: a worker still opening a
    # session on a loaded machine would otherwise open it through the next test's fake, in that test's list
    for eng in opened:
        assert eng.close_and_wait(60), "an engine's worker did not end after close()"


def test_a_tuned_cuda_session_asks_for_nhwc_heuristic_algorithms_and_fusion_never_graphs(cuda_engine):
    eng, asked, _ = cuda_engine("auto")
    assert asked[-1]["prefer_nhwc"] == "1" and asked[-1]["cudnn_conv_algo_search"] == "HEURISTIC"
    assert asked[-1]["fuse_conv_bias"] == "1" and eng.fused  # each convolution fused with its bias by cuDNN
    assert "enable_cuda_graph" not in asked[-1]
    off, asked, _ = cuda_engine("off")
    assert not ({"prefer_nhwc", "cudnn_conv_algo_search", "enable_cuda_graph", "fuse_conv_bias"} & set(asked[-1]))
    assert not off.fused
    # host arrays only (no device buffers): the same tuned kernels
    host, asked, _ = cuda_engine("auto", device_buffers=False)
    assert asked[-1]["prefer_nhwc"] == "1" and asked[-1]["fuse_conv_bias"] == "1"
    with pytest.raises(UsageProblem, match="use one of: auto, off"):
        cuda_engine("graphs")


def test_a_quantized_model_gets_no_nhwc_layout_nor_fusion_and_no_quick_copy(cuda_engine, lite0_int8):
    """INT8 Lite0 (Q/DQ; its kept-in-FP16 convolutions read their weights through DequantizeLinear and Cast): the
    tuned session asks only for heuristic algorithms (ONNX Runtime's NHWC rewrite of this graph failed on an H100),
    and the quick session runs the file itself, not the depthwise copy made for float graphs."""
    eng, asked, _ = cuda_engine("auto", path=lite0_int8.output, quick_start=True)
    eng.wait_ready(30)
    tuned = [a for a in asked if a.get("cudnn_conv_algo_search") == "HEURISTIC"]
    assert tuned and all(not ({"prefer_nhwc", "fuse_conv_bias"} & set(a)) for a in tuned) and not eng.fused
    quick = _quick_sessions(cuda_engine.sessions)
    assert quick and all(s.model is None or s.model == str(lite0_int8.output) for s in quick)
    eng.close()


def test_no_two_uses_of_the_tuned_session_overlap(cuda_engine):
    """The engine's one owner of its tuned session: the quick start's preparations (the open-time batch and shapes
    announced meanwhile), numpy batches (ONNX Runtime's copies), device batches and the reopen
    unfused (cuDNN refuses the fused session's first run), each from its own thread at once, never run the tuned
    session (or the one replacing it) at the same time. Fails with the engine's lock taken away."""
    cuda_engine.use = {"lock": threading.Lock(), "active": 0, "overlaps": [], "hold": 0.005}
    eng, _, fused = cuda_engine("auto", quick_start=True, refuse_fusion=REFUSED)
    cp = cuda_engine.cp
    a = cp.asarray(np.zeros((4, 3, 224, 224), np.float32))
    errors = []

    def repeat(name, call, times=15):
        def go():
            try:
                for _ in range(times):
                    call()
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append((name, repr(exc)))
        return threading.Thread(target=go, name=name)

    threads = [repeat("numpy-2", lambda: eng.infer(np.zeros((2, 3, 224, 224), np.float32))),
               repeat("numpy-3", lambda: eng.infer(np.zeros((3, 3, 224, 224), np.float32))),
               repeat("device-4", lambda: eng.infer(a)),
               repeat("device-1", lambda: eng.infer(cp.asarray(np.zeros((1, 3, 224, 224), np.float32)))),
               repeat("expect", lambda: eng.expect([5, 6, 7]), times=1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert eng.wait_ready(30)
    assert not errors, errors
    assert not eng.fused and eng.session is not fused and len(eng.session.runs) >= 30  # the numpy batches at least
    assert {(n, 3, 224, 224) for n in (5, 6, 7)} <= {r[1]["input"][1] for r in eng.session.runs}  # prepared
    assert cuda_engine.use["overlaps"] == []
    eng.close()


def test_only_a_cudnn_refusal_reopens_the_session_unfused(cuda_engine):
    """An error that merely names cuDNN (an allocation failure in it) is raised, and the session stays fused;
    cuDNN's frontend refusing the fused graph reopens it."""
    x = cuda_engine.cp.asarray(np.zeros((2, 3, 224, 224), np.float32))
    eng, _, fused = cuda_engine("auto", refuse_fusion="CUDNN failure 4: CUDNN_STATUS_ALLOC_FAILED")
    with pytest.raises(EngineError, match="ALLOC_FAILED"):
        eng.infer(x)
    assert eng.fused and eng.session is fused
    eng, _, fused = cuda_engine("auto", refuse_fusion="cuDNN: CUDNN_STATUS_NOT_SUPPORTED")
    eng.infer(x)
    assert not eng.fused and eng.session is not fused


def test_every_device_run_names_its_graph_id_also_without_graphs(cuda_engine):
    """ONNX Runtime's Python run_with_iobinding looks gpu_graph_id up on every run; a missing key raises inside
    it (a C++ exception made a Python one, ~30 us with the interpreter lock held), so trtc always sets it."""
    for tuning in ("auto", "off"):
        eng, _, session = cuda_engine(tuning)
        x = cuda_engine.cp.asarray(np.zeros((2, 3, 224, 224), np.float32))
        eng.infer(x)
        eng.infer(x)
        assert [r[0] for r in session.runs][-2:] == ["-1", "-1"], tuning


def test_an_onnx_runtime_failure_without_a_message_is_still_one_line(cuda_engine):
    """ORT exceptions are reported by their first line; one with an empty message must not turn into IndexError."""
    eng, _, session = cuda_engine("auto")

    def fail(io, ro):
        raise RuntimeError("")

    session.run_with_iobinding = fail
    with pytest.raises(EngineError, match="ONNX Runtime failed on .*: RuntimeError$"):
        eng.infer(cuda_engine.cp.asarray(np.zeros((2, 3, 224, 224), np.float32)))


REFUSED = ("Error in execution: Non-zero status code returned while running Conv node. Name:'node_Conv_881' Status "
           "Message: Failed to initialize CUDNN Frontend: CUDNN_FE failure 8: HEURISTIC_QUERY_FAILED")


def _fused(options) -> bool:
    return options.get("fuse_conv_bias") == "1"


def test_a_fused_session_cudnn_refuses_is_reopened_unfused_and_said_once(cuda_engine, caplog):
    """What cuDNN said on an H100 of Lite0's first convolution fused under NCHW (2026-11-27): a run of the fused
    session that fails in cuDNN reopens the session without the fusion, keeping the other tuned options, and the
    batch runs there; later batches go straight to it; said once per model."""
    oe._told.clear()
    cp = cuda_engine.cp
    x = cp.asarray(np.zeros((2, 3, 224, 224), np.float32))
    with caplog.at_level(logging.WARNING, logger="trtc"):
        eng, asked, fused = cuda_engine("auto", refuse_fusion=REFUSED)
        out = eng.infer(x)[0]
        assert eng.session is not fused and not eng.fused and len(cuda_engine.sessions) == 2
        assert not _fused(asked[-1]) and asked[-1]["prefer_nhwc"] == "1"
        assert asked[-1]["cudnn_conv_algo_search"] == "HEURISTIC" and asked[-1]["user_compute_stream"]
        assert float(out.host[0, 0]) == 1 and len(eng.session.runs) == 1  # the unfused session's first run
        eng.infer(x)
        assert len(cuda_engine.sessions) == 2 and len(eng.session.runs) == 2  # not reopened again
        host, _, _ = cuda_engine("auto", device_buffers=False, refuse_fusion=REFUSED)  # host arrays, ORT's copies
        assert host.infer(np.zeros((2, 3, 224, 224), np.float32))[0].shape == (2, 1000) and not host.fused
    said = [r.getMessage() for r in caplog.records if "unfused" in r.getMessage()]
    assert len(said) == 1 and "HEURISTIC_QUERY_FAILED" in said[0] and "fused with its bias" in said[0]


def test_the_quick_start_s_preparation_reopens_a_refused_fused_session(cuda_engine):
    """The tuned session's first run of a shape is the quick start's preparation, on its own thread: a cuDNN
    refusal there reopens it unfused and prepares the shape on the new session, while batches ran on the quick
    session; afterwards they run on the unfused tuned session."""
    gate = threading.Event()
    eng, _, fused = cuda_engine("auto", quick_start=True, gate=gate, refuse_fusion=REFUSED)
    _warmed(eng)
    x = cuda_engine.cp.asarray(np.zeros((4, 3, 224, 224), np.float32))
    eng.infer(x)
    gate.set()
    assert eng.wait_ready(10)
    assert not eng.fused and eng.session is not fused and not _fused(eng.session.options)
    prepared = len(eng.session.runs)
    assert prepared == 2  # the open-time batch and the caller's, prepared on the new session
    eng.infer(x)
    assert len(eng.session.runs) == prepared + 1


def test_shapes_the_fused_session_prepared_are_prepared_again_on_the_unfused_one(cuda_engine, lite0_onnx):
    """The open-time batch is prepared on the fused session; cuDNN then refuses a new shape, and the session is
    reopened unfused: the open-time batch is new to that session, so its next batch runs on the quick session while
    the unfused one prepares it, not straight on a session that never ran it (seconds on the caller's thread)."""
    gate = threading.Event()
    gate.set()
    eng, _, fused = cuda_engine("auto", quick_start=True, gate=gate)
    n = _manifest_batch(lite0_onnx[0])
    assert eng.wait_ready(10) and eng.fused and [r[1]["input"][1] for r in fused.runs] == [(n, 3, 224, 224)]
    fused.fail = REFUSED
    cp = cuda_engine.cp
    for shape in ((1, 3, 224, 224), (n, 3, 224, 224)):  # first a new shape, refused while being prepared
        gate.clear()  # each preparation waits at the gate, so that the batch meets it under way
        before = eng.quick_runs
        eng.infer(cp.asarray(np.zeros(shape, np.float32)))
        assert eng.quick_runs == before + 1  # on the quick session, while the tuned one prepares the shape
        gate.set()
        assert eng.wait_ready(10) and not eng.fused
    assert eng.wait_ready(10)
    assert [r[1]["input"][1] for r in eng.session.runs] == [(1, 3, 224, 224), (n, 3, 224, 224)]


def test_a_failure_that_is_not_cudnn_s_is_raised_and_the_session_stays_fused(cuda_engine):
    eng, asked, fused = cuda_engine("auto", refuse_fusion="CUDA failure 2: out of memory")
    with pytest.raises(EngineError, match="out of memory"):
        eng.infer(cuda_engine.cp.asarray(np.zeros((2, 3, 224, 224), np.float32)))
    assert eng.fused and eng.session is fused and len(cuda_engine.sessions) == 1
    host, _, _ = cuda_engine("auto", device_buffers=False, refuse_fusion="CUDA failure 2: out of memory")
    with pytest.raises(RuntimeError, match="out of memory"):
        host.infer(np.zeros((2, 3, 224, 224), np.float32))
    assert host.fused


def test_an_unknown_tuning_is_refused_with_the_choices(lite0_onnx):
    with pytest.raises(UsageProblem, match="unknown ONNX Runtime tuning 'fast'") as err:
        oe.OnnxRuntimeEngine(lite0_onnx[0], tuning="fast")
    assert err.value.fix == "use one of: auto, off"


def test_the_caller_s_output_buffer_gets_the_result(cuda_engine):
    eng, _, session = cuda_engine("auto")
    cp = cuda_engine.cp
    x = cp.asarray(np.zeros((2, 3, 224, 224), np.float32))
    mine = cp.asarray(np.full((2, 1000), -7, np.float32))
    cuda_engine.registry[mine.data.ptr] = mine  # the fake session writes through the bound address
    got = eng.infer(x, outputs=[mine])[0]
    assert got is mine and float(mine.host[1, 999]) == len(session.runs) == 1


def test_a_run_at_another_shape_waits_for_the_last(cuda_engine):
    """ONNX Runtime's cuDNN convolutions keep the plan of the last input shape only and replace it at a new one
    without waiting for the GPU: before a run at another shape the engine waits for the session's last run if an
    event query says it is still on the GPU."""
    eng, _, session = cuda_engine("auto")
    cp = cuda_engine.cp
    a = cp.asarray(np.zeros((4, 3, 224, 224), np.float32))
    eng.infer(a)
    synced = []
    ran = eng._ran
    ran.synchronize = lambda: synced.append(len(session.runs))
    recorded = []
    ran.record = lambda stream=None: recorded.append(stream.ptr)
    eng.infer(a[:2]), eng.infer(a)  # changes after the last run ended (an event query says so): no wait
    assert synced == [] and recorded == [eng.stream.ptr] * 2  # the event marks each run on the session's stream
    ran.done = False  # from here the last run is always still on the GPU at a change
    eng.infer(a), eng.infer(a)  # the same shape: nothing to wait for
    assert synced == []
    eng.infer(a[:2])  # another shape: wait for the runs before it
    assert synced == [len(session.runs) - 1]
    eng.infer(a[:2])
    assert synced == [len(session.runs) - 2]
    eng.infer(np.zeros((3, 3, 224, 224), np.float32))  # host arrays at another shape: the same rule
    assert synced[-1] == len(session.runs) - 1


# Quick start (engines/onnxruntime_engine.py, _QuickStart): a tuned session's first run of a shape prepares it (seconds
# for Lite0 on an H100); the batches that come meanwhile run on a second session with cuDNN's default algorithms.

def _manifest_batch(path) -> int:
    import json

    from engines.manifest import manifest_path

    return min(64, json.loads(manifest_path(path).read_text())["batch"]["opt"])


def _until(ready, timeout=10.0) -> bool:
    end = time.monotonic() + timeout
    while not ready() and time.monotonic() < end:
        time.sleep(0.01)
    return ready()


def _warmed(eng) -> None:
    """Wait until the worker has opened the quick session and run it once at the first shape queued."""
    assert _until(lambda: eng._quick is not None and eng._quick.runs and eng._queue)


def _queue(eng, key) -> None:
    with eng._cond:
        eng._queue_shape(key)


def _quick_sessions(sessions) -> list:
    """The quick sessions among those opened (the warm-up thread opens one while the tuned one opens: any order)."""
    return [s for s in sessions if s.options.get("cudnn_conv_algo_search") == "DEFAULT"]


def test_quick_start_opens_a_default_algorithm_session_on_its_own_stream(cuda_engine, lite0_onnx):
    gate = threading.Event()
    eng, asked, tuned = cuda_engine("auto", quick_start=True, gate=gate)
    n = _manifest_batch(lite0_onnx[0])
    # at open a thread opened the quick session and ran it once at the batch the video pipeline defaults to (the
    # manifest's opt, <= 64): that run loads its kernels before the caller's first batch
    assert eng._worker.name == "trtc-ort-prepare"
    _warmed(eng)
    (quick,) = _quick_sessions(cuda_engine.sessions)
    assert [r[1]["input"][1] for r in quick.runs] == [(n, 3, 224, 224)]
    x = cuda_engine.cp.asarray(np.zeros((2, 3, 224, 224), np.float32))
    eng.infer(x)
    assert len(quick.runs) == 2 and quick.runs[-1][1]["input"][1] == (2, 3, 224, 224)
    assert _quick_sessions(cuda_engine.sessions) == [quick]  # not opened again
    assert quick.options["cudnn_conv_algo_search"] == "DEFAULT"
    assert not {"prefer_nhwc", "enable_cuda_graph", "fuse_conv_bias"} & set(quick.options)
    assert quick.options["user_compute_stream"] != tuned.options["user_compute_stream"]
    assert quick.options["device_id"] == 0
    # the quick session runs the copy with Lite0's depthwise convolutions as multiply-adds; the tuned one the file
    assert isinstance(quick.model, bytes) and b"trtc_taps0_" in quick.model and tuned.model is None
    gate.set()
    assert eng.wait_ready(10)
    # the tuned session prepared the open-time batch first, then the caller's
    prepared = [r[1]["input"][1] for r in tuned.runs]
    assert prepared == [(n, 3, 224, 224), (2, 3, 224, 224)]
    assert all(r[0] == "-1" for r in tuned.runs)  # gpu_graph_id -1: no graph


def test_batches_run_on_the_quick_session_until_the_tuned_one_has_prepared_their_shape(cuda_engine):
    gate = threading.Event()
    eng, _, tuned = cuda_engine("auto", quick_start=True, gate=gate)
    _warmed(eng)
    (quick,) = _quick_sessions(cuda_engine.sessions)
    cp = cuda_engine.cp
    x = cp.asarray(np.zeros((4, 3, 224, 224), np.float32))
    outs = [eng.infer(x)[0] for _ in range(3)]
    assert len(quick.runs) == 4 and eng.quick_runs == 3  # the warm-up's run, then the caller's three
    assert [float(o.host[0, 0]) for o in outs] == [2, 3, 4]  # each call's own result, from the quick session
    assert not tuned.runs  # the preparation waits at the gate
    gate.set()
    assert eng.wait_ready(10)
    assert eng._quick is None  # let go once nothing is being prepared
    prepared = len(tuned.runs)
    eng.infer(x)
    assert len(tuned.runs) == prepared + 1 and len(quick.runs) == 4 and eng.quick_runs == 3
    # a new shape: prepared in its turn, meanwhile on a new quick session
    gate.clear()
    eng.infer(x[:1])
    again = _quick_sessions(cuda_engine.sessions)
    assert len(again) == 2 and again[-1] is not quick and len(again[-1].runs) == 1
    gate.set()
    assert eng.wait_ready(10)
    eng.close()
    assert tuned.runs[-1][1]["input"][1] == (1, 3, 224, 224)


def test_the_tuned_session_never_runs_beside_its_own_preparation(cuda_engine):
    """While the tuned session prepares a new shape on its thread, even a shape it has prepared runs on the quick
    session (two runs of the tuned session at two shapes at once failed on an H100 with illegal memory accesses in
    cuDNN); the preparation starts after the tuned work already enqueued (its stream synchronised)."""
    gate = threading.Event()
    eng, _, tuned = cuda_engine("auto", quick_start=True, gate=gate)
    cp = cuda_engine.cp
    x = cp.asarray(np.zeros((4, 3, 224, 224), np.float32))
    eng.infer(x)
    gate.set()
    assert eng.wait_ready(10)
    eng.infer(x)  # prepared, nothing else being prepared: the tuned session
    before, quick_before = len(tuned.runs), eng.quick_runs
    gate.clear()
    synced = []
    real_sync = eng.stream.synchronize
    eng.stream.synchronize = lambda: (synced.append(len(tuned.runs)), real_sync())[1]
    eng.infer(x[:2])  # a new shape: its preparation waits at the gate
    eng.infer(x)  # prepared shape, but a preparation is running: the quick session
    assert eng.quick_runs == quick_before + 2 and len(tuned.runs) == before
    for _ in range(1000):  # the preparing thread synchronises, then waits at the gate inside its run
        if synced:
            break
        time.sleep(0.01)
    assert synced == [before]  # it waited for the stream before running the tuned session
    retired = []
    eng._quick_stream.synchronize = lambda: retired.append(eng._quick)
    gate.set()
    assert eng.wait_ready(10)
    for _ in range(1000):  # the thread lets the quick session go, then waits for its stream
        if retired:
            break
        time.sleep(0.01)
    assert retired == [None]  # once no longer the quick session, and before the last reference went
    eng.infer(x)
    assert len(tuned.runs) == before + 2 and eng.quick_runs == quick_before + 2  # preparation, then the call
    eng.close()


def test_a_quick_session_that_cannot_open_leaves_every_batch_to_the_tuned_one(cuda_engine, caplog):
    """The quick session fails to open (here out of memory): batches wait for the tuned session's preparation and
    run there, none fails, and the loss of the quick start is said once."""
    gate = threading.Event()
    with caplog.at_level(logging.WARNING, logger="trtc"):
        eng, _, tuned = cuda_engine("auto", quick_start=True, gate=gate, refuse_quick="CUDA failure 2: out of memory")
        x = cuda_engine.cp.asarray(np.zeros((4, 3, 224, 224), np.float32))
        threading.Timer(0.2, gate.set).start()  # the preparation ends a little later
        outs = [eng.infer(x)[0] for _ in range(3)]
    assert eng.quick_runs == 0 and not _quick_sessions(cuda_engine.sessions)
    assert [float(o.host[0, 0]) for o in outs] == [len(tuned.runs) - 2, len(tuned.runs) - 1, len(tuned.runs)]
    said = [r.getMessage() for r in caplog.records if "quick start off" in r.getMessage()]
    assert len(said) == 1 and "out of memory" in said[0]
    eng.close()


def test_the_quick_session_is_let_go_when_no_shape_is_known_to_prepare(cuda_engine, lite0_onnx, tmp_path):
    """Nothing announced at open (a dynamic batch, no manifest): nothing is prepared, and the warm-up holds its quick
    session for the first shape announced; a numpy batch lets it go (a host caller needs none), not kept for the
    engine's life; a device batch then opens one for its own preparation, let go when that ends."""
    import shutil

    bare = tmp_path / "bare.onnx"
    shutil.copy(lite0_onnx[0], bare)
    gate = threading.Event()
    gate.set()
    eng, _, tuned = cuda_engine("auto", quick_start=True, gate=gate, path=bare)
    for _ in range(1000):
        if eng._quick is not None:
            break
        time.sleep(0.01)
    assert len(_quick_sessions(cuda_engine.sessions)) == 1 and not tuned.runs  # nothing prepared on a guess
    eng.infer(np.zeros((2, 3, 224, 224), np.float32))  # numpy: the tuned session; the idle quick session goes
    assert eng.wait_ready(10) and eng._quick is None
    assert len(_quick_sessions(cuda_engine.sessions)) == 1 and not _quick_sessions(cuda_engine.sessions)[0].runs
    eng.infer(cuda_engine.cp.asarray(np.zeros((2, 3, 224, 224), np.float32)))
    assert eng.wait_ready(10) and eng._quick is None and len(_quick_sessions(cuda_engine.sessions)) == 2
    eng.close()


def test_a_failed_preparation_leaves_the_error_to_the_tuned_run(cuda_engine):
    gate = threading.Event()
    gate.fail = "CUDA failure 2: out of memory"
    eng, _, tuned = cuda_engine("auto", quick_start=True, gate=gate)
    gate.set()
    assert eng.wait_ready(10)
    x = cuda_engine.cp.asarray(np.zeros((2, 3, 224, 224), np.float32))
    eng.infer(x)  # prepared in the background: quick session; the preparation fails
    assert eng.wait_ready(10) and (((2, 3, 224, 224),) in eng.failed)
    # that shape now runs the tuned session in the caller's thread, which meets the error itself
    with pytest.raises(EngineError, match="out of memory"):
        tuned.run_with_iobinding = lambda io, ro: (_ for _ in ()).throw(RuntimeError(gate.fail))
        eng.infer(x)


def test_no_quick_start_when_told_or_untuned_or_on_host_arrays(cuda_engine):
    eng, asked, tuned = cuda_engine("auto", quick_start=False)
    eng.infer(cuda_engine.cp.asarray(np.zeros((2, 3, 224, 224), np.float32)))
    assert not eng.quick_start and not eng.warms_itself and len(asked) == 1 and len(tuned.runs) == 1
    off, asked, _ = cuda_engine("off", quick_start=True)
    assert not off.quick_start and not off.warms_itself and off.wait_ready(0)
    host, asked, _ = cuda_engine("auto", quick_start=True, device_buffers=False)
    assert not host.quick_start and not host.warms_itself
    quick, _, _ = cuda_engine("auto", quick_start=True)  # the pipeline then runs no warm-up batch
    assert quick.quick_start and quick.warms_itself


def test_close_stops_the_preparation_and_does_not_wait_for_it(cuda_engine):
    """close() while the tuned session prepares a shape on its thread returns before that run ends: the queued
    preparations are dropped, the running one's options get ONNX Runtime's terminate flag, and the session the
    thread is running is not let go under it but by that thread once its run has ended."""
    gate = threading.Event()
    eng, _, tuned = cuda_engine("auto", quick_start=True, gate=gate)
    _queue(eng, ((2, 3, 224, 224),))  # queued behind the open-time batch, which waits at the gate
    for _ in range(1000):
        if eng._preparing is not None:
            break
        time.sleep(0.01)
    running = eng._preparing
    assert running is not None and not running.terminate
    closing = threading.Thread(target=eng.close, daemon=True)
    closing.start()
    closing.join(10)
    assert not closing.is_alive(), "close() waited for the preparation"
    assert running.terminate and eng._queue == [eng._queue[0]]  # the queued shape dropped
    assert eng.session is tuned  # still being run by the preparing thread: not let go under it
    gate.set()
    assert eng.wait_ready(10)
    assert eng.session is None and eng._quick is None  # let go by the thread, once its run ended
    assert [r[1]["input"][1][0] for r in tuned.runs] == [_manifest_batch_of(eng)]  # the dropped shape never ran


def _manifest_batch_of(eng) -> int:
    return _manifest_batch(eng.path)


def test_another_batch_pays_no_second_preparation(cuda_engine, lite0_onnx):
    """The caller's batch (at open, or announced before its first batch as classify() does) is the one shape the
    tuned session prepares: nothing at the manifest's batch, the quick warm-up at the caller's, and the batches of
    that size then run on the tuned session without preparing anything again."""
    n = _manifest_batch(lite0_onnx[0])
    other = 16 if n != 16 else 8
    for at_open in (True, False):
        cuda_engine.sessions.clear()
        gate = threading.Event()
        eng, _, tuned = cuda_engine("auto", quick_start=True, gate=gate, batch=other if at_open else None)
        if not at_open:
            eng.expect(other, "device")
        for _ in range(1000):  # the preparation waits at the gate; the warm-up runs meanwhile
            if _quick_sessions(cuda_engine.sessions) and _quick_sessions(cuda_engine.sessions)[0].runs:
                break
            time.sleep(0.01)
        gate.set()
        assert eng.wait_ready(10)
        (quick,) = _quick_sessions(cuda_engine.sessions)
        assert [r[1]["input"][1] for r in quick.runs] == [(other, 3, 224, 224)]  # the warm-up, at the caller's
        x = cuda_engine.cp.asarray(np.zeros((other, 3, 224, 224), np.float32))
        for _ in range(3):
            eng.infer(x)
        assert [r[1]["input"][1][0] for r in tuned.runs] == [other] * 4 and eng.quick_runs == 0
        eng.close()


def test_a_host_caller_gets_its_batch_prepared_and_no_quick_session(cuda_engine):
    gate = threading.Event()
    gate.set()
    eng, _, tuned = cuda_engine("auto", quick_start=True, gate=gate, batch=4, form="host")
    assert eng.wait_ready(10) and [r[1]["input"][1] for r in tuned.runs] == [(4, 3, 224, 224)]
    assert eng.infer(np.zeros((4, 3, 224, 224), np.float32))[0].shape == (4, 1000)
    assert not _quick_sessions(cuda_engine.sessions) and eng._quick is None
    with pytest.raises(UsageProblem, match="unknown input form 'gpu'"):
        eng.expect(4, "gpu")
    eng.close()


def test_classify_and_the_pusher_announce_their_batch_and_form(lite0_onnx, bikes):
    """What the video pipeline and FramePusher will run is said to the engine before their first batch."""
    from engines.video import FramePusher, classify

    eng = oe.OnnxRuntimeEngine(lite0_onnx[0])
    said = []
    eng.expect = lambda batch=None, form=None: said.append((batch, form))
    run = classify([str(bikes)], eng, batch=3, decoder="pyav")
    assert said == [(3, "host")]
    with FramePusher(eng, batch=5):
        pass
    assert said[-1] == (5, "host")
    del run
    eng.close()
