"""Live sources: network cameras and streams that never "finish" the way a file does.

A source is live when it is a network URL (rtsp://, rtmp://, srt://, udp://, http(s)://, ...) or when the caller
says so (``classify(..., live=True)``, ``trtc run --live``). A live source differs from a file in four ways:

- **It reconnects.** A connection that fails or ends is retried with exponential back-off (``backoff_first`` s,
  doubling, at most ``backoff_max`` s) until ``reconnect_for`` seconds have passed without a frame (or
  ``reconnect_attempts`` attempts were made); each outage and recovery is a :class:`SourceEvent`. A live source
  that is given up on is a failure of that source, never a normal end.
- **Its reading never waits on inference.** Frames are received and decoded in the source's own thread and handed
  over through a small per-source queue; when inference lags, the policy says what happens: ``drop-oldest``
  (default: the oldest waiting frame of that source is dropped, and counted) or ``block`` (nothing is dropped; the
  reader waits, as for a recording, and the network may drop instead).
- **Its timestamps are the stream's own** (pts x time base, the first frame included), and each frame carries the
  wall-clock time it was received.
- **Its network options are stated**: RTSP over TCP (default) or UDP, an open timeout and a read timeout.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..errors import first_line

NETWORK_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "srt", "udp", "rtp", "tcp", "http", "https", "hls", "mms")
POLICIES = ("drop-oldest", "block")
TRANSPORTS = ("tcp", "udp")


def scheme(name: str) -> str | None:
    head, sep, _ = str(name).partition("://")
    return head.lower() if sep and head.isascii() and head.replace("+", "").replace("-", "").isalnum() else None


def is_network(name: str) -> bool:
    """A URL other than file:// (what a live source is by default)."""
    s = scheme(name)
    return s is not None and s != "file"


@dataclass
class LiveOptions:
    """How live sources are read. Times are seconds."""

    transport: str = "tcp"  # RTSP's lower transport: tcp (interleaved in the RTSP connection) or udp
    open_timeout: float = 10.0  # connecting and the first answer
    read_timeout: float = 10.0  # between two reads once connected
    reconnect_for: float = 300.0  # give up after this long without a frame (rides out a camera reboot)
    reconnect_attempts: int | None = None  # and/or after this many attempts in one outage (None: no limit)
    backoff_first: float = 0.5
    backoff_max: float = 10.0
    policy: str = "drop-oldest"  # or "block"
    queue_frames: int | None = None  # frames a live source may have waiting (default: one batch, at least 2)

    def check(self) -> "LiveOptions":
        from ..errors import UsageProblem

        if self.transport not in TRANSPORTS:
            raise UsageProblem(f"unknown RTSP transport {self.transport!r}", "use tcp or udp")
        if self.policy not in POLICIES:
            raise UsageProblem(f"unknown policy {self.policy!r} for frames inference cannot take yet",
                               "use drop-oldest or block")
        for name in ("open_timeout", "read_timeout", "backoff_first", "backoff_max"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise UsageProblem(f"{name.replace('_', '-')} must be a positive number of seconds, got {v!r}")
        if not (math.isfinite(self.reconnect_for) and self.reconnect_for >= 0):
            raise UsageProblem(f"reconnect-for must be 0 or more seconds, got {self.reconnect_for!r}")
        if self.reconnect_attempts is not None and self.reconnect_attempts < 0:
            raise UsageProblem(f"reconnect-attempts must be 0 or more, got {self.reconnect_attempts}")
        if self.queue_frames is not None and self.queue_frames < 1:
            raise UsageProblem(f"the live queue must hold at least one frame, got {self.queue_frames}")
        return self

    def av_options(self, name: str) -> dict:
        """FFmpeg options for opening ``name`` with PyAV."""
        opts = {}
        if scheme(name) in ("rtsp", "rtsps"):
            opts["rtsp_transport"] = self.transport
        return opts


@dataclass
class SourceEvent:
    """Something that happened to a live source: ``disconnected`` (with the reason), ``reconnected`` (after
    ``outage_s`` and ``attempts``), ``gave_up``; written as a JSON line beside the predictions."""

    source: str
    event: str
    received: float  # wall-clock time (Unix seconds)
    frames: int  # frames received from this source so far
    reason: str | None = None
    outage_s: float | None = None
    attempts: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"event": self.event, "source": self.source, "received": round(self.received, 3), "frames": self.frames}
        if self.reason is not None:
            d["reason"] = self.reason
        if self.outage_s is not None:
            d["outage_s"] = round(self.outage_s, 3)
        if self.attempts is not None:
            d["attempts"] = self.attempts
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SourceEvent":
        """The inverse of :meth:`to_dict` (an event sent over a pipe by a worker process)."""
        known = {"event", "source", "received", "frames", "reason", "outage_s", "attempts"}
        return cls(d["source"], d["event"], d["received"], d["frames"], d.get("reason"), d.get("outage_s"),
                   d.get("attempts"), {k: v for k, v in d.items() if k not in known})

    def line(self) -> str:
        """The stderr line for this event."""
        if self.event == "disconnected":
            return f"{self.source}: connection lost after {self.frames} frames: {self.reason}"
        if self.event == "reconnected":
            return f"{self.source}: reconnected after {self.outage_s:.1f} s ({self.attempts} attempt(s))"
        if self.event == "gave_up":
            return f"{self.source}: gave up reconnecting after {self.outage_s:.1f} s ({self.attempts} attempt(s))"
        return f"{self.source}: {self.event}" + (f": {self.reason}" if self.reason else "")


class Reconnector:
    """The back-off schedule of one live source's outages.

    ``lost(reason)`` starts (or continues) an outage and returns the delay before the next attempt, or None when
    the source is to be given up; ``connected()`` ends the outage. ``sleep`` waits, returning early (False) when
    ``stop`` is set."""

    def __init__(self, options: LiveOptions, clock=time.monotonic):
        self.o = options
        self.clock = clock
        self.outage_start: float | None = None
        self.attempts = 0  # attempts made in the current outage
        self.delay = options.backoff_first

    @property
    def in_outage(self) -> bool:
        return self.outage_start is not None

    def lost(self) -> float | None:
        now = self.clock()
        if self.outage_start is None:
            self.outage_start, self.attempts, self.delay = now, 0, self.o.backoff_first
        elapsed = now - self.outage_start
        if self.o.reconnect_attempts is not None and self.attempts >= self.o.reconnect_attempts:
            return None
        if elapsed >= self.o.reconnect_for:
            return None
        delay = min(self.delay, self.o.backoff_max, max(0.0, self.o.reconnect_for - elapsed))
        self.delay = min(self.delay * 2, self.o.backoff_max)
        self.attempts += 1
        return delay

    def outage_s(self) -> float:
        return 0.0 if self.outage_start is None else self.clock() - self.outage_start

    def connected(self) -> tuple[float, int] | None:
        """Ends an outage: (its length in s, attempts), or None when there was none."""
        if self.outage_start is None:
            return None
        out = (self.clock() - self.outage_start, self.attempts)
        self.outage_start, self.attempts = None, 0
        return out

    @staticmethod
    def sleep(seconds: float, stop) -> bool:
        if stop is None:
            time.sleep(seconds)
            return True
        return not stop.wait(seconds)


def network_error(name: str, exc: BaseException, options: LiveOptions, opening: bool,
                  elapsed: float | None = None) -> tuple[str, str]:
    """(reason, fix) in words for a failure to open or read a network source. FFmpeg's texts ("Immediate exit
    requested", "Invalid data found when processing input") are kept in brackets after the explanation. A failure
    that came when the timeout ran out (``elapsed``, seconds the attempt took) is a timeout whatever FFmpeg says:
    its RTSP client reports a server that never answers as "Invalid data"."""
    text = first_line(exc)
    low = text.lower()
    host = str(name).split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    limit = options.open_timeout if opening else options.read_timeout
    if isinstance(exc, ConnectionRefusedError) or "connection refused" in low:
        return (f"nothing accepts connections at {host} (connection refused)",
                "check that the camera or server is running and the URL's host and port")
    timed_out = elapsed is not None and elapsed >= 0.9 * limit
    if timed_out or "immediate exit requested" in low or "timed out" in low or isinstance(exc, TimeoutError):
        t = options.open_timeout if opening else options.read_timeout
        what = "no answer to the connection" if opening else "no data"
        return (f"{what} within {t:g} s [{text}]",
                f"check the address and the network, or allow longer with --{'open' if opening else 'read'}-timeout")
    if "404" in low or "not found" in low:
        return (f"the server at {host} has no stream at this path (404)", "check the path part of the URL")
    if "401" in low or "unauthorized" in low:
        return (f"the server at {host} asks for a user name and password (401)",
                "put them in the URL: rtsp://USER:PASSWORD@host/path")
    if "no route" in low or "unreachable" in low or "name or service not known" in low or "resolve" in low:
        return f"cannot reach {host} [{text}]", "check the host name and the network route to it"
    if "end of file" in low or isinstance(exc, EOFError):
        return "the server closed the stream", "check the camera or server; it stopped sending"
    if "invalid data" in low:
        return (f"the server's answer is not a stream FFmpeg can read [{text}]",
                "check the URL; for RTSP try the other transport (--rtsp-transport udp or tcp)")
    return f"[{text}]", "check the camera or server and the URL"


class LiveSource:
    """What both decoders' sources share for live reading: events and the wait between connection attempts.
    Subclasses set ``name``, ``decoded``, ``options``, ``stop`` and ``on_event``."""

    def _event(self, kind: str, **kw) -> None:
        import logging

        ev = SourceEvent(self.name, kind, time.time(), self.decoded, **kw)
        logging.getLogger("trtc").warning("%s", ev.line())
        if self.on_event is not None:
            self.on_event(ev)

    def _retry_or_give_up(self, rc: Reconnector, reason: str, fix: str | None) -> None:
        """Wait for the next attempt; raise SourceError when the source is given up on (or the run stops)."""
        from .sources import SourceError

        if self.stop is not None and self.stop.is_set():
            raise SourceError(self.name, f"stopped while reconnecting ({reason})")
        delay = rc.lost()
        if delay is None:
            outage, attempts = rc.outage_s(), rc.attempts
            self._event("gave_up", reason=reason, outage_s=outage, attempts=attempts)
            raise SourceError(self.name, f"live source lost: {reason}; gave up after {outage:.1f} s and "
                              f"{attempts} reconnect attempt(s)",
                              f"{fix}; to wait longer: --reconnect-for SECONDS (now {self.options.reconnect_for:g})")
        if not Reconnector.sleep(delay, self.stop):
            raise SourceError(self.name, f"stopped while reconnecting ({reason})")
