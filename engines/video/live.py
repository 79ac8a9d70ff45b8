"""Live sources: network cameras and streams that never "finish" the way a file does.

A source is live when it is a network URL (rtsp://, rtmp://, srt://, udp://, http(s)://, ...) or when the caller
says so (``classify(..., live=True)``, ``trtc run --live``). A live source differs from a file in four ways:

- **It is alive while frames arrive** (:class:`Liveness`). A connection counts once a decoded frame comes from it;
  a connection that gives no frame within ``open_timeout`` s of its attempt, or no further frame within
  ``read_timeout`` s of the last one, is lost, by trtc's own watchdog (:func:`watched_packets`) whatever the
  demuxer does. A lost connection is retried with exponential back-off (``backoff_first`` s, doubling, at most
  ``backoff_max`` s) until ``reconnect_for`` seconds have passed since the last frame (or ``reconnect_attempts``
  attempts were made). Each outage is one ``disconnected`` event, ended by ``reconnected`` at the first frame of a
  new connection (``outage_s``: the time without frames) or by ``gave_up``; a source that never gave a frame says
  so at its first failure (``connect_failed``) and then retries quietly. A live source that is given up on is a
  failure of that source, never a normal end.
- **Its reading never waits on inference.** Frames are received and decoded in the source's own thread and handed
  over through a small per-source queue; when inference lags, the policy says what happens: ``drop-oldest``
  (default: the oldest waiting frame of that source is dropped, and counted) or ``block`` (nothing is dropped; the
  reader waits, as for a recording, and the network may drop instead).
- **Its timestamps are the stream's own** (pts x time base, the first frame included), and each frame carries the
  wall-clock time it was received.
- **Its network options are stated**: RTSP over TCP (default) or UDP, an open timeout and a read timeout.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

from ..errors import first_line
from .credentials import has_credentials, scrub, url_of
from .source_base import SourceError

NETWORK_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "srt", "udp", "rtp", "tcp", "http", "https", "hls", "mms")
POLICIES = ("drop-oldest", "block")
TRANSPORTS = ("tcp", "udp")
# seconds a read of a live source may block before trtc's watchdog checks the time since the last frame
WATCH_SLICE = 0.5
# a source that keeps going past --max-lag: a warning line at most this often (seconds); each event is still a line
LAG_WARN_EVERY = 60.0
# a live stream's damage: a damaged event at most this often per source (seconds), with the frames lost since the last
DAMAGE_EVERY = 10.0
AVERROR_EXIT = 1414092869  # FFmpeg's "Immediate exit requested": PyAV's read timeout interrupted the read
# seconds a pipeline that stops waits, in all, for its reader threads: a read ends within WATCH_SLICE; an open
# (FFmpeg's RTSP handshake) cannot be interrupted before its own timeout
JOIN_S = 1.0

_readers_lock = threading.Lock()  # owns _readers
_readers: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


def reader_started(thread: threading.Thread) -> None:
    """Note a source's reader thread (it may be inside FFmpeg or NVDEC): :func:`readers_running` waits for it."""
    with _readers_lock:
        _readers.add(thread)


def join_readers(threads, timeout: float = JOIN_S) -> list[str]:
    """Wait for ``threads`` (their stop already asked for) at most ``timeout`` s in all; the names of those still
    running."""
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


def readers_running(timeout: float = 0.0) -> list[str]:
    """The reader threads of this process still running after waiting at most ``timeout`` s for them: threads that
    may be inside native code (an FFmpeg open cannot be interrupted), under which the interpreter must not finalize
    (a process that ends then ends with ``os._exit``, after flushing its outputs)."""
    with _readers_lock:
        threads = [t for t in _readers if t.is_alive()]
    return join_readers(threads, timeout)


def scheme(name: str) -> str | None:
    head, sep, _ = str(url_of(name)).partition("://")
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
    max_lag: float | None = 2.0  # a frame captured longer ago than this is decoded but skipped (None: no bound)

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
        if self.max_lag is not None and not (math.isfinite(self.max_lag) and self.max_lag > 0):
            raise UsageProblem(f"max-lag must be a positive number of seconds, got {self.max_lag!r}")
        if self.queue_frames is not None and self.queue_frames < 1:
            raise UsageProblem(f"the live queue must hold at least one frame, got {self.queue_frames}")
        return self

    @property
    def watch_slice(self) -> float:
        """PyAV's read timeout for a watched live source: the longest a read blocks before the watchdog looks at the
        time since the last frame again (so a timeout fires at most this late)."""
        return min(WATCH_SLICE, self.read_timeout, self.open_timeout)

    def av_options(self, name: str) -> dict:
        """FFmpeg options for opening ``name`` with PyAV."""
        opts = {}
        if scheme(name) in ("rtsp", "rtsps"):
            opts["rtsp_transport"] = self.transport
        return opts


def _turn_words(turn: dict) -> str:
    """A turn as Orientation.to_dict gives it, in words: "turned 90 degrees clockwise (its metadata)"."""
    if not turn["degrees"] and not turn.get("mirrored"):
        return "not turned"
    mirror = "mirrored, then " if turn.get("mirrored") else ""
    why = {"metadata": "its metadata", "--rotate": "--rotate"}.get(turn.get("from"), turn.get("from"))
    return f"{mirror}turned {turn['degrees']} degrees clockwise ({why})"


@dataclass
class SourceEvent:
    """Something that happened to a live source: ``connect_failed`` (its first attempt failed, with the reason),
    ``disconnected`` (frames stopped, with the reason and ``outage_s`` so far), ``reconnected`` (the first frame of
    a new connection, after ``outage_s`` without frames and ``attempts``), ``gave_up``; written as a JSON line
    beside the predictions."""

    source: str
    event: str
    received: float  # wall-clock time (Unix seconds)
    frames: int  # frames received from this source so far
    reason: str | None = None
    outage_s: float | None = None
    attempts: int | None = None
    extra: dict = field(default_factory=dict)
    # whether its stderr line is a warning (else info, shown at -v): a source lagging over and over warns once a
    # minute; every event is a JSON line whatever this says. Not part of the line.
    loud: bool = field(default=True, compare=False)

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
        if self.event == "connect_failed":  # the reason of a failed open says "cannot connect" already
            reason = self.reason[len("cannot connect: "):] if self.reason.startswith("cannot connect: ") else \
                self.reason
            return f"{self.source}: cannot connect (retrying quietly): {reason}"
        if self.event == "disconnected":
            return f"{self.source}: connection lost after {self.frames} frames: {self.reason}"
        if self.event == "reconnected":
            return f"{self.source}: reconnected after {self.outage_s:.1f} s ({self.attempts} attempt(s))"
        if self.event == "lagging":
            return f"{self.source}: {self.extra['lag_s']:.1f} s behind live (bound {self.extra['max_lag_s']:g} s): " \
                   "skipping frames until caught up"
        if self.event == "caught_up":
            return f"{self.source}: caught up ({self.extra['lag_s']:.1f} s behind) after skipping " \
                   f"{self.extra['skipped']} frame(s)"
        if self.event == "damaged":
            since = time.strftime("%H:%M:%S", time.localtime(self.extra["since"]))
            return f"{self.source}: {self.extra['lost']} frame(s) or packet(s) lost to damage in the stream since " \
                   f"{since} ({self.extra['total']} in all); the run goes on"
        if self.event == "rotated":
            new, old = self.extra["rotation"], self.extra["previous"]
            return f"{self.source}: the new connection's frames are {_turn_words(new)}; the last connection's were " \
                   f"{_turn_words(old)}"
        if self.event == "auth_failed":
            return f"{self.source}: the server refused the credentials or this client, not retrying: {self.reason}"
        if self.event == "gave_up":
            return f"{self.source}: gave up reconnecting after {self.outage_s:.1f} s ({self.attempts} attempt(s))"
        return f"{self.source}: {self.event}" + (f": {self.reason}" if self.reason else "")

    def say(self) -> None:
        """Its stderr line, through the ``trtc`` logger: a warning, or info for a quiet lag event."""
        logging.getLogger("trtc").log(logging.WARNING if self.loud else logging.INFO, "%s", self.line())


class Liveness:
    """One live source's connection, judged by its decoded frames (the one state machine of the CPU and GPU paths).

    The reader calls :meth:`opening` before each connection attempt, :meth:`frame` for each decoded frame and
    :meth:`lost` when the attempt or the connection failed. A connection is *live* from its first frame; the outage
    runs from the last frame (from the first attempt for a source that never gave one), so ``outage_s`` is the
    time without frames and ``reconnect_for`` counts from the last frame. :meth:`deadline` is when the watchdog
    declares the current connection lost: ``open_timeout`` after the attempt began until its first frame, then
    ``read_timeout`` after the last frame, and never past the moment it is to be given up, whether it had frames or
    not (but a source's first attempt gets its whole ``open_timeout``)."""

    def __init__(self, options: LiveOptions, clock=time.monotonic):
        self.o = options
        self.clock = clock
        self.ever = False  # a frame has come from some connection
        self.live = False  # a frame has come from the current connection
        self.last_frame: float | None = None
        self.attempt_start = clock()
        self.outage_start: float | None = self.attempt_start  # no frame yet: the outage runs from the start
        self.attempts = 0  # reconnect attempts in the current outage
        self.failures = 0  # failed attempts since the last frame
        self.delay = options.backoff_first

    def opening(self) -> None:
        """A connection attempt begins (its first frame is due within ``open_timeout``)."""
        self.attempt_start = self.clock()
        self.live = False

    def frame(self) -> tuple[float, int] | None:
        """A decoded frame arrived. Returns (seconds without frames, attempts) when it ends an outage of a source
        that had frames before (a reconnection), else None."""
        now = self.clock()
        back = None
        if not self.live:
            if self.ever and self.outage_start is not None:
                back = (now - self.outage_start, self.attempts)
            self.live = self.ever = True
            self.outage_start, self.attempts, self.failures, self.delay = None, 0, 0, self.o.backoff_first
        self.last_frame = now
        return back

    def deadline(self) -> float:
        """Monotonic time at which the current connection counts as lost without another frame."""
        if self.live:
            return self.last_frame + self.o.read_timeout
        due = self.attempt_start + self.o.open_timeout
        if not self.ever and self.failures == 0:
            return due  # a source's first attempt gets its whole open_timeout
        if self.outage_start is not None:  # then never past the moment it is given up, whether it ever connected
            return min(due, self.outage_start + self.o.reconnect_for)
        return due

    def squeezed(self) -> bool:
        """Whether the current attempt had less than a second (or its open_timeout) before the give-up moment: its
        failure says little (a timeout of a few milliseconds), the one before it says why the source is given up."""
        return not self.live and self.deadline() - self.attempt_start < min(1.0, self.o.open_timeout)

    def timeout_reason(self) -> tuple[str, str]:
        """(reason, fix) for a connection the watchdog declared lost, with the time it actually waited."""
        if self.live:
            return (f"no frame for {self.o.read_timeout:g} s",
                    "check the camera and the network, or allow longer with --read-timeout")
        return (f"no frame within {self.clock() - self.attempt_start:.1f} s of connecting (--open-timeout "
                f"{self.o.open_timeout:g})", "check the camera and the network, or allow longer with --open-timeout")

    def lost(self) -> float | None:
        """The attempt or connection failed: the delay before the next attempt, or None to give up."""
        now = self.clock()
        if self.live:
            self.outage_start, self.attempts, self.delay = self.last_frame, 0, self.o.backoff_first
        self.live = False
        self.failures += 1
        if self.outage_start is None:
            self.outage_start = now
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

    def ran_out(self) -> str:
        """The option that ended the outage, as the user types it."""
        if self.o.reconnect_attempts is not None and self.attempts >= self.o.reconnect_attempts:
            return f"--reconnect-attempts (now {self.o.reconnect_attempts})"
        return f"--reconnect-for SECONDS (now {self.o.reconnect_for:g})"

    @staticmethod
    def sleep(seconds: float, stop) -> bool:
        if stop is None:
            time.sleep(seconds)
            return True
        return not stop.wait(seconds)


class Capture(NamedTuple):
    """A live frame's capture on its connection's :class:`LagClock`: its stream time ``t``; ``at``, the capture time
    (Unix s) by the anchor when it was decoded; ``final``, whether that anchor was settled then."""

    clock: "LagClock"
    t: float
    at: float
    final: bool


class LagClock:
    """When a live stream's frames were captured, on the wall clock: the stream's own time (pts x time base)
    anchored at the wall clock by the smallest (received - stream time) seen on this connection, so delay that
    builds up before decoding (a stall, a link thinner than the stream, a reader that cannot keep up) shows as
    lag, while the fixed delay of the path to the first frame does not. (RTCP sender reports' NTP times are not
    read: PyAV does not hand them out.) A new clock at every connection: RTSP restarts timestamps.

    A connection's first frames come in a burst (those read while the stream was probed), late: the anchor is the
    smallest (received - stream time) over the first SETTLE_S s of stream time, **applied back** to those frames
    (:meth:`LagStats.add_capture` holds their results until then), and the smallest so far after that. The reader
    thread writes the anchor, the results' thread reads it: one lock."""

    SETTLE_S = 5.0

    def __init__(self):
        self._lock = threading.Lock()  # owns offset, first_t, settled
        self.offset: float | None = None  # the smallest (received - stream time) so far
        self.first_t: float | None = None
        self.settled: float | None = None  # the anchor at the end of the first SETTLE_S s of stream time

    def captured(self, t: float | None, received: float) -> Capture | None:
        """The capture of a frame with stream time ``t`` received at ``received`` (Unix seconds); None for a
        frame without a stream time (its capture time is unknown: it has no lag, and sets no anchor)."""
        if t is None:
            return None
        with self._lock:
            off = received - t
            if self.offset is None or off < self.offset:
                self.offset = off
            if self.first_t is None:
                self.first_t = t
            final = self.settled is not None
            if not final and t - self.first_t >= self.SETTLE_S:
                self.settled = self.offset
            return Capture(self, t, self.offset + t, final)

    def anchor(self) -> tuple[float | None, bool]:
        """(the anchor for the frames of the first window, whether it is settled)."""
        with self._lock:
            return (self.settled, True) if self.settled is not None else (self.offset, False)


class LagStats:
    """Lag of one source's results (seconds from capture to result): p50, p99 and max in fixed memory (a
    histogram of 10 ms bins up to 120 s; larger lags fall in the last bin and still set ``max``). The results of a
    connection's first frames wait (as result - stream time, to the millisecond) until its anchor is settled."""

    BIN = 0.01
    BINS = 12000

    def __init__(self):
        import numpy as np

        self.counts = np.zeros(self.BINS, np.int64)
        self.n = 0
        self.max = 0.0
        self.waiting: dict = {}  # LagClock -> {round((result - t) x 1000): results}

    def add(self, lag: float, n: int = 1) -> None:
        lag = max(0.0, lag)
        self.counts[min(int(lag / self.BIN), self.BINS - 1)] += n
        self.n += n
        self.max = max(self.max, lag)

    def add_capture(self, result: float, cap: Capture) -> None:
        """A result at ``result`` (Unix s) of the frame captured as ``cap``."""
        if cap.final:
            self.add(result - cap.at)
            return
        anchor, settled = cap.clock.anchor()
        if settled:
            self._settle(cap.clock)
            self.add(result - (anchor + cap.t))
            return
        for clock in [c for c in self.waiting if c is not cap.clock]:  # an earlier connection: its anchor is final
            self._settle(clock)
        held = self.waiting.setdefault(cap.clock, {})
        key = round((result - cap.t) * 1000)
        held[key] = held.get(key, 0) + 1

    def _settle(self, clock: LagClock) -> None:
        held = self.waiting.pop(clock, None)
        if held:
            anchor = clock.anchor()[0]
            for key, n in held.items():
                self.add(key / 1000 - anchor, n)

    def quantile(self, q: float) -> float:
        """The upper edge of the bin holding quantile ``q`` (so within 10 ms above the true value, capped by max)."""
        import numpy as np

        k = int(np.searchsorted(np.cumsum(self.counts), q * self.n, side="left"))
        return min((k + 1) * self.BIN, self.max)

    def to_dict(self) -> dict:
        for clock in list(self.waiting):  # a connection still in its first window: the anchor it has now
            self._settle(clock)
        if not self.n:
            return {}
        return {"p50": round(self.quantile(0.5), 3), "p99": round(self.quantile(0.99), 3), "max": round(self.max, 3),
                "frames": self.n}


class NoFrames(Exception):
    """The watchdog's verdict: no frame by the deadline (``reason``, ``fix`` in words)."""

    def __init__(self, reason: str, fix: str):
        super().__init__(reason)
        self.reason, self.fix = reason, fix


def _interrupted(exc: BaseException) -> bool:
    return getattr(exc, "errno", None) == AVERROR_EXIT or "immediate exit requested" in str(exc).lower()


def watched_packets(container, stream, liveness: Liveness, stop=None):
    """The packets of a live ``stream`` (opened by :func:`open_url` with its ``liveness``), under trtc's watchdog:
    yields (packet, interrupted) until the stream ends; raises :class:`NoFrames` once ``liveness.deadline()`` has
    passed (checked after every packet and at least every ``watch_slice`` s), so a timeout fires at its own time
    whatever FFmpeg does with an interrupted read. A read that PyAV's short read timeout interrupted is resumed
    with a fresh demuxer (FFmpeg's RTSP reader goes on where it was); the packet such a read may hand back is
    flagged ``interrupted`` (it may be cut short, so its decoder's refusal is not damage to the stream). Returns
    early when ``stop`` is set. Other demuxer errors propagate (the connection failed)."""
    slice_s = liveness.o.watch_slice
    while True:
        packets = container.demux(stream)
        try:
            while True:
                t0 = time.monotonic()
                try:
                    packet = next(packets)
                except StopIteration:
                    return
                except Exception as exc:  # noqa: BLE001 - av.error.ExitError from the read timeout; others go up
                    if not _interrupted(exc):
                        raise
                    packet = None
                if stop is not None and stop.is_set():
                    return
                if liveness.clock() >= liveness.deadline():
                    raise NoFrames(*liveness.timeout_reason())
                if packet is None:
                    break  # a fresh demuxer resumes the read
                yield packet, time.monotonic() - t0 >= 0.9 * slice_s
        finally:
            packets.close()


def open_url(av, name: str, options: LiveOptions, liveness: Liveness | None = None):
    """A network source opened by PyAV with ``options``' RTSP transport and open/read timeouts; a failure is a
    SourceError in words (:func:`network_error`), a silent server included.

    ``liveness``: a watched live source (:func:`watched_packets`). Its reads time out after
    ``options.watch_slice`` s, and the open is given the time left to the attempt (:meth:`Liveness.deadline`).
    PyAV bounds each of the open's two steps (the handshake, then reading the first packets to learn the stream)
    by that time from the step's own start: a silent server (the handshake) times out at the deadline; a server
    that answers at once and then sends nothing, at the deadline plus the handshake's time. (Halving the time
    between the two steps, as before, made --open-timeout 10 give up after 5 s.)"""
    t0 = time.monotonic()
    if liveness is None:
        timeout = (options.open_timeout, options.read_timeout)
    else:
        timeout = (max(0.05, liveness.deadline() - liveness.clock()), options.watch_slice)
    try:
        return av.open(url_of(name), options=options.av_options(name), timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - av.error.*, OSError
        reason, fix = network_error(name, exc, options, opening=True, elapsed=time.monotonic() - t0,
                                    limit=timeout[0])
        err = SourceError(name, f"cannot connect: {reason}", fix)
        err.final = refused(name, exc)
        raise err from exc


def refused(name: str, exc: BaseException) -> bool:
    """Whether the server refused this client for good: credentials it rejects (401 when they were given) or no
    access at all (403). Retrying would change nothing, and on many cameras locks the account."""
    status = http_status(first_line(exc))
    return status == 403 or (status == 401 and has_credentials(name))


def http_status(text: str) -> int | None:
    """The RTSP/HTTP status (401, 403 or 404) an FFmpeg error text reports ("Server returned 401 Unauthorized"),
    read without the quoted URL that follows it (a port such as 48403 is no status)."""
    import re

    low = re.sub(r"'[^']*'", "", str(text)).lower()
    for code, word in ((401, "unauthorized"), (403, "forbidden"), (404, "not found")):
        if re.search(rf"\b{code}\b", low) or word in low:
            return code
    return None


def network_error(name: str, exc: BaseException, options: LiveOptions, opening: bool,
                  elapsed: float | None = None, limit: float | None = None) -> tuple[str, str]:
    """(reason, fix) in words for a failure to open or read a network source. FFmpeg's texts ("Immediate exit
    requested", "Invalid data found when processing input") are kept in brackets after the explanation. A failure
    that came when the timeout ran out (``elapsed``, seconds the attempt took) is a timeout whatever FFmpeg says:
    its RTSP client reports a server that never answers as "Invalid data". ``limit``: the timeout the demuxer was
    given, where it is not the option's own."""
    text = scrub(name, first_line(exc))  # FFmpeg's text names the URL it was given: no credentials out
    low = text.lower()
    host = str(url_of(name)).split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    limit = limit or (options.open_timeout if opening else options.read_timeout)
    if isinstance(exc, ConnectionRefusedError) or "connection refused" in low:
        return (f"nothing accepts connections at {host} (connection refused)",
                "check that the camera or server is running and the URL's host and port")
    timed_out = elapsed is not None and elapsed >= 0.9 * limit
    if timed_out or "immediate exit requested" in low or "timed out" in low or isinstance(exc, TimeoutError):
        t = options.open_timeout if opening else options.read_timeout
        what = "no answer to the connection" if opening else "no data"
        waited = f"{elapsed:.1f} s (--{'open' if opening else 'read'}-timeout {t:g})" if elapsed is not None \
            else f"{t:g} s"
        return (f"{what} within {waited} [{text}]",
                f"check the address and the network, or allow longer with --{'open' if opening else 'read'}-timeout")
    status = http_status(text)
    if status == 404:
        return (f"the server at {host} has no stream at this path (404)", "check the path part of the URL")
    if "protocol not supported" in low and options.transport == "udp" and scheme(name) in ("rtsp", "rtsps"):
        return (f"the server at {host} does not send RTP over UDP [{text}]",
                "use --rtsp-transport tcp (RTP inside the RTSP connection, what most cameras and NVRs offer)")
    if status == 403:
        return (f"the server at {host} refuses this client (403 Forbidden)",
                "check the camera's access rules for this user and address")
    if status == 401 and has_credentials(name):
        return (f"the server at {host} refused the user name and password given (401)",
                "check them (in the URL, TRTC_RTSP_USER/TRTC_RTSP_PASSWORD or --credentials FILE); trtc does not "
                "retry refused credentials, so that the camera does not lock the account")
    if status == 401:
        return (f"the server at {host} asks for a user name and password (401)",
                "give them: in the URL (rtsp://USER:PASSWORD@host/path), or TRTC_RTSP_USER and TRTC_RTSP_PASSWORD, "
                "or --credentials FILE (docs/LIVE.md)")
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
        """Hand an event to the pipeline, which says it (:meth:`SourceEvent.say`) in the caller's thread: a reader
        never writes to stderr, so a log that is not being read (a full pipe, a blocked log driver) cannot stop a
        source's reading or its watchdog. Without a pipeline the event is said here."""
        ev = SourceEvent(self.name, kind, time.time(), self.decoded, **kw)
        if self.on_event is not None:
            self.on_event(ev)
        else:
            ev.say()

    def _frame_arrived(self, lv: Liveness) -> None:
        """Per decoded frame: the first of a new connection after an outage is the ``reconnected`` event."""
        back = lv.frame()
        if back is not None:
            self._event("reconnected", outage_s=back[0], attempts=back[1])

    def _turned(self, turn) -> None:
        """A connection's turn (an :class:`~engines.video.orientation.Orientation`, read from its first frame or key
        frame): its frames are turned by it from here. A live source whose new connection turns differently from
        the last one (a camera remounted, or its stream re-tagged) says so: a ``rotated`` event with the new turn
        and the one before (``rotation``, ``previous``)."""
        before = getattr(self, "_turn_said", None)
        self.turn = turn
        self._turn_said = turn.to_dict()
        if before is not None and before != self._turn_said and getattr(self, "live", False):
            self._event("rotated", extra={"rotation": self._turn_said, "previous": before})

    def _damage(self, n: int = 1) -> None:
        """``n`` more frames or packets of this live stream lost to damage (already counted in ``damaged``): a
        ``damaged`` event at once, then at most one every DAMAGE_EVERY s with those lost since the last (``lost``;
        ``since``: the wall time of the first of them; ``total``: the source's count so far); its stderr line a
        warning at most once a minute (else info, shown at -v), as for lagging."""
        now = time.monotonic()
        self._damage_lost = getattr(self, "_damage_lost", 0) + n
        if getattr(self, "_damage_since", None) is None:
            self._damage_since = time.time()
        said = getattr(self, "_damage_said", None)
        if said is not None and now - said < DAMAGE_EVERY:
            return
        warned = getattr(self, "_damage_warned", None)
        loud = warned is None or now - warned >= LAG_WARN_EVERY
        if loud:
            self._damage_warned = now
        self._damage_said = now
        self._event("damaged", extra={"lost": self._damage_lost, "since": round(self._damage_since, 3),
                                      "total": self.damaged}, loud=loud)
        self._damage_lost, self._damage_since = 0, None

    def _keep_frame(self, captured: Capture | None, received: float) -> bool:
        """:meth:`_keep` for a frame captured as ``captured`` (None: unknown) and decoded at ``received``. A frame of
        unknown capture time neither starts nor ends a skip: it is skipped while one runs, else kept."""
        if captured is not None:
            return self._keep(received - captured.at)
        if getattr(self, "_skipping", None) is None or self.options.max_lag is None or self.options.policy == "block":
            return True
        self._skipping += 1
        self.lagged += 1
        return False

    def _keep(self, lag: float) -> bool:
        """Whether a decoded frame ``lag`` s after its capture is passed on; decided before any preprocessing. Past
        ``options.max_lag`` frames are skipped (counted in ``lagged``) until the lag is back under half the bound:
        one ``lagging`` event when skipping starts, one ``caught_up`` (with the frames skipped) when it ends.
        Under the ``block`` policy every frame is kept."""
        bound = self.options.max_lag
        if bound is None or self.options.policy == "block":  # block keeps every frame (a recording)
            return True
        skipping = getattr(self, "_skipping", None)
        if skipping is None:
            if lag <= bound:
                return True
            self._skipping = 0
            now = time.monotonic()
            last = getattr(self, "_lag_warned", None)
            self._lag_loud = last is None or now - last >= LAG_WARN_EVERY
            if self._lag_loud:
                self._lag_warned = now
            self._event("lagging", extra={"lag_s": round(lag, 3), "max_lag_s": bound}, loud=self._lag_loud)
        elif lag <= bound / 2:
            self._skipping = None
            self._event("caught_up", extra={"lag_s": round(lag, 3), "skipped": skipping}, loud=self._lag_loud)
            return True
        self._skipping += 1
        self.lagged += 1
        return False

    def _lost(self, lv: Liveness, reason: str, fix: str | None, final: bool = False) -> None:
        """The attempt or the connection failed: say so once (``disconnected`` when frames stopped,
        ``connect_failed`` at a never-connected source's first failure; nothing for later failed attempts), then
        wait for the next attempt; raise SourceError when the source is given up on (or the run stops). ``final``:
        the server refused the credentials or the client (:func:`refused`): an ``auth_failed`` event, and the source
        is given up at once."""
        if self.stop is not None and self.stop.is_set():
            raise SourceError(self.name, f"stopped while reconnecting ({reason})")
        if final:
            self._event("auth_failed", reason=reason)
            raise SourceError(self.name, f"auth_failed: {reason}; not retried", fix)
        was_live, first, squeezed = lv.live, not lv.ever and lv.failures == 0, lv.squeezed()
        before, self._failure = getattr(self, "_failure", None), (reason, fix)
        delay = lv.lost()
        if delay is None and squeezed and before is not None:  # the last try had no time: the one before says why
            reason, fix = before
        if was_live:
            self._event("disconnected", reason=reason, outage_s=lv.outage_s())
        elif first:
            self._event("connect_failed", reason=reason)
        if delay is None:
            outage, attempts = lv.outage_s(), lv.attempts
            self._event("gave_up", reason=reason, outage_s=outage, attempts=attempts)
            what = ("never connected" if not lv.ever else "live source lost")
            raise SourceError(self.name, f"{what}: {reason}; gave up after {outage:.1f} s without a frame and "
                              f"{attempts} reconnect attempt(s)",
                              f"{fix}; to keep trying longer: {lv.ran_out()}")
        if not Liveness.sleep(delay, self.stop):
            raise SourceError(self.name, f"stopped while reconnecting ({reason})")
