"""ONNX Runtime backend: the CPU execution provider, or the CUDA one where onnxruntime-gpu is installed.

``infer(numpy batch)`` returns numpy outputs. ``infer(device array, outputs=None, stream=None)`` runs zero-copy
(IOBinding on the device pointers, the session's own CUDA stream ordered with ``stream`` by events) and returns CuPy
outputs without a host synchronisation. Why the rules are as they are: docs/INTERNALS.md ("How the GPU path runs")."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import threading
import weakref
from pathlib import Path

import numpy as np

from ._cuda import device_input, device_output, external_stream, is_device_array
from ._deps import is_installed, require
from ._gpu import check_gpu_index, parse_device
from ._quick_model import quick_session
from .base import EngineBase, TensorSpec
from .errors import EngineError, UsageProblem, first_line
from .manifest import is_float_graph, precision_of, qdq_fusion_ok, runtime_warning
from .ort_session import providers_for, session_options

log = logging.getLogger("trtc")
# tuning="off": ONNX Runtime's defaults. No CUDA graphs: captures failed beside decoder threads (docs/INTERNALS.md)
TUNED_CUDA_OPTIONS = {"cudnn_conv_algo_search": "HEURISTIC", "prefer_nhwc": "1", "fuse_conv_bias": "1"}
FUSION = "fuse_conv_bias"
TUNINGS = ("auto", "off")
FORMS = ("device", "host")
_told: set = set()  # (path, what) said once per process
_alive: "weakref.WeakSet" = weakref.WeakSet()  # engines with a quick start, stopped at exit


def _spec(arg) -> TensorSpec:
    dtype = arg.type[7:-1] if arg.type.startswith("tensor(") else arg.type
    return TensorSpec(arg.name, {"float": "float32", "double": "float64"}.get(dtype, dtype),
                      tuple(d if isinstance(d, int) else (d or "?") for d in arg.shape))


def _say_once(path, what: str, text: str) -> None:
    if (os.fspath(path), what) not in _told:
        _told.add((os.fspath(path), what))
        log.warning("%s: %s", Path(path).name, text)


def tuned_cuda_options(path, precision: dict | None = None) -> dict:
    """TUNED_CUDA_OPTIONS for a float graph (see is_float_graph), only the heuristic algorithms for a quantized one."""
    if is_float_graph(path, precision):
        return dict(TUNED_CUDA_OPTIONS)
    return {"cudnn_conv_algo_search": TUNED_CUDA_OPTIONS["cudnn_conv_algo_search"]}


def _output_shape(spec, n: int) -> tuple:
    shape = tuple(n if j == 0 and (isinstance(d, str) or d is None or d < 0) else d for j, d in enumerate(spec.shape))
    if any(not isinstance(d, int) for d in shape):
        raise EngineError(f"output {spec.name!r} has dynamic dimensions {spec.shape} besides the batch",
                          "export the model with a fixed output shape")
    return shape


def _device_run_options():
    """A device run's options: no synchronisation after it (events order it), and ``gpu_graph_id`` -1 (no graph),
    since ONNX Runtime's binding looks it up on every run and a missing key raised inside it."""
    ro = require("onnxruntime", "Running ONNX models").RunOptions()
    ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
    ro.add_run_config_entry("gpu_graph_id", "-1")
    return ro


class _QuickStart:
    """The quick start of OnnxRuntimeEngine's tuned CUDA session on device buffers. One worker thread opens the quick
    session (cuDNN's default algorithms, the depthwise copy, a stream of its own) beside the tuned session's open,
    runs it once at the first shape queued, then prepares the queued shapes on the tuned session in order, under the
    engine's lock; meanwhile device batches run on the quick session (_route). ``_cond`` owns this state."""

    def _quick_setup(self, ort, new_options, providers, form) -> None:
        import cupy as cp
        with cp.cuda.Device(self.device_id) as gpu:
            self._quick_stream = cp.cuda.Stream(non_blocking=True)
        options = {k: v for k, v in providers[0][1].items() if k not in TUNED_CUDA_OPTIONS}
        options.update(cudnn_conv_algo_search="DEFAULT", user_compute_stream=str(self._quick_stream.ptr))
        tag = f"onnxruntime {ort.__version__}, sm {gpu.compute_capability}, qdq fusion {self.qdq_fusion}, " \
              f"{sorted((k, v) for k, v in options.items() if k not in ('device_id', 'user_compute_stream'))}"
        self._quick_open = (ort, new_options, [(providers[0][0], options), *providers[1:]], tag)
        self._wanted = self._speculative = form != "host"  # held before a shape is known, until a host batch
        self._quick_run_options = _device_run_options()
        with self._cond:
            if self._wanted:
                self._queue_shape()

    def expect(self, batch=None, form: str | None = None) -> None:
        """The caller says what it will run: ``batch``, a size or a list (None: the graph's fixed batch, if any), and
        ``form``, "device" or "host" (numpy: no quick session). With quick start the tuned session prepares those
        shapes now, in order (not those with other dynamic dimensions); without it nothing runs ahead."""
        _check_expected(batch, form)
        if not self.quick_start:
            return
        first = self.inputs[0].shape[0] if self.inputs[0].shape else None
        fixed = isinstance(first, int) and first > 0  # a fixed batch is the only one the graph takes
        sizes = [first] if batch is None or fixed else [batch] if isinstance(batch, int) else list(batch)
        rest = [spec.shape[1:] for spec in self.inputs]
        with self._cond:
            for n in sizes:
                if isinstance(n, int) and n > 0 and all(isinstance(d, int) and d > 0 for r in rest for d in r):
                    self._queue_shape(tuple((n, *dims) for dims in rest))
            self._wanted = self._wanted and form != "host"
        if form == "host":
            self._let_quick_go(always=True)

    def _queue_shape(self, key=None) -> None:
        """Queue ``key`` unless prepared or queued, and wake the worker, starting it if needed (under ``_cond``)."""
        if key is not None and key not in self._ready and key not in self._queue and not self._closed:
            self._queue.append(key)
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="trtc-ort-prepare", daemon=True)
            self._worker.start()
        self._cond.notify_all()

    def _todo(self):
        """The worker's next task (under ``_cond``): stop, open_quick, warm, prepare, or None."""
        if self._closed:
            return "stop"
        if self._quick is None and self._wanted and self.quick_unavailable is None and (
                self._queue or self._speculative):
            return "open_quick"
        return ("warm" if self._unwarmed and not self._waiting else "prepare") if self._queue else None

    def _work(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._todo() or self._quick is None)  # waits holding a quick session
                todo = self._todo()
                self._busy = todo not in (None, "stop")
                if not self._busy:
                    self._worker = None
                    if todo == "stop":  # close() kept the preparation it stopped: it ended
                        self._queue.clear()
                    break
                key = self._queue[0] if self._queue else None
            getattr(self, "_" + todo)(key)
        if todo == "stop":
            self._let_quick_go(always=True)

    def _open_quick(self, key) -> None:
        """Open the quick session, kept while it has something to cover."""
        session = None
        try:
            ort, new_options, providers, tag = self._quick_open
            session = quick_session(self.path, ort, new_options, lambda o, m: self._session(ort, o, providers, m), tag)
        except Exception as exc:  # noqa: BLE001 - the tuned session then runs every batch
            self.quick_unavailable = exc
            log.warning("%s: quick start off, the first batches wait for the tuned session: its quick session did "
                        "not open (%s)", self.path.name, first_line(exc))
        with self._cond:
            if session is not None and not self._closed and self._wanted and (self._queue or self._speculative):
                self._quick, self._unwarmed = session, True

    def _warm(self, key) -> None:
        """One run of the new quick session at ``key``: its kernels load before the caller's batch."""
        with self._cond:
            session, self._unwarmed = self._quick, False
        try:
            if session is not None:
                self._run_on_zeros(key, self._quick_run_options, session)
        except Exception as exc:  # noqa: BLE001 - the caller's run meets the same problem
            log.debug("%s: warming the quick session failed: %s", self.path.name, exc)

    def _prepare(self, key) -> None:
        """One run of the tuned session at ``key`` after its enqueued work, under the engine's lock; close() stops it
        (RunOptions.terminate); a failure is left to the caller's own tuned run at ``key``."""
        def prepare():
            self._at_shapes(key)
            run_options = self._preparing = _device_run_options()
            run_options.terminate = self._closed  # a close() before these options were there to stop
            self._run_on_zeros(key, run_options)

        with self._lock:
            try:
                if not self._closed:
                    self.stream.synchronize()
                    self._unfused_if_refused(prepare)
            except Exception as exc:  # noqa: BLE001 - the caller's tuned run at this shape raises it again
                self.failed[key] = exc
                log.debug("%s: preparing the tuned session at %s failed: %s", self.path.name, key, exc)
            finally:
                self._preparing = None
                if self._closed:  # close() found the session in use: it goes now that this run has ended
                    self._let_go()
        with self._cond:
            self._queue.pop(0)
            self._ready.add(key)
            self._speculative = False
        self._let_quick_go()

    def _route(self, key):
        """The quick session for a device batch at ``key`` (its preparation queued), or None (run the tuned session):
        ``key`` is prepared and nothing is being prepared, or no quick session can come and ``key`` is prepared."""
        with self._cond:
            self._queue_shape(key)
            tuned = lambda: self._closed or key in self._ready and not (  # noqa: E731
                self._queue and self._wanted and self.quick_unavailable is None)
            self._waiting += 1  # a batch waits: a quick session opened now runs it, not a warm-up first
            self._cond.wait_for(lambda: tuned() or self._quick is not None)
            self._waiting -= 1
            if tuned():
                return None
            self.quick_runs, self._unwarmed = self.quick_runs + 1, False
            return self._quick

    def _let_quick_go(self, always: bool = False) -> None:
        """Let the quick session go when nothing is queued (``always``: even then), once its stream is idle."""
        with self._cond:
            if self._queue and not always:
                return
            retired, self._quick = self._quick, None
            self._cond.notify_all()
        if retired is not None:
            self._quick_stream.synchronize()

    def _run_on_zeros(self, key, run_options, quick=None) -> None:
        """One run (see _run) on zeros at ``key`` into new outputs, on the session's stream; wait for it."""
        import cupy as cp
        stream = self.stream if quick is None else self._quick_stream
        with cp.cuda.Device(self.device_id), stream:
            xs = [cp.zeros(shape, spec.numpy_dtype) for spec, shape in zip(self.inputs, key)]
            outs = [cp.empty(_output_shape(spec, key[0][0]), spec.numpy_dtype) for spec in self.outputs]
            self._run(self._bind((quick or self.session).io_binding(), xs, outs), run_options, quick)
            stream.synchronize()

    def _bind(self, io, xs, outs):
        """``io``, an IOBinding, bound to device arrays: ``xs`` in, ``outs`` out."""
        for spec, x in zip(self.inputs, xs):
            io.bind_input(spec.name, "cuda", self.device_id, x.dtype, tuple(x.shape), x.data.ptr)
        for spec, out in zip(self.outputs, outs):
            io.bind_output(spec.name, "cuda", self.device_id, out.dtype, tuple(out.shape), out.data.ptr)
        return io

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every queued shape is prepared and the worker idle; False after ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._queue or self._busy), timeout)


def _check_expected(batch, form) -> None:
    """expect()'s arguments: ``form`` one of FORMS (or None), ``batch`` None, a size or a list of sizes."""
    if form not in (None, *FORMS):
        raise UsageProblem(f"unknown input form {form!r}", f"use one of: {', '.join(FORMS)}")
    try:
        sizes = [batch] if batch is None or isinstance(batch, int) else list(batch)
    except TypeError:
        sizes = [batch]
    if any(n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1) for n in sizes):
        raise UsageProblem(f"batch={batch!r} is not a batch size nor a list of them",
                           "give a whole number of 1 or more, a list of them, or None")


@atexit.register
def _join_at_exit() -> None:
    """Stop every worker and wait for it (its current node) before CUDA is torn down under it."""
    for engine in list(_alive):
        engine.close_and_wait(60)


class OnnxRuntimeEngine(_QuickStart, EngineBase):
    def __init__(self, path: str | os.PathLike, device: str = "cpu", threads: int | None = None,
                 qdq_fusion: bool | None = None, device_buffers: bool | None = None, tf32: bool = True,
                 tuning: str = "auto", quick_start: bool = True, batch=None, form: str | None = None):
        """``device_buffers``: a CUDA stream of its own for zero-copy device arrays (default: on CUDA with CuPy).
        ``tf32=False``: FP32 convolutions in full FP32. ``tuning``: one of TUNINGS. ``batch``, ``form``: see expect.
        ``quick_start`` (tuned CUDA sessions on device buffers): see _QuickStart; False: the tuned session only."""
        ort = require("onnxruntime", "Running ONNX models")
        _check_expected(batch, form)  # before any session or worker thread exists
        if tuning not in TUNINGS:
            raise UsageProblem(f"unknown ONNX Runtime tuning {tuning!r}", f"use one of: {', '.join(TUNINGS)}")
        self.path, self.device, self.tuning = Path(path), device, tuning
        self._lock = threading.RLock()  # the tuned session's one owner: held by every use and by its replacement
        kind, self.device_id = parse_device(device)
        precision = precision_of(self.path)
        self.qdq_fusion = qdq_fusion_ok(precision) if qdq_fusion is None else qdq_fusion
        if qdq_fusion is None and not self.qdq_fusion and runtime_warning(precision, "onnxruntime"):
            log.warning("%s: %s", self.path.name, runtime_warning(precision, "onnxruntime"))
        on_device = kind == "cuda" and bool(device_buffers or (device_buffers is None and is_installed("cupy")))
        opts = session_options(ort, threads, self.qdq_fusion, spin=kind == "cuda")  # the CUDA EP's as measured
        providers = self._providers(kind, on_device, device_buffers, tf32, precision)
        self._binding = self._ran = self._preparing = self._quick = self._worker = self.quick_unavailable = None
        self._last_shapes, self._closed, self._busy, self._unwarmed = None, False, False, False
        self._cond, self._ready, self._queue, self.failed, self.quick_runs = threading.Condition(), set(), [], {}, 0
        self._quick_lock, self._waiting = threading.Lock(), 0
        self.quick_start = self.warms_itself = quick_start and on_device and tuning != "off"  # see engines.base
        if self.quick_start:  # first: the quick session's creation overlaps the tuned one's
            _alive.add(self)
            self._quick_setup(ort, lambda: session_options(ort, threads, self.qdq_fusion, spin=True), providers, form)
        try:
            self._reopen_with = (ort, opts, providers)
            self.session = self._session(*self._reopen_with)
        except BaseException:
            self.close()
            raise
        self.fused = kind == "cuda" and providers[0][1].get(FUSION) == "1"  # unfused on a cuDNN refusal
        self.inputs = [_spec(a) for a in self.session.get_inputs()]
        self.outputs = [_spec(a) for a in self.session.get_outputs()]
        if kind == "cuda" and precision.get("mode") == "int8":
            _say_once(self.path, "int8", "an INT8 model runs no faster than FP16 under ONNX Runtime's CUDA execution "
                                         "provider (it computes the Q/DQ pairs); INT8 pays under TensorRT: trtc "
                                         f"build {self.path.name}, or use the FP16 model here")
        self.expect(batch, form)

    def _providers(self, kind: str, on_device: bool, device_buffers, tf32: bool, precision: dict) -> list:
        """The execution providers with the CUDA EP's options; makes ``self.stream`` (None off device buffers)."""
        self.stream = None
        if kind == "cuda":  # first: without the GPU, a missing CUDA provider is not the problem to fix
            if device_buffers is not False and is_installed("cupy"):
                require("cupy", "Running ONNX models on device buffers")  # first: the check then asks CUDA
            check_gpu_index(self.device_id)
        providers = providers_for(self.device)
        if on_device:
            cp = require("cupy", "Running ONNX models on device buffers")
            with cp.cuda.Device(self.device_id):
                self.stream = cp.cuda.Stream(non_blocking=True)
            providers[0][1]["user_compute_stream"] = str(self.stream.ptr)
        if kind == "cuda" and not tf32:
            providers[0][1]["use_tf32"] = "0"
        if kind == "cuda" and self.tuning != "off":
            providers[0][1].update(tuned_cuda_options(self.path, precision))
        return providers

    def _at_shapes(self, shapes) -> None:
        """Before the tuned session runs at these shapes: after a run at others, wait for it if still on the GPU
        (cuDNN's plans are of the last shape, replaced without waiting)."""
        if self._ran is not None and self._last_shapes not in (None, shapes) and not self._ran.done:
            self._ran.synchronize()
        self._last_shapes = shapes

    def _unfused_if_refused(self, run):
        """``run()`` (the caller holds the lock), and once more on the tuned session reopened unfused (its queued work
        ended; said once) when cuDNN refused a fused convolution: known by its words, not by any error naming cuDNN."""
        try:
            return run()
        except Exception as exc:  # EngineError from _run, ORT's own types from a host run
            refused = self.fused and re.search(r"CUDNN_FE failure( \d+: \w+)?|CUDNN_STATUS_NOT_SUPPORTED",
                                               str(exc.__cause__ or exc))
            if not refused:
                raise
        ort, opts, providers = self._reopen_with
        plain = [(providers[0][0], {k: v for k, v in providers[0][1].items() if k != FUSION}), *providers[1:]]
        if self.stream is not None:
            self.stream.synchronize()
        self.session = self._session(ort, opts, plain)
        self.fused, self._reopen_with, self._binding, self._last_shapes = False, (ort, opts, plain), None, None
        with self._cond:  # shapes the fused session prepared are new to this one
            self._ready.clear()
        _say_once(self.path, "fusion", "runs its convolutions unfused: cuDNN refused a convolution fused with its "
                                       f"bias ({refused.group(0)})")
        return run()

    def _session(self, ort, opts, providers, model=None):
        """A session of ``model`` (a path or a model's bytes; default: this engine's file)."""
        try:
            return ort.InferenceSession(os.fspath(self.path) if model is None else model, sess_options=opts,
                                        providers=providers)
        except Exception as exc:  # ORT raises its own exception types for bad graphs
            raise EngineError(f"ONNX Runtime cannot load {self.path.name}: {first_line(exc)}",
                              "check the model with `trtc inspect` or re-export it") from exc

    def infer(self, batch, outputs=None, stream=None) -> list:
        """Run one batch. Host arrays in, host arrays out; device arrays in, device (CuPy) arrays out, the call
        returning once the work is enqueued (the input must stay unchanged until ``stream`` reaches this point)."""
        feeds = batch if isinstance(batch, dict) else {self.inputs[0].name: batch}
        if is_device_array(next(iter(feeds.values()))):
            return self._infer_device(feeds, outputs, stream)
        if any(spec.name not in feeds for spec in self.inputs):
            raise UsageProblem(f"no data for model input {next(s.name for s in self.inputs if s.name not in feeds)!r}")
        casted = {s.name: np.ascontiguousarray(feeds[s.name], dtype=s.numpy_dtype) for s in self.inputs}
        if self.quick_start:  # a host caller: a quick session held for no preparation goes
            with self._cond:
                self._speculative = False
            self._let_quick_go()

        def run():
            self._at_shapes(tuple(casted[spec.name].shape for spec in self.inputs))
            return self.session.run([o.name for o in self.outputs], casted)

        return self._tuned(run)

    def _infer_device(self, feeds, outputs, stream):
        if self.stream is None:
            raise UsageProblem(f"{self.path.name} is open on {self.device} without device buffers",
                               "open it with device='cuda:N' (CuPy installed) or pass numpy arrays")
        import cupy as cp
        xs = [device_input(feeds, spec) for spec in self.inputs]
        caller = external_stream(stream, self.device_id) if stream is not None else cp.cuda.get_current_stream()
        key = tuple(tuple(x.shape) for x in xs)
        quick = self._route(key) if self.quick_start else None
        own = self._quick_stream if quick is not None else self.stream
        if caller.ptr != own.ptr:
            own.wait_event(caller.record())
        results = [device_output(outputs, i, spec, _output_shape(spec, key[0][0]), own)
                   for i, spec in enumerate(self.outputs)]
        if quick is not None:
            self._run(self._bind(quick.io_binding(), xs, results), self._quick_run_options, quick)
        else:
            def run():
                self._tuned_run(xs, results, key)
                self._ran = self._ran or cp.cuda.Event(disable_timing=True)
                self._ran.record(self.stream)

            self._tuned(run)
        if caller.ptr != own.ptr:
            caller.wait_event(own.record())
        if quick is not None and self._quick is not quick:  # let go meanwhile: this reference may be the last,
            self._quick_stream.synchronize()  # and a session must not go while its kernels run
        return results

    def _tuned(self, run):
        """``run()`` under the tuned session's lock. A closed engine refuses; a close() that came while it ran (and so
        could not take the lock) is completed here: the session goes once the run has ended."""
        try:
            with self._lock:
                if self.session is None:
                    raise EngineError(f"{self.path.name}: this engine is closed", "open the model again")
                return self._unfused_if_refused(run)
        finally:
            if self._closed and self._lock.acquire(blocking=False):  # after the release: see close()
                try:
                    self._let_go()
                finally:
                    self._lock.release()

    def _tuned_run(self, xs, results, key) -> None:
        """One run of the tuned session on self.stream."""
        self._at_shapes(key)
        if self._binding is None:
            self._binding, self._run_options = self.session.io_binding(), _device_run_options()
        self._run(self._bind(self._binding, xs, results), self._run_options)

    def _run(self, io, run_options, quick=None) -> None:
        """One run of the tuned session, or of the quick session ``quick`` (one at a time: its warm-up and a batch)."""
        try:
            with self._quick_lock if quick is not None else contextlib.nullcontext():
                (quick or self.session).run_with_iobinding(io, run_options)
        except Exception as exc:  # ORT's own exception types
            raise EngineError(f"ONNX Runtime failed on {self.path.name}: {first_line(exc)}") from exc

    def close(self) -> None:
        """Let the sessions go without waiting: queued preparations are dropped, the running one stopped at its next
        node (RunOptions.terminate); a session another thread runs is let go by that thread when its run ends."""
        with self._cond:
            self._closed = True
            del self._queue[1:]
            self._cond.notify_all()
        preparing = self._preparing  # read once: the worker may clear it meanwhile (under the lock, not held here)
        if preparing is not None:
            preparing.terminate = True
        if self._lock.acquire(blocking=False):
            try:
                self._let_go()
            finally:
                self._lock.release()

    def close_and_wait(self, timeout: float) -> bool:
        """close(), then wait up to ``timeout`` s for the worker to end its current step; whether it ended."""
        self.close()
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
        return worker is None or not worker.is_alive()

    def _let_go(self) -> None:
        """Drop the tuned session and its binding (under the lock) once their queued work ended."""
        if self.stream is not None:
            self.stream.synchronize()
        self._binding, self.session = None, None
