"""Frames an app already has -> Predictions: the runtime as a library for apps that capture their own frames.

    with FramePusher(engine, batch=32, max_wait_ms=50) as pusher:          # from any number of threads:
        pusher.push("cam1", frame, pts=pts, frame_id=n, format="NV12")      # NV12 / RGB / BGR..., device or NumPy
        for pred in pusher.results(timeout=0):                              # or FramePusher(..., callback=fn)
            print(pred.source, pred.frame, pred.labels[0])

No decoder: the stages after it are the video pipeline's own. On a GPU engine (:class:`_GpuPusher`) push only checks
a device array (CuPy, torch, anything with DLPack), notes its producer stream and queues it (no CUDA call for a CuPy
stream); one writer thread reads the frames waiting in place with ONE preprocessing kernel per group of up to 16,
which writes them into slots of the rotating input buffers (:class:`~engines.video.gpu_pipeline.GpuBatches`: the
assembler, inference on the GPU, top-k, results to the host; the same code as ``classify``'s GPU path). On the
CPU, or an engine that takes host arrays (:class:`_HostPusher`), NumPy frames are preprocessed by the numpy
reference in the pushing thread and batched through a :class:`~engines.video.hub.FrameHub` into the CPU path's
``infer_and_collect``. Both honour ``on_lag`` as live sources do ("drop-oldest" or "block", drops counted) and
``max_wait_ms`` bounds a batch's age. ``push_many`` queues several frames of one stream at once. A device frame
is read after push returns: push returns a :class:`PushHandle` that says when the frame may be written again.
The frame contract (formats, ownership, the release point, threading): docs/PUSH.md.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import TrtcError, UsageProblem
from ..preprocess import PACKED, ColorSpace, PreprocessSpec, planes_from_surface, preprocess_packed, preprocess_yuv
from ..topk import TopK, resolve_k
from .assembler import Stopped
from .live import LiveOptions
from .orientation import Orientation, pushed_turn
from .pipeline import (Prediction, RunStats, SourceProblem, _announce, _check_batch, _default_batch, _input_shape,
                       _manifest_of, check_classifier, label_names, model_classes, model_name, model_spec)

log = logging.getLogger("trtc")

FORMATS = ("NV12", *PACKED)
_AS_STORED = Orientation()  # a pushed frame without rotate=
_END = object()


@dataclass
class _Stream:
    """One pushed stream: its lock (held from numbering a frame to queueing it, so its frames stay in order) and
    the next frame number."""

    name: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_index: int = 0

    def number(self, frame_id):
        index = frame_id if frame_id is not None else self.next_index
        self.next_index += 1
        return index


def frame_layout(shape, strides, dtype, fmt: str | None) -> tuple[str, int, int, int]:
    """(format, height, width, row pitch in bytes) of a frame from its array geometry (NumPy or device arrays:
    shape, strides in bytes, dtype), or a :class:`UsageProblem` naming what is wrong and the fix."""
    if np.dtype(dtype) != np.uint8:
        raise UsageProblem(f"frames are 8-bit pixels (uint8), got {np.dtype(dtype)}",
                           "push uint8 frames (e.g. (x * 255).round().astype(uint8))")
    if fmt is None:  # no shape says its format alone: (H, W, 3) is RGB or BGR, a 2-D array NV12 or greyscale
        if len(shape) == 3 and shape[2] in (3, 4):
            names = "'RGB' or 'BGR'" if shape[2] == 3 else "'RGBA' or 'BGRA'"
            raise UsageProblem(f"an {tuple(shape)} frame: its channel order is not known",
                               f"say it: push(..., format={names}) (OpenCV gives BGR; PyAV, PIL, torchvision RGB)")
        if len(shape) == 2:
            raise UsageProblem(f"a 2-D {tuple(shape)} frame: an NV12 surface (Y rows, then UV rows) or a greyscale "
                               "picture? its format is not known",
                               "say it: push(..., format='NV12') or FramePusher(..., format='NV12') for NV12; a "
                               "greyscale picture: push np.repeat(frame[:, :, None], 3, axis=2) with format='RGB'")
        raise UsageProblem(f"a frame of shape {tuple(shape)} fits no frame format",
                           f"push (H, W, 3|4) pixels or an NV12 surface, and say its format= ({', '.join(FORMATS)})")
    fmt = fmt.upper()
    if fmt not in FORMATS:
        raise UsageProblem(f"unknown frame format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    if any(s <= 0 for s in strides):
        raise UsageProblem(f"the frame's strides {tuple(strides)} are not forward (a flipped or transposed view)",
                           "push a frame whose rows and pixels go forward in memory (e.g. a copy of it)")
    if fmt == "NV12":
        return _nv12_layout(shape, strides)
    step = PACKED[fmt][3]
    if len(shape) != 3 or shape[2] != step:
        raise UsageProblem(f"a {fmt} frame is an (H, W, {step}) array, got shape {tuple(shape)}",
                           f"push (height, width, {step}) uint8 pixels, or give the frame's format")
    if strides[2] != 1 or strides[1] != step or strides[0] < shape[1] * step:
        raise UsageProblem(f"a {fmt} frame's pixels must be packed (strides (pitch, {step}, 1)), got strides "
                           f"{tuple(strides)}", "push a view whose pixels are packed; only rows may be pitched")
    return fmt, int(shape[0]), int(shape[1]), int(strides[0])


def _nv12_layout(shape, strides) -> tuple[str, int, int, int]:
    if len(shape) != 2:
        raise UsageProblem(f"an NV12 frame is a 2-D (height * 3 / 2, width) array, got shape {tuple(shape)}",
                           "push the Y rows followed by the interleaved UV rows in one array, or give format=")
    rows, width = int(shape[0]), int(shape[1])
    if rows % 3 or (rows * 2 // 3) % 2 or width % 2 or rows < 3:
        raise UsageProblem(f"an NV12 frame of {rows} rows x {width} is not an even-sized picture (rows = height x "
                           "3 / 2, height and width even)", "push the whole surface: Y plane then UV plane")
    if strides[1] != 1 or strides[0] < width:
        raise UsageProblem(f"an NV12 frame's samples must be packed in rows (strides (pitch, 1)), got strides "
                           f"{tuple(strides)}", "push a view whose samples are packed; only rows may be pitched")
    return "NV12", rows * 2 // 3, width, int(strides[0])


class FramePusher:
    """Push frames of any number of streams, from any thread; get :class:`Prediction` objects back per stream in
    order, from :meth:`results` or ``callback(pred)`` (called in trtc's result thread).

    ``engine``: from :func:`engines.open_engine` (any engine). ``batch``: frames per inference (default: the
    manifest's optimum, at most 64). ``max_wait_ms``: a partly filled batch runs once its oldest frame waited this
    long. ``on_lag``: "drop-oldest" (a push never waits for inference; frames it cannot take are dropped and
    counted in ``stats.dropped``) or "block" (push waits; nothing is dropped). ``format``: the frames' default
    format (NV12, RGB, BGR, RGBA, BGRA). ``colorspace``: NV12 frames' matrix and range ("bt709", "bt601:full";
    default BT.709 from 720 rows, else BT.601, limited). ``buffers`` (GPU): input buffers that rotate (default 4).
    ``queue_frames`` (CPU): frames each stream may have waiting (default one batch).
    """

    def __init__(self, engine, *, batch: int | None = None, top_k: int | None = None, scores: str = "auto",
                 max_wait_ms: float = 100.0, on_lag: str = "drop-oldest", format: str | None = None,  # noqa: A002
                 colorspace: str | None = None, preprocess: PreprocessSpec | None = None,
                 labels: list[str] | None = None, buffers: int | None = None, queue_frames: int | None = None,
                 callback=None):
        options = LiveOptions(policy=on_lag, queue_frames=queue_frames).check()
        if not 0 <= max_wait_ms <= 3_600_000:  # also refuses nan
            raise UsageProblem(f"max_wait_ms must be between 0 and 3600000 (an hour), got {max_wait_ms}",
                               "e.g. max_wait_ms=100")
        if buffers is not None and buffers < 2:
            raise UsageProblem(f"at least two input buffers are needed (got {buffers})")
        if format is not None and format.upper() not in FORMATS:
            raise UsageProblem(f"unknown frame format {format!r}", f"use one of {', '.join(FORMATS)}")
        check_classifier(engine)
        manifest = _manifest_of(engine)
        spec = model_spec(engine, manifest, preprocess)
        self.labels = labels if labels is not None else (manifest.labels if manifest is not None else None)
        self.batch = batch or _default_batch(engine, manifest)
        _check_batch(engine, manifest, self.batch)
        size = _input_shape(engine, spec, "the preprocess argument" if preprocess is not None else
                            ("manifest" if manifest is not None else None))
        self.format, self.colorspace = format, colorspace
        if colorspace:
            ColorSpace.parse(colorspace)  # a bad name is refused here, once
        self.callback = callback
        self.problems: list[SourceProblem] = []
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()  # new streams, close()
        self._closed = False
        # one token per push in progress: deque.append/pop are atomic, so a push takes no lock here (close() waits
        # for the deque to empty; a push appends before it checks _closed, so close() cannot miss it)
        self._active: deque = deque()
        self._out: queue.Queue = queue.Queue()
        self._errors: list = []  # the engine's or the pipeline's: the pusher stops
        self._callback_errors: list = []  # the app's callback's: the pusher goes on
        # predictions handed on (the callback returned, or put on results()) per stream, under _handed (flush())
        self._handed_on: dict[str, int] = {}
        self._handed = threading.Condition()
        topk = TopK(resolve_k(top_k, model_classes(engine, manifest), model_name(engine)), scores)
        backend = _GpuPusher if _pushes_on_gpu(engine) else _HostPusher
        _announce(engine, self.batch, "device" if backend is _GpuPusher else "host")
        self.stats = RunStats(path=f"push -> {type(engine).__name__} ({getattr(engine, 'device', 'cpu')})",
                              decoder="push")
        self._backend = backend(self, engine, spec, size, topk, max_wait_ms, options, buffers or 4)
        self._thread = threading.Thread(target=self._deliver, daemon=True, name="trtc-push-results")
        self._thread.start()

    # ------------------------------------------------------------------------------------------ the app's calls
    def push(self, stream, frame, *, pts=None, time: float | None = None, frame_id=None,
             format: str | None = None, colorspace: str | None = None, cuda_stream=None, rotate=None):  # noqa: A002
        """Queue one frame of ``stream`` (any name; a new name starts a stream). ``pts``, ``time`` (seconds) and
        ``frame_id`` come back in the prediction (``pred.pts``, ``pred.time``, ``pred.frame``; without a
        ``frame_id``, the stream's push count from 0). ``cuda_stream`` (device frames): the CUDA stream that wrote
        the frame (CuPy or torch stream, or a handle; default: the thread's current CuPy stream); trtc's read
        waits for it on the GPU. ``rotate``: how the frame is turned to be shown, clockwise degrees (0, 90, 180,
        270) or an :class:`~engines.video.orientation.Orientation` (None: as it is); on the GPU the
        preprocessing kernel reads it turned, in the same pass.

        Returns, for a device frame on a GPU engine, a :class:`PushHandle`: the frame is read later by a kernel
        for a group of frames, and must not be written again before ``handle.done()``, or before the GPU-side
        ``your_stream.wait_event(handle.wait())`` (``wait`` blocks until that kernel is enqueued and returns the
        CUDA event recorded after it; None if the frame was dropped unread). trtc keeps a reference to the frame
        until its prediction is out, so dropping yours is safe. None: nothing of the frame is read after push
        returns (NumPy frames). A frame of the wrong format or shape raises :class:`UsageProblem`; the stream
        and the others go on."""
        meta = (pts, time, frame_id, format or self.format, colorspace or self.colorspace, pushed_turn(rotate))
        active = self._active
        active.append(None)
        try:
            st = self._stream(stream)
            return self._backend.push(st, frame, meta, cuda_stream)
        finally:
            active.pop()

    def push_many(self, stream, frames, *, pts=None, times=None, frame_ids=None,
                  format: str | None = None, colorspace: str | None = None, cuda_stream=None,  # noqa: A002
                  rotate=None) -> list:
        """Queue several frames of one ``stream`` at once, in order (cheaper per frame than ``push``: one check of
        the pusher, one producer stream, one lock). ``pts``, ``times``, ``frame_ids``: a value per frame, or None;
        ``rotate``: as for ``push``, for every frame of the call. Every frame is checked before any is queued: a bad
        one raises :class:`UsageProblem` and none of the call's frames is queued. Returns a list: what ``push``
        returns, per frame."""
        frames = list(frames)
        n = len(frames)
        cols = []
        for label, values in (("pts", pts), ("times", times), ("frame_ids", frame_ids)):
            values = [None] * n if values is None else list(values)
            if len(values) != n:
                raise UsageProblem(f"push_many got {n} frames and {len(values)} {label}", f"give one {label} value "
                                   "per frame, or none")
            cols.append(values)
        fmt, cs, turn = format or self.format, colorspace or self.colorspace, pushed_turn(rotate)
        metas = [(p, t, i, fmt, cs, turn) for p, t, i in zip(*cols, strict=True)]
        return self._call(stream, self._backend.push_many, frames, metas, cuda_stream)

    def _call(self, stream, fn, frames, metas, cuda_stream):
        """``fn(st, frames, metas, cuda_stream)`` for the stream named ``stream``, counted as a push in progress
        (close() waits for it)."""
        self._active.append(None)
        try:
            return fn(self._stream(stream), frames, metas, cuda_stream)
        finally:
            self._active.pop()

    def _stream(self, stream) -> _Stream:
        """The stream named ``stream`` (made on its first push), or the reason no push is taken now. Call with a
        token in ``_active``."""
        if self._closed:
            raise UsageProblem(f"push to {str(stream)!r} after the pusher was closed", "push before close()")
        if self._errors:
            raise TrtcError(f"the pusher stopped: {self._errors[0]}", "see the first error; open a new pusher")
        name = stream if type(stream) is str else str(stream)
        st = self._streams.get(name)
        if st is None:
            with self._lock:
                st = self._streams.get(name)
                if st is None:
                    self._backend.add_stream(name)  # before the stream is seen: its counters exist
                    st = self._streams[name] = _Stream(name)
        return st

    def results(self, timeout: float | None = None):
        """Predictions as they come (each stream's in order) until the pusher is closed and every frame is out.
        ``timeout``: stop when none comes for this many seconds (0: only those ready now)."""
        if self.callback is not None:
            raise UsageProblem("this pusher hands its predictions to its callback", "iterate results() or give a "
                               "callback, not both")
        while True:
            try:
                item = self._out.get(timeout=timeout)
            except queue.Empty:
                return
            if item is _END:
                self._out.put(_END)  # for any other iterator
                self._raise_error()
                return
            yield item

    def flush(self, stream, timeout: float | None = None) -> bool:
        """Wait until every frame pushed to ``stream`` so far has had its prediction handed on (the callback
        returned, or it is on :meth:`results`' queue) or was dropped; the stream stays open. True when so, False
        at ``timeout`` seconds (None: no bound) or when the pusher stopped (its first error is raised by close())."""
        name = stream if type(stream) is str else str(stream)
        pushed = self.stats.decoded.get(name, 0)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._handed:
            while self._handed_on.get(name, 0) + self._backend.dropped.get(name, 0) < pushed:
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or self._errors:
                    return False
                # a drop is counted outside this lock: look again at least every 50 ms
                self._handed.wait(0.05 if left is None else min(left, 0.05))
        return True

    def close(self, drain: bool = True) -> RunStats:
        """No more pushes. ``drain``: classify every frame queued (default), else count those not yet run as
        dropped. Waits for pushes in progress and for the results; returns the stats (``stats.dropped``,
        ``stats.decoded``: frames pushed, ``stats.per_source``: classified, per stream)."""
        with self._lock:
            if self._closed:
                return self.stats
            self._closed = True
        while self._active:  # pushes in progress (each appended its token before it looked at _closed)
            time.sleep(0.001)
        self._backend.close(drain)
        self._thread.join()
        self._backend.settle()
        if self._callback_errors:
            raise self._callback_errors[0]
        if self.callback is not None:
            self._raise_error()
        return self.stats

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(drain=exc_type is None)
        return False

    @property
    def dropped(self) -> dict:
        return dict(self._backend.dropped)

    # -------------------------------------------------------------------------------------------- trtc's side
    def _deliver(self) -> None:
        """The result thread: the backend's predictions to the callback or the results() queue."""
        try:
            for pred in self._backend.predictions():
                if self.callback is None:
                    self._out.put(pred)
                else:
                    try:
                        self.callback(pred)
                    except Exception as exc:  # noqa: BLE001 - the app's callback: raised again by close(); it goes on
                        if not self._callback_errors:
                            log.error("the push callback raised %s: %s", type(exc).__name__, exc)
                        self._callback_errors.append(exc)
                with self._handed:
                    self._handed_on[pred.source] = self._handed_on.get(pred.source, 0) + 1
                    self._handed.notify_all()
        except BaseException as exc:  # noqa: BLE001 - the engine failed: pushes and results() say so
            self._errors.append(exc)
            self._backend.abort()
        finally:
            self._out.put(_END)

    def _raise_error(self) -> None:
        if self._errors:
            exc = self._errors[0]
            raise exc if isinstance(exc, TrtcError) else TrtcError(
                f"classifying pushed frames failed: {type(exc).__name__}: {exc}", "see the error above") from exc

    def make_prediction(self, name, index, pts, t, indices, scores, latency_ms, decode_ms, received=None):
        return Prediction(name, index, pts, t, indices, scores, label_names(self.labels, indices), latency_ms,
                          decode_ms, received=received)


def _pushes_on_gpu(engine) -> bool:
    """Device frames go straight into the engine's input when it runs on a GPU and takes device arrays."""
    from .._deps import is_installed

    on_gpu = str(getattr(engine, "device", "cpu")).startswith("cuda")
    return on_gpu and not getattr(engine, "host_arrays_only", False) and is_installed("cupy")


class _HostPusher:
    """NumPy frames -> the numpy preprocessing in the pushing thread -> a FrameHub (a queue per stream, the live
    policy) -> the CPU path's ``infer_and_collect`` (batches, ``max_wait_ms``, any engine, top-k on the host)."""

    def __init__(self, front: FramePusher, engine, spec, size, topk, max_wait_ms, options: LiveOptions, _buffers):
        from .cpu_pipeline import infer_and_collect
        from .hub import FrameHub

        self.front, self.engine, self.spec, self.options = front, engine, spec, options
        self.dtype = engine.inputs[0].numpy_dtype
        self.hub = FrameHub()
        self.hub.open_producer()  # the pusher: done at close()
        self.counts: dict = {}
        self.left: dict = {}  # frames taken for a batch but not run when the run stopped
        self.start = time.perf_counter()
        self._run = infer_and_collect(self.hub, engine, front.batch, topk, max_wait_ms, front.stats, self.counts,
                                      self.start, front.make_prediction, self.left)

    @property
    def dropped(self) -> dict:
        return self.hub.dropped

    def add_stream(self, name: str) -> None:
        cap = self.options.queue_frames or max(2, self.front.batch)
        self.hub.add(name, cap, self.options.policy, producer=False)
        self.counts[name] = 0

    def _check(self, frame, meta):
        """(format, height, width) of a NumPy frame, or the UsageProblem that refuses it."""
        if not isinstance(frame, np.ndarray):
            raise UsageProblem(f"{type(self.engine).__name__} on {getattr(self.engine, 'device', 'cpu')} reads host "
                               f"memory, and this frame is a {type(frame).__name__}",
                               "push NumPy frames (cupy.asnumpy(x), tensor.cpu().numpy()), or open the engine on "
                               "the GPU")
        return frame_layout(frame.shape, frame.strides, frame.dtype, meta[3])[:3]

    def push(self, st: _Stream, frame, meta, _cuda_stream):
        pts, t, frame_id, _fmt, colorspace, turn = meta
        fmt, h, w = self._check(frame, meta)
        turn = turn or _AS_STORED
        if fmt == "NV12":
            planes = turn.apply(planes_from_surface(frame, "NV12", h, w))
            x = preprocess_yuv(planes, self.spec, ColorSpace.parse(colorspace, h), self.dtype)
        else:
            x = preprocess_packed(turn.plane(frame), fmt, self.spec, self.dtype)
        from .hub import Closed

        received = time.time()
        with st.lock:
            index = st.number(frame_id)
            self.front.stats.decoded[st.name] = self.front.stats.decoded.get(st.name, 0) + 1
            try:
                self.hub.put(st.name, (st.name, index, pts, t, x, received, time.monotonic()))
            except Closed:
                self.hub.dropped[st.name] += 1
                raise TrtcError("the pusher stopped while this frame waited (counted as dropped)",
                                "see the pusher's first error") from None
        return None

    def push_many(self, st: _Stream, frames, metas, cuda_stream) -> list:
        for frame, meta in zip(frames, metas, strict=True):  # every frame checked before any is queued
            self._check(frame, meta)
        return [self.push(st, frame, meta, cuda_stream) for frame, meta in zip(frames, metas, strict=True)]

    def predictions(self):
        yield from self._run

    def close(self, drain: bool) -> None:
        if drain:
            self.hub.done("push")
        else:
            for name, n in self.hub.close().items():
                self.left[name] = self.left.get(name, 0) + n

    def abort(self) -> None:
        for name, n in self.hub.close().items():
            self.left[name] = self.left.get(name, 0) + n

    def settle(self) -> None:
        stats = self.front.stats
        stats.seconds = time.perf_counter() - self.start
        stats.per_source = dict(self.counts)
        for name, n in self.hub.dropped.items():
            if n + self.left.get(name, 0):
                stats.dropped[name] = n + self.left.get(name, 0)


def _stream_ptr(stream) -> int:
    """A CUDA stream's handle from a CuPy stream (``.ptr``), a torch stream (``.cuda_stream``) or an int."""
    for attr in ("ptr", "cuda_stream"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    if isinstance(stream, int):
        return stream
    raise UsageProblem(f"cuda_stream must be a CUDA stream (CuPy, torch) or its handle, got {type(stream).__name__}")


class PushHandle:
    """The release point of one pushed device frame, returned by :meth:`FramePusher.push` (a list of them by
    ``push_many``). The frame is read by a preprocessing kernel that trtc's writer thread enqueues for a group of
    frames shortly after the push; until then the frame must not be overwritten.

    ``wait(timeout=None)``: blocks the host until that kernel is enqueued; returns its CUDA event (recorded right
    after the kernel), or None when the frame was dropped unread. ``event``: that event, None until then.
    ``done()``: the frame will not be read again (its kernel has finished on the GPU, or it was dropped) - the
    frame's memory may be written. ``synchronize()``: wait() and then the event, on the host. GPU-side, without a
    host wait on the GPU: ``ev = h.wait(); if ev is not None: your_stream.wait_event(ev)`` before the write."""

    __slots__ = ("event", "state", "_cond")

    def __init__(self, cond):
        self.event = None
        self.state = _PENDING
        self._cond = cond

    def enqueued(self) -> bool:
        """True once the frame's kernel is enqueued (``event`` is set) or the frame was dropped unread."""
        return self.state != _PENDING

    def dropped(self) -> bool:
        return self.state == _DROPPED

    def wait(self, timeout: float | None = None):
        if self.state == _PENDING:
            with self._cond:
                if not self._cond.wait_for(lambda: self.state != _PENDING, timeout):
                    raise TrtcError(f"the frame's kernel was not enqueued within {timeout} s",
                                    "wait longer, or check that the pusher is running (pusher.stats)")
        return self.event

    def done(self) -> bool:
        return self.state == _DROPPED or (self.state == _ENQUEUED and bool(self.event.done))

    def synchronize(self) -> None:
        ev = self.wait()
        if ev is not None:
            ev.synchronize()

    def _settle(self, state, event=None) -> None:  # the writer's side (call with the pusher's lock held)
        self.event, self.state = event, state


_PENDING, _ENQUEUED, _DROPPED = 0, 1, 2
_PER_THREAD_STREAM = 2  # cudaStreamPerThread: a different stream in each thread
# the legacy default stream: CuPy's Stream.null (handle 0) and cudaStreamLegacy (1). One per device, shared by every
# thread, so the writer (on the engine's GPU) may record on it; CuPy gives its singleton device_id -1
_LEGACY_STREAMS = (0, 1)


@dataclass
class _Kind:
    """What a frame's geometry decides, looked up once per (shape, strides, dtype, format, colour space)."""

    plan: object
    height: int


class _FrameReader:
    """A pushed frame made an item for the pusher's queue, on the caller's thread: taken as a CuPy array (uploaded, or
    through DLPack on this thread's import stream), checked to be on the engine's GPU, its geometry's launch plan
    looked up in a cache (made once per shape, strides, dtype, format and colour space)."""

    def __init__(self, cp, gpu):
        self.cp, self.gpu = cp, gpu
        self.kinds: dict = {}  # (shape, strides, dtype, format, colour space) -> _Kind
        self.local = threading.local()
        self.ndarray = cp.ndarray

    def item(self, frame, meta) -> tuple:
        """((array, pointer, launch plan, pts, time, frame_id, host), imported) for one frame, or the
        UsageProblem that refuses it. ``host``: None for a CuPy array, True for an uploaded NumPy frame, False for
        one taken through DLPack; ``imported``: on this thread's import stream."""
        pts, t, frame_id, fmt, colorspace, turn = meta
        if type(frame) is self.ndarray:
            arr, host = frame, None
        else:
            arr, host = self._import(frame)
        data = arr.data
        if data.device_id != self.gpu.device_id:
            raise UsageProblem(f"the frame is on GPU {data.device_id}, the engine on GPU {self.gpu.device_id}",
                               "push frames that are on the engine's GPU")
        key = (arr.shape, arr.strides, arr.dtype, fmt, colorspace, turn)
        kind = self.kinds.get(key) or self._kind(arr, fmt, colorspace, turn, key)
        return (arr, data.ptr, kind.plan, pts, t, frame_id, host), host is not None

    def _kind(self, arr, fmt, colorspace, turn, key) -> _Kind:
        fmt, h, w, pitch = frame_layout(arr.shape, arr.strides, arr.dtype, fmt)
        cs = ColorSpace.parse(colorspace, h) if fmt == "NV12" else ColorSpace()
        gpu = self.gpu
        with self.cp.cuda.Device(gpu.device_id):
            plan = gpu.pre.plan(fmt, (arr.shape[0], pitch), np.uint8, h, w, cs, gpu.dtype, turn)
        kind = self.kinds[key] = _Kind(plan, h)
        return kind

    def import_stream(self):
        """This thread's import stream (made on its first use): uploads and DLPack exchanges are ordered on it."""
        s = getattr(self.local, "stream", None)
        if s is None:
            with self.cp.cuda.Device(self.gpu.device_id):
                s = self.local.stream = self.cp.cuda.Stream(non_blocking=True)
        return s

    def _import(self, frame):
        """(device array, True) for a NumPy frame uploaded, (device array, False) for another library's device
        array taken through DLPack without a copy, on this thread's import stream, which the writer then waits
        for (DLPack's exchange orders that stream after the stream the frame was written on)."""
        cp = self.cp
        with cp.cuda.Device(self.gpu.device_id), self.import_stream():
            if isinstance(frame, np.ndarray):
                return cp.asarray(frame), True
            if hasattr(frame, "__dlpack__"):
                return cp.from_dlpack(frame), False
            if hasattr(frame, "__cuda_array_interface__"):
                return cp.asarray(frame), False
        raise UsageProblem(f"cannot read a frame of type {type(frame).__name__}",
                           "push a device array with DLPack (CuPy, torch, ...) or a NumPy array")


class _GpuPusher:
    """Device frames -> a queue (the caller's thread: checks from a cache, the frame's producer stream noted (or, for a
    stream trtc cannot record on later, an event recorded on it), numbering; no kernel) -> ONE writer thread that
    takes every frame waiting and enqueues ONE preprocessing kernel per run of up to MAX_FRAMES_PER_LAUNCH frames of
    one geometry (any streams) into consecutive slots of the rotating input buffers, reading the frames in place,
    then one release event for the group -> the video pipeline's GPU stages
    (:class:`~engines.video.gpu_pipeline.GpuBatches`: inference on the GPU, top-k, (batch, k) results to the host).
    The writer's stream first waits, on the GPU, for each producer stream of the group: an event the writer records
    on it then (everything enqueued there up to the group, which includes all before each push), or the event its
    push recorded. Order: one queue, numbered under its lock, slots taken in queue order."""

    def __init__(self, front: FramePusher, engine, spec, size, topk, max_wait_ms, options: LiveOptions, buffers):
        from ..preprocess import MAX_FRAMES_PER_LAUNCH
        from .gpu_pipeline import GpuBatches

        self.front, self.group = front, MAX_FRAMES_PER_LAUNCH
        self.gpu = GpuBatches(engine, spec, front.batch, topk, buffers, max_wait_ms, front.stats, size,
                              front.make_prediction, options.policy)
        self.cp = cp = self.gpu.cp
        self.block = options.policy == "block"
        # frames waiting for the writer: drop-oldest drops the oldest beyond this, block waits for room
        self.cap = options.queue_frames or max(front.batch, 2 * MAX_FRAMES_PER_LAUNCH)
        self.pending: deque = deque()
        self.lock = threading.Lock()
        self.work, self.room, self.launched = (threading.Condition(self.lock) for _ in range(3))
        self.closing = self.idle = False
        self.ready: dict = {}  # producer stream ptr -> the event re-recorded on it at each push (eager producers)
        self.frames = _FrameReader(cp, self.gpu)
        self.stream_type = cp.cuda.Stream
        with cp.cuda.Device(self.gpu.device_id):
            self.gpu.open(sources=1)  # the writer is the one source: close() ends the run
            self.stream = cp.cuda.Stream(non_blocking=True)
            # recorded by the writer on each lazy producer of a group, then waited for (one event serves them all:
            # a stream's wait takes the event's state at the wait call)
            self.sync_event = cp.cuda.Event(block=False, disable_timing=True)
            try:  # CuPy >= 10 names the device: no device switch per push
                cp.cuda.get_current_stream(self.gpu.device_id)
                self.current_stream = cp.cuda.get_current_stream
            except TypeError:
                self.current_stream = self._current_stream_switching
        self.infer = self.gpu.start_inference()
        self.writer = threading.Thread(target=self._write_loop, daemon=True, name="trtc-push-writer")
        self.writer.start()

    @property
    def dropped(self) -> dict:
        return self.gpu.dropped

    def add_stream(self, name: str) -> None:
        self.gpu.dropped[name] = 0
        self.gpu.counts[name] = 0

    # --------------------------------------------------------------------------------- the caller's thread
    def push(self, st: _Stream, frame, meta, cuda_stream):
        item, imported = self.frames.item(frame, meta)
        return self._enqueue(st, (item,), self._syncs(cuda_stream, imported))[0]

    def push_many(self, st: _Stream, frames, metas, cuda_stream) -> list:
        """Check every frame (a dict hit per frame of a known geometry), order trtc's reads after the producer,
        queue them; returns a PushHandle per device frame (None for NumPy frames, uploaded already)."""
        items, imported = [], False
        for frame, meta in zip(frames, metas, strict=True):
            item, imp = self.frames.item(frame, meta)
            items.append(item)
            imported = imported or imp
        if not items:
            return []
        return self._enqueue(st, items, self._syncs(cuda_stream, imported))

    def _syncs(self, cuda_stream, imported: bool) -> tuple:
        """What the writer's stream waits for before it reads these frames: per producer, either the producer's
        CuPy stream itself, or CuPy's null stream (lazy: the writer records its event there once per group, so a
        push makes no CUDA call) or an event recorded on it now (eager: a handle, a torch stream, CuPy's
        per-thread default stream, an external stream, a stream of another GPU: streams trtc cannot keep alive
        or record on from its writer thread)."""
        if cuda_stream is None:
            s = self.current_stream(self.gpu.device_id)
        elif type(cuda_stream) is self.stream_type:
            s = cuda_stream
        else:
            s = None
        if s is not None and type(s) is self.stream_type and (s.ptr in _LEGACY_STREAMS or (
                s.ptr != _PER_THREAD_STREAM and getattr(s, "device_id", self.gpu.device_id) == self.gpu.device_id)):
            producer = s  # the item keeps the stream object alive until the writer recorded on it
        else:
            ptr = s.ptr if s is not None else _stream_ptr(cuda_stream)
            producer = self.ready.get(ptr) or self._ready_event(ptr)
            self.cp.cuda.runtime.eventRecord(producer.ptr, ptr)
        if imported:  # this thread's import stream (ours): after the upload, or DLPack's wait on the producer
            return producer, self.frames.import_stream()
        return (producer,)

    def _enqueue(self, st: _Stream, items, syncs) -> list:
        handles = []
        now, received = time.perf_counter(), time.time()
        decoded, pending, cap, stop = self.front.stats.decoded, self.pending, self.cap, self.gpu.stop
        with self.lock:
            for arr, ptr, plan, pts, t, frame_id, host in items:
                while self.block and len(pending) >= cap and not stop.is_set():
                    self.room.wait()
                if stop.is_set():
                    raise TrtcError("the pusher stopped while this frame waited for room",
                                    "see the pusher's first error")
                index = st.number(frame_id)
                decoded[st.name] = decoded.get(st.name, 0) + 1
                if len(pending) >= cap:  # drop-oldest: the oldest waiting frame makes room
                    self._drop(pending.popleft())
                h = PushHandle(self.launched)
                slot = (st.name, index, pts, t, now, None, received, arr)  # arr: kept until its result is out
                pending.append((ptr, plan, slot, syncs, h))
                handles.append(h if not host else None)  # host: an uploaded NumPy frame, read already
            if self.idle:
                self.idle = False  # one wake-up, however many pushes come before the writer runs
                self.work.notify()
        return handles

    def _drop(self, item) -> None:
        """A queued frame that will not be read (call with the lock held): counted, its handle settled."""
        name = item[2][0]
        self.gpu.dropped[name] = self.gpu.dropped.get(name, 0) + 1
        item[4]._settle(_DROPPED)
        self.launched.notify_all()  # an app thread may wait on its handle

    def _current_stream_switching(self, device_id: int):
        with self.cp.cuda.Device(device_id):
            return self.cp.cuda.get_current_stream()

    def _ready_event(self, producer: int):
        with self.lock, self.cp.cuda.Device(self.gpu.device_id):
            ev = self.ready.get(producer)
            if ev is None:
                ev = self.ready[producer] = self.cp.cuda.Event(block=False, disable_timing=True)
            return ev

    # ----------------------------------------------------------------------------------------- the writer
    def _write_loop(self) -> None:
        """Take every frame waiting, write them (:meth:`_write_group`), until closed and nothing waits. Runs in
        its own thread, on the engine's GPU."""
        try:
            with self.cp.cuda.Device(self.gpu.device_id):
                while True:
                    with self.lock:
                        while not self.pending and not self.closing:
                            self.idle = True
                            self.work.wait()
                        self.idle = False
                        if not self.pending:
                            return
                        group = list(self.pending)
                        self.pending.clear()
                        self.room.notify_all()
                    self._write_group(group)
        except BaseException as exc:  # noqa: BLE001 - the pusher stops; push, results() and close() say why
            self.front._errors.append(exc)
            self.abort()
            with self.lock:
                while self.pending:
                    self._drop(self.pending.popleft())

    def _write_group(self, group: list) -> None:
        """Frames taken from the queue, in order: the writer's stream waits for their producers' events, then
        ONE kernel per run of up to MAX_FRAMES_PER_LAUNCH frames of one plan into consecutive slots, then ONE
        release event after them all, handed to every frame's handle."""
        stream, stream_type, ev = self.stream, self.stream_type, self.sync_event
        for sync in {sync.ptr: sync for item in group for sync in item[3]}.values():
            if type(sync) is stream_type:  # a lazy producer: everything enqueued on it so far
                ev.record(sync)
                stream.wait_event(ev)
            else:
                stream.wait_event(sync)
        written, failed, start = [], [], 0
        while start < len(group):
            plan, end = group[start][1], start + 1
            while end < len(group) and group[end][1] is plan:
                end += 1
            self._write_run(group[start:end], written, failed)
            start = end
        release = None
        if written:
            release = self.cp.cuda.Event(block=False, disable_timing=True)
            release.record(stream)
        with self.lock:
            for item in written:
                item[4]._settle(_ENQUEUED, release)
            for item in group:
                if item[4].state == _PENDING:  # no slot (drop-oldest), stopped, or its launch failed
                    self._drop(item)
            self.launched.notify_all()
        if failed:
            self._report(failed)

    def _write_run(self, run: list, written: list, failed: list) -> None:
        """Frames of one plan into the next free slots: ONE kernel per run of consecutive slots (at most
        MAX_FRAMES_PER_LAUNCH), after the buffer's "free" event. Frames that find no slot are left out of
        ``written`` (the caller drops them); a failed launch's frames go to ``failed`` and their slots are lost."""
        gpu, stream, pos = self.gpu, self.stream, 0
        while pos < len(run):
            try:
                got = gpu.asm.reserve([item[2] for item in run[pos:pos + self.group]], wait=self.block)
            except Stopped:
                return
            if got is None:
                return
            buf, start, m = got
            part, ev = run[pos:pos + m], None
            try:
                stream.wait_event(buf.free)  # inference has read this buffer's previous batch (GPU-side wait)
                gpu.pre.launch(run[pos][1], [item[0] for item in part], buf.data.data.ptr + start * buf.slot_bytes,
                               stream)
                ev = buf.event_for(stream.ptr)
                ev.record(stream)
                written.extend(part)
            except Exception as exc:  # noqa: BLE001 - these frames are lost (counted), the writer goes on
                failed.append((part, exc))
                ev = None
            finally:
                gpu.asm.commit(buf, start, m, stream.ptr, ev)
            pos += m

    def _report(self, failed: list) -> None:
        for part, exc in failed:
            names = sorted({item[2][0] for item in part})
            reason = (f"{len(part)} frame(s) of {', '.join(names)} lost: preprocessing failed: "
                      f"{type(exc).__name__}: {exc} (counted as dropped)")
            log.error("%s", reason)
            self.front.problems.append(SourceProblem(names[0], reason, self.gpu.counts.get(names[0], 0)))

    # ------------------------------------------------------------------------------------------ the run
    def predictions(self):
        with self.cp.cuda.Device(self.gpu.device_id):
            yield from self.gpu.collect_stage(self.gpu.results, self.gpu.errors, self.gpu.start)

    def close(self, drain: bool) -> None:
        """``drain``: the writer writes every frame queued, then the last partial buffer runs. Else what waits is
        dropped (counted) and the run stops after the batch inference runs now."""
        with self.lock:
            self.closing = True
            if not drain:
                self.gpu.stop.set()
                while self.pending:
                    self._drop(self.pending.popleft())
            self.work.notify_all()
            self.room.notify_all()
        if not drain:
            self.gpu.asm.halt()  # a writer waiting for a slot gives up; buffers not taken are counted by settle
        self.writer.join()
        self.gpu.asm.source_done()  # the one writer is done: a partial buffer runs at once, then the run ends
        self.infer.join()

    def abort(self) -> None:
        self.gpu.stop.set()
        self.gpu.asm.halt()
        with self.lock:
            self.room.notify_all()
            self.launched.notify_all()

    def settle(self) -> None:
        gpu = self.gpu
        with self.cp.cuda.Device(gpu.device_id):
            self.cp.cuda.Device().synchronize()  # kernels still reading frames end before the frames are let go
        for buf in list(gpu.asm.order):  # buffers inference never took (close without drain, or a failure)
            for m in buf.meta:
                if m is not None:
                    gpu.dropped[m[0]] = gpu.dropped.get(m[0], 0) + 1
            buf.meta = []
        gpu.asm.order.clear()
        with self.cp.cuda.Device(gpu.device_id):
            gpu.shutdown([self.infer])
        if self.front._errors:  # the batch inference failed on is gone with its frames: they were not classified
            for name, n in self.front.stats.decoded.items():
                lost = n - gpu.counts.get(name, 0) - gpu.dropped.get(name, 0)
                if lost > 0:
                    gpu.dropped[name] = gpu.dropped.get(name, 0) + lost
        for name, n in gpu.dropped.items():
            if n:
                self.front.stats.dropped[name] = n
