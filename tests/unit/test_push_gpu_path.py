"""engines.video.FramePusher's GPU path on the CPU: a NumPy stand-in for CuPy (tests/push_fake_gpu.py) whose
"kernel" reads each frame through its pointer when it is launched, and an engine that gives a frame filled with v
class v. Checks the batched writer: frames of many streams and threads grouped into launches of up to
MAX_FRAMES_PER_LAUNCH, each stream's order, pushed = classified + dropped, close with frames still queued,
push_many, and the release point (a frame overwritten once its handle says so is not misread). Nothing about CUDA
is proven here: tests/gpu/test_push_gpu.py runs the same on a GPU."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engines.errors import UsageProblem
from engines.preprocess import MAX_FRAMES_PER_LAUNCH, PreprocessSpec
from tests import push_fake_gpu

SPEC = PreprocessSpec(size=(8, 8), resize=None, mean=(0, 0, 0), std=(1, 1, 1))


@pytest.fixture
def cp(monkeypatch):
    return push_fake_gpu.install(monkeypatch)


def pusher(engine=None, **kw):
    from engines.video import FramePusher

    kw.setdefault("batch", 32)
    kw.setdefault("on_lag", "block")
    kw.setdefault("format", "NV12")
    return FramePusher(engine or push_fake_gpu.ValueEngine(), preprocess=SPEC, top_k=1, **kw)


def nv12(cp, v: int):
    f = cp.zeros((24, 16), np.uint8)
    f[...] = v
    return f


def test_sixteen_threads_batched_launches_each_stream_in_order(cp):
    n_streams, n_frames = 16, 60
    frames = {s: [nv12(cp, (s * 7 + i) % 256) for i in range(n_frames)] for s in range(n_streams)}
    eng = push_fake_gpu.ValueEngine(delay=0.002)
    with pusher(eng, max_wait_ms=5) as p:
        assert type(p._backend).__name__ == "_GpuPusher"

        def produce(s):
            for i, f in enumerate(frames[s]):
                h = p.push(f"cam{s}", f, pts=10 * i, frame_id=i)
                assert h is not None
        threads = [threading.Thread(target=produce, args=(s,)) for s in range(n_streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    preds = list(p.results())
    assert len(preds) == n_streams * n_frames and not p.stats.dropped
    for s in range(n_streams):
        mine = [q for q in preds if q.source == f"cam{s}"]
        assert [q.frame for q in mine] == list(range(n_frames))
        assert [q.pts for q in mine] == [10 * i for i in range(n_frames)]
        assert [q.indices[0] for q in mine] == [(s * 7 + i) % 256 for i in range(n_frames)]
    launches = push_fake_gpu.RawKernel.launches
    assert sum(launches) == n_streams * n_frames
    assert max(launches) <= MAX_FRAMES_PER_LAUNCH
    assert len(launches) < n_streams * n_frames / 2, f"not batched: {len(launches)} launches"
    assert p.stats.decoded == {f"cam{s}": n_frames for s in range(n_streams)}


def test_drop_oldest_counts_every_frame_and_keeps_order(cp):
    """A slow engine and four fast pushers: pushes never wait, drops are counted, pushed = classified + dropped
    per stream exactly, and each stream's classified frames stay in order."""
    eng = push_fake_gpu.ValueEngine(delay=0.03)
    p = pusher(eng, batch=8, on_lag="drop-oldest", max_wait_ms=5)
    frames = [nv12(cp, i) for i in range(200)]

    def produce(s):
        for i, f in enumerate(frames):
            p.push(f"cam{s}", f, frame_id=i)
    threads = [threading.Thread(target=produce, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = p.close()
    preds = list(p.results())
    assert sum(stats.dropped.values()) > 100
    for s in range(4):
        mine = [q for q in preds if q.source == f"cam{s}"]
        assert stats.decoded[f"cam{s}"] == 200 == len(mine) + stats.dropped.get(f"cam{s}", 0)
        assert [q.frame for q in mine] == sorted(q.frame for q in mine)
        assert all(q.indices[0] == q.frame for q in mine)


@pytest.mark.parametrize("drain", [True, False])
def test_close_with_frames_still_queued_for_the_writer(cp, drain):
    """Frames pushed faster than a slow engine runs: close(drain=True) classifies every one; drain=False counts
    what did not run as dropped. Either way pushed = classified + dropped, and nothing is classified twice."""
    eng = push_fake_gpu.ValueEngine(delay=0.05)
    p = pusher(eng, batch=4, buffers=2, max_wait_ms=1000)
    handles = [p.push("cam", nv12(cp, i), frame_id=i) for i in range(40)]
    stats = p.close(drain=drain)
    preds = list(p.results())
    assert [q.frame for q in preds] == list(range(len(preds)))
    assert all(q.indices[0] == q.frame for q in preds)
    assert stats.decoded["cam"] == 40 == len(preds) + stats.dropped.get("cam", 0)
    assert (len(preds) == 40) if drain else (len(preds) < 40)
    for h in handles:  # every handle settled: none left for an app to wait on forever
        assert h.enqueued() and (h.wait(timeout=1) is None) == h.dropped()
    # a frame written into a buffer that never ran was read (its handle is released), and is counted as dropped
    assert sum(h.dropped() for h in handles) <= (0 if drain else stats.dropped["cam"])


def test_push_many_queues_in_order_and_refuses_a_bad_frame_whole(cp):
    with pusher(batch=8, max_wait_ms=5) as p:
        handles = p.push_many("cam", [nv12(cp, v) for v in range(20)], pts=list(range(100, 120)))
        assert len(handles) == 20 and all(h is not None for h in handles)
        with pytest.raises(UsageProblem, match="even-sized"):
            p.push_many("cam", [nv12(cp, 50), cp.zeros((25, 16), np.uint8)])
        with pytest.raises(UsageProblem, match="3 frame_ids"):
            p.push_many("cam", [nv12(cp, 1), nv12(cp, 2)], frame_ids=[1, 2, 3])
        p.push("cam", nv12(cp, 20))
        for h in handles:
            assert h.wait(timeout=5) is not None and h.done()
    preds = list(p.results())
    assert [q.indices[0] for q in preds] == list(range(21))  # the refused call queued nothing
    assert [q.frame for q in preds] == list(range(21)) and preds[3].pts == 103
    assert p.stats.decoded == {"cam": 21}


def test_a_frame_overwritten_at_its_release_point_is_read_first(cp):
    """One frame buffer reused for every frame, rewritten as soon as the previous push's handle says its kernel
    is enqueued (polling enqueued(), or wait(): the host forms of the release point). The stand-in kernel sleeps
    1 ms, the interpreter lock released, then reads the frame: a handle settled before its kernel's launch
    returned lets the frame be overwritten first, and a prediction comes out wrong."""
    import time

    push_fake_gpu.RawKernel.read_delay = 0.001
    buf = nv12(cp, 0)
    with pusher(batch=16, max_wait_ms=5) as p:
        h = None
        for i in range(60):
            if h is not None and i % 2:
                while not h.enqueued():
                    time.sleep(0)
                assert h.event is not None
            elif h is not None:
                assert h.wait(timeout=5) is not None
            buf[...] = i
            h = p.push("ring", buf, frame_id=i)
    assert [q.indices[0] for q in p.results()] == list(range(60))


def test_a_failed_launch_loses_its_frames_counted_and_the_run_goes_on(cp, monkeypatch):
    real = push_fake_gpu.RawKernel.__call__
    calls = []

    def flaky(self, grid, block, args, stream=None):
        if self.topk:  # the preprocessing kernel's launches fail, not top-k's
            return real(self, grid, block, args, stream)
        calls.append(grid[1])
        if len(calls) == 2:
            raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")
        return real(self, grid, block, args, stream)
    monkeypatch.setattr(push_fake_gpu.RawKernel, "__call__", flaky)
    with pusher(batch=4, max_wait_ms=5) as p:
        handles = []
        for i in range(12):
            handles.append(p.push("cam", nv12(cp, i)))
            handles[-1].wait(timeout=5)  # one frame per launch
    preds = list(p.results())
    assert len(preds) == 11 and p.stats.dropped == {"cam": 1} and handles[1].dropped()
    assert [q.indices[0] for q in preds] == [0] + list(range(2, 12))
    assert "preprocessing failed" in str(p.problems[0])


def test_max_wait_bounds_a_partial_batch(cp):
    import time

    with pusher(batch=64, max_wait_ms=30) as p:
        t0 = time.perf_counter()
        p.push("cam", nv12(cp, 7))
        pred = next(iter(p.results(timeout=5)))
        waited = time.perf_counter() - t0
    assert pred.indices[0] == 7 and 0.025 < waited < 1.0


def test_an_engine_failure_stops_pushes_and_blocked_pushers(cp):
    """The engine fails: results() raises its reason; pushers (also those waiting for room under block) stop
    with an error instead of hanging, and close() returns."""
    import time

    from engines.errors import TrtcError

    class Broken(push_fake_gpu.ValueEngine):
        def infer(self, x, stream=None):
            if self.batches:
                raise RuntimeError("out of memory")
            return super().infer(x, stream)  # the warm-up
    p = pusher(Broken(), batch=4, max_wait_ms=1, queue_frames=4)
    errors = []

    def produce():
        try:
            for i in range(10_000):
                p.push("cam", nv12(cp, i % 256))
                time.sleep(0.0005)
        except TrtcError as exc:
            errors.append(exc)
    t = threading.Thread(target=produce)
    t.start()
    with pytest.raises(TrtcError, match="out of memory"):
        list(p.results(timeout=5))
    t.join(5)
    assert not t.is_alive() and errors
    p.close()
    assert p.stats.decoded["cam"] == p.stats.frames + sum(p.stats.dropped.values())


def _unordered_reads(log: list, writer: int) -> list:
    """Frames a launch on the writer's stream read without the writer first waiting for an event recorded on the
    frame's producer stream after the frame's push (the push's log entry: ("push", producer ptr, frame ptr))."""
    at = {e[3]: i for i, e in enumerate(log) if e[0] == "record"}  # record number -> log position
    pushed, waits, bad = {}, [], []
    for i, e in enumerate(log):
        if e[0] == "push":
            pushed[e[2]] = (i, e[1])
        elif e[0] == "wait" and e[1] == writer and e[2] is not None:
            waits.append(e[2])
        elif e[0] == "launch" and e[1] == writer:
            for ptr in e[2]:
                k, producer = pushed[ptr]
                if not any(s == producer and at[n] > k for s, n in waits):
                    bad.append((ptr, producer))
    return bad


@pytest.mark.parametrize("how", ["current", "null", "argument", "handle", "per-thread", "torch"])
def test_every_read_waits_for_its_producer_streams_work_before_the_push(cp, how):
    """Four threads push, each on its own producer stream (the thread's current CuPy stream, CuPy's null stream
    shared by all four (what a program that never picks a stream uses), a CuPy stream given as cuda_stream, a raw
    handle, CuPy's per-thread default stream, a torch-like stream): every launch reads each of its frames only after
    the writer's stream waited for an event recorded on that frame's producer after the push. CuPy streams of the
    engine's GPU and the null stream cost the push no CUDA call (the writer records once per group); the others
    get an event recorded by the push."""
    log = push_fake_gpu.TRACE["log"] = []
    lock = threading.Lock()
    n_threads, n_frames = 4, 40
    frames = [[nv12(cp, (10 * s + i) % 256) for i in range(n_frames)] for s in range(n_threads)]
    streams = [cp.cuda.Stream.ptds if how == "per-thread" else cp.cuda.Stream.null if how == "null" else
               cp.cuda.Stream() for _ in range(n_threads)]
    with pusher(max_wait_ms=1) as p:
        def produce(s):
            st = streams[s]
            arg = {"current": None, "null": None, "argument": st, "handle": st.ptr, "per-thread": None,
                   "torch": type("TorchStream", (), {"cuda_stream": st.ptr})()}[how]
            with st:
                for f in frames[s]:
                    with lock:  # the frame's write on st precedes the push (the log's order is the calls' order)
                        log.append(("push", st.ptr, f.data.ptr))
                        p.push(f"cam{s}", f, cuda_stream=arg)
        threads = [threading.Thread(target=produce, args=(s,)) for s in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        writer = p._backend.stream.ptr
    preds = list(p.results())
    assert len(preds) == n_threads * n_frames
    assert sorted(q.indices[0] for q in preds) == sorted((10 * s + i) % 256 for s in range(n_threads)
                                                          for i in range(n_frames))
    assert sum(len(e[2]) for e in log if e[0] == "launch") == n_threads * n_frames
    assert _unordered_reads(log, writer) == []
    lazy = how in ("current", "null", "argument")
    assert (p._backend.ready == {}) == lazy  # eager producers have an event recorded by push
    assert sum(e[0] == "launch" for e in log) < n_threads * n_frames / 2  # groups, not a launch per push


def test_push_many_from_two_producer_streams_in_one_group(cp):
    """Frames of two producer streams queued while the writer is busy go out in one group: its kernel waits for
    both producers (one event each, recorded after both pushes)."""
    log = push_fake_gpu.TRACE["log"] = []
    a, b = cp.cuda.Stream(), cp.cuda.Stream()
    fa, fb = [nv12(cp, i) for i in range(6)], [nv12(cp, 100 + i) for i in range(6)]
    with pusher(max_wait_ms=1) as p:
        backend = p._backend
        with backend.lock:
            backend.idle = False  # the writer waits for work: the pushes below do not wake it
        for st, fs in ((a, fa), (b, fb)):
            log.extend(("push", st.ptr, f.data.ptr) for f in fs)
            t = threading.Thread(target=p.push_many, args=(f"s{st.ptr}", fs), kwargs={"cuda_stream": st})
            t.start()
            t.join()
        with backend.lock:
            backend.work.notify()
        writer = backend.stream.ptr
    preds = list(p.results())
    assert sorted(q.indices[0] for q in preds) == list(range(6)) + list(range(100, 106))
    assert _unordered_reads(log, writer) == []
    assert [len(e[2]) for e in log if e[0] == "launch"] == [12]


def test_top_k_of_each_batch_waits_for_that_batchs_inference(cp):
    """Top-k is enqueued by the result thread on its own stream: for every batch, that stream first waits for an
    event recorded on the inference stream after the batch's engine call (the i-th wait after the i-th call)."""
    log = push_fake_gpu.TRACE["log"] = []
    frames = [nv12(cp, i) for i in range(100)]
    with pusher(batch=8, max_wait_ms=1) as p:
        for i, f in enumerate(frames):
            p.push("cam", f, frame_id=i)
        gpu = p._backend.gpu
    assert [q.indices[0] for q in p.results()] == list(range(100))
    at = {e[3]: i for i, e in enumerate(log) if e[0] == "record"}
    calls = [i for i, e in enumerate(log) if e == ("infer", gpu.infer_stream.ptr)][1:]  # [0]: the warm-up
    waits = [at[e[2][1]] for e in log if e[0] == "wait" and e[1] == gpu.topk_stream.ptr]
    assert len(calls) == len(waits) == p.stats.batches
    assert all(w > c for c, w in zip(calls, waits))
    assert all(log[w][2] == gpu.infer_stream.ptr for w in waits)


def test_top_k_falls_back_to_cupys_sort_when_its_kernel_does_not_compile(cp, monkeypatch, caplog):
    """A CuPy whose NVRTC cannot compile the top-k kernel (say, no CUDA headers on an edge box): one warning, and
    CuPy's sort gives the same predictions."""
    real = push_fake_gpu.RawKernel.compile

    def compile_(self):
        if self.topk:
            raise RuntimeError("NVRTC_ERROR_COMPILATION (6)\ncuda_fp16.h: cannot open source file")
        return real(self)
    monkeypatch.setattr(push_fake_gpu.RawKernel, "compile", compile_)
    with caplog.at_level("WARNING", logger="trtc"), pusher(batch=8, max_wait_ms=1) as p:
        for i in range(40):
            p.push("cam", nv12(cp, i), frame_id=i)
    assert [q.indices[0] for q in p.results()] == list(range(40))
    said = [r.getMessage() for r in caplog.records if "top-k kernel" in r.getMessage()]
    assert said == ["the top-k kernel (f32) did not compile, so top-k uses CuPy's sort: NVRTC_ERROR_COMPILATION (6)"]


@pytest.mark.parametrize("preferred", ["NHWC", "NCHW", None])
def test_slots_are_written_in_the_layout_the_engine_prefers(cp, preferred):
    """An engine that reads NHWC best (the compiled PyTorch engine's preferred_layout) gets (B, 3, H, W) views of
    channels_last buffers, and every launch asks the kernel for NHWC slots; other engines get C-contiguous NCHW.
    Classes still come out per frame (the slot's bytes are the frame's)."""

    class Engine(push_fake_gpu.ValueEngine):
        def infer(self, x, stream=None):
            self.strides.add(tuple(s // x.itemsize for s in x.strides))
            return super().infer(x, stream)

    eng = Engine()
    eng.strides = set()
    if preferred:
        eng.preferred_layout = preferred
    with pusher(eng, batch=8) as p:
        for i in range(20):
            p.push("cam", nv12(cp, i), frame_id=i)
    assert [q.indices[0] for q in p.results()] == list(range(20))
    nhwc = preferred == "NHWC"
    assert eng.strides == {(3 * 64, 1, 8 * 3, 3) if nhwc else (3 * 64, 64, 8, 1)}
    assert set(push_fake_gpu.RawKernel.layouts) == {"NHWC" if nhwc else "NCHW"}


def test_the_preprocessor_refuses_a_layout_it_cannot_write(cp):
    from engines.preprocess import GpuPreprocessor

    with pytest.raises(UsageProblem, match="NCHW or NHWC slots, not 'NCWH'") as err:
        GpuPreprocessor(SPEC, layout="NCWH")
    assert 'layout="NHWC"' in err.value.fix


def test_the_warm_up_and_every_batch_run_on_the_inference_thread(cp, monkeypatch):
    """Every engine call of a GPU pipeline comes from one thread, the warm-up's included: what an engine keeps per
    thread (torch's cuDNN plans, for the compiled engine's quick start) is made once. That thread makes no host
    synchronisation, also not for the warm-up (the opening thread waits for it). A warm-up that fails is raised to
    the caller when the pipeline opens."""
    syncs = []
    for owner in (push_fake_gpu.Stream, push_fake_gpu.Event):
        monkeypatch.setattr(owner, "synchronize", lambda self: syncs.append(threading.current_thread().name))

    class Threads(push_fake_gpu.ValueEngine):
        binds_inputs = True  # the warm-up runs every input buffer

        def __init__(self):
            super().__init__()
            self.threads = []

        def infer(self, x, stream=None):
            self.threads.append(threading.current_thread().name)
            return super().infer(x, stream)

    eng = Threads()
    with pusher(eng, batch=4, max_wait_ms=1) as p:
        warm_ups = len(eng.threads)
        for i in range(20):
            p.push("cam", nv12(cp, i))
    assert len(list(p.results())) == 20
    assert warm_ups >= 2 and len(eng.threads) > warm_ups  # the warm-up ran every buffer, then the batches
    assert set(eng.threads) == {"trtc-infer"}
    assert syncs and "trtc-infer" not in syncs  # the warm-up was waited for, by another thread

    class Refuses(push_fake_gpu.ValueEngine):
        def infer(self, x, stream=None):
            raise UsageProblem("the warm-up's batch does not fit", "give another")

    with pytest.raises(UsageProblem, match="the warm-up's batch does not fit"):
        pusher(Refuses(), batch=4)


def test_an_interrupted_warm_up_leaves_no_inference_thread_waiting(cp, monkeypatch):
    """Ctrl-C while the opening thread waits for the warm-up (on the inference thread): the interrupt reaches the
    caller, and the inference thread, once its warm-up ends, stops instead of waiting for batches for ever."""
    import engines.video.gpu_pipeline as gp

    started = []

    def interrupted(self):
        raise KeyboardInterrupt

    real_start = threading.Thread.start

    def start(self):
        started.append(self)
        return real_start(self)

    monkeypatch.setattr(gp.GpuBatches, "_wait_for_warm_up", interrupted)
    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(KeyboardInterrupt):
        pusher(push_fake_gpu.ValueEngine(delay=0.05), batch=4)
    (infer,) = [t for t in started if t.name == "trtc-infer"]
    infer.join(5)
    assert not infer.is_alive()


def test_flush_waits_for_the_writer_and_the_engine(cp):
    """flush(stream) on the GPU path: every frame of the stream pushed before it is through the writer's kernel,
    inference and top-k, and at the callback, when it returns True (a slow engine keeps most queued without it)."""
    seen: list = []
    with pusher(push_fake_gpu.ValueEngine(delay=0.02), batch=4, max_wait_ms=5,
                callback=lambda q: seen.append((q.source, q.frame))) as p:
        for i in range(24):
            p.push("a", nv12(cp, i))
            p.push("b", nv12(cp, i))
        assert p.flush("a", timeout=30)
        assert [f for s, f in list(seen) if s == "a"] == list(range(24))
    assert len(seen) == 48
