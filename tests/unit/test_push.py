"""engines.video.FramePusher's contract on the CPU path with a stand-in engine (fast; the real model is in
tests/cpu/test_push_cpu.py): frame checks, order per stream from many threads, the lag policy's accounting,
close() with and without draining, the callback, errors."""

from __future__ import annotations

import threading
import time
import types

import numpy as np
import pytest

from engines.errors import TrtcError, UsageProblem
from engines.preprocess import PreprocessSpec
from engines.video import FramePusher
from engines.video.push import frame_layout

SPEC = PreprocessSpec(size=(8, 8), resize=None, mean=(0, 0, 0), std=(1, 1, 1))


class MeanEngine:
    """Logits over 256 classes whose top-1 is the frame's mean red value (0..255) after preprocessing: a frame
    filled with value v is classified as class v. ``delay``: seconds per batch (a slow engine)."""

    device = "cpu"

    def __init__(self, delay: float = 0.0):
        self.inputs = [types.SimpleNamespace(shape=[None, 3, 8, 8], numpy_dtype=np.float32)]
        self.delay, self.batches = delay, []

    def infer(self, x):
        self.batches.append(len(x))
        time.sleep(self.delay)
        v = np.rint(x[:, 0].mean(axis=(1, 2)) * 255).astype(int)
        logits = np.zeros((len(x), 256), np.float32)
        logits[np.arange(len(x)), v] = 10.0
        return [logits]


def rgb(v: int) -> np.ndarray:
    return np.full((16, 16, 3), v, np.uint8)


def pusher(engine=None, **kw):
    kw.setdefault("batch", 4)
    return FramePusher(engine or MeanEngine(), preprocess=SPEC, format="RGB", top_k=1, **kw)


@pytest.mark.parametrize("shape,dtype,fmt,strides,match", [
    ((24, 16), np.float32, None, None, "uint8"),
    ((16, 16, 3), np.uint8, None, None, "channel order is not known"),
    ((24, 16), np.uint8, None, None, "NV12 surface .* or a greyscale picture"),  # fits NV12 and is a grey picture
    ((25, 16), np.uint8, None, None, "its format is not known"),  # not even NV12: still no format without format=
    ((16,), np.uint8, None, None, "fits no frame format"),
    ((25, 16), np.uint8, "NV12", None, "even-sized picture"),
    ((24, 15), np.uint8, "NV12", None, "even-sized picture"),
    ((16, 16, 3), np.uint8, "NV12", None, "2-D"),
    ((16, 16), np.uint8, "RGB", None, r"\(H, W, 3\)"),
    ((16, 16, 3), np.uint8, "RGBA", None, r"\(H, W, 4\)"),
    ((16, 16, 3), np.uint8, "YUYV", None, "unknown frame format"),
    ((16, 16, 3), np.uint8, "RGB", (48, 6, 2), "packed"),  # every other byte: not packed pixels
    ((16, 16, 3), np.uint8, "RGB", (-48, 3, 1), "not forward"),  # flipped upside down
    ((24, 16), np.uint8, "NV12", (1, 24), "packed in rows"),  # a transposed view: strides[1] > 1
])
def test_frame_layout_refuses_with_a_fix(shape, dtype, fmt, strides, match):
    strides = strides or np.empty(shape, dtype).strides
    with pytest.raises(UsageProblem, match=match) as e:
        frame_layout(shape, strides, dtype, fmt)
    assert e.value.fix


def test_frame_layout_reads_pitch():
    assert frame_layout((1620, 1920), (2048, 1), np.uint8, "NV12") == ("NV12", 1080, 1920, 2048)
    assert frame_layout((1080, 1920, 3), (6144, 3, 1), np.uint8, "bgr") == ("BGR", 1080, 1920, 6144)
    assert frame_layout((1080, 1920, 4), (7680, 4, 1), np.uint8, "RGBA") == ("RGBA", 1080, 1920, 7680)


def test_streams_from_many_threads_come_back_in_order_with_their_ids_and_times():
    n_streams, n_frames = 6, 40
    with pusher(on_lag="block", max_wait_ms=5) as p:
        def produce(s):
            for i in range(n_frames):
                p.push(f"cam{s}", rgb((s * 40 + i) % 256), pts=1000 * i, time=i / 30, frame_id=f"f{i}")
        threads = [threading.Thread(target=produce, args=(s,)) for s in range(n_streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        p.close()
        preds = list(p.results())
    assert len(preds) == n_streams * n_frames
    for s in range(n_streams):
        mine = [q for q in preds if q.source == f"cam{s}"]
        assert [q.frame for q in mine] == [f"f{i}" for i in range(n_frames)]
        assert [q.pts for q in mine] == [1000 * i for i in range(n_frames)]
        assert [q.indices[0] for q in mine] == [(s * 40 + i) % 256 for i in range(n_frames)]
        assert mine[5].time == pytest.approx(5 / 30)
    assert p.stats.frames == n_streams * n_frames and not p.stats.dropped
    assert p.stats.decoded == {f"cam{s}": n_frames for s in range(n_streams)}


def test_a_bad_frame_is_refused_and_the_stream_goes_on():
    with pusher(on_lag="block") as p:
        p.push("cam", rgb(1))
        with pytest.raises(UsageProblem, match="uint8"):
            p.push("cam", rgb(2).astype(np.float32))
        with pytest.raises(UsageProblem, match="host memory"):
            p.push("cam", types.SimpleNamespace(__dlpack__=None))
        p.push("cam", rgb(3))
    preds = list(p.results())
    assert [q.indices[0] for q in preds] == [1, 3]
    assert [q.frame for q in preds] == [0, 1]  # refused frames take no number


def test_drop_oldest_counts_every_frame_it_drops():
    """A slow engine (50 ms a batch of 4) and a fast producer: the producer never waits, frames are dropped and
    counted, and pushed = classified + dropped exactly; the frames classified stay in order."""
    eng = MeanEngine(delay=0.05)
    p = pusher(eng, on_lag="drop-oldest", queue_frames=4, max_wait_ms=10)
    t0 = time.perf_counter()
    for i in range(300):
        p.push("cam", rgb(i % 256))
    pushing = time.perf_counter() - t0
    stats = p.close()
    preds = list(p.results())
    assert stats.dropped["cam"] > 100
    assert stats.decoded["cam"] == 300 == len(preds) + stats.dropped["cam"]
    assert [q.frame for q in preds] == sorted(q.frame for q in preds)
    assert pushing < 0.05 * 300 / 4 / 2  # far faster than the engine: push did not wait for it


def test_block_drops_nothing_and_close_drains():
    eng = MeanEngine(delay=0.01)
    with pusher(eng, on_lag="block", queue_frames=2) as p:
        for i in range(30):
            p.push("cam", rgb(i))
    assert [q.indices[0] for q in p.results()] == list(range(30))
    assert not p.stats.dropped and p.stats.per_source == {"cam": 30}


def test_close_without_drain_counts_what_was_not_run():
    eng = MeanEngine(delay=0.2)
    p = pusher(eng, on_lag="block", queue_frames=64, batch=4, max_wait_ms=1000)
    for i in range(40):
        p.push("cam", rgb(i))
    stats = p.close(drain=False)
    got = len(list(p.results()))
    assert got < 40
    assert stats.decoded["cam"] == 40 == got + stats.dropped["cam"]
    with pytest.raises(UsageProblem, match="after the pusher was closed"):
        p.push("cam", rgb(1))


def test_max_wait_bounds_a_partial_batch():
    with pusher(on_lag="block", batch=64, max_wait_ms=30) as p:
        t0 = time.perf_counter()
        p.push("cam", rgb(7))
        pred = next(iter(p.results(timeout=5)))
        waited = time.perf_counter() - t0
    assert pred.indices[0] == 7
    assert 0.025 < waited < 1.0  # ran after the age limit, not at close


def test_callback_gets_every_prediction_and_its_errors_surface_at_close():
    got = []
    with pusher(on_lag="block", callback=got.append) as p:
        for i in range(10):
            p.push("cam", rgb(i))
        with pytest.raises(UsageProblem, match="callback"):
            next(iter(p.results()))
    assert [q.indices[0] for q in got] == list(range(10))

    def bad(_pred):
        raise ValueError("app bug")
    p = pusher(on_lag="block", callback=bad)
    p.push("cam", rgb(1))
    with pytest.raises(ValueError, match="app bug"):
        p.close()


def test_an_engine_failure_stops_the_pusher_with_its_reason():
    class Broken(MeanEngine):
        def infer(self, x):
            raise RuntimeError("out of memory")
    p = pusher(Broken(), on_lag="block", max_wait_ms=1)
    p.push("cam", rgb(1))
    with pytest.raises(TrtcError, match="out of memory"):
        list(p.results(timeout=5))
    with pytest.raises(TrtcError, match="pusher stopped"):
        for _ in range(50):
            p.push("cam", rgb(1))
            time.sleep(0.01)
    p.close()


def test_arguments_are_checked_once():
    with pytest.raises(UsageProblem, match="policy"):
        pusher(on_lag="sometimes")
    with pytest.raises(UsageProblem, match="max_wait_ms"):
        pusher(max_wait_ms=-1)
    with pytest.raises(UsageProblem, match="frame format"):
        FramePusher(MeanEngine(), preprocess=SPEC, format="YUY2")


def test_push_many_on_the_cpu_path_keeps_order_and_refuses_a_bad_frame_whole():
    with pusher(on_lag="block", max_wait_ms=5) as p:
        assert p.push_many("cam", [rgb(v) for v in range(6)], frame_ids=[f"f{v}" for v in range(6)]) == [None] * 6
        with pytest.raises(UsageProblem, match="uint8"):
            p.push_many("cam", [rgb(9), rgb(9).astype(np.float32)])
        p.push_many("cam", [rgb(6)], times=[0.5])
    preds = list(p.results())
    assert [q.indices[0] for q in preds] == list(range(7))
    assert [q.frame for q in preds[:6]] == [f"f{v}" for v in range(6)] and preds[6].time == 0.5
    assert p.stats.decoded == {"cam": 7}


def test_flush_waits_for_every_pushed_frame_of_one_stream():
    """flush(stream): when it returns True, each frame pushed to that stream before the call has reached the
    callback (a slow engine: without the wait most would still be queued)."""
    seen: list = []
    with pusher(MeanEngine(delay=0.02), on_lag="block", max_wait_ms=5,
                callback=lambda p: seen.append((p.source, p.frame))) as p:
        for i in range(20):
            p.push("a", rgb(i))
            p.push("b", rgb(i))
        assert p.flush("a", timeout=30)
        assert [f for s, f in list(seen) if s == "a"] == list(range(20))
    assert len(seen) == 40


def test_flush_counts_dropped_frames_as_done():
    """Under drop-oldest a frame dropped unread never reaches the callback: flush counts it and returns."""
    got: list = []
    with pusher(MeanEngine(delay=0.05), on_lag="drop-oldest", queue_frames=2, max_wait_ms=5,
                callback=got.append) as p:
        for i in range(30):
            p.push("a", rgb(i))
        assert p.flush("a", timeout=30)
        assert len(got) + p.dropped.get("a", 0) == 30 and p.dropped.get("a", 0) > 0
