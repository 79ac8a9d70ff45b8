"""Live sources against a real RTSP server on 127.0.0.1 (GStreamer's gst-rtsp-server, tests/rtsp_server.py), with
the real Lite0 model on the CPU path: connect and classify, a server killed and restarted, an unreachable port, a
server that never answers, three cameras with one dead, inference slower than the camera, SIGTERM with -o.

Every case is bounded in time (timeouts on every wait; the servers are killed in ``finally``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import needs_export

pytestmark = needs_export
ROOT = Path(__file__).resolve().parents[2]


def _trtc(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "toolchain", *map(str, args)], cwd=kw.pop("cwd", None),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_rtsp_stream_gives_the_files_predictions_and_times(rtsp, engine, bikes):
    """bikes.mp4 served over RTSP: every frame arrives (policy block), with the same top-1 and scores as the file
    read directly, the same pts-based times (frame 0 included), a wall-clock receive time, and - the stream being
    live - its end is a failure with a disconnected and a gave_up event, never a normal end."""
    from engines.video import LiveOptions, SourceEvent, classify

    ref = {p.frame: p for p in classify([bikes], engine, batch=8, top_k=3)}
    with rtsp.start(file=bikes) as srv:
        t0 = time.time()
        run = classify([srv.url], engine, batch=8, top_k=3, events=True,
                       live_options=LiveOptions(reconnect_attempts=0, policy="block", read_timeout=5))
        items = list(run)
    preds = [p for p in items if not isinstance(p, SourceEvent)]
    events = [e for e in items if isinstance(e, SourceEvent)]
    assert [p.frame for p in preds] == list(range(250))
    assert all(p.indices == ref[p.frame].indices for p in preds)
    assert max(abs(a - b) for p in preds for a, b in zip(p.scores, ref[p.frame].scores, strict=True)) < 1e-4
    assert max(abs(p.time - ref[p.frame].time) for p in preds) < 1e-3 and preds[0].time == 0.0
    assert all(t0 - 1 < p.received < time.time() + 1 for p in preds)
    assert [e.event for e in events] == ["disconnected", "gave_up"] and events[0].frames == 250
    assert not run.ok and "live source lost" in run.problems[0].reason and "ended" in run.problems[0].reason


def test_killed_server_reconnects_with_events_and_sigterm_keeps_the_output(rtsp, lite0_onnx, tmp_path):
    """The camera goes away (SIGKILL) and comes back 2 s later: the run reconnects, writes a disconnected and a
    reconnected event line, numbers frames on; SIGTERM then ends it like Ctrl-C: exit 143, every line in -o (valid
    JSON, no NaN), the summary on stdout, and stderr says what happened."""
    out = tmp_path / "live.jsonl"
    with rtsp.start(pattern=True) as srv:
        proc = _trtc("run", srv.url, "--model", lite0_onnx[0], "--device", "cpu", "-o", out, "--top-k", "1",
                     "--batch", "4", "--summary", tmp_path / "s.json")
        with _stopped(proc) as ended:
            _wait_for_lines(out, proc, 20)
            srv.kill()
            time.sleep(2)
            srv.start()
            _wait_for(lambda: "reconnected" in _tmp_text(out), 30, proc)
            _wait_for_lines(out, proc, 20, after_event="reconnected")
        stdout, stderr = ended
    assert proc.returncode == 143, stderr
    records = [json.loads(line, parse_constant=_no_nan) for line in out.read_text().splitlines()]
    kinds = [r["event"] for r in records if "event" in r]
    assert kinds == ["disconnected", "reconnected"], kinds
    frames = [r["frame"] for r in records if "frame" in r]
    assert frames == sorted(set(frames)) and len(frames) >= 40  # on across the reconnection, never twice
    assert all(isinstance(r["time"], float) and isinstance(r["received"], float) for r in records if "frame" in r)
    reconnected = next(r for r in records if r.get("event") == "reconnected")
    assert reconnected["attempts"] >= 1 and 1.5 < reconnected["outage_s"] < 30
    assert "connection lost" in stderr and "reconnected after" in stderr
    assert "SIGTERM" not in stdout and "interrupted" in stdout  # the summary table
    assert "--resume" not in stderr  # a live source cannot be resumed: the message must not offer it
    entry = json.loads((tmp_path / "s.json").read_text())["by_source"][srv.url]  # --summary per source
    assert entry["outages"] == 1 and entry["status"] == "interrupted" and entry["classified"] == len(frames)
    assert entry["received"] >= entry["classified"] + entry["dropped"]["queue"] + entry["dropped"]["lag"]
    assert entry["lag_s"]["frames"] == len(frames) and 0 <= entry["lag_s"]["p50"] <= entry["lag_s"]["max"] < 10


def test_unreachable_port_is_a_failure_with_a_fix(rtsp, lite0_onnx, tmp_path):
    """A camera unreachable from the start: a connect_failed event at the first failure (then quiet back-off), a
    gave_up after --reconnect-for, and "never connected" in the problem."""
    url = f"rtsp://127.0.0.1:{rtsp.free_port()}/cam"
    t0 = time.monotonic()
    proc = _trtc("-q", "run", url, "--model", lite0_onnx[0], "--device", "cpu", "--reconnect-for", "2",
                 "--summary", tmp_path / "s.json")
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert time.monotonic() - t0 < 40
    first, event = [json.loads(line) for line in stdout.splitlines()]  # stdout: the event lines, nothing else
    assert first["event"] == "connect_failed" and "nothing accepts connections" in first["reason"]
    assert event["event"] == "gave_up" and event["attempts"] >= 2 and 1.9 < event["outage_s"] < 10
    (problem,) = json.loads((tmp_path / "s.json").read_text())["problems"]
    assert "nothing accepts connections at 127.0.0.1" in problem["reason"] and "gave up after" in problem["reason"]
    assert "never connected" in problem["reason"]
    entry = json.loads((tmp_path / "s.json").read_text())["by_source"][url]
    assert entry == {"received": 0, "classified": 0, "dropped": {"queue": 0, "lag": 0, "cut": 0}, "missing": 0,
                     "damaged": 0,
                     "lag_s": {}, "outages": 0, "status": problem["reason"]}
    # -q: the status column says what happened, then the one error line the run ends with; no warning repeats it
    named = [line for line in stderr.splitlines() if url in line]
    assert len(named) == 2 and named[-1].startswith("error:"), stderr


def test_sigterm_keeps_a_camera_that_never_connected_in_the_problems(rtsp, lite0_onnx, tmp_path):
    """A camera unreachable from the start, the run stopped by SIGTERM while it retries: the connect_failed line
    comes at once, the exit code is the signal's (143), and the camera is a problem ("never connected"), not just
    "interrupted"."""
    url = f"rtsp://127.0.0.1:{rtsp.free_port()}/cam"
    proc = _trtc("run", url, "--model", lite0_onnx[0], "--device", "cpu", "--summary", tmp_path / "s.json")
    with _stopped(proc, 60) as ended:
        first = json.loads(proc.stdout.readline())  # blocks until the first line: the event
        assert first["event"] == "connect_failed"
    stdout, stderr = ended
    assert proc.returncode == 143, stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    (problem,) = summary["problems"]
    assert problem["source"] == url and problem["reason"].startswith("never connected: cannot connect: nothing")
    assert "when the run ended" in problem["reason"] and summary["interrupted"]


def test_silent_server_times_out_and_never_hangs(rtsp, lite0_onnx, tmp_path):
    with rtsp.start(silent=True) as srv:
        t0 = time.monotonic()
        proc = _trtc("run", srv.url, "--model", lite0_onnx[0], "--device", "cpu", "--open-timeout", "1",
                     "--reconnect-attempts", "1", "--summary", tmp_path / "s.json")
        try:
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 1
    assert time.monotonic() - t0 < 30
    (problem,) = json.loads((tmp_path / "s.json").read_text())["problems"]
    assert "no answer to the connection within 1." in problem["reason"] and "gave up after" in problem["reason"]
    assert "--reconnect-attempts (now 1)" in problem["reason"]  # the fix names the option that ended it
    assert [json.loads(line)["event"] for line in stdout.splitlines()] == ["connect_failed", "gave_up"]
    assert stderr.count("cannot connect (retrying quietly)") == 1, stderr  # a warning at once, then quiet


def test_open_timeout_and_reconnect_for_fire_at_their_values(rtsp, orientation_model, tmp_path):
    """A server that accepts and never answers: --open-timeout 5 and 10 end the attempt at 5 and 10 s (+-1 s;
    the message says how long it waited), and a camera that never connected is given up at --reconnect-for
    (9 s, with 4 s attempts), not after the attempt that runs past it. Three processes at once (mostly waiting)."""
    runs = {}
    with rtsp.start(silent=True) as srv:
        for name, opts in (("open5", ["--open-timeout", "5", "--reconnect-for", "0"]),
                           ("open10", ["--open-timeout", "10", "--reconnect-for", "0"]),
                           ("for9", ["--open-timeout", "4", "--reconnect-for", "9"])):
            runs[name] = _trtc("-q", "run", srv.url, "--model", orientation_model, "--device", "cpu", *opts,
                               "--summary", tmp_path / f"{name}.json")
        try:
            done = {name: p.communicate(timeout=60) for name, p in runs.items()}
        finally:
            for p in runs.values():
                p.kill()
    for name, seconds in (("open5", 5), ("open10", 10), ("for9", 9)):
        assert runs[name].returncode == 1, done[name][1]
        events = [json.loads(line) for line in done[name][0].splitlines()]
        gave_up = events[-1]
        assert gave_up["event"] == "gave_up" and abs(gave_up["outage_s"] - seconds) <= 1, (name, events)
        if name != "for9":
            m = re.search(r"no answer to the connection within ([\d.]+) s \(--open-timeout (\d+)\)",
                          gave_up["reason"])
            assert m and abs(float(m.group(1)) - seconds) <= 1 and int(m.group(2)) == seconds, gave_up
    assert json.loads(done["for9"][0].splitlines()[-1])["attempts"] >= 2


def test_three_cameras_one_dead_the_others_unaffected(rtsp, engine):
    from engines.video import LiveOptions, classify

    dead = f"rtsp://127.0.0.1:{rtsp.free_port()}/cam"
    with rtsp.start(pattern=True) as a, rtsp.start(pattern=True) as b:
        run = classify([a.url, dead, b.url], engine, batch=4, top_k=1,
                       live_options=LiveOptions(reconnect_for=1.0, open_timeout=2))
        counts = {a.url: 0, b.url: 0, dead: 0}
        t0 = time.monotonic()
        for p in run:
            counts[p.source] += 1
            if (min(counts[a.url], counts[b.url]) >= 45 and run.problems) or time.monotonic() - t0 > 60:
                break
    assert counts[dead] == 0 and min(counts[a.url], counts[b.url]) >= 45
    assert [p.source for p in run.problems] == [dead] and "gave up" in run.problems[0].reason


class Slow:
    """The real engine, slowed down to a fixed time per batch (inference slower than the camera)."""

    def __init__(self, engine, seconds: float):
        self.engine, self.seconds = engine, seconds
        self.inputs, self.outputs, self.device = engine.inputs, engine.outputs, engine.device
        self.manifest = getattr(engine, "manifest", None)
        self.path = getattr(engine, "path", None)

    def infer(self, x, stream=None):
        t0 = time.perf_counter()
        out = self.engine.infer(x)
        time.sleep(max(0.0, self.seconds - (time.perf_counter() - t0)))
        return out


def test_slow_inference_drops_oldest_counts_every_frame_and_bounds_latency(rtsp, engine):
    """Inference at half the camera's rate (30 fps camera, 4 frames a batch, 266 ms a batch = 15 fps): frames are
    dropped by policy and every one is counted (received = classified + dropped), and the p99 age of a frame
    (received -> result) stays under 2 x (max_wait + one batch's inference)."""
    from engines.video import LiveOptions, classify

    batch, per_batch, max_wait = 4, 4 / 15, 0.1
    slow = Slow(engine, per_batch)
    with rtsp.start(pattern=True) as srv:
        run = classify([srv.url], slow, batch=batch, top_k=1, max_wait_ms=max_wait * 1000,
                       live_options=LiveOptions(reconnect_attempts=0))
        ages = []
        t0 = time.monotonic()
        for p in run:
            ages.append(p.latency_ms / 1000)
            if time.monotonic() - t0 > 8:
                break
    s = run.stats
    decoded, dropped = s.decoded[srv.url], s.dropped.get(srv.url, 0)
    classified = s.per_source[srv.url]
    print(f"slow inference: {decoded} received, {classified} classified, {dropped} dropped; "
          f"age p50 {np.percentile(ages, 50):.3f} s p99 {np.percentile(ages, 99):.3f} s")
    assert classified >= 80 and dropped >= 60  # about half of ~240 frames each
    # every frame received is classified or counted as dropped (by the policy, or left waiting when the run was
    # left); at most the one frame being preprocessed at that moment is neither
    assert 0 <= decoded - classified - dropped - s.damaged.get(srv.url, 0) <= 1
    assert np.percentile(ages, 99) < 2 * (max_wait + per_batch)


def test_worker_pool_passes_live_events_through_in_order(rtsp, lite0_onnx):
    """Live sources in worker processes (--device cuda:0,cuda:1 runs them so; here two CPU workers): the events come
    back to the caller among the predictions, after the frames before them."""
    from engines.video import LiveOptions, SourceEvent, WorkerPool

    with rtsp.start(pattern=True) as a, rtsp.start(pattern=True) as b, \
            WorkerPool(lite0_onnx[0], devices=["cpu", "cpu"]) as pool:
        run = pool.classify([a.url, b.url], events=True, batch=4, top_k=1,  # no lag bound: connection events only
                            live_options=LiveOptions(reconnect_attempts=0, max_lag=None))
        items, t0 = [], time.monotonic()
        for item in run:
            items.append(item)
            if len([i for i in items if not isinstance(i, SourceEvent) and i.source == a.url]) == 30:
                a.kill()  # camera a goes away for good; b goes on
            if any(isinstance(i, SourceEvent) and i.event == "gave_up" for i in items) and \
                    sum(1 for i in items if not isinstance(i, SourceEvent) and i.source == b.url) >= 90:
                break
            assert time.monotonic() - t0 < 90
    events = [(i.source, i.event) for i in items if isinstance(i, SourceEvent)]
    assert events == [(a.url, "disconnected"), (a.url, "gave_up")]
    at = next(n for n, i in enumerate(items) if isinstance(i, SourceEvent))  # disconnected: a's frames all before
    assert not [i for i in items[at:] if not isinstance(i, SourceEvent) and i.source == a.url]
    assert run.events and run.events[0].event == "disconnected"


class _Proxy:
    """A TCP relay between trtc and the RTSP server on 127.0.0.1. ``mute``: the server's RTP data (interleaved
    "$" frames) is dropped while its RTSP replies pass (a camera whose encoder hung); ``stall``: nothing passes
    either way while set (held, not dropped), on every connection, new ones included."""

    def __init__(self, target: int, path: str = "/cam"):
        import socket
        import threading

        self.mute, self.stall = threading.Event(), threading.Event()
        self.target = target
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"rtsp://127.0.0.1:{self.sock.getsockname()[1]}{path}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(c, u, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c, True), daemon=True).start()

    def _pipe(self, a, b, from_server):
        buf = b""
        try:
            while data := a.recv(65536):
                while self.stall.is_set():
                    time.sleep(0.01)
                if not from_server:
                    b.sendall(data)
                    continue
                buf += data
                while buf:  # whole interleaved frames or RTSP messages, so muting never cuts one in half
                    if buf[:1] == b"$":
                        if len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[2:4], "big"):
                            break
                        n = 4 + int.from_bytes(buf[2:4], "big")
                        if not self.mute.is_set():
                            b.sendall(buf[:n])
                        buf = buf[n:]
                    else:
                        end = buf.find(b"\r\n\r\n")
                        if end < 0:
                            break
                        head = buf[:end + 4]
                        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                       if line.lower().startswith(b"content-length:")), 0)
                        if len(buf) < end + 4 + length:
                            break
                        b.sendall(buf[:end + 4 + length])
                        buf = buf[end + 4 + length:]
        except OSError:
            pass
        finally:
            a.close()
            b.close()

    def close(self):
        self.sock.close()


def _events_and_frames(run, until, limit: float):
    """(events with their monotonic arrival times, [(monotonic time, prediction)]) until ``until(events, frames)``
    or ``limit`` seconds."""
    from engines.video import SourceEvent

    events, frames, t0 = [], [], time.monotonic()
    for item in run:
        now = time.monotonic()
        (events if isinstance(item, SourceEvent) else frames).append((now, item))
        if until(events, frames) or now - t0 > limit:
            break
    return events, frames



def _stall_once(proxy, seconds: float, after: int = 30):
    """A callable for an ``until`` test: once ``after`` frames have come, the proxy stalls the stream, and a timer
    ends the stall ``seconds`` later whatever the run does."""
    started = []

    def stall(frames) -> None:
        if len(frames) >= after and not started:
            started.append(threading.Timer(seconds, proxy.stall.clear))
            proxy.stall.set()
            started[0].start()

    return stall

def test_a_camera_that_answers_but_sends_no_video_is_lost_once_then_given_up(rtsp, engine):
    """The server answers RTSP but its video stops (and every reconnection gets replies without video): one
    disconnected at --read-timeout after the last frame (+-1 s), no reconnected (no frame came), and gave_up at
    --reconnect-for after the last frame (+-1 s), with outage_s the time without frames."""
    from engines.video import LiveOptions, classify

    with rtsp.start(pattern=True) as srv:
        proxy = _Proxy(srv.port)
        try:
            run = classify([proxy.url], engine, batch=4, top_k=1, events=True,
                           live_options=LiveOptions(read_timeout=3, open_timeout=3, reconnect_for=8))
            events, frames = _events_and_frames(
                run, lambda ev, fr: (len(fr) >= 30 and proxy.mute.set()) or any(e.event == "gave_up" for _, e in ev),
                60)
        finally:
            proxy.close()
    kinds = [e.event for _, e in events]
    assert kinds == ["disconnected", "gave_up"], kinds
    last = frames[-1][0]
    (t_lost, lost), (t_gave, gave) = events
    assert 3 - 1 <= t_lost - last <= 3 + 1 and "no frame for 3 s" in lost.reason
    assert 8 - 1 <= gave.outage_s <= 8 + 1  # the time without frames, as the source measured it
    assert gave.outage_s == pytest.approx(t_gave - last, abs=1)  # and as the results show it
    assert not run.ok and "--reconnect-for" in str(run.problems[0].reason) + str(run.problems)


def test_a_stall_on_an_open_connection_is_lost_at_the_read_timeout_and_comes_back(rtsp, engine):
    """A stream that stalls 6 s with --read-timeout 2: disconnected 2 s (+-1 s) after the last frame (trtc's own
    watchdog, whatever FFmpeg does with its first timeout), then reconnected at the first frame after the stall
    with outage_s = the time without frames, and frames go on."""
    from engines.video import LiveOptions, classify

    with rtsp.start(pattern=True) as srv:
        proxy = _Proxy(srv.port)
        stall = _stall_once(proxy, 6)

        def until(ev, fr):
            stall(fr)
            return any(e.event == "reconnected" for _, e in ev) and len(fr) >= 60

        try:
            run = classify([proxy.url], engine, batch=4, top_k=1, events=True,
                           live_options=LiveOptions(read_timeout=2, open_timeout=2, reconnect_for=30))
            events, frames = _events_and_frames(run, until, 60)
        finally:
            proxy.stall.clear()
            proxy.close()
    kinds = [e.event for _, e in events]
    assert kinds == ["disconnected", "reconnected"], kinds
    (t_lost, lost), (t_back, back) = events
    last = max(t for t, _ in frames if t < t_lost)
    assert 2 - 1 <= t_lost - last <= 2 + 1 and "no frame for 2 s" in lost.reason
    first_after = min(t for t, _ in frames if t > t_lost)
    # the time without frames (the socket buffers still deliver a little of the stream after the stall begins; the
    # back-off between attempts may add up to its next step, 2 s here, after the stall ends)
    assert back.outage_s == pytest.approx(first_after - last, abs=1) and 2 < back.outage_s < 6 + 2 + 2
    assert len(frames) >= 60


def test_a_backlog_past_max_lag_is_skipped_before_preprocessing_and_reported(rtsp, engine):
    """A 4 s stall shorter than --read-timeout: the frames held back arrive late, all at once. Their lag
    (capture -> now, from the stream's timestamps) is past --max-lag 1: one lagging event, frames decoded but
    skipped (counted in lagged), one caught_up with the count; no disconnection; every frame is classified,
    skipped, dropped or damaged; the lag of the results is measured per source and its max stays near the bound."""
    from engines.video import LiveOptions, classify

    with rtsp.start(pattern=True) as srv:
        proxy = _Proxy(srv.port)
        stall = _stall_once(proxy, 4)

        def until(ev, fr):
            stall(fr)
            return any(e.event == "caught_up" for _, e in ev) and len(fr) >= 90

        try:
            run = classify([proxy.url], engine, batch=4, top_k=1, events=True,
                           live_options=LiveOptions(read_timeout=10, max_lag=1.0, reconnect_attempts=0))
            events, frames = _events_and_frames(run, until, 60)
        finally:
            proxy.stall.clear()
            proxy.close()
    kinds = [e.event for _, e in events]
    assert kinds == ["lagging", "caught_up"], [(e.event, e.reason, e.frames) for _, e in events]
    lagging, caught = events[0][1], events[1][1]
    assert lagging.extra["lag_s"] > 1.0 and caught.extra["lag_s"] <= 0.5
    s = run.stats
    assert s.lagged[proxy.url] == caught.extra["skipped"] >= 30  # most of the 4 s held back (30 fps)
    decoded, classified = s.decoded[proxy.url], s.per_source[proxy.url]
    assert 0 <= decoded - classified - s.lagged[proxy.url] - s.dropped.get(proxy.url, 0) \
        - s.damaged.get(proxy.url, 0) <= 1
    lag = s.to_dict()["lag_s"][proxy.url]
    print(f"lag of results: {lag}")
    assert lag["frames"] == classified and lag["max"] < 1.0 + 1.0  # the bound plus a batch's wait and inference


def test_bandwidth_below_the_bitrate_is_lag_reported_and_bounded(rtsp, engine):
    """The link carries 15 KB/s for 8 s (tests/faultproxy.py's throttle, well below the pattern's bitrate): the
    frames arrive later and later, the lag passes --max-lag 1: one lagging event, frames skipped, then caught_up
    once the backlog drains; no disconnection; the results' lag max stays under the bound + 1 s."""
    from engines.video import LiveOptions, classify
    from tests.faultproxy import Fault, FaultProxy

    with rtsp.start(pattern=True) as srv, \
            FaultProxy(("127.0.0.1", srv.port), [Fault("throttle", 4, 8, rate=15_000)], lifetime=60,
                       path=srv.path) as proxy:
        run = classify([proxy.url()], engine, batch=4, top_k=1, events=True,
                       live_options=LiveOptions(read_timeout=10, max_lag=1.0, reconnect_attempts=0))
        events, frames = _events_and_frames(
            run, lambda ev, fr: any(e.event == "caught_up" for _, e in ev) and len(fr) >= 200, 60)
    kinds = [e.event for _, e in events]
    assert kinds == ["lagging", "caught_up"], kinds
    s = run.stats
    lag = s.to_dict()["lag_s"][proxy.url()]
    print(f"throttled: {s.lagged[proxy.url()]} skipped; lag of results {lag}")
    assert s.lagged[proxy.url()] == events[1][1].extra["skipped"] > 0
    assert lag["max"] < 1.0 + 1.0


def test_damage_is_said_while_the_run_goes_on_and_a_throttled_link_is_not_damage(rtsp, orientation_model,
                                                                                  tmp_path):
    """Two cameras in one `trtc run`: one whose RTP payloads get bytes flipped for 8 s, one throttled to 3 KB/s for
    8 s (a link so thin that trtc's own read timeout interrupts reads in the middle of a picture). The damaged one:
    a damaged event and a warning while the run goes on (results after it), listed in problems with its count. The
    throttled one: no damage anywhere (the frames made up from a packet the read timeout cut short are counted as
    cut, not damaged)."""
    from tests.faultproxy import Fault, FaultProxy

    out, summary = tmp_path / "live.jsonl", tmp_path / "s.json"
    with rtsp.start(pattern=True) as srv, \
            FaultProxy(("127.0.0.1", srv.port), [Fault("corrupt", 2, 8, rate=0.05, flips=4)], lifetime=90,
                       path=srv.path, seed=7) as bad, \
            FaultProxy(("127.0.0.1", srv.port), [Fault("throttle", 2, 8, rate=3_000)], lifetime=90,
                       path=srv.path) as thin:
        proc = _trtc("run", f"bad={bad.url()}", f"thin={thin.url()}", "--model", orientation_model, "--device", "cpu",
                     "--stride", "3", "--top-k", "1", "--max-lag", "30", "-o", out, "--summary", summary,
                     env={**os.environ, "TRTC_CPU_THREADS": "1", "PYTHONPATH": str(ROOT)})
        with _stopped(proc) as ended:
            _wait_for(lambda: '"damaged"' in _tmp_text(out), 40, proc)
            _wait_for(lambda: thin.elapsed() > 12, 40, proc)  # both faults over, the thin link drained
            _wait_for(lambda: _tmp_text(out).split('"damaged"', 1)[1].count('"source": "bad"') >= 5, 40, proc)
        stdout, stderr = ended
    assert proc.returncode == 143, stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    damaged = [r for r in records if r.get("event") == "damaged"]
    assert damaged and {r["source"] for r in damaged} == {"bad"}, damaged
    assert damaged[0]["lost"] >= 1 and damaged[0]["total"] >= damaged[0]["lost"] and damaged[0]["since"] > 0
    last_bad = max(r["received"] for r in records if r.get("source") == "bad" and "frame" in r)
    assert last_bad > damaged[0]["received"]  # said while the run went on
    assert "lost to damage in the stream" in stderr and "the run goes on" in stderr
    report = json.loads(summary.read_text())
    problems = {p["source"]: p["reason"] for p in report["problems"]}
    assert "bad" in problems and problems["bad"].startswith("damaged:") and report["by_source"]["bad"]["damaged"] > 0
    thin_entry = report["by_source"]["thin"]
    print(f"throttled: {thin_entry}")
    assert thin_entry["damaged"] == 0 and "thin" not in problems and thin_entry["status"] == "interrupted"
    assert thin_entry["classified"] > 0


SETTLE_S = 5.0  # the stream time over which a connection's lag anchor is the smallest (received - time)


def _lags_from_lines(records: list[dict]) -> list[float]:
    """Each result's lag (capture -> result) from the lines alone: result = received + latency_ms; a connection's
    capture time = anchor + time, the anchor being the smallest (received - time) over the connection's first
    SETTLE_S s of stream time (applied back to those frames), then the smallest so far."""
    lags, anchor, first, settled = [], None, None, None
    for r in records:
        if r.get("event") in ("disconnected", "reconnected"):
            anchor = first = settled = None
            continue
        if "frame" not in r:
            continue
        off = r["received"] - r["time"]
        anchor = off if anchor is None else min(anchor, off)
        first = r["time"] if first is None else first
        if settled is None and r["time"] - first >= SETTLE_S:
            settled = len(lags) + 1  # the window's lines get the anchor it ends with
            lags = [x - anchor for x in lags]
        result = r["received"] + r["latency_ms"] / 1000 - r["time"]
        lags.append(result - anchor if settled is not None else result)
    if settled is None:
        lags = [x - anchor for x in lags]
    return lags


def test_summary_lag_is_the_lines_lag_from_the_first_frame(rtsp, orientation_model, tmp_path):
    """The summary's lag p50 / p99 / max equal, within 50 ms, what the lines give (each line's result time and
    stream time; the anchor computed here), the first frames of the connection included: they come in a burst
    (read while the stream is probed), late, and used to count as about 0."""
    out, summary = tmp_path / "live.jsonl", tmp_path / "s.json"
    with rtsp.start(pattern=True) as srv:
        proc = _trtc("run", srv.url, "--model", orientation_model, "--device", "cpu", "--top-k", "1", "--latency",
                     "--on-lag", "block", "--max-lag", "0", "-o", out, "--summary", summary,
                     env={**os.environ, "TRTC_CPU_THREADS": "1", "PYTHONPATH": str(ROOT)})
        with _stopped(proc) as ended:
            _wait_for_lines(out, proc, 240)  # 8 s at 30 fps: past the anchor's window
        stdout, stderr = ended
    assert proc.returncode == 143, stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    lags = np.sort(_lags_from_lines(records))
    got = json.loads(summary.read_text())["by_source"][srv.url]["lag_s"]
    n = len(lags)
    want = {"p50": lags[int(np.ceil(0.5 * n)) - 1], "p99": lags[int(np.ceil(0.99 * n)) - 1], "max": lags[-1]}
    print(f"lines: { {k: round(float(v), 3) for k, v in want.items()} }, summary: {got}, first: {lags[:3]}")
    assert got["frames"] == n
    for k in ("p50", "p99", "max"):
        assert abs(got[k] - want[k]) <= 0.05, (k, got, want)


def test_udp_against_a_tcp_only_server_says_to_use_tcp_in_a_short_table_row(rtsp, orientation_model, tmp_path):
    """gst-rtsp-server here offers RTP over TCP only: --rtsp-transport udp fails with FFmpeg's "Protocol not
    supported", which trtc says as such, with --rtsp-transport tcp as the fix. The problem (about 400 characters with
    its fix) is whole in the warning, the error line and --summary, and a few lines in the stdout table (it used to
    wrap into 35)."""
    with rtsp.start(pattern=True) as srv:
        proc = _trtc("run", srv.url, "--model", orientation_model, "--device", "cpu", "--rtsp-transport", "udp",
                     "--reconnect-for", "0", "-o", tmp_path / "o.jsonl", "--summary", tmp_path / "s.json")
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    (problem,) = json.loads((tmp_path / "s.json").read_text())["problems"]
    assert "does not send RTP over UDP" in problem["reason"] and "--rtsp-transport tcp" in problem["reason"]
    assert len(problem["reason"]) > 300
    assert "fix: use --rtsp-transport tcp" in stderr
    table = [line for line in stdout.splitlines() if line.startswith(("│", "┃"))]
    assert 2 <= len(table) <= 8, stdout  # the header, then the row's few lines


def test_sigterm_in_the_first_second_with_o_says_no_file_and_lists_the_camera(rtsp, orientation_model, tmp_path):
    """SIGTERM while the only camera is still in its first attempt (a server that never answers): no line was
    written, so -o is not created and the message says so (not "the lines printed above"); the camera is a problem,
    never connected; exit 143."""
    out, summary = tmp_path / "o.jsonl", tmp_path / "s.json"
    with rtsp.start(silent=True) as srv:
        proc = _trtc("run", srv.url, "--model", orientation_model, "--device", "cpu", "-o", out, "--summary", summary)
        with _stopped(proc) as ended:
            _wait_for(out.exists, 30, proc)  # the run is under way (a live run writes -o itself)
            time.sleep(0.5)
        stdout, stderr = ended
    assert proc.returncode == 143, stderr
    assert not out.exists() and not list(tmp_path.glob(".o.jsonl.*"))
    assert f"no line was written yet, so {out} was not created" in stderr and "printed above" not in stderr
    (problem,) = json.loads(summary.read_text())["problems"]
    assert problem["source"] == srv.url and problem["reason"].startswith("never connected: no frame in the")


def test_resume_refuses_live_sources(lite0_onnx, tmp_path):
    from click.testing import CliRunner

    from toolchain.cli import cli

    out = tmp_path / "o.jsonl"
    out.write_text("")
    r = CliRunner().invoke(cli, ["run", "rtsp://127.0.0.1:9/cam", "--model", str(lite0_onnx[0]), "--device", "cpu",
                                 "-o", str(out), "--resume"])
    assert r.exit_code == 2 and "--resume cannot continue a live source" in r.output


def test_a_run_with_nothing_to_keep_leaves_no_output_file(lite0_onnx, tmp_path):
    """A failed source used to leave a 0-byte -o that then blocked the corrected command ("already exists")."""
    from click.testing import CliRunner

    from toolchain.cli import cli

    out = tmp_path / "o.jsonl"
    args = ["run", str(tmp_path / "missing.mp4"), "--model", str(lite0_onnx[0]), "--device", "cpu", "-o", str(out)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2 and "no such file" in r.output and "fix: check the path" in r.output  # a missing input
    assert not out.exists() and not list(tmp_path.glob(".o.jsonl.*"))


# --------------------------------------------------------------------------------------------------- helpers
def _no_nan(text):
    raise AssertionError(f"{text} in a JSON line")


def _tmp_text(out: Path) -> str:
    """What a live run has written so far: ``out`` itself, a whole line at a time (no temporary file beside it)."""
    assert not list(out.parent.glob(f".{out.name}.*.tmp")), "a live run's -o went to a temporary file"
    return out.read_text() if out.exists() else ""



@contextlib.contextmanager
def _stopped(proc, timeout: float = 30):
    """``with _stopped(proc) as ended:``: the body waits for what the test needs; then SIGTERM, and ``ended`` holds
    the process's (stdout, stderr) once it ended; it is killed however the body or the wait ended."""
    ended: list = []
    try:
        yield ended
        proc.send_signal(signal.SIGTERM)
        ended.extend(proc.communicate(timeout=timeout))
    finally:
        proc.kill()

def _wait_for(cond, timeout: float, proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"trtc run ended early: {proc.communicate()}")
        time.sleep(0.2)
    raise AssertionError("timed out")


def _wait_for_lines(out: Path, proc, n: int, after_event: str | None = None) -> None:
    def enough():
        text = _tmp_text(out)
        if after_event:
            text = text.split(after_event, 1)[-1] if after_event in text else ""
        return text.count('"frame"') >= n

    _wait_for(enough, 60, proc)


