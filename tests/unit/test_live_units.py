"""The parts of live-source handling that need no server: back-off, the frame hand-over's policies, the Annex B feed
NVDEC reads (checked by decoding it with a bare FFmpeg decoder), stdout kept for results, JSON without NaN, and
run's temporary files of a killed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engines.video.hub import EVENT, FRAME, FrameHub
from engines.video.live import LiveOptions, Liveness, network_error, refused

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_backoff_doubles_up_to_its_cap_and_gives_up_after_reconnect_for():
    clock = Clock()
    lv = Liveness(LiveOptions(backoff_first=0.5, backoff_max=4, reconnect_for=10), clock)
    lv.frame()
    delays = []
    while (d := lv.lost()) is not None:
        delays.append(d)
        clock.t += d
    assert delays == [0.5, 1, 2, 4, 2.5]  # the last one is cut to end exactly at reconnect_for
    assert lv.outage_s() == pytest.approx(10)
    lv.opening()
    assert lv.frame() == (pytest.approx(10), 5)  # the first frame of the new connection ends the outage
    assert lv.lost() == 0.5  # a new outage starts the schedule again


def test_reconnect_attempts_limit_and_zero_means_no_reconnect():
    lv = Liveness(LiveOptions(reconnect_attempts=2), Clock())
    assert [lv.lost(), lv.lost(), lv.lost()] == [0.5, 1, None]
    assert "--reconnect-attempts (now 2)" in lv.ran_out()
    lv = Liveness(LiveOptions(reconnect_for=0), Clock())
    assert lv.lost() is None and "--reconnect-for" in lv.ran_out()


def test_a_connection_counts_from_its_first_frame_and_the_outage_from_the_last():
    """Connections that open but give no frame neither end the outage nor restart its clock: the outage (and
    reconnect_for) runs from the last frame, and only a frame ends it."""
    clock = Clock()
    lv = Liveness(LiveOptions(read_timeout=5, open_timeout=3, reconnect_for=15), clock)
    assert lv.deadline() == 3  # the first frame is due open_timeout after the attempt
    clock.t = 1.0
    assert lv.frame() is None and lv.live  # the first frame ever: no reconnection
    clock.t = 2.0
    lv.frame()
    assert lv.deadline() == 7  # read_timeout after the last frame
    clock.t = 7.0
    assert lv.lost() is not None and lv.outage_s() == 5.0  # counted from the last frame
    for t in (8.0, 11.0, 14.0):  # each attempt opens, no frame comes
        clock.t = t
        lv.opening()
        assert lv.deadline() == min(t + 3, 17.0)  # never past the give-up moment (last frame + reconnect_for)
        clock.t = lv.deadline()
        delay = lv.lost()
    assert delay is None and lv.outage_s() == 15.0 and not lv.live


def test_a_camera_that_never_connected_is_given_up_at_reconnect_for_not_past_it():
    """Its attempts' deadlines never pass the give-up moment (first attempt + reconnect_for), as for a camera that
    had frames; with reconnect_for 0 (no reconnecting) its one attempt gets its whole open_timeout."""
    clock = Clock()
    lv = Liveness(LiveOptions(open_timeout=10, reconnect_for=25), clock)
    ends = []
    while True:
        lv.opening()
        clock.t = lv.deadline()  # each attempt times out
        ends.append(clock.t)
        delay = lv.lost()
        if delay is None:
            break
        clock.t += delay
    assert ends[0] == 10 and max(ends) == 25 and lv.outage_s() == 25
    lv = Liveness(LiveOptions(open_timeout=10, reconnect_for=2), Clock())
    assert lv.deadline() == 10  # a first attempt gets its whole open_timeout, whatever reconnect_for says


def test_a_last_try_squeezed_by_the_give_up_reports_the_failure_before_it():
    """The attempt made just before the give-up moment has a few milliseconds and times out: the source is given up
    with the reason of the attempt before it (a 401 here), not with that timeout."""
    from engines.video.live import LiveSource
    from engines.video.source_base import SourceError

    class Src(LiveSource):
        name, decoded, stop, lagged = "cam", 0, None, 0
        options = LiveOptions(open_timeout=3, reconnect_for=2, backoff_first=0.01, backoff_max=0.01)

        def __init__(self):
            self.events = []
            self.on_event = self.events.append

    clock, src = Clock(), Src()
    lv = Liveness(src.options, clock)
    lv.opening()
    clock.t = 0.1
    src._lost(lv, "the server asks for a user name and password (401)", "give them")
    clock.t = 1.995
    lv.opening()
    assert lv.squeezed()
    clock.t = 2.0
    with pytest.raises(SourceError, match=r"never connected: the server asks for a user name and password \(401\)"):
        src._lost(lv, "no answer to the connection within 0.0 s", "allow longer")
    assert [e.event for e in src.events] == ["connect_failed", "gave_up"] and "401" in src.events[1].reason


def test_watchdog_resumes_interrupted_reads_and_fires_at_the_deadline():
    """watched_packets: a read that PyAV's short timeout interrupts is resumed with a fresh demuxer while the
    deadline is ahead; past it NoFrames says which timeout, whatever the demuxer does."""
    from engines.video.live import AVERROR_EXIT, NoFrames, watched_packets

    class Exit(Exception):
        errno = AVERROR_EXIT

    clock = Clock()
    reads = []

    class Container:
        def demux(self, stream):
            reads.append(clock.t)
            while True:
                clock.t += 1.0
                if clock.t < 3:
                    yield f"p{clock.t:g}"
                else:
                    raise Exit("Immediate exit requested")

    lv = Liveness(LiveOptions(read_timeout=5, open_timeout=10), clock)
    got = []
    with pytest.raises(NoFrames, match="no frame for 5 s"):
        for packet, _ in watched_packets(Container(), None, lv):
            lv.frame()
            got.append(packet)
    assert got == ["p1", "p2"] and clock.t == 7.0  # the last frame at 2 s, declared lost at 2 + 5 s
    assert reads == [0.0, 3.0, 4.0, 5.0, 6.0]  # one fresh demuxer per interrupted read


def test_hub_drop_oldest_keeps_the_newest_frames_and_counts_the_rest():
    hub = FrameHub()
    hub.add("cam", 3, "drop-oldest")
    for i in range(10):
        hub.put("cam", i)  # never waits
    hub.done("cam")
    got = []
    while (item := hub.get(None)) is not None:
        got.append(item[1][1])
    assert got == [7, 8, 9] and hub.dropped == {"cam": 7}


def test_hub_block_waits_and_loses_nothing_and_takes_sources_in_arrival_order():
    hub = FrameHub()
    hub.add("file", 2, "block")
    hub.add("cam", 2, "drop-oldest")

    def producer():
        for i in range(6):
            hub.put("file", i)
        hub.done("file")

    t = threading.Thread(target=producer)
    t.start()
    time.sleep(0.2)
    assert hub.waiting() == 2  # the file's producer waits for room
    hub.put("cam", "c0")
    hub.event("ev")
    hub.done("cam")
    got = []
    while (item := hub.get(time.monotonic() + 5)) is not None:
        got.append(item[1] if item[0] == EVENT else item[1][1])
    t.join(5)
    assert [g for g in got if isinstance(g, int)] == list(range(6)) and hub.dropped == {"file": 0, "cam": 0}
    assert got.index("c0") < got.index("ev")  # an event comes after the frames that arrived before it
    assert FRAME == "frame"


def test_hub_remove_takes_one_source_out_while_the_others_go_on():
    """A camera removed from a running service (engines.video.fleet): its waiting and dropped frames are counted,
    its producer gets Closed (also one blocked on a full queue), the other source and the order are untouched."""
    from engines.video.hub import Closed

    hub = FrameHub()
    hub.open_producer()  # the fleet's own hold: the hub does not finish when its sources do
    hub.add("door", 2, "drop-oldest")
    hub.add("dock", 1, "block")
    for i in range(3):
        hub.put("door", i)  # one dropped
    hub.put("dock", "d0")
    blocked = []

    def producer():
        try:
            hub.put("dock", "d1")  # waits: the queue is full
        except Closed:
            blocked.append("closed")

    t = threading.Thread(target=producer)
    t.start()
    time.sleep(0.2)
    assert hub.remove("dock") == 1  # d0 waited, nothing dropped
    t.join(5)
    assert blocked == ["closed"]
    with pytest.raises(Closed):
        hub.put("dock", "late")
    assert hub.remove("door") == 3 and hub.remove("door") == 0  # two waiting + one dropped; then nothing
    hub.add("door", 2, "drop-oldest")  # the same name again (a changed camera): a new queue, counts from 0
    hub.put("door", "new")
    assert hub.get(time.monotonic() + 1)[1][1] == "new" and hub.dropped["door"] == 0


def test_hub_get_returns_none_at_the_deadline():
    hub = FrameHub()
    hub.add("cam", 2, "drop-oldest")
    t0 = time.monotonic()
    assert hub.get(t0 + 0.2) is None and 0.15 < time.monotonic() - t0 < 2


def test_batch_age_is_bounded_by_max_wait_not_by_the_gap_between_frames():
    """A frame every 60 ms with --max-wait-ms 100: the old rule (wait between frames) never ran a partial batch;
    a batch must run once its oldest frame has waited 100 ms."""
    import numpy as np

    from engines.video.cpu_pipeline import infer_and_collect
    from engines.video.pipeline import RunStats
    from engines.topk import TopK

    class Engine:
        def infer(self, x):
            return [np.tile(np.arange(5, dtype=np.float32), (len(x), 1))]

    hub = FrameHub()
    hub.add("cam", 100, "block")

    def producer():
        for i in range(8):
            hub.put("cam", ("cam", i, i, i / 25, np.zeros(3, np.float32), time.time(), time.monotonic()))
            time.sleep(0.06)
        hub.done("cam")

    threading.Thread(target=producer, daemon=True).start()
    stats = RunStats()
    ages = []
    for p in infer_and_collect(hub, Engine(), 32, TopK(1, "raw"), 100, stats, {"cam": 0}, time.perf_counter(),
                               lambda *a: a):
        ages.append(p[6])  # latency_ms
    assert len(ages) == 8 and max(stats.batch_sizes) <= 3  # about 100 ms / 60 ms + 1 frames a batch
    assert max(ages) < 100 + 80  # the oldest frame of a batch waited about max_wait, plus scheduling slack


def test_annexb_packets_decode_with_a_bare_decoder_exactly_as_the_container(bikes):
    """What NVDEC's parser is fed on the GPU path (engines.video.nvdec_feed.AnnexB): a decoder without the MP4's
    codec parameters must decode it to the same pictures as PyAV reading the container."""
    import av
    import numpy as np

    from engines.video.nvdec_feed import AnnexB

    with av.open(str(bikes)) as c:
        ref = [f.to_ndarray(format="gray") for f in c.decode(video=0)]
    with av.open(str(bikes)) as c:
        s = c.streams.video[0]
        feed = AnnexB(s)
        bare = av.CodecContext.create("h264", "r")
        got = []
        for packet in c.demux(s):
            for data, pts in feed.convert(packet):
                assert bytes(data[:4]) == b"\x00\x00\x00\x01" or bytes(data[:3]) == b"\x00\x00\x01"
                p = av.Packet(data.tobytes())
                p.pts = pts
                got += [f.to_ndarray(format="gray") for f in bare.decode(p)]
        got += [f.to_ndarray(format="gray") for f in bare.decode(None)]
    assert len(got) == len(ref) == 250
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))


def test_network_errors_are_said_in_words_with_a_fix():
    o = LiveOptions(open_timeout=3)
    reason, fix = network_error("rtsp://cam:554/s", ConnectionRefusedError("Connection refused"), o, True)
    assert "nothing accepts connections at cam:554" in reason and "running" in fix
    reason, fix = network_error("rtsp://u:p@cam/s", OSError("Invalid data found when processing input"), o, True,
                                elapsed=3.1)
    assert reason.startswith("no answer to the connection within 3.1 s (--open-timeout 3)") and "--open-timeout" in fix
    reason, _ = network_error("rtsp://cam/s", OSError("Server returned 401 Unauthorized"), o, True, elapsed=0.1)
    assert "user name and password" in reason and "u:p" not in reason
    # a port that holds 401, 403 or 404 is no status: a closed port is neither refused credentials nor final
    refused_port = OSError("[Errno 111] Connection refused: 'rtsp://u:p@127.0.0.1:48403/cam'")
    assert not refused("rtsp://u:p@127.0.0.1:48403/cam", refused_port)
    reason, _ = network_error("rtsp://127.0.0.1:40404/cam", OSError("Input/output error: 'rtsp://127.0.0.1:40404/cam'"),
                              o, False)
    assert "404" not in reason.split("[")[0]
    assert refused("rtsp://u:p@cam/s", OSError("Server returned 401 Unauthorized (authorization failed)"))
    assert refused("rtsp://cam/s", OSError("Server returned 403 Forbidden (access denied): 'rtsp://cam/s'"))
    assert not refused("rtsp://cam/s", OSError("Server returned 401 Unauthorized: 'rtsp://cam/s'"))


def test_stdout_keeps_only_results_when_a_native_library_prints(tmp_path):
    """A native print (libc puts, as PyNvVideoCodec's decoder does) goes to stderr once trtc's CLI has moved stdout;
    Python's prints stay on stdout."""
    code = ("import ctypes, sys; from toolchain.cli import keep_stdout_for_results; keep_stdout_for_results(); "
            "libc = ctypes.CDLL(None); libc.puts(b'Decode Error occurred for picture 3'); libc.fflush(None); "
            "print(json.dumps({'frame': 0}))")
    r = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == '{"frame": 0}\n' and "Decode Error occurred" in r.stderr


def test_prediction_json_has_no_nan():
    from engines.video.pipeline import Prediction

    p = Prediction("s", 3, None, float("nan"), [1], [0.5], received=float("inf"), latency_ms=float("nan"),
                   decode_ms=None)
    d = p.to_dict(latency=True)
    json.dumps(d, allow_nan=False)
    assert d["time"] is None and d["received"] is None and d["latency_ms"] is None


def test_killed_runs_temporary_file_is_named_or_adopted_by_resume(tmp_path, caplog):
    from toolchain._ui import Reporter
    from toolchain.run import _orphans

    out = tmp_path / "preds.jsonl"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f".preds.jsonl.{dead.pid}.tmp"
    orphan.write_text('{"source": "a.mp4", "frame": 0}\n')
    mine = tmp_path / f".preds.jsonl.{os.getpid()}.tmp"  # a run still going (this process): left alone
    mine.write_text("")
    with caplog.at_level("WARNING", logger="trtc"):
        _orphans(out, resume=False, reporter=Reporter())
    assert orphan.exists() and str(orphan) in caplog.text and "--resume" in caplog.text
    _orphans(out, resume=True, reporter=Reporter())
    assert not orphan.exists() and out.read_text().startswith('{"source": "a.mp4"') and mine.exists()


def test_missing_frames_are_counted_from_the_span_of_timestamps_even_out_of_order():
    from fractions import Fraction
    from types import SimpleNamespace

    from engines.video.sources import Timeline

    stream = SimpleNamespace(time_base=Fraction(1, 90000), average_rate=Fraction(25), guessed_rate=None,
                             start_time=None)

    def feed(pts_list):
        tl = Timeline(stream, live=True)
        for p in pts_list:
            tl.stamp(SimpleNamespace(pts=p, time_base=None))
        return tl

    step = 3600
    decode_order = [0, 2 * step, step, 4 * step, 3 * step, 6 * step, 5 * step]  # B-frames stamped in decode order
    assert feed(decode_order).missing == 0
    assert feed([0, step, 5 * step, 6 * step]).missing == 3  # frames 2, 3 and 4 never came
    tl = feed([None, step, 2 * step])  # an RTSP session's first frame has no pts
    assert tl.missing == 0 and tl.low == 0


def test_gpu_live_path_replans_a_camera_that_returns_at_another_size():
    """nvdec_feed.make_decoder takes each connection's stream as new: the source's info (size, codec, colour) is
    replaced, so the preprocessing plan (keyed on it) follows a camera that comes back at another resolution."""
    from fractions import Fraction
    from types import SimpleNamespace as NS

    from engines.video.nvdec_feed import make_decoder
    from engines.video.sources import NvdecSource

    made = []
    nvc = NS(cudaVideoCodec=NS(H264=4, HEVC=8), cudaVideoChromaFormat=NS(__members__={"YUV420": 1}),
             DisplayDecodeLatencyType=NS(NATIVE=0, LOW=1, ZERO=2),
             GetDecoderCaps=lambda **kw: {"supported": True, "width_max": 8192, "height_max": 8192},
             CreateDecoder=lambda **kw: made.append(kw) or object())

    def stream(codec, w, h):
        cc = NS(name=codec, width=w, height=h, pix_fmt="yuv420p", format=None, colorspace=None, color_range=None)
        return NS(codec_context=cc, average_rate=Fraction(30), time_base=Fraction(1, 90000))

    src = NvdecSource("rtsp://127.0.0.1:1/cam")
    make_decoder(src, nvc, stream("h264", 640, 360), 0)
    first = src.info
    make_decoder(src, nvc, stream("hevc", 1920, 1080), 0)
    assert (first.width, first.height, first.codec) == (640, 360, "h264")  # the old info is not changed in place
    assert (src.info.width, src.info.height, src.info.codec) == (1920, 1080, "hevc")
    assert src.info.colorspace.matrix == "bt709" and first.colorspace.matrix == "bt601"
    assert [m["codec"] for m in made] == [4, 8]  # a decoder per connection, for its codec
    # a connection that opened without any video (its size unknown) is no frame, judged by the liveness rules,
    # not a stream NVDEC cannot decode (which would end the source)
    from engines.video.live import NoFrames

    with pytest.raises(NoFrames, match="no video"):
        make_decoder(src, nvc, stream("h264", 0, 0), 0)
    assert src.info.width == 1920 and len(made) == 2


def test_lag_is_capture_to_now_anchored_at_the_quickest_frame_and_restarts_per_connection():
    from engines.video.live import LagClock

    lc = LagClock()
    assert lc.captured(10.0, 1000.5).at == 1000.5  # the first frame anchors: stream time 10 s = 1000.5
    assert lc.captured(10.04, 1000.6).at == pytest.approx(1000.54)  # 60 ms late: lag 0.06 s
    assert lc.captured(11.0, 1005.0).at == pytest.approx(1001.5)  # after a stall: 3.5 s behind live
    assert lc.captured(12.0, 1001.9).at == pytest.approx(1001.9)  # a quicker frame moves the anchor (no negative lag)
    assert LagClock().captured(0.0, 2000.0).at == 2000.0  # a new connection's timestamps start again


def test_the_anchor_of_the_first_window_is_applied_back_to_its_frames():
    """A connection's first frames come late in a burst: their results wait until the anchor is settled (the
    quickest frame of the first SETTLE_S s), then count with it, so the burst's delay is in the figures."""
    from engines.video.live import LagClock, LagStats

    lc, st = LagClock(), LagStats()
    for i in range(10):  # stream times 0 .. 0.9 s all decoded at 1000.9 (a burst), classified 50 ms later
        st.add_capture(1000.95, lc.captured(i / 10, 1000.9))
    for i in range(10, 80):  # then on time: decoded at 1000 + t, classified 50 ms later
        st.add_capture(1000.05 + i / 10, lc.captured(i / 10, 1000.0 + i / 10))
    d = st.to_dict()
    assert d["frames"] == 80 and d["max"] == pytest.approx(0.95)  # stream time 0: captured at 1000.0, result 1000.95
    assert d["p50"] == pytest.approx(0.05, abs=0.011)
    other = LagClock()  # a connection stopped within its first window: the anchor it has
    st2 = LagStats()
    st2.add_capture(5.5, other.captured(0.0, 5.0))
    st2.add_capture(5.6, other.captured(0.5, 5.1))
    assert st2.to_dict()["max"] == pytest.approx(0.9)


def test_lag_stats_quantiles_within_a_bin_and_max_exact():
    from engines.video.live import LagStats

    st = LagStats()
    for i in range(1000):
        st.add(i / 1000)  # 0 .. 0.999 s
    st.add(500.0)  # past the last bin: still the max
    d = st.to_dict()
    assert d["frames"] == 1001 and d["max"] == 500.0
    assert 0.5 <= d["p50"] <= 0.51 and 0.98 <= d["p99"] <= 0.99 + 0.01
    assert LagStats().to_dict() == {}


def test_frames_past_max_lag_are_skipped_with_one_lagging_and_one_caught_up_event():
    from engines.video.live import LiveSource

    class Src(LiveSource):
        name, decoded, stop, lagged = "cam", 0, None, 0
        options = LiveOptions(max_lag=2.0)

        def __init__(self):
            self.events = []
            self.on_event = self.events.append

    src = Src()
    kept = [src._keep(lag) for lag in (0.1, 1.9, 2.5, 3.0, 1.5, 0.9, 0.2, 2.1)]
    assert kept == [True, True, False, False, False, True, True, False]  # skipping ends under half the bound
    assert [(e.event, e.extra.get("skipped")) for e in src.events] == [("lagging", None), ("caught_up", 3),
                                                                       ("lagging", None)]
    assert src.lagged == 4 and src.events[0].extra["lag_s"] == 2.5
    src.options = LiveOptions(max_lag=None)
    assert src._keep(100.0)
    src.options = LiveOptions(policy="block")  # a recording keeps every frame
    assert src._keep(100.0) and src.lagged == 4


def test_a_frame_without_stream_time_has_no_lag_and_never_starts_or_ends_a_skip():
    """28 s of frames on time, then one without a stream time (no pts, no frame rate): it used to get the
    connection's anchor as its capture time, so its lag came out as the whole 28 s since the stream began (a false
    ``lagging`` event at the end of a live run). Its capture time is unknown: no lag, no event; during a skip it is
    skipped with the others and the skip goes on."""
    from engines.video.live import LagClock, LiveSource

    class Src(LiveSource):
        name, decoded, stop, lagged = "cam", 0, None, 0
        options = LiveOptions(max_lag=1.0)

        def __init__(self):
            self.events = []
            self.on_event = self.events.append

    src, clock = Src(), LagClock()
    start = 1_800_000_000.0
    for i in range(281):  # stream time i / 10, decoded 50 ms later
        assert src._keep_frame(clock.captured(i / 10, start + i / 10 + 0.05), start + i / 10 + 0.05)
    received = start + 28.15
    captured = clock.captured(None, received)
    kept = src._keep_frame(captured, received)
    assert src.events == [] and kept and captured is None  # no lagging event, no lag
    assert src._keep_frame(clock.captured(28.1, start + 30.0), start + 30.0) is False  # 1.85 s behind: a skip
    assert src._keep_frame(clock.captured(None, start + 30.05), start + 30.05) is False  # skipped with it
    assert [e.event for e in src.events] == ["lagging"] and src.lagged == 2
    assert src._keep_frame(clock.captured(30.1, start + 30.2), start + 30.2)  # back under half: caught up
    assert [e.event for e in src.events] == ["lagging", "caught_up"] and src.events[1].extra["skipped"] == 2


def test_ray_reruns_a_live_source_as_a_new_connection_with_frame_numbers_going_on():
    """A live source whose Ray actor failed is handed to another actor without ``done`` (which a live source
    refuses) and its new connection's frames, numbered from 0 there, reach the caller numbered on from the last
    frame it had; a file in the same job still resumes with ``done``."""
    from types import SimpleNamespace as NS

    from engines.video.pipeline import RunStats
    from engines.video.ray_cluster import _Dispatch
    from engines.video.results import ResultBlock

    calls = []

    class Actor:
        def __init__(self, name):
            self.name, self.alive, self.labels = name, True, None
            remote = NS(remote=lambda srcs, opts: calls.append((name, srcs, opts)) or object())
            self.handle = NS(run=NS(options=lambda **kw: remote))

    a, b = Actor("a"), Actor("b")
    pool = NS(actors=[a, b], streams=4)
    run = NS(problems=[], failures=[], retried=[], placement={}, stats=RunStats(), timing={}, events=[])
    cam, clip = "rtsp://127.0.0.1:9/cam", "/data/clip.mp4"
    d = _Dispatch(pool, [cam, clip], {}, run, None)
    d.hand_out()

    def block(frames):
        return ResultBlock([cam], [0] * len(frames), frames, frames, [None] * len(frames), [[1]] * len(frames),
                           [[0.5]] * len(frames), [None] * len(frames), [None] * len(frames),
                           [0.0] * len(frames), ['{"x": 1}\n'] * len(frames), None)

    assert [list(d._kept(a, block([0, 1, 2])).frame)] == [[0, 1, 2]]
    d.last[clip] = 7
    a.alive = False
    d.busy.clear()
    d.retry_or_give_up(a, [cam, clip], "died")
    d.hand_out()
    name, srcs, opts = calls[-1]
    assert name == "b" and opts["done"] == {clip: 7}  # the file resumes; the camera does not
    got = d._kept(b, block([0, 1]))
    assert list(got.frame) == [3, 4] and got.lines is None  # numbered on; the lines formatted again
    assert not run.problems


def _fake_nvdec(refuse_every: int = 0):
    """A stand-in for PyNvVideoCodec's core decoder: one frame per non-empty packet, carrying the pts fed; every
    ``refuse_every``-th packet refused (as NVDEC refuses a damaged one)."""
    from types import SimpleNamespace as NS

    class Frame:
        def __init__(self, pts):
            self.pts = pts

        def getPTS(self):
            return self.pts

    class Dec:
        n = 0

        def Decode(self, pkt):
            if not pkt.bsl:
                return []
            Dec.n += 1
            if refuse_every and Dec.n % refuse_every == 0:
                raise RuntimeError("refused")
            return [Frame(pkt.pts)]

    class PacketData:
        bsl, bsl_data, pts, decode_flag = 0, 0, 0, 0

    return NS(cudaVideoCodec=NS(H264=4), cudaVideoChromaFormat=NS(__members__={"YUV420": 1}),
              DisplayDecodeLatencyType=NS(NATIVE=0, LOW=1, ZERO=2), VideoPacketFlag=NS(ENDOFPICTURE=1),
              GetDecoderCaps=lambda **kw: {"supported": True}, CreateDecoder=lambda **kw: Dec(),
              PacketData=PacketData)


@pytest.mark.parametrize("refuse_every", [0, 10])
def test_nvdec_feed_pass_numbers_frames_counts_refused_packets_and_times_them(bikes, monkeypatch, refuse_every):
    """feed_pass over bikes.mp4's real packets (PyAV demuxer, Annex B filter) with a stand-in decoder: every
    packet's frame is passed on with consecutive indices and the pts-based time; a refused packet is counted as
    damage and skipped, the stream going on."""
    import av

    from engines.video import nvdec_feed
    from engines.video.sources import NvdecSource

    monkeypatch.setattr(nvdec_feed, "_synchronize", lambda ptr: None)
    src = NvdecSource(str(bikes), live=False)
    got = []
    with av.open(str(bikes)) as c:
        s = c.streams.video[0]
        tb = s.time_base
        end = nvdec_feed.feed_pass(src, _fake_nvdec(refuse_every), 0,
                                   lambda i, pts, t, f, fed: got.append((i, pts, t)), 5, c, s)
    refused = 250 // refuse_every if refuse_every else 0
    assert src.damaged == refused and src.decoded == 250 - refused == len(got)
    assert [i for i, _, _ in got] == list(range(5, 5 + len(got))) and end == 5 + len(got)
    assert all(t == pytest.approx(float(pts * tb)) for _, pts, t in got)
    assert src.info.width == 640 and src.info.height == 272


def test_nvdec_feed_counts_packets_the_demuxer_flags_as_corrupt(bikes, monkeypatch, tmp_path):
    """bikes.mp4 remuxed to MPEG-TS with 4 KB zeroed: PyAV's demuxer flags the damaged packet, and the GPU feed
    counts it as damage although the (stand-in) decoder takes every packet, as NVDEC conceals."""
    import av

    from engines.video import nvdec_feed
    from engines.video.sources import NvdecSource

    from tests.clips import remux_ts

    ts = remux_ts(bikes, tmp_path / "b.ts")
    data = bytearray(ts.read_bytes())
    at = len(data) // 2 // 188 * 188 + 4  # inside a transport packet's payload, mid-file
    data[at:at + 4096] = bytes(4096)
    bad = tmp_path / "zeroed.ts"
    bad.write_bytes(bytes(data))
    monkeypatch.setattr(nvdec_feed, "_synchronize", lambda ptr: None)
    for path, damaged in ((ts, 0), (bad, 1)):
        src = NvdecSource(str(path), live=False)
        with av.open(str(path)) as c:
            nvdec_feed.feed_pass(src, _fake_nvdec(), 0, lambda *a: None, 0, c, c.streams.video[0])
        assert (src.damaged > 0) == bool(damaged), (path.name, src.damaged)


def test_a_workers_lag_figures_reach_the_pool_stats():
    from engines.video.live import LagStats
    from engines.video.pipeline import RunStats

    worker = RunStats()
    worker.lag["/w/cam"] = LagStats()
    for x in (0.1, 0.2, 0.3):
        worker.lag["/w/cam"].add(x)
    pool = RunStats()
    pool.merge_from(worker.for_pool(), names={"/w/cam": "cam"})
    lag = pool.to_dict()["lag_s"]
    assert lag == {"cam": worker.lag["/w/cam"].to_dict()} and lag["cam"]["frames"] == 3


def test_a_source_that_keeps_lagging_warns_once_a_minute_and_writes_every_event(monkeypatch):
    from engines.video import live

    class Src(live.LiveSource):
        name, decoded, stop, lagged = "cam", 0, None, 0
        options = LiveOptions(max_lag=2.0)

        def __init__(self):
            self.events = []
            self.on_event = self.events.append

    now = [1000.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: now[0])
    src = Src()
    for t in (0.0, 2.0, 30.0, 61.0, 70.0):  # a spell of lag starting at each of these seconds
        now[0] = 1000.0 + t
        src._keep(3.0), src._keep(0.5)
    assert [e.event for e in src.events] == ["lagging", "caught_up"] * 5  # every spell is in the output
    assert [e.loud for e in src.events] == [True, True, False, False, False, False, True, True, False, False]


def test_events_are_said_on_stderr_by_the_callers_thread_never_by_a_reader():
    """A reader that wrote its events to stderr itself stopped reading (and its watchdog with it) whenever stderr
    was not being read; the pipeline says them in the thread that takes them."""
    import logging

    from engines.video.cpu_pipeline import infer_and_collect
    from engines.video.live import LiveSource, SourceEvent

    said: list = []

    class Keep(logging.Handler):
        def emit(self, record):
            said.append((record.threadName, record.levelno, record.getMessage()))

    class Src(LiveSource):
        name, decoded, stop, lagged = "cam", 7, None, 0
        options = LiveOptions()

    hub = FrameHub()
    hub.add("cam", 4, "drop-oldest")
    src = Src()
    src.on_event = hub.event

    def reader():
        src._event("disconnected", reason="no frame for 5 s", outage_s=5.0)
        src._event("lagging", extra={"lag_s": 2.5, "max_lag_s": 2.0}, loud=False)
        hub.done("cam")

    logger = logging.getLogger("trtc")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        t = threading.Thread(target=reader, name="reader")
        t.start()
        t.join()
        assert said == []  # nothing said by the reader
        out = list(infer_and_collect(hub, None, 4, 1, 10, None, {"cam": 0}, time.perf_counter(), None))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [(kind, e.event) for kind, e in out] == [(EVENT, "disconnected"), (EVENT, "lagging")]
    me = threading.current_thread().name
    assert said == [(me, logging.WARNING, "cam: connection lost after 7 frames: no frame for 5 s"),
                    (me, logging.INFO, "cam: 2.5 s behind live (bound 2 s): skipping frames until caught up")]
    alone = Src()  # no pipeline: the source says its events itself
    alone.on_event = None
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # whatever an earlier test in this process (a CLI run with -q) left it at
    try:
        alone._event("gave_up", reason="no frame for 5 s", outage_s=300.0, attempts=9)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert said[-1][2] == "cam: gave up reconnecting after 300.0 s (9 attempt(s))"
    assert isinstance(out[0][1], SourceEvent)


def test_a_failed_connection_is_said_once_as_cannot_connect():
    """The open's reason starts with "cannot connect:", and the event's line starts its sentence with it too: the
    line said it twice ("cannot connect (retrying quietly): cannot connect: ...")."""
    from engines.video.live import SourceEvent

    ev = SourceEvent("door", "connect_failed", 0.0, 0, reason="cannot connect: the server at 10.0.0.5:554 refused "
                                                              "the connection")
    assert ev.line() == ("door: cannot connect (retrying quietly): the server at 10.0.0.5:554 refused the "
                         "connection")
    assert SourceEvent("door", "connect_failed", 0.0, 0, reason="timed out").line().endswith("quietly): timed out")
