"""The fault proxy of the live-source tests (tests/faultproxy.py) against a plain TCP echo server on 127.0.0.1:
each fault does what it says, only while it is scheduled, and is recorded."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from tests.faultproxy import Fault, FaultProxy, _split


@pytest.fixture
def echo():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.1)
    stop = threading.Event()

    def serve(c):
        with c:
            while True:
                try:
                    d = c.recv(65536)
                except OSError:
                    return
                if not d:
                    return
                c.sendall(d)

    def loop():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield srv.getsockname()
    stop.set()
    t.join(2)
    srv.close()


def _client(proxy, timeout=2.0):
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    return s


def _recv(s, n, timeout=2.0):
    s.settimeout(timeout)
    got = b""
    while len(got) < n:
        d = s.recv(n - len(got))
        if not d:
            break
        got += d
    return got


def _closed(s) -> bool:
    """True when the proxy closed or reset ``s`` without passing anything."""
    try:
        s.sendall(b"?")
        return _recv(s, 1) == b""
    except (ConnectionResetError, BrokenPipeError):  # a reset, or data unread when the proxy closed
        return True


def _shut_at_accept(proxy) -> bool:
    """True when a new connection to ``proxy`` is reset or closed before anything passes."""
    try:
        with _client(proxy) as s:
            return _closed(s)
    except ConnectionResetError:
        return True


def _frame(channel, payload):
    return b"$" + bytes([channel]) + struct.pack(">H", len(payload)) + payload


RTP = bytes([0x80, 96]) + b"\x00\x01" + b"\x00" * 8  # version 2, no CSRC, no extension


def test_bytes_pass_both_ways_and_the_proxy_binds_loopback_only(echo):
    with FaultProxy(echo, rtsp=False, lifetime=10) as p:
        assert p._listener.getsockname()[0] == "127.0.0.1"
        with _client(p) as s:
            s.sendall(b"hello" * 1000)
            assert _recv(s, 5000) == b"hello" * 1000
        assert p.connections() == 1


def test_stall_holds_bytes_then_releases_them(echo):
    with FaultProxy(echo, [Fault("stall", 0.3, 1.0)], rtsp=False, lifetime=10) as p:
        with _client(p) as s:
            s.sendall(b"a")
            assert _recv(s, 1) == b"a"
            time.sleep(0.5 - p.elapsed() if p.elapsed() < 0.5 else 0)
            s.sendall(b"held")
            s.settimeout(0.5)
            with pytest.raises(TimeoutError):
                s.recv(10)  # nothing while stalled, connection open
            t = time.monotonic()
            assert _recv(s, 4, timeout=3) == b"held"
            assert p.elapsed() >= 1.25 and time.monotonic() - t < 2
        (rec,) = p.report()
        assert rec["kind"] == "stall" and rec["ended"] - rec["started"] == pytest.approx(1.0, abs=0.2)


def test_cut_closes_open_connections_and_new_ones_during_its_window(echo):
    with FaultProxy(echo, [Fault("cut", 0.3, 0.6)], rtsp=False, lifetime=10) as p:
        s = _client(p)
        s.sendall(b"x")
        assert _recv(s, 1) == b"x"
        time.sleep(0.5)
        assert _closed(s)  # closed by the proxy
        assert _shut_at_accept(p)
        time.sleep(max(0.0, 1.0 - p.elapsed()))
        with _client(p) as s3:  # after the window: through again
            s3.sendall(b"z")
            assert _recv(s3, 1) == b"z"
        s.close()
        assert p.report()[0]["connections"] == 2


def test_refuse_resets_new_connections_only(echo):
    with FaultProxy(echo, [Fault("refuse", 0.2, 0.6)], rtsp=False, lifetime=10) as p:
        with _client(p) as kept:
            time.sleep(0.4)
            assert _shut_at_accept(p)
            kept.sendall(b"k")
            assert _recv(kept, 1) == b"k"
        time.sleep(max(0.0, 0.9 - p.elapsed()))
        with _client(p) as s:
            s.sendall(b"r")
            assert _recv(s, 1) == b"r"
        assert p.report()[0]["connections"] == 1


def test_throttle_caps_the_rate_from_the_server(echo):
    rate = 40_000
    with FaultProxy(echo, [Fault("throttle", 0.0, 30, rate=rate)], rtsp=False, lifetime=10) as p:
        with _client(p, timeout=5) as s:
            data = b"t" * 40_000
            t = time.monotonic()
            s.sendall(data)
            assert _recv(s, len(data), timeout=5) == data
            took = time.monotonic() - t
    assert 0.8 < took < 2.5  # 1 s at 40 kB/s


def test_mute_drops_rtp_frames_and_passes_rtsp_text_and_rtcp(echo):
    setup = b"RTSP/1.0 200 OK\r\nCSeq: 3\r\nTransport: RTP/AVP/TCP;unicast;interleaved=2-3\r\n\r\n"
    rtp, rtcp = _frame(2, RTP + b"video"), _frame(3, b"\x80\xc8sender-report")
    with FaultProxy(echo, [Fault("mute", 0.3, 30)], lifetime=10) as p:
        with _client(p) as s:
            s.sendall(setup)
            assert _recv(s, len(setup)) == setup
            s.sendall(rtp)
            assert _recv(s, len(rtp)) == rtp  # before the fault: through
            time.sleep(0.4)
            reply = b"RTSP/1.0 200 OK\r\nCSeq: 4\r\nContent-Length: 5\r\n\r\nhello"
            s.sendall(rtp + rtcp + rtp + reply)
            want = rtcp + reply
            assert _recv(s, len(want)) == want
        assert p.report()[0]["frames"] == 2


def test_corrupt_flips_payload_bytes_but_keeps_framing_and_header(echo):
    payload = bytes(range(200))
    pkt = _frame(0, RTP + payload)
    with FaultProxy(echo, [Fault("corrupt", 0.0, 30, rate=1.0, flips=50)], lifetime=10) as p:
        with _client(p) as s:
            s.sendall(pkt * 3)
            got = _recv(s, len(pkt) * 3)
    units, rest = _split(got)
    assert len(units) == 3 and rest == b""
    for u in units:
        assert u[:4] == pkt[:4] and u[4:16] == RTP  # framing and RTP header untouched
        assert u[16:] != payload and sum(a != b for a, b in zip(u[16:], payload)) <= 50
    assert p.report()[0]["frames"] == 3


def test_switch_moves_the_upstream_and_drops_open_connections(echo):
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(4)
    other.settimeout(3)
    try:
        with FaultProxy(echo, [Fault("switch", 0.2, upstream=other.getsockname())], rtsp=False, lifetime=10) as p:
            s = _client(p)
            time.sleep(0.4)
            assert _closed(s)
            s.close()
            with _client(p) as s2:
                c, _ = other.accept()  # the new connection went to the other server
                c.sendall(b"B")
                assert _recv(s2, 1) == b"B"
                c.close()
            assert p.report()[0]["connections"] == 1
    finally:
        other.close()


def test_stops_by_itself_after_its_lifetime(echo):
    p = FaultProxy(echo, rtsp=False, lifetime=0.3).start()
    s = _client(p)
    time.sleep(0.8)
    assert _closed(s)
    with pytest.raises(OSError):
        _client(p, timeout=0.5).sendall(b"x")
    s.close()


def test_split_keeps_partial_units():
    a, b = _frame(0, b"x" * 10), b"RTSP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc"
    units, rest = _split(a + b + a[:5])
    assert units == [a, b] and rest == a[:5]


def test_mute_and_corrupt_need_rtsp_framing(echo):
    with pytest.raises(ValueError):
        FaultProxy(echo, [Fault("mute", 0, 1)], rtsp=False)
    with pytest.raises(ValueError):
        Fault("drop", 0)


def test_add_starts_a_fault_now(echo):
    with FaultProxy(echo, rtsp=False, lifetime=10) as p:
        with _client(p) as s:
            time.sleep(0.3)
            p.add("cut")
            time.sleep(0.2)
            assert _closed(s)
        assert p.report()[0]["kind"] == "cut" and p.report()[0]["connections"] == 1
