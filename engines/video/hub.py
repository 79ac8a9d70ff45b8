"""The hand-over between producers of frames (a thread per source) and the one thread that batches them.

Each source has its own bounded FIFO. When it is full, a source's ``put`` either waits (files, and live sources
under the ``block`` policy: nothing is lost) or drops that source's oldest waiting frame (``drop-oldest``: a live
source's reader never waits on inference; every drop is counted per source). The consumer takes frames in the
order they arrived, across sources, so no source starves another, and each source's frames stay in order.
Events (a live source lost or regained its connection) pass through the same hub, in order with the frames.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque


class Closed(Exception):
    """The consumer has gone: producers stop."""


EVENT = "event"
FRAME = "frame"


class FrameHub:
    def __init__(self):
        self.cond = threading.Condition()
        self._queues: dict[str, deque] = {}
        self._caps: dict[str, int] = {}
        self._policy: dict[str, str] = {}
        self._events: deque = deque()
        self.dropped: dict[str, int] = {}
        self.live = 0  # producers not yet done
        self._seq = itertools.count()
        self.closed = False

    def add(self, name: str, capacity: int, policy: str = "block", producer: bool = True) -> None:
        """A source's queue. ``producer=False``: the queue's frames come from a producer counted once with
        :meth:`open_producer` (an app pushing frames of many streams), so the source calls no :meth:`done`."""
        with self.cond:
            self._queues[name] = deque()
            self._caps[name] = max(1, int(capacity))
            self._policy[name] = policy
            self.dropped.setdefault(name, 0)
            self.live += int(producer)
            self.cond.notify_all()

    def open_producer(self) -> None:
        """One more producer that will call :meth:`done` when it has finished."""
        with self.cond:
            self.live += 1

    def put(self, name: str, item) -> None:
        """Queue ``item`` (a frame of source ``name``) by the source's policy. Raises :class:`Closed` when the
        consumer has gone."""
        with self.cond:
            q = self._queues.get(name)
            while q is not None and len(q) >= self._caps[name] and not self.closed:
                if self._policy[name] == "drop-oldest":
                    q.popleft()
                    self.dropped[name] += 1
                    break
                self.cond.wait(0.5)
                if self._queues.get(name) is not q:  # the source was removed while it waited
                    q = None
            if self.closed or q is None:
                raise Closed
            q.append((next(self._seq), time.monotonic(), item))
            self.cond.notify_all()

    def event(self, event) -> None:
        with self.cond:
            self._events.append((next(self._seq), event))
            self.cond.notify_all()

    def done(self, name: str) -> None:
        with self.cond:
            self.live -= 1
            self.cond.notify_all()

    def remove(self, name: str) -> int:
        """Take source ``name``'s queue out (a source removed while the others go on); its producer gets
        :class:`Closed` from then on. Returns the frames it lost in the hub: those it still had waiting and those
        its policy dropped (not classified: counted by the caller); its count starts again at 0."""
        with self.cond:
            q = self._queues.pop(name, None)
            self._caps.pop(name, None)
            self._policy.pop(name, None)
            lost = (len(q) if q else 0) + self.dropped.get(name, 0)
            self.dropped[name] = 0
            self.cond.notify_all()
            return lost

    def close(self) -> dict:
        """Stop: producers get :class:`Closed`. Returns the frames still waiting, per source (not classified: the
        caller counts them as dropped, so that no frame is lost without a number)."""
        with self.cond:
            self.closed = True
            left = {name: len(q) for name, q in self._queues.items() if q}
            for q in self._queues.values():
                q.clear()
            self.cond.notify_all()
            return left

    def waiting(self) -> int:
        with self.cond:
            return sum(len(q) for q in self._queues.values())

    def get(self, deadline: float | None):
        """The oldest waiting thing: (EVENT, event) or (FRAME, (arrived_at, item)); None when ``deadline``
        (time.monotonic()) passes first, or when every producer is done and nothing is left."""
        with self.cond:
            while True:
                best = None
                if self._events:
                    best = (self._events[0][0], None)
                for name, q in self._queues.items():
                    if q and (best is None or q[0][0] < best[0]):
                        best = (q[0][0], name)
                if best is not None:
                    name = best[1]
                    if name is None:
                        return EVENT, self._events.popleft()[1]
                    _, arrived, item = self._queues[name].popleft()
                    self.cond.notify_all()  # a blocked producer of this source may go on
                    return FRAME, (arrived, item)
                if self.live <= 0 or self.closed:
                    return None
                if deadline is None:
                    self.cond.wait(0.5)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self.cond.wait(left)

    @property
    def finished(self) -> bool:
        with self.cond:
            return (self.live <= 0 and not self._events and not any(self._queues.values())) or self.closed
