"""What every network sink of the service shares: a bounded queue in front, one sender thread, a disk spool behind.

A sink subclass says how to open and close its connection (``_open``, ``_close``), whether its consumer can take
messages now (``_ready``), and how to deliver a batch of them (``_deliver``: True once the consumer acknowledged
every one). The rest is here:

- ``publish(topic, message)`` never blocks: the message is queued (a full queue sends it straight to the spool);
- the sender thread owns the queue's far end and the spool's reading side. A batch goes to the consumer when it is
  ready and the spool is empty; otherwise to the spool, which the sender drains, oldest first, whenever the
  consumer is ready, before anything newer: messages reach the consumer in the order they were published;
- a batch the consumer did not acknowledge is spooled (again): delivery is at-least-once within the spool's bound;
- ``stop(timeout)`` lets the sender deliver for up to ``timeout`` s, spools the rest, in order, for the next start
  (which drains the spool first), then closes.
"""

from __future__ import annotations

import json
import queue
import threading
import time

from .spool import Spool


class SpooledSink:
    batch = 1  # messages delivered per call of _deliver
    name = "sink"
    on_delivered = None  # callable(sink name, [{"topic", "payload"}, ...]) in the sender thread, after each delivery
    on_spooled = None  # callable(sink name, {"topic", "payload"}) for each message written to the spool

    def __init__(self, spool: Spool, queue_size: int = 10000):
        self.spool = spool
        self.counts = {"published": 0, "spooled": 0, "sent_from_spool": 0, "queue_full": 0}  # under _count_lock
        self._count_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(queue_size)
        self._stop = threading.Event()
        self._deadline = float("inf")  # set by stop(): until when the queue may still go to the consumer
        self._thread = threading.Thread(target=self._send, name=f"trtc-{self.name}", daemon=True)

    # the caller's side -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._open()
        self._thread.start()

    def publish(self, topic: str, message: dict) -> None:
        """Queue ``message`` for ``topic``; never blocks (a full queue goes to the spool)."""
        record = json.dumps({"topic": self._topic(topic), "payload": message}, separators=(",", ":"))
        try:
            self._queue.put_nowait(record)
        except queue.Full:  # the sender is behind (a slow consumer): straight to disk
            self._count("queue_full")
            self._spool(record)

    def stop(self, timeout: float = 10.0) -> None:
        """Deliver what is queued for up to ``timeout`` s, the rest to the spool in order; then close."""
        self._deadline = time.monotonic() + timeout
        self._stop.set()
        self._thread.join(timeout + 30)
        self._close()

    def count(self, key: str) -> int:
        with self._count_lock:
            return self.counts[key]

    # for subclasses --------------------------------------------------------------------------------------------
    def _topic(self, topic: str) -> str:
        return topic

    def _open(self) -> None:
        pass

    def _close(self) -> None:
        pass

    def _ready(self) -> bool:
        raise NotImplementedError

    def _deliver(self, docs: list[dict]) -> bool:
        raise NotImplementedError

    # the sender thread -----------------------------------------------------------------------------------------
    def _send(self) -> None:
        while True:
            if self._stop.is_set() and (not self._ready() or time.monotonic() > self._deadline):
                self._spool_rest()
                return
            if self._ready() and self._drain_spool():
                continue  # more to drain
            records = self._take()
            if not records:
                if self._stop.is_set():
                    return
                continue
            # behind what the spool holds, or with no consumer: spooled, so that the order holds
            docs = [json.loads(r) for r in records]
            if not self._ready() or not self.spool.empty() or not self._deliver(docs):
                for record in records:
                    self._spool(record)
            else:
                self._count("published", len(records))
                self._delivered(docs)

    def _take(self) -> list[str]:
        try:
            records = [self._queue.get(timeout=0.1)]
        except queue.Empty:
            return []
        while len(records) < self.batch:
            try:
                records.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return records

    def _spool_rest(self) -> None:
        while True:  # stopping, and the consumer takes no more now: the rest to the spool, in order
            try:
                self._spool(self._queue.get_nowait())
            except queue.Empty:
                return

    def _delivered(self, docs: list[dict]) -> None:
        if self.on_delivered is not None:
            self.on_delivered(self.name, docs)

    def _count(self, key: str, n: int = 1) -> None:
        with self._count_lock:
            self.counts[key] += n

    def _spool(self, record: str) -> None:
        self.spool.put(record.encode())
        self._count("spooled")
        if self.on_spooled is not None:
            self.on_spooled(self.name, json.loads(record))

    def _drain_spool(self) -> bool:
        """Send the spool's oldest records; True when some went and more may wait."""
        records = self.spool.peek(max(self.batch, 200))
        if not records:
            return False
        for start in range(0, len(records), self.batch):
            part = [json.loads(r) for r in records[start:start + self.batch]]
            if not self._deliver(part):
                self.spool.ack(start)
                self._count("sent_from_spool", start)
                time.sleep(0.2)
                return False
            self._delivered(part)
        self.spool.ack(len(records))
        self._count("sent_from_spool", len(records))
        return True
