"""Batch assembly for the GPU pipeline: decoder threads reserve runs of slots in rotating input buffers.

A decoder thread asks for as many slots as it has frames (``reserve``), fills them with one kernel launch on its
own CUDA stream, records its event and hands the run back (``commit``). A buffer is ready for inference when it
is full (or taken partial after ``max_wait`` or at the end) and every run reserved in it has been enqueued.

No host waits: a buffer that inference is still reading is reused only after the writer's stream has been told,
on the GPU, to wait for inference's "free" event (``InputBuffer.free``). A run whose launch failed is marked lost
(its metadata becomes ``None``) and still completes the buffer, so no slot is left reserved forever and no stale
row is returned as a frame.
"""

from __future__ import annotations

import threading
import time
from collections import deque


class Stopped(Exception):
    """The run was stopped (the caller left the loop or something failed)."""


class InputBuffer:
    """One (batch, 3, H, W) engine input, its slots' metadata and the events that order it between streams.
    ``layout="NHWC"``: ``data`` is a (batch, 3, H, W) view of channels_last memory, each slot (H, W, 3)."""

    def __init__(self, cp, shape, dtype, batch: int, layout: str = "NCHW"):
        if layout == "NHWC":
            c, h, w = shape
            self.data = cp.empty((batch, h, w, c), dtype).transpose(0, 3, 1, 2)
        else:
            self.data = cp.empty((batch, *shape), dtype)
        self.slot_bytes = int(self.data.nbytes // batch) if batch else 0
        # recorded by inference after it has read the buffer; writers of the next batch wait on it on the GPU
        self.free = cp.cuda.Event(block=False, disable_timing=True)
        self._make_event = lambda: cp.cuda.Event(block=False, disable_timing=True)
        self.events: dict = {}  # writer stream ptr -> its event (re-recorded for each run it writes)
        self.reset()

    def reset(self) -> None:
        self.filled = 0  # slots handed out
        self.writing = 0  # runs handed out whose launch has not been enqueued yet
        self.closed = False  # no more slots: full, or taken partial
        self.meta: list = []  # one entry per slot, None for a lost frame
        self.last_event: dict = {}  # writer stream ptr -> the event recorded after its last run here
        self.lost = 0

    def event_for(self, stream_ptr: int):
        ev = self.events.get(stream_ptr)
        if ev is None:
            ev = self.events[stream_ptr] = self._make_event()
        return ev


class SlotAssembler:
    """Hands out runs of slots in order and passes full (or timed-out) buffers to inference."""

    def __init__(self, buffers: list, batch: int):
        self.batch = batch
        self.free = deque(buffers)
        # buffers handed out, in the order they were opened: inference takes them in this order, so that the
        # frames of one source (reserved in order) come out in order even when a later buffer is finished first
        self.order: deque = deque()
        self.current: InputBuffer | None = None
        self.cond = threading.Condition()
        self.sources_live = 0
        self.first_put_at = 0.0
        self.stopped = False

    def reserve(self, metas: list, wait: bool = True):
        """Reserve up to ``len(metas)`` consecutive slots of the current buffer for these frames' metadata.

        Returns (buffer, first slot, count). The caller enqueues its writes of those slots on its stream after
        ``stream.wait_event(buffer.free)``, then calls :meth:`commit` exactly once, also when the launch failed.
        ``wait=False`` (a live source that must not wait on inference): None instead of waiting when no buffer is
        open and none is free, or when a full buffer already waits for inference (so a frame taken now would wait
        behind it and the one running: a bounded age)."""
        with self.cond:
            if not wait and self.current is None and (not self.free or self._queued() >= 1):
                return None
            while self.current is None:  # loop: another source may open a buffer while this one waits
                if self.stopped:
                    raise Stopped
                if not self.free:
                    self.cond.wait(0.1)
                    continue
                buf = self.free.popleft()
                buf.reset()
                self.current = buf
                self.order.append(buf)
                self.first_put_at = time.perf_counter()
            buf = self.current
            start = buf.filled
            m = min(len(metas), self.batch - start)
            buf.meta.extend(metas[:m])
            buf.filled += m
            buf.writing += 1
            if buf.filled == self.batch:
                buf.closed = True
                self.current = None
            if start == 0:
                self.cond.notify_all()  # starts the partial-batch clock in take()
            return buf, start, m

    def commit(self, buf: InputBuffer, start: int, m: int, stream_ptr: int, event) -> None:
        """The run [start, start+m) is enqueued; ``event`` was recorded after it on ``stream_ptr``'s stream, or
        is None when the launch failed (the run's frames are then marked lost)."""
        with self.cond:
            if event is None:
                buf.meta[start:start + m] = [None] * m
                buf.lost += m
            else:
                buf.last_event[stream_ptr] = event
            buf.writing -= 1
            if buf.closed and buf.writing == 0:
                self.cond.notify_all()

    def take(self, max_wait: float):
        """The oldest buffer once it is complete (full, or partial ``max_wait`` s after its first frame or when
        every source is done, and all its runs enqueued), or None when every source is done and nothing is left.
        Waits on the condition (reserve() notifies on a buffer's first run, commit() when one completes)."""
        with self.cond:
            while not self.stopped:
                head = self.order[0] if self.order else None
                if head is not None and head.closed:
                    if head.writing == 0:
                        return self.order.popleft()
                    self.cond.wait(0.5)  # its last runs are being enqueued; commit() notifies
                elif head is not None:  # the open buffer (only the newest can be open): time out a partial one
                    remaining = max_wait - (time.perf_counter() - self.first_put_at)
                    if self.sources_live == 0 or remaining <= 0:
                        self.current = None
                        head.closed = True
                        continue
                    self.cond.wait(remaining)
                elif self.sources_live == 0:
                    return None
                else:
                    self.cond.wait(0.5)
            return None

    def _queued(self) -> int:
        """Closed buffers that inference has not taken yet (call with the lock held)."""
        return sum(1 for b in self.order if b.closed)

    def halt(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def release(self, buf: InputBuffer) -> None:
        """Inference has enqueued its read of ``buf`` and recorded ``buf.free`` after it."""
        with self.cond:
            self.free.append(buf)
            self.cond.notify_all()

    def source_done(self) -> None:
        with self.cond:
            self.sources_live -= 1
            self.cond.notify_all()
