"""Results and events POSTed to an HTTP endpoint as JSON batches, with retry and back-off, without ever slowing the
caller (the queue, sender thread and spool of :class:`toolchain.serve.sink.SpooledSink`).

    sink = WebhookSink("http://127.0.0.1:8080/trtc", spool=Spool("spool/webhook"), batch=50)
    sink.start()
    sink.publish("door/result", {...})
    sink.stop()

Each POST carries a JSON array of ``{"topic": ..., "payload": ...}`` in publish order, with ``Content-Type:
application/json``. Any 2xx answer acknowledges the whole batch. Anything else (a refused connection, a timeout, a
non-2xx status) leaves it unacknowledged: it is spooled, and the sink waits before trying again, 0.5 s doubling up to
``backoff_max`` s, then sends the spool, oldest first, before anything newer. A receiver sees every message at least
once, in order (the standard library's HTTP client: no extra package).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request

from .sink import SpooledSink
from .spool import Spool

log = logging.getLogger("trtc")


class WebhookSink(SpooledSink):
    name = "webhook"

    def __init__(self, url: str, *, spool: Spool, batch: int = 50, timeout: float = 5.0, backoff_max: float = 30.0,
                 queue_size: int = 10000):
        if not url.startswith(("http://", "https://")):
            raise ValueError("the webhook URL must start with http:// or https://")
        super().__init__(spool, queue_size)
        self.url, self.batch, self.timeout, self.backoff_max = url, batch, timeout, backoff_max
        self._retry_at = 0.0  # the sender's: no POST before this (monotonic) time
        self._backoff = 0.5
        self.failures = 0  # the sender's: POSTs that were not acknowledged

    def _ready(self) -> bool:
        return time.monotonic() >= self._retry_at

    def _deliver(self, docs: list[dict]) -> bool:
        body = json.dumps(docs, separators=(",", ":")).encode()
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout):  # raises HTTPError for what is not 2xx
                ok = True
        except (urllib.error.URLError, OSError, ValueError) as exc:  # HTTPError is a URLError
            ok = False
            if self.failures == 0:
                log.warning("webhook %s did not take a batch (%s); spooling, retrying with back-off",
                            _without_userinfo(self.url), getattr(exc, "reason", exc))
        if ok:
            self._backoff, self.failures = 0.5, 0
            return True
        self.failures += 1
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.backoff_max)
        return False


def _without_userinfo(url: str) -> str:
    """``url`` without a user:password@ part (a message never carries one)."""
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"
