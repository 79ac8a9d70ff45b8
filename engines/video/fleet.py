"""Live sources that come and go while one engine classifies them: the stages of the CPU path of
:func:`engines.video.classify` (a :func:`~engines.video.cpu_pipeline.decode_stage` thread per source, one
:class:`~engines.video.hub.FrameHub`, :func:`~engines.video.cpu_pipeline.infer_and_collect`) over a set of sources
that changes while it runs. `trtc serve` runs one per model and device.

    fleet = SourceFleet(engine, on_prediction=print, on_event=print)
    fleet.add("door", "rtsp://10.0.0.5/stream1", stride=5, options=LiveOptions(read_timeout=5))
    fleet.remove("door")        # its reader stops; a ``removed`` event follows its last prediction
    fleet.close()

Sources are decoded with PyAV on the host (as ``classify``'s CPU path does, on any engine). On a GPU engine,
:class:`NvdecFleet` decodes each source with NVDEC instead and hands its device frames to the stages after the
decoder of the GPU path (a :class:`~engines.video.push.FramePusher`: the preprocessing kernel into the rotating
input slots, inference, top-k on the GPU). Each source's frames stay in order; a source that is removed and added again (a changed camera) numbers its frames from 0 again, and
every prediction of the old one is delivered before the ``removed`` event that separates them. One thread (the
fleet's consumer) runs the engine and calls ``on_prediction`` and ``on_event``; only the caller's thread adds and
removes sources (one lock owns the table of readers).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from ..errors import UsageProblem
from ..preprocess import PreprocessSpec
from ..topk import TopK, resolve_k
from .cpu_pipeline import decode_stage, infer_and_collect
from .hub import FrameHub
from .live import LiveOptions, SourceEvent, join_readers, reader_started
from .orientation import check_rotate
from .pipeline import (Prediction, RunStats, _default_batch, _input_shape, _manifest_of, check_classifier,
                       label_names, model_classes, model_name)
from .sources import PyAVSource, SourceError


class _ReaderTable:
    """What both fleets keep of their sources: one reader thread per name, under one lock (only the caller's thread
    adds and removes; the consumer and result threads read a source's top_k). Subclasses set ``engine``,
    ``classes`` and ``k`` (the most classes a source may ask for)."""

    def _open_table(self) -> None:
        self._lock = threading.Lock()
        self._readers: dict[str, tuple] = {}  # name -> (thread, stop, source, top_k)

    @property
    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._readers)

    def _top_k(self, stride: int, top_k: int | None) -> int:
        """A new source's k (``top_k``, or the fleet's), refused where it is over the fleet's or ``stride`` < 1."""
        if stride < 1:
            raise UsageProblem(f"stride must be at least 1, got {stride}")
        k = self.k if top_k is None else resolve_k(top_k, self.classes, model_name(self.engine))
        if k > self.k:
            raise UsageProblem(f"top_k {k} is over the {self.k} this fleet was opened with",
                               f"open it with top_k={k} or more")
        return k

    def _taken(self, name: str) -> None:
        """Refuses a name already running (call with the lock held)."""
        if name in self._readers:
            raise UsageProblem(f"a source named {name} is already running", "remove it first, or give another name")

    def _stop_reader(self, name: str, timeout: float):
        """Take ``name`` out of the table and stop its reader, waiting up to ``timeout``: (its source, its thread,
        whether the thread outlived the wait), or None when no source of that name runs."""
        with self._lock:
            entry = self._readers.pop(name, None)
        if entry is None:
            return None
        thread, stop, src, _ = entry
        stop.set()
        return src, thread, bool(join_readers([thread], timeout))

    def top_k_of(self, name: str) -> int | None:
        with self._lock:
            entry = self._readers.get(name)
        return entry[3] if entry else None

    def source(self, name: str):
        with self._lock:
            entry = self._readers.get(name)
        return entry[2] if entry else None


class SourceFleet(_ReaderTable):
    def __init__(self, engine, *, batch: int | None = None, top_k: int | None = None, max_wait_ms: float = 100.0,
                 scores: str = "auto", on_prediction=None, on_event=None, on_problem=None, on_batch=None):
        check_classifier(engine)
        manifest = _manifest_of(engine)
        self.engine = engine
        self.spec = manifest.preprocess if manifest is not None else PreprocessSpec()
        self.labels = manifest.labels if manifest is not None else None
        self.batch = batch or _default_batch(engine, manifest)
        self.classes = model_classes(engine, manifest)
        _input_shape(engine, self.spec, "manifest" if manifest is not None else None)
        # the most classes any source may ask for; each prediction is cut to its source's own top_k
        self.topk = TopK(resolve_k(top_k, self.classes, model_name(engine)), scores)
        self.k = self.topk.k
        self.max_wait_ms = max_wait_ms
        self.dtype = engine.inputs[0].numpy_dtype
        self.on_prediction = on_prediction or (lambda p: None)
        self.on_event = on_event or (lambda e: None)
        self.on_problem = on_problem or (lambda name, reason: None)
        self.on_batch = on_batch  # callable(seconds, frames) after each inference, in the consumer thread
        self.stats = RunStats(path=f"pyav -> {type(engine).__name__} ({getattr(engine, 'device', 'cpu')})",
                              decoder="pyav")
        self.counts: dict = defaultdict(int)
        self.hub = FrameHub()
        self.hub.open_producer()  # the fleet itself: the hub does not finish while the fleet is open
        self._open_table()
        self._retiring: dict[str, threading.Thread] = {}  # removed sources' readers that outlived their join
        self._consumer = threading.Thread(target=self._consume, daemon=True, name="trtc-fleet")
        self.error: BaseException | None = None
        self._consumer.start()

    def add(self, name: str, url, *, stride: int = 1, top_k: int | None = None, options: LiveOptions | None = None,
            rotate: str = "auto", queue_frames: int | None = None) -> None:
        """Start reading ``url`` (a str, or an :class:`~engines.video.credentials.Address` whose ``url`` holds the
        user info) as source ``name``; its events and predictions carry ``name``. ``rotate``: "auto" turns its
        frames as each connection's display matrix says, 0/90/180/270 clockwise instead."""
        k = self._top_k(stride, top_k)
        options = (options or LiveOptions()).check()
        src = PyAVSource(_named(name, url), live=True, options=options, rotate=check_rotate(rotate))
        stop = threading.Event()
        earlier = self._retiring.pop(name, None)
        if earlier is not None and join_readers([earlier], 10.0):
            self._retiring[name] = earlier
            raise UsageProblem(f"the earlier reader of {name} has not stopped yet (it is inside a network call)",
                               "try again in a few seconds")
        with self._lock:
            self._taken(name)
            cap = queue_frames or options.queue_frames or max(2, self.batch)
            self.hub.add(src.name, cap, options.policy)
            thread = threading.Thread(target=decode_stage, daemon=True, name=f"trtc-decode-{name}",
                                      args=(src, self.spec, stride, self.dtype, self.hub, stop, self._problem,
                                            self.counts))
            self._readers[name] = (thread, stop, src, k)
        thread.start()
        reader_started(thread)

    def remove(self, name: str, reason: str = "removed", timeout: float = 10.0) -> bool:
        """Stop source ``name``: its reader ends (within the source's watch slice, or ``timeout``), its frames still
        waiting are dropped (counted), and an event ``reason`` follows its last prediction. False if it was not
        running; raises nothing when the reader outlives ``timeout`` (it is a daemon thread, stopped at its next
        read)."""
        stopped = self._stop_reader(name, timeout)
        if stopped is None:
            return False
        src, thread, outlived = stopped
        if outlived:
            self._retiring[name] = thread  # its next read sees the stop; a new source of this name waits for it
        dropped = self.hub.remove(src.name)
        self.stats.add_source(src, dropped=dropped)
        self.hub.event(SourceEvent(src.name, reason, time.time(), src.decoded, extra={"dropped": dropped},
                                   loud=False))
        return True

    def dropped_of(self, name: str) -> int:
        """Frames of source ``name`` dropped in the hand-over to inference (its queue was full)."""
        return self.hub.dropped.get(name, 0)

    def close(self, timeout: float = 10.0) -> None:
        """Stop every source, then the consumer (frames still waiting are dropped and counted)."""
        for name in self.names:
            self.remove(name, reason="stopped", timeout=timeout)
        self.hub.done("fleet")
        self._consumer.join(timeout)
        if self._consumer.is_alive():  # the consumer is inside an inference: the hub's close ends it after
            self.hub.close()

    def _problem(self, name, reason, frames) -> None:
        self.on_problem(name, reason)

    def _make_prediction(self, name, index, pts, t, indices, scores, latency_ms, decode_ms, received=None):
        k = self.top_k_of(name) or self.topk.k
        return Prediction(name, index, pts, t, indices[:k], scores[:k], label_names(self.labels, indices[:k]),
                          latency_ms, decode_ms, received=received)

    def _consume(self) -> None:
        start = time.perf_counter()
        try:
            engine = _Timed(self.engine, self.on_batch) if self.on_batch else self.engine
            for item in infer_and_collect(self.hub, engine, self.batch, self.topk, self.max_wait_ms, self.stats,
                                          self.counts, start, self._make_prediction):
                if isinstance(item, tuple):  # (EVENT, SourceEvent)
                    self.on_event(item[1])
                else:
                    self.on_prediction(item)
        except BaseException as exc:  # noqa: BLE001 - the owner reads it (a dead consumer classifies nothing)
            self.error = exc


class _Timed:
    """The engine as the consumer calls it, each ``infer`` timed for ``on_batch(seconds, frames)``."""

    def __init__(self, engine, on_batch):
        self.engine, self.on_batch = engine, on_batch

    def infer(self, x):
        t0 = time.perf_counter()
        out = self.engine.infer(x)
        self.on_batch(time.perf_counter() - t0, len(x))
        return out


def _named(name: str, url):
    """The source as the fleet names it: ``name``, opened at ``url`` (user info kept for the open only)."""
    from .credentials import Address

    return Address(name, getattr(url, "url", str(url)))


def open_fleet(engine, **kw):
    """The fleet for ``engine``: :class:`NvdecFleet` on a GPU engine that takes device arrays where PyNvVideoCodec
    is installed, else :class:`SourceFleet` (PyAV on the host)."""
    from .._deps import is_installed
    from .pipeline import _pick_decoder

    decoder = _pick_decoder(engine, "auto")
    if decoder == "nvdec" and is_installed("PyNvVideoCodec") and is_installed("cupy"):
        return NvdecFleet(engine, **kw)
    return SourceFleet(engine, **kw)


class NvdecFleet(_ReaderTable):
    """:class:`SourceFleet`'s interface on the GPU path: a reader thread per source decodes with NVDEC
    (:class:`~engines.video.sources.NvdecSource`, reconnecting as `trtc run`'s live sources do) and pushes each kept
    frame, NV12 on the device, into one :class:`~engines.video.push.FramePusher`; the next decode on the reader's
    stream waits for the kernel that read the frame (NVDEC reuses its surfaces). Predictions come from the pusher's
    result thread, events from the readers' threads. A source's ``removed`` event follows the predictions of every
    frame it pushed (:meth:`FramePusher.flush`), unless that takes longer than the removal's ``timeout``."""

    def __init__(self, engine, *, batch: int | None = None, top_k: int | None = None, max_wait_ms: float = 100.0,
                 scores: str = "auto", on_prediction=None, on_event=None, on_problem=None, on_batch=None):
        from .push import FramePusher

        self.engine = engine
        self.classes = model_classes(engine, _manifest_of(engine))
        self.on_prediction = on_prediction or (lambda p: None)
        self.on_event = on_event or (lambda e: None)
        self.on_problem = on_problem or (lambda name, reason: None)
        self.pusher = FramePusher(engine, batch=batch, top_k=top_k, scores=scores, max_wait_ms=max_wait_ms,
                                  format="NV12", callback=self._deliver)
        self.k = resolve_k(top_k, self.classes, model_name(engine))
        self._open_table()
        self._skipped: dict = defaultdict(int)  # frames a reader could not hand over (the pusher dropped them)

    @property
    def error(self):
        errors = self.pusher._errors
        return errors[0] if errors else None

    def add(self, name: str, url, *, stride: int = 1, top_k: int | None = None, options: LiveOptions | None = None,
            rotate: str = "auto", queue_frames: int | None = None) -> None:
        """As :meth:`SourceFleet.add`; ``rotate`` is applied by the preprocessing kernel, in the same pass."""
        from .sources import NvdecSource

        k = self._top_k(stride, top_k)
        options = (options or LiveOptions()).check()
        src = NvdecSource(_named(name, url), getattr(self.engine, "device_id", 0), live=True, options=options,
                          latency="low", rotate=check_rotate(rotate))
        stop = threading.Event()
        with self._lock:
            self._taken(name)
            thread = threading.Thread(target=self._read, args=(src, stop, stride), daemon=True,
                                      name=f"trtc-nvdec-{name}")
            self._readers[name] = (thread, stop, src, k)
        thread.start()
        reader_started(thread)

    def remove(self, name: str, reason: str = "removed", timeout: float = 10.0) -> bool:
        stopped = self._stop_reader(name, timeout)
        if stopped is None:
            return False
        src = stopped[0]
        self.pusher.flush(src.name, timeout)  # its frames pushed already are classified (or dropped) before the event
        self.on_event(SourceEvent(src.name, reason, time.time(), src.decoded,
                                  extra={"dropped": self._skipped.pop(name, 0)}, loud=False))
        return True

    def dropped_of(self, name: str) -> int:
        return self._skipped.get(name, 0)

    def close(self, timeout: float = 10.0) -> None:
        for name in self.names:
            self.remove(name, reason="stopped", timeout=timeout)
        self.pusher.close(drain=True)

    def _read(self, src, stop: threading.Event, stride: int) -> None:
        """One source's reader: NVDEC on a stream of its own; every ``stride``-th kept frame pushed."""
        import cupy as cp

        src.stop, src.on_event = stop, self.on_event
        stream = cp.cuda.Stream(non_blocking=True)

        def on_frame(index, pts, t, frame, fed_at):
            if stop.is_set():
                return False
            if index % stride:
                return True
            with stream:
                nv12 = cp.from_dlpack(frame)  # ordered after the decode on this stream (DLPack's event)
            handle = self.pusher.push(src.name, nv12, pts=pts, time=t, frame_id=index,
                                      colorspace=str(src.info.colorspace) if src.info else None, cuda_stream=stream,
                                      rotate=src.turn)  # this connection's (TurnProbe, the reader's own thread)
            event = handle.wait() if handle is not None else None
            if event is None:
                self._skipped[src.name] += 1
            else:
                stream.wait_event(event)  # the next decode into this surface after the kernel read it
            return True

        try:
            src.run(stream.ptr, on_frame)
        except SourceError as exc:
            if not stop.is_set():
                self.on_problem(src.name, str(exc))
        except Exception as exc:  # noqa: BLE001 - the other sources go on
            self.on_problem(src.name, f"{type(exc).__name__}: {exc}")

    def _deliver(self, pred) -> None:
        k = self.top_k_of(pred.source) or self.k
        if k < len(pred.indices):
            pred.indices, pred.scores = pred.indices[:k], pred.scores[:k]
            pred.labels = pred.labels[:k] if pred.labels else pred.labels
        self.on_prediction(pred)
