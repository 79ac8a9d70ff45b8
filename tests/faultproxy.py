"""A fault-injecting TCP proxy for the live-source tests (stdlib only, threads).

It listens on 127.0.0.1 only and forwards each accepted connection to an upstream ``(host, port)`` (the RTSP server
of tests/rtsp_server.py), while a schedule of faults, each active from ``start`` for ``duration`` seconds after
:meth:`FaultProxy.start`, changes what passes:

- ``stall``: no byte moves either way; the connections stay open (TCP back-pressure holds the rest upstream).
- ``mute``: the server's RTP data frames are dropped while RTSP text and RTCP pass. The proxy reads RTSP over TCP
  interleaved framing (``$ channel len16 payload``, RFC 2326 10.12) and drops frames on the RTP channels that the
  server's SETUP replies named (``Transport: ...;interleaved=RTP-RTCP``; channel 0 until one is seen).
- ``cut``: at ``start`` every open connection is closed (both sides); during ``duration`` new connections are
  closed as soon as they are accepted.
- ``refuse``: new connections are reset at accept (SO_LINGER 0); open ones are left alone.
- ``throttle``: at most ``rate`` bytes/s from the server to the client, per connection.
- ``corrupt``: bytes flipped inside RTP payloads (never the interleaved framing or the RTP header), in a fraction
  ``rate`` of the packets, ``flips`` bytes each, from a seeded generator.
- ``switch``: at ``start`` the upstream becomes ``upstream`` and every open connection is closed, so the client
  reconnects to the other server (a camera that comes back at another resolution).

``conn`` limits a fault to the n-th connection accepted (0-based); None means every connection.
Every fault is recorded when it starts and ends (wall clock, ``time.time()``) with what it did
(:attr:`FaultProxy.log`), for the soak report. The proxy stops by itself after ``lifetime`` seconds.

Parsing the interleaved framing is on with ``rtsp=True`` (the default); with ``rtsp=False`` bytes are forwarded
as they come (``mute`` and ``corrupt`` then have nothing to act on and raise at construction).
"""

from __future__ import annotations

import random
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

KINDS = ("stall", "mute", "cut", "refuse", "throttle", "corrupt", "switch")
_TRANSPORT = re.compile(rb"interleaved=(\d+)-(\d+)", re.I)
_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.I)


@dataclass
class Fault:
    kind: str
    start: float
    duration: float = 0.0
    conn: int | None = None
    rate: float | None = None  # throttle: bytes/s; corrupt: fraction of RTP packets (default 0.2)
    flips: int = 8  # corrupt: bytes flipped in a packet
    upstream: tuple[str, int] | None = None  # switch: the new upstream

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault {self.kind!r}; one of {', '.join(KINDS)}")
        if self.kind == "throttle" and not self.rate:
            raise ValueError("throttle needs rate (bytes/s)")
        if self.kind == "switch" and not self.upstream:
            raise ValueError("switch needs upstream (host, port)")

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass
class Injected:
    """What one fault did: when it began and ended (wall clock) and its counts."""

    kind: str
    conn: int | None
    started: float | None = None
    ended: float | None = None
    connections: int = 0  # cut, refused, or switched
    frames: int = 0  # RTP frames dropped (mute) or corrupted (corrupt)
    bytes: int = 0  # bytes passed under throttle

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class _Conn:
    index: int
    client: socket.socket
    server: socket.socket
    rtp_channels: set = field(default_factory=set)  # from the SETUP replies; empty: channel 0
    closed: bool = False


class FaultProxy:
    def __init__(self, upstream: tuple[str, int], faults: list[Fault] = (), lifetime: float = 600.0,
                 rtsp: bool = True, seed: int = 0, path: str = "/cam"):
        if not rtsp and any(f.kind in ("mute", "corrupt") for f in faults):
            raise ValueError("mute and corrupt act on RTSP interleaved frames: rtsp=True")
        self.upstream, self.path = upstream, path  # path: the stream's path and query at the server
        self.faults = sorted(faults, key=lambda f: f.start)
        self.lifetime, self.rtsp = lifetime, rtsp
        self.log = [Injected(f.kind, f.conn) for f in self.faults]
        self._lock = threading.Lock()  # owns _conns, _active, upstream, log counts
        self._conns: list[_Conn] = []
        self._active: set[int] = set()  # indices into self.faults
        self._accepted = 0
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.t0: float | None = None

    # ----------------------------------------------------------------------------------------------- control
    def url(self, path: str | None = None) -> str:
        return f"rtsp://127.0.0.1:{self.port}{self.path if path is None else path}"

    def start(self) -> "FaultProxy":
        self.t0 = time.monotonic()
        for target in (self._accept_loop, self._schedule_loop):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            self._close(c)
        for t in self._threads:
            t.join(5)
        self._listener.close()
        now = time.time()
        with self._lock:
            for i in self._active:
                self.log[i].ended = now
            self._active.clear()

    def __enter__(self):
        return self.start() if self.t0 is None else self

    def __exit__(self, *exc):
        self.stop()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def report(self) -> list[dict]:
        with self._lock:
            return [dict(i.as_dict(), start=f.start, duration=f.duration) for f, i in zip(self.faults, self.log)]

    def connections(self) -> int:
        """How many connections were accepted (refused ones included)."""
        with self._lock:
            return self._accepted

    # ----------------------------------------------------------------------------------------------- faults
    def _on(self, kind: str, conn: _Conn | None) -> list[int]:
        with self._lock:
            return [i for i in self._active if self.faults[i].kind == kind
                    and (self.faults[i].conn is None or conn is None or self.faults[i].conn == conn.index)]

    def add(self, kind: str, duration: float = 0.0, **kw) -> Fault:
        """Schedule a fault starting now (for a test that waits for its client to be streaming first)."""
        f = Fault(kind, self.elapsed(), duration, **kw)
        with self._lock:
            self.faults.append(f)
            self.log.append(Injected(f.kind, f.conn))
        return f

    def _schedule_loop(self) -> None:
        done: set[int] = set()
        while not self._stop.is_set():
            t = self.elapsed()
            if t >= self.lifetime:
                threading.Thread(target=self.stop, daemon=True).start()
                return
            with self._lock:
                count = len(self.faults)
            for i in range(count):
                f = self.faults[i]
                if i in done:
                    continue
                if t >= f.start and self.log[i].started is None:
                    with self._lock:
                        self.log[i].started = time.time()
                        self._active.add(i)
                        if f.kind == "switch":
                            self.upstream = f.upstream
                        hit = [c for c in self._conns if f.conn in (None, c.index)] \
                            if f.kind in ("cut", "switch") else []
                        self.log[i].connections += len(hit)
                    for c in hit:
                        self._close(c)
                if t >= f.end and self.log[i].started is not None:
                    with self._lock:
                        self._active.discard(i)
                        self.log[i].ended = time.time()
                    done.add(i)
            self._stop.wait(0.02)

    # ----------------------------------------------------------------------------------------------- plumbing
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            with self._lock:
                index = self._accepted
                self._accepted += 1
            probe = _Conn(index, client, None)
            shut = self._on("refuse", probe) + self._on("cut", probe)
            if shut:
                with self._lock:
                    for i in shut:
                        self.log[i].connections += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            try:
                with self._lock:
                    upstream = self.upstream
                server = socket.create_connection(upstream, timeout=5)
            except OSError:
                client.close()
                continue
            conn = _Conn(index, client, server)
            with self._lock:
                self._conns.append(conn)
            for src, dst, down in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pump, args=(conn, src, dst, down), daemon=True).start()

    def _close(self, conn: _Conn) -> None:
        with self._lock:
            if conn.closed:
                return
            conn.closed = True
            if conn in self._conns:
                self._conns.remove(conn)
        for s in (conn.client, conn.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _pump(self, conn: _Conn, src: socket.socket, dst: socket.socket, down: bool) -> None:
        src.settimeout(0.1)
        buf = b""
        try:
            while not self._stop.is_set() and not conn.closed:
                if self._on("stall", conn):
                    time.sleep(0.02)
                    continue
                try:
                    data = src.recv(65536)
                except (TimeoutError, socket.timeout):
                    continue
                if not data:
                    break
                if not (down and self.rtsp):
                    self._send(conn, dst, data, down)
                    continue
                buf += data
                units, buf = _split(buf)
                out = b"".join(self._filter(conn, u) for u in units)
                if out:
                    self._send(conn, dst, out, down)
        except OSError:
            pass
        self._close(conn)

    def _filter(self, conn: _Conn, unit: bytes) -> bytes:
        if unit[:1] != b"$":  # RTSP text: learn the channels, pass it
            for m in _TRANSPORT.finditer(unit):
                conn.rtp_channels.add(int(m.group(1)))  # only this pump writes it
            return unit
        if unit[1] not in (conn.rtp_channels or {0}):  # RTCP
            return unit
        muted = self._on("mute", conn)
        if muted:
            with self._lock:
                self.log[muted[0]].frames += 1
            return b""
        corrupt = self._on("corrupt", conn)
        if corrupt:
            f = self.faults[corrupt[0]]
            with self._lock:
                hit = self._rng.random() < (0.2 if f.rate is None else f.rate)
                positions = [self._rng.random() for _ in range(f.flips)]
            first = 4 + _rtp_header(unit[4:])
            if hit and first < len(unit):
                body = bytearray(unit)
                for p in positions:
                    body[first + int(p * (len(unit) - first))] ^= 0xFF
                with self._lock:
                    self.log[corrupt[0]].frames += 1
                return bytes(body)
        return unit

    def _send(self, conn: _Conn, dst: socket.socket, data: bytes, down: bool) -> None:
        view = memoryview(data)
        while view:
            throttled = self._on("throttle", conn) if down else []
            if not throttled:
                dst.sendall(view)
                return
            rate = self.faults[throttled[0]].rate
            piece = view[:max(1, int(rate / 20))]
            dst.sendall(piece)
            with self._lock:
                self.log[throttled[0]].bytes += len(piece)
            view = view[len(piece):]
            time.sleep(len(piece) / rate)
            if self._stop.is_set() or conn.closed:
                return


def _rtp_header(pkt: bytes) -> int:
    """The RTP header's length in ``pkt`` (fixed 12 bytes, the CSRCs and the extension if present)."""
    if len(pkt) < 12:
        return len(pkt)
    n = 12 + 4 * (pkt[0] & 0x0F)
    if pkt[0] & 0x10 and len(pkt) >= n + 4:
        n += 4 + 4 * struct.unpack(">H", pkt[n + 2:n + 4])[0]
    return min(n, len(pkt))


def _split(buf: bytes) -> tuple[list[bytes], bytes]:
    """Whole units at the front of ``buf`` (interleaved frames, RTSP messages with their bodies) and the rest."""
    units = []
    while buf:
        if buf[:1] == b"$":
            if len(buf) < 4:
                break
            n = 4 + struct.unpack(">H", buf[2:4])[0]
        else:
            head = buf.find(b"\r\n\r\n")
            if head < 0:
                break
            m = _LENGTH.search(buf[:head + 2])
            n = head + 4 + (int(m.group(1)) if m else 0)
        if len(buf) < n:
            break
        units.append(buf[:n])
        buf = buf[n:]
    return units, buf
