"""The CPU path of :func:`engines.video.classify`, one function per stage: ``decode_stage`` (PyAV and the numpy
preprocessing, a thread per source) hands frames through a :class:`~engines.video.hub.FrameHub` (files wait when
it is full; live sources drop their oldest frame, or wait under the ``block`` policy) to ``infer_and_collect``
(any engine, top-k on the host) in the caller's thread."""

from __future__ import annotations

import threading
import time

import numpy as np

from ..preprocess import preprocess_yuv
from .hub import EVENT, Closed, FrameHub
from .live import LagStats, join_readers, reader_started
from .sources import SourceError


def decode_stage(src, spec, stride, dtype, hub: FrameHub, stop: threading.Event, report_problem, counts,
                 skip_to: int = -1) -> None:
    """One source: decode with PyAV, preprocess on the host, hand over (name, index, pts, t, x, received, at,
    captured); ``captured``: a live source's :class:`~engines.video.live.Capture`, else None.
    Its own thread. Frames up to ``skip_to`` (a resumed run's last classified frame) are decoded, not classified."""
    src.stop = stop
    src.on_event = hub.event
    try:
        for index, pts, t, planes, received in src.frames():
            if stop.is_set():  # decoded after the run was left: counted, not classified
                hub.dropped[src.name] += 1
                return
            if index % stride or index <= skip_to:
                continue
            at = time.monotonic()
            captured = getattr(src, "captured", None) if src.live else None
            x = (src.preprocess(planes, spec, dtype) if hasattr(src, "preprocess")  # an image: RGB pixels
                 else preprocess_yuv(planes, spec, src.info.colorspace, dtype))
            hub.put(src.name, (src.name, index, pts, t, x, received, at, captured))
    except Closed:
        hub.dropped[src.name] += 1
        return
    except SourceError as exc:
        if not stop.is_set():
            report_problem(src.name, str(exc), counts[src.name])
    except Exception as exc:  # noqa: BLE001 - keep the other sources going
        report_problem(src.name, f"{src.name}: {type(exc).__name__}: {exc}", counts[src.name])
    finally:
        hub.done(src.name)


def queue_sizes(srcs, batch: int, live_frames: int | None) -> dict:
    """Frames each source may have waiting: files share 4 batches (as the single queue before live sources did);
    live sources share one batch (``live_frames`` each when given), so a lagging run holds at most about one
    batch of old frames."""
    n_live = sum(1 for s in srcs if s.live) or 1
    n_files = sum(1 for s in srcs if not s.live) or 1
    out = {}
    for s in srcs:
        if s.live:
            out[s.name] = live_frames or max(2, -(-batch // n_live))
        else:
            out[s.name] = max(2, -(-4 * batch // n_files))
    return out


def cpu_pipeline(srcs, engine, spec, batch, stride, topk, max_wait_ms, stats, report_problem, make_prediction,
                 done: dict | None = None, policy: str = "drop-oldest", live_frames: int | None = None,
                 events: list | None = None, yield_events: bool = False):
    """Decode threads -> host batches -> ``engine.infer`` -> top-k on the host -> Predictions (and, with
    ``yield_events``, the live sources' SourceEvents in order with them; every event is also appended to
    ``events``)."""
    done = done or {}
    dtype = engine.inputs[0].numpy_dtype
    hub = FrameHub()
    sizes = queue_sizes(srcs, batch, live_frames)
    for s in srcs:
        hub.add(s.name, sizes[s.name], policy if s.live else "block")
    stop = threading.Event()
    counts = {s.name: 0 for s in srcs}
    threads = _decode_threads(srcs, spec, stride, dtype, hub, stop, report_problem, counts, done)
    start = time.perf_counter()
    for t in threads:
        t.start()
        reader_started(t)
    left: dict = {}  # frames taken from the hub but not run when the caller stopped iterating
    try:
        for item in infer_and_collect(hub, engine, batch, topk, max_wait_ms, stats, counts, start, make_prediction,
                                      left):
            if isinstance(item, tuple):  # (EVENT, event)
                if events is not None:
                    events.append(item[1])
                if yield_events:
                    yield item[1]
            else:
                yield item
    finally:
        stop.set()
        for name, n in hub.close().items():
            left[name] = left.get(name, 0) + n
        # each notices the stop after its current frame or interrupted read (WATCH_SLICE); one inside an FFmpeg open
        # may run on until the open's timeout (the CLI then ends the process without finalizing under it)
        join_readers(threads)
        stats.seconds = time.perf_counter() - start
        stats.per_source = dict(counts)
        for src in srcs:
            stats.add_source(src, dropped=hub.dropped.get(src.name, 0) + left.get(src.name, 0))


def _decode_threads(srcs, spec, stride, dtype, hub, stop, report_problem, counts, done) -> list:
    """A decoding thread per video source; the image sources (one frame each: a folder may hold thousands) take
    turns in one thread, in the order given, so their frames come in that order."""
    def decode(batch):
        for s in batch:
            decode_stage(s, spec, stride, dtype, hub, stop, report_problem, counts, done.get(s.name, -1))
            if stop.is_set():
                return

    images = [s for s in srcs if getattr(s, "backend", None) == "image"]
    groups = [[s] for s in srcs if s not in images] + ([images] if images else [])
    return [threading.Thread(target=decode, args=(g,), daemon=True, name=f"trtc-decode-{i}")
            for i, g in enumerate(groups)]


def infer_and_collect(hub: FrameHub, engine, batch, topk, max_wait_ms, stats, counts, start, make_prediction,
                      left: dict | None = None):
    """Frames -> batches of ``batch``, or fewer once the oldest frame waiting has waited ``max_wait_ms`` (a batch's
    age is bounded, not the gap between frames), or at the end -> Predictions. An event (a live source lost or
    regained its connection) first runs what is pending, then is passed on as (EVENT, event). Frames pending when
    the caller stops iterating are counted per source in ``left``."""
    pending: list = []
    try:
        yield from _collect(hub, engine, batch, topk, max_wait_ms, stats, counts, start, make_prediction, pending)
    finally:
        if left is not None:
            for item in pending:
                left[item[0]] = left.get(item[0], 0) + 1


def _collect(hub, engine, batch, topk, max_wait_ms, stats, counts, start, make_prediction, pending: list):
    wait = max_wait_ms / 1000.0
    while True:
        deadline = pending[0][6] + wait if pending else None
        got = hub.get(deadline)
        if got is not None and got[0] == EVENT:
            got[1].say()  # here, in the caller's thread: a reader never waits on stderr
            if pending:
                chunk = pending[:]
                pending.clear()
                yield from _run(chunk, engine, topk, stats, counts, start, make_prediction, pending)
            yield got
            continue
        if got is not None:
            pending.append(got[1][1])
        if pending and (len(pending) >= batch or got is None):
            chunk = pending[:batch]
            del pending[:batch]
            yield from _run(chunk, engine, topk, stats, counts, start, make_prediction, pending)
        elif got is None and hub.finished:
            return


def _run(chunk, engine, topk, stats, counts, start, make_prediction, pending: list):
    """One batch -> its Predictions. If the caller stops iterating part-way, the rest of the batch goes back to
    ``pending`` (so the frames are counted as not delivered, never lost without a number)."""
    out = engine.infer(np.stack([c[4] for c in chunk]))[0]
    idx, sc = topk.host(out)
    now = time.time()
    stats.note_batch(len(chunk))
    rows = list(zip(chunk, idx.tolist(), sc.tolist(), strict=True))
    for n, (item, i_row, s_row) in enumerate(rows):
        name, index, pts, t, _, received, at = item[:7]
        captured = item[7] if len(item) > 7 else None  # pushed frames (push.py) carry none
        counts[name] += 1
        stats.frames += 1
        if captured is not None:  # a live source: capture -> result
            lag = stats.lag.get(name)
            if lag is None:
                lag = stats.lag[name] = LagStats()
            lag.add_capture(now, captured)
        try:
            yield make_prediction(name, index, pts, t, i_row, s_row, (now - received) * 1000.0, None, received)
        except GeneratorExit:  # the caller has prediction n and left: the rest were not delivered
            pending[:0] = chunk[n + 1:]
            raise
    stats.seconds = time.perf_counter() - start
