"""The CPU path of :func:`engines.video.classify`, one function per stage: ``decode_stage`` (PyAV and the numpy
preprocessing, a thread per source) feeds host batches to ``infer_and_collect`` (any engine, top-k on the host) in
the caller's thread."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from ..preprocess import preprocess_yuv
from .sources import SourceError

_DONE = object()


def decode_stage(src, spec, stride, dtype, q: queue.Queue, stop: threading.Event, report_problem, counts,
                 skip_to: int = -1) -> None:
    """One source: decode with PyAV, preprocess on the host, queue (name, index, pts, t, x). Its own thread.
    Frames up to ``skip_to`` (a resumed run's last classified frame) are decoded but not classified."""
    try:
        for index, pts, t, planes in src.frames():
            if stop.is_set():
                return
            if index % stride or index <= skip_to:
                continue
            q.put((src.name, index, pts, t, preprocess_yuv(planes, spec, src.info.colorspace, dtype)))
    except SourceError as exc:
        report_problem(src.name, exc.reason, counts[src.name])
    except Exception as exc:  # noqa: BLE001 - keep the other sources going
        report_problem(src.name, f"{src.name}: {type(exc).__name__}: {exc}", counts[src.name])
    finally:
        q.put(_DONE)


def cpu_pipeline(srcs, engine, spec, batch, stride, topk, max_wait_ms, stats, report_problem, make_prediction,
                 done: dict | None = None):
    """Decode threads -> host batches -> ``engine.infer`` -> top-k on the host -> Predictions."""
    done = done or {}
    dtype = engine.inputs[0].numpy_dtype
    q: queue.Queue = queue.Queue(maxsize=4 * batch)
    stop = threading.Event()
    counts = {s.name: 0 for s in srcs}
    threads = [threading.Thread(target=decode_stage, daemon=True, name=f"trtc-decode-{i}",
                                args=(s, spec, stride, dtype, q, stop, report_problem, counts, done.get(s.name, -1)))
               for i, s in enumerate(srcs)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    try:
        yield from infer_and_collect(q, len(threads), engine, batch, topk, max_wait_ms, stats, counts, start,
                                     make_prediction)
    finally:
        stop.set()
        while True:  # unblock workers stuck on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                break
        stats.seconds = time.perf_counter() - start
        stats.per_source = dict(counts)
        for src in srcs:
            stats.decoded[src.name] = stats.decoded.get(src.name, 0) + src.decoded


def infer_and_collect(q, live, engine, batch, topk, max_wait_ms, stats, counts, start, make_prediction):
    """Queued frames -> batches of ``batch`` (or fewer after ``max_wait_ms``, or at the end) -> Predictions."""
    pending: list = []
    wait = max_wait_ms / 1000.0
    while live or pending:
        item = None
        if live:
            try:
                item = q.get(timeout=wait if pending else None)
            except queue.Empty:
                item = None
        if item is _DONE:
            live -= 1
        elif item is not None:
            pending.append(item)
        if pending and (len(pending) >= batch or item is None or not live):
            chunk, pending = pending[:batch], pending[batch:]
            out = engine.infer(np.stack([c[4] for c in chunk]))[0]
            idx, sc = topk.host(out)
            stats.batches += 1
            stats.batch_sizes.append(len(chunk))
            for (name, index, pts, t, _), i_row, s_row in zip(chunk, idx.tolist(), sc.tolist(), strict=True):
                counts[name] += 1
                stats.frames += 1
                yield make_prediction(name, index, pts, t, i_row, s_row, None, None)
            stats.seconds = time.perf_counter() - start
