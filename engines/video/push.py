"""Frames an app already has -> Predictions: the runtime as a library for apps that capture their own frames.

    with FramePusher(engine, batch=32, max_wait_ms=50) as pusher:          # from any number of threads:
        pusher.push("cam1", frame, pts=pts, frame_id=n)                     # frame: NV12 / RGB / BGR, device or NumPy
        for pred in pusher.results(timeout=0):                              # or FramePusher(..., callback=fn)
            print(pred.source, pred.frame, pred.labels[0])

No decoder: the stages after it are the video pipeline's own. On a GPU engine (:class:`_GpuPusher`) a pushed
device array (CuPy, torch, anything with DLPack) is read in place by the preprocessing kernel, which writes it
into a slot of the rotating input buffers (:class:`~engines.video.gpu_pipeline.GpuBatches`: the assembler,
inference on the GPU, top-k, results to the host; the same code as ``classify``'s GPU path). On the CPU, or an
engine that takes host arrays (:class:`_HostPusher`), NumPy frames are preprocessed by the numpy reference in the
pushing thread and batched through a :class:`~engines.video.hub.FrameHub` into the CPU path's
``infer_and_collect``. Both honour ``on_lag`` as live sources do ("drop-oldest" or "block", drops counted) and
``max_wait_ms`` bounds a batch's age. The frame contract (formats, ownership, lifetime, threading): docs/PUSH.md.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import TrtcError, UsageProblem
from ..preprocess import PACKED, ColorSpace, PreprocessSpec, planes_from_surface, preprocess_packed, preprocess_yuv
from ..topk import TopK
from .live import LiveOptions
from .pipeline import (Prediction, RunStats, SourceProblem, _check_batch, _default_batch, _input_shape, _manifest_of,
                       label_names)

log = logging.getLogger("trtc")

FORMATS = ("NV12", *PACKED)
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
    if fmt is None:
        if len(shape) == 3 and shape[2] in (3, 4):
            names = "'RGB' or 'BGR'" if shape[2] == 3 else "'RGBA' or 'BGRA'"
            raise UsageProblem(f"an {tuple(shape)} frame: its channel order is not known",
                               f"say it: push(..., format={names}) (OpenCV gives BGR; PyAV, PIL, torchvision RGB)")
        fmt = "NV12"
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

    def __init__(self, engine, *, batch: int | None = None, top_k: int = 5, scores: str = "auto",
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
        manifest = _manifest_of(engine)
        spec = preprocess or (manifest.preprocess if manifest is not None else PreprocessSpec())
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
        self._lock = threading.Condition()
        self._closed = False
        self._active = 0
        self._out: queue.Queue = queue.Queue()
        self._errors: list = []  # the engine's or the pipeline's: the pusher stops
        self._callback_errors: list = []  # the app's callback's: the pusher goes on
        topk = TopK(top_k, scores)
        backend = _GpuPusher if _pushes_on_gpu(engine) else _HostPusher
        self.stats = RunStats(path=f"push -> {type(engine).__name__} ({getattr(engine, 'device', 'cpu')})",
                              decoder="push")
        self._backend = backend(self, engine, spec, size, topk, max_wait_ms, options, buffers or 4)
        self._thread = threading.Thread(target=self._deliver, daemon=True, name="trtc-push-results")
        self._thread.start()

    # ------------------------------------------------------------------------------------------ the app's calls
    def push(self, stream, frame, *, pts=None, time: float | None = None, frame_id=None,
             format: str | None = None, colorspace: str | None = None, cuda_stream=None):  # noqa: A002
        """Queue one frame of ``stream`` (any name; a new name starts a stream). ``pts``, ``time`` (seconds) and
        ``frame_id`` come back in the prediction (``pred.pts``, ``pred.time``, ``pred.frame``; without a
        ``frame_id``, the stream's push count from 0). ``cuda_stream`` (device frames): the CUDA stream that wrote
        the frame (CuPy or torch stream, or a handle; default: the thread's current CuPy stream); trtc's read
        waits for it on the GPU.

        Returns, for a device frame, a CUDA event (``cupy.cuda.Event``) recorded after trtc's kernel read the
        frame: the frame's memory may be written again once it has completed (``stream.wait_event(ev)`` or
        ``ev.synchronize()``); trtc keeps a reference to the frame until then, so dropping yours is safe. None:
        nothing of the frame is read after push returns (NumPy frames, and dropped frames). A frame of the wrong
        format or shape raises :class:`UsageProblem`; the stream and the others go on."""
        name = str(stream)
        with self._lock:
            if self._closed:
                raise UsageProblem(f"push to {name!r} after the pusher was closed", "push before close()")
            if self._errors:
                raise TrtcError(f"the pusher stopped: {self._errors[0]}", "see the first error; open a new pusher")
            st = self._streams.get(name)
            if st is None:
                st = self._streams[name] = _Stream(name)
                self._backend.add_stream(name)
            self._active += 1
        try:
            meta = (pts, time, frame_id, format or self.format, colorspace or self.colorspace)
            return self._backend.push(st, frame, meta, cuda_stream)
        finally:
            with self._lock:
                self._active -= 1
                self._lock.notify_all()

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

    def close(self, drain: bool = True) -> RunStats:
        """No more pushes. ``drain``: classify every frame queued (default), else count those not yet run as
        dropped. Waits for pushes in progress and for the results; returns the stats (``stats.dropped``,
        ``stats.decoded``: frames pushed, ``stats.per_source``: classified, per stream)."""
        with self._lock:
            if self._closed:
                return self.stats
            self._closed = True
            while self._active:
                self._lock.wait(0.5)
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
                    continue
                try:
                    self.callback(pred)
                except Exception as exc:  # noqa: BLE001 - the app's callback: raised again by close(), the run goes on
                    if not self._callback_errors:
                        log.error("the push callback raised %s: %s", type(exc).__name__, exc)
                    self._callback_errors.append(exc)
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

    def push(self, st: _Stream, frame, meta, _cuda_stream):
        pts, t, frame_id, fmt, colorspace = meta
        if not isinstance(frame, np.ndarray):
            raise UsageProblem(f"{type(self.engine).__name__} on {getattr(self.engine, 'device', 'cpu')} reads host "
                               f"memory, and this frame is a {type(frame).__name__}",
                               "push NumPy frames (cupy.asnumpy(x), tensor.cpu().numpy()), or open the engine on "
                               "the GPU")
        fmt, h, w, _pitch = frame_layout(frame.shape, frame.strides, frame.dtype, fmt)
        if fmt == "NV12":
            planes = planes_from_surface(frame, "NV12", h, w)
            x = preprocess_yuv(planes, self.spec, ColorSpace.parse(colorspace, h), self.dtype)
        else:
            x = preprocess_packed(frame, fmt, self.spec, self.dtype)
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


class _GpuPusher:
    """Device frames -> ONE preprocessing kernel each, reading the frame in place, into a slot of the rotating
    input buffers -> the video pipeline's GPU stages (:class:`~engines.video.gpu_pipeline.GpuBatches`: inference
    on the GPU, top-k, (batch, k) results to the host). Each pushing thread has its own CUDA stream for its kernels
    (as each decoder thread has), which first waits on the GPU for the frame's producer stream."""

    def __init__(self, front: FramePusher, engine, spec, size, topk, max_wait_ms, options: LiveOptions, buffers):
        from .gpu_pipeline import GpuBatches

        self.front = front
        self.gpu = GpuBatches(engine, spec, front.batch, topk, buffers, max_wait_ms, front.stats, size,
                              front.make_prediction, options.policy)
        self.cp = self.gpu.cp
        with self.cp.cuda.Device(self.gpu.device_id):
            self.gpu.open(sources=1)  # the pusher is the one writer: its close() ends the run
        self.infer = self.gpu.start_inference()
        self.local = threading.local()

    @property
    def dropped(self) -> dict:
        return self.gpu.dropped

    def add_stream(self, name: str) -> None:
        self.gpu.dropped[name] = 0
        self.gpu.counts[name] = 0

    def _writer(self):
        """This thread's CUDA stream and the event that orders it after the frame's producer."""
        w = getattr(self.local, "w", None)
        if w is None:
            cp = self.cp
            w = self.local.w = (cp.cuda.Stream(non_blocking=True), cp.cuda.Event(block=False, disable_timing=True))
        return w

    def _device_array(self, frame, stream):
        """The frame as a CuPy array on this GPU, without a copy (NumPy: uploaded, the one copy it needs)."""
        cp = self.cp
        if not isinstance(frame, cp.ndarray):
            with stream:  # DLPack's exchange orders ``stream`` after the producer's stream
                if isinstance(frame, np.ndarray):
                    frame = cp.asarray(frame)
                elif hasattr(frame, "__dlpack__") or hasattr(frame, "__cuda_array_interface__"):
                    frame = cp.from_dlpack(frame) if hasattr(frame, "__dlpack__") else cp.asarray(frame)
                else:
                    raise UsageProblem(f"cannot read a frame of type {type(frame).__name__}",
                                       "push a device array with DLPack (CuPy, torch, ...) or a NumPy array")
        if frame.device.id != self.gpu.device_id:
            raise UsageProblem(f"the frame is on GPU {frame.device.id}, the engine on GPU {self.gpu.device_id}",
                               "push frames that are on the engine's GPU")
        return frame

    def push(self, st: _Stream, frame, meta, cuda_stream):
        with self.cp.cuda.Device(self.gpu.device_id):
            return self._push(st, frame, meta, cuda_stream)

    def _push(self, st: _Stream, frame, meta, cuda_stream):
        cp, gpu = self.cp, self.gpu
        pts, t, frame_id, fmt, colorspace = meta
        stream, ready = self._writer()
        arr = self._device_array(frame, stream)
        fmt, h, w, pitch = frame_layout(arr.shape, arr.strides, arr.dtype, fmt)
        cs = ColorSpace.parse(colorspace, h) if fmt == "NV12" else ColorSpace()
        plan = gpu.pre.plan(fmt, (arr.shape[0], pitch), np.uint8, h, w, cs, gpu.dtype)
        producer = _stream_ptr(cuda_stream) if cuda_stream is not None else cp.cuda.get_current_stream().ptr
        cp.cuda.runtime.eventRecord(ready.ptr, producer)
        stream.wait_event(ready)  # on the GPU: the kernel reads the frame after its producer wrote it
        lost: list = []
        with st.lock:
            index = st.number(frame_id)
            now = time.perf_counter()
            slot = (st.name, index, pts, t, now, None, time.time(), arr)  # arr: kept until its result is out
            dropped = gpu.write(gpu.asm, gpu.pre, plan, [arr.data.ptr], [slot], stream, gpu.policy == "block",
                                lambda m, exc: lost.append(exc))
            self.front.stats.decoded[st.name] = self.front.stats.decoded.get(st.name, 0) + 1
            gpu.dropped[st.name] += dropped
        if lost:
            raise TrtcError(f"{st.name}: frame {index} lost: preprocessing failed: {type(lost[0]).__name__}: "
                            f"{lost[0]}", "check the frame's memory and the GPU's health")
        if dropped:
            return None
        released = cp.cuda.Event(block=False, disable_timing=True)
        released.record(stream)
        return released

    def predictions(self):
        with self.cp.cuda.Device(self.gpu.device_id):
            yield from self.gpu.collect_stage(self.gpu.results, self.gpu.errors, self.gpu.start)

    def close(self, drain: bool) -> None:
        if not drain:
            self.gpu.stop.set()  # inference ends after the batch it runs; frames in other buffers are dropped
        self.gpu.asm.source_done()  # the one writer is done: a partial buffer runs at once, then the run ends
        self.infer.join()

    def abort(self) -> None:
        self.gpu.stop.set()
        self.gpu.asm.halt()

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
        for name, n in gpu.dropped.items():
            if n:
                self.front.stats.dropped[name] = n
