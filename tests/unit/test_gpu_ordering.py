"""Ordering rules of the GPU video path that can be checked on the CPU with recording stand-ins for CuPy and
PyNvVideoCodec (nothing here runs on a GPU; tests/gpu checks the pixels):

- the sampling grid and coefficients are uploaded and their stream synchronised before any decoder thread's
  stream can read them (an upload on the first decoder's stream, read by others without an event, was a race);
- the packet loop and the SimpleDecoder loop synchronise the source's stream before the decoder (and the
  surfaces our kernels read) is freed;
- a batched launch passes one pointer per frame and zero for the unused ones;
- a decoder is kept for reuse only when its file was decoded to the end without an error, and is handed out
  again only for the same GPU and format.
"""

from __future__ import annotations

import sys
import types

import numpy as np

from engines.preprocess import MAX_FRAMES_PER_LAUNCH, ColorSpace, GpuPreprocessor, PreprocessSpec


class _Log(list):
    pass


def _fake_cupy(monkeypatch, log):
    class Stream:
        def __init__(self, non_blocking=False):
            self.ptr = 7

        def __enter__(self):
            log.append("enter")
            return self

        def __exit__(self, *exc):
            log.append("exit")

        def synchronize(self):
            log.append("sync")

    class Kernel:
        def __init__(self, code, name):
            self.code = code

        def compile(self):
            pass

        def __call__(self, grid, block, args, stream=None):
            log.append(("launch", grid, args[:MAX_FRAMES_PER_LAUNCH]))

    def asarray(a, dtype=None):
        log.append("upload")
        return np.asarray(a, dtype)

    m = types.ModuleType("cupy")
    m.asarray = asarray
    m.RawKernel = Kernel
    m.cuda = types.SimpleNamespace(Stream=Stream, get_current_stream=lambda: Stream(),
                                   runtime=types.SimpleNamespace(streamSynchronize=lambda p: log.append(("sync", p))))
    monkeypatch.setitem(sys.modules, "cupy", m)
    return m


def test_grid_and_coefficients_are_uploaded_and_synchronised_before_use(monkeypatch):
    log = _Log()
    _fake_cupy(monkeypatch, log)
    pre = GpuPreprocessor(PreprocessSpec(size=(8, 8), resize=10))
    plan = pre.plan("NV12", (30, 20), np.uint8, 20, 20, ColorSpace("bt601", "limited"), np.float32)
    uploads = [i for i, e in enumerate(log) if e == "upload"]
    syncs = [i for i, e in enumerate(log) if e == "sync"]
    assert len(uploads) == 7  # six grid arrays, one coefficient vector
    # every upload is followed by a synchronisation of its stream before plan() returns
    assert all(any(s > u for s in syncs) for u in uploads) and syncs[-1] > uploads[-1]
    log.clear()
    pre.launch(plan, [0x1000, 0x2000, 0x3000], 0x9000, object())
    (_, grid, srcs), = log
    assert grid == (plan.grid_x, 3)
    assert [int(p) for p in srcs] == [0x1000, 0x2000, 0x3000] + [0] * (MAX_FRAMES_PER_LAUNCH - 3)
    assert plan.slot_bytes == 3 * 8 * 8 * 4
    # the same plan is reused without another upload
    assert pre.plan("NV12", (30, 20), np.uint8, 20, 20, ColorSpace("bt601", "limited"), np.float32) is plan
    assert "upload" not in log


def _fake_nvc(monkeypatch, log, frames_per_packet=1, packets=3, batched_frames=None, declared=None):
    class Decoder:
        def Decode(self, packet):  # noqa: N802 - PyNvVideoCodec's name
            return [types.SimpleNamespace(getPTS=lambda: 0) for _ in range(frames_per_packet)]

        def __del__(self):
            log.append("decoder freed")

    class Simple:
        def __init__(self, *a, **k):
            self.left = packets if batched_frames is None else batched_frames
            log.append(("new decoder", k.get("cuda_stream")))

        def reconfigure_decoder(self, path):
            log.append(("reconfigured", path))
            self.left = packets if batched_frames is None else batched_frames

        def get_stream_metadata(self):
            return types.SimpleNamespace(num_frames=packets if declared is None else declared)

        def get_batch_frames(self, n):
            log.append(("asked", n))
            k = min(n, self.left)
            self.left -= k
            return [types.SimpleNamespace(getPTS=lambda: 0) for _ in range(k)]

        def __del__(self):
            log.append("decoder freed")

    class Demuxer:
        def __iter__(self):
            return iter([types.SimpleNamespace(bsl=1, pts=i) for i in range(packets)])

        def GetNvCodecId(self):  # noqa: N802
            return "cudaVideoCodec.H264"

        def Width(self):  # noqa: N802
            return 64

        def Height(self):  # noqa: N802
            return 48

        def ChromaFormat(self):  # noqa: N802
            return 1

        def BitDepth(self):  # noqa: N802
            return 8

        def FrameRate(self):  # noqa: N802
            return 25.0

    m = types.ModuleType("PyNvVideoCodec")
    m.CreateDemuxer = lambda filename: Demuxer()
    m.CreateDecoder = lambda **k: Decoder()
    m.SimpleDecoder = Simple
    m.GetDecoderCaps = lambda **k: {"supported": True}
    m.DisplayDecodeLatencyType = types.SimpleNamespace(NATIVE=0, LOW=1, ZERO=2)
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", m)
    monkeypatch.setattr("engines.video.sources.decoder_caps", lambda *a: {"supported": True})


def _fake_clip(monkeypatch, tmp_path, **nvc_options):
    """Recording stand-ins for CuPy and PyNvVideoCodec, and a file for them to 'decode': (log, path)."""
    log = _Log()
    _fake_cupy(monkeypatch, log)
    _fake_nvc(monkeypatch, log, **nvc_options)
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"x")
    monkeypatch.setattr("engines.video.sources.probe_stream", lambda *a: (ColorSpace("bt601", "limited"), None, 0))
    return log, clip


def test_decoders_are_freed_only_after_their_stream_is_synchronised(monkeypatch, tmp_path):
    from engines.video.sources import NvdecSource

    log, clip = _fake_clip(monkeypatch, tmp_path)

    seen = []
    src = NvdecSource(str(clip))
    src.run(42, lambda *a: seen.append("frame"))
    assert seen == ["frame"] * 3
    assert log.index(("sync", 42)) < log.index("decoder freed")

    log.clear()
    src = NvdecSource(str(clip))
    assert src.batched
    src.run_batches(43, 16, lambda first, frames: seen.append(first))
    assert log.index(("sync", 43)) < log.index("decoder freed")


def test_a_batched_pass_that_ends_early_goes_on_with_the_packet_loop(monkeypatch, tmp_path):
    """The SimpleDecoder stops at a corrupt picture: the packet loop decodes the rest, every index once."""
    from engines.video.sources import NvdecSource, SourceError

    log, clip = _fake_clip(monkeypatch, tmp_path, packets=5, batched_frames=3)
    got = []
    src = NvdecSource(str(clip))
    src.run_batches(1, 16, lambda first, frames: got.extend(range(first, first + len(frames))))
    assert got == [0, 1, 2, 3, 4] and src.decoded == 5

    # and a file that is really cut off (its container declares 7 frames, 5 exist) is reported, after its frames
    _fake_nvc(monkeypatch, log, packets=5, batched_frames=3, declared=7)
    got.clear()
    src = NvdecSource(str(clip))
    try:
        src.run_batches(1, 16, lambda first, frames: got.extend(range(first, first + len(frames))))
    except SourceError as exc:
        assert "ended after 5 of the 7 frames" in str(exc)
    else:
        raise AssertionError("a cut-off file was not reported")
    assert got == [0, 1, 2, 3, 4]


def test_stage_threads_run_on_the_engine_gpu(monkeypatch):
    """CuPy's current device is per thread: the decoder and inference threads must enter the engine's GPU
    themselves (on a 2-GPU host the worker for cuda:1 made its decoder streams on GPU 0, and NVDEC refused them:
    'ValidateCUDAStream')."""
    import threading

    from engines.video.assembler import SlotAssembler
    from engines.video.gpu_pipeline import GpuPipeline

    log = _Log()
    cp = _fake_cupy(monkeypatch, log)
    entered = []

    class Device:
        def __init__(self, index=0):
            self.index = index

        def __enter__(self):
            entered.append((threading.current_thread().name, self.index))

        def __exit__(self, *exc):
            return False

    cp.cuda.Device = Device
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", types.ModuleType("PyNvVideoCodec"))
    cp.cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: 2)
    class Src:
        name, batched = "cam", False

        def run(self, stream_ptr, on_frame):
            raise RuntimeError("no decoder here")

    engine = types.SimpleNamespace(device_id=1)
    pipe = GpuPipeline([Src()], engine, None, 8, 1, None, None, 4, 10.0, types.SimpleNamespace(decode_stage={}, infer_stage={}),
                       [], (8, 8), lambda *a: None, lambda *a: None)

    asm = SlotAssembler([], 8)
    asm.sources_live = 1
    t = threading.Thread(target=pipe.decode_stage, args=(Src(), None, asm, np.float32), name="decoder-thread")
    t.start()
    t.join(5)
    results: list = []
    asm.sources_live = 0
    t = threading.Thread(target=pipe.infer_stage, args=(asm, None, types.SimpleNamespace(put=results.append), []),
                         name="infer-thread")
    t.start()
    t.join(5)
    assert ("decoder-thread", 1) in entered and ("infer-thread", 1) in entered


def test_the_batched_decoder_is_never_asked_past_the_declared_count(monkeypatch, tmp_path):
    """PyNvVideoCodec's SimpleDecoder prints "INVALID INDEX n" on stdout for each frame asked past the end, which
    corrupted `trtc bench --json` on the H200: ask for what is left, and stop at the declared count."""
    from engines.video.sources import NvdecSource

    log, clip = _fake_clip(monkeypatch, tmp_path, packets=40)
    got = []
    NvdecSource(str(clip)).run_batches(1, 16, lambda first, frames: got.append((first, len(frames))))
    assert got == [(0, 16), (16, 16), (32, 8)]
    assert [e for e in log if isinstance(e, tuple) and e[0] == "asked"] == [("asked", 16), ("asked", 16),
                                                                          ("asked", 8)]


def test_a_kept_decoder_is_pointed_at_the_next_file_and_reused_for_every_loop(monkeypatch, tmp_path):
    """Opening NVDEC decoders is slow and serial (16 took ~1 s on the H200); a decoder that decoded its file to the
    end is returned, and the next source of the same format (and each further loop) reconfigures it instead."""
    from engines.video.sources import NvdecSource

    log, clip = _fake_clip(monkeypatch, tmp_path, packets=5)
    first = NvdecSource(str(clip))
    assert first.probe() == "H264 4:2:0 8-bit 64x48"
    got = []
    dec = first.run_batches(9, 4, lambda i, frames: got.extend(range(i, i + len(frames))))
    assert dec is not None and got == [0, 1, 2, 3, 4] and ("new decoder", 9) in log
    log.clear()
    got.clear()
    second = NvdecSource(str(clip), loop=3)
    assert second.run_batches(9, 4, lambda i, frames: got.extend(range(i, i + len(frames))), decoder=dec) is dec
    assert got == list(range(15))  # three loops, numbered on
    assert [e for e in log if isinstance(e, tuple) and e[0] in ("new decoder", "reconfigured")] == \
        [("reconfigured", str(clip))] * 3
    # a source that stops early gives nothing back, and its decoder is freed after its stream is synchronised
    log.clear()
    third = NvdecSource(str(clip))
    assert third.run_batches(9, 2, lambda i, frames: False, decoder=dec) is None
    del dec
    assert log.index(("sync", 9)) < log.index("decoder freed")


def test_a_decoder_that_cannot_be_reconfigured_is_dropped_and_the_packet_loop_takes_over(monkeypatch, tmp_path):
    from engines.video.sources import BatchUnavailable, NvdecSource

    log, clip = _fake_clip(monkeypatch, tmp_path)

    class Broken:
        def reconfigure_decoder(self, path):
            raise RuntimeError("PyNvVCExceptionUnsupported: reconfigure")

    try:
        NvdecSource(str(clip)).run_batches(1, 4, lambda *a: True, decoder=Broken())
    except BatchUnavailable as exc:
        assert "reconfigure" in str(exc)
    else:
        raise AssertionError("a failed reconfiguration was not reported before the first frame")


def test_the_decoder_cache_hands_out_by_gpu_and_format_and_keeps_a_limit():
    from engines.video.decoders import DecoderCache

    freed = []

    class Dec:
        def __init__(self, name):
            self.name = name

        def __del__(self):
            freed.append(self.name)

    cache = DecoderCache(limit=2)
    cache.give(0, "h264 1080p", "stream-a", Dec("a"))
    cache.give(1, "h264 1080p", "stream-b", Dec("b"))
    cache.give(0, "h264 1080p", "stream-c", Dec("c"))  # over the limit: freed at once
    assert freed == ["c"] and cache.idle() == 2 and cache.idle(gpu=0) == 1
    assert cache.take(0, "hevc 1080p") == (None, None)  # another format: nothing
    stream, dec = cache.take(0, "h264 1080p")
    assert stream == "stream-a" and dec.name == "a" and cache.reused == 1
    assert cache.take(0, "h264 1080p") == (None, None)  # each decoder goes to one source at a time
    del dec
    assert cache.release(gpu=1) == 1 and freed == ["c", "a", "b"] and cache.idle() == 0


def test_the_number_of_kept_decoders_comes_from_the_environment(monkeypatch):
    from engines.video.decoders import DEFAULT_LIMIT, DecoderCache

    monkeypatch.delenv("TRTC_KEEP_DECODERS", raising=False)
    assert DecoderCache().limit == DEFAULT_LIMIT
    monkeypatch.setenv("TRTC_KEEP_DECODERS", "0")
    off = DecoderCache()
    off.give(0, "h264 1080p", "stream", object())
    assert off.limit == 0 and off.idle() == 0  # nothing kept: every source opens its own decoder
    monkeypatch.setenv("TRTC_KEEP_DECODERS", "many")
    assert DecoderCache().limit == DEFAULT_LIMIT


class _NullStream:
    """A CuPy stream's context, synchronize() and record(), doing nothing (the warm-up tests run no GPU work)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def synchronize(self):
        pass

    def record(self):
        return self


def test_the_warm_up_runs_again_after_the_engine_ran_another_batch_size():
    """ONNX Runtime's CUDA EP searches cuDNN algorithms again at every change of input shape, also back to one it
    ran before (measured on an H100: docs/BENCHMARKS.md). A pipeline therefore warms its batch up unless the
    engine's last pipeline ran the same size: 64 then 64 warms once, then 8, then 64 again warms each time."""
    from engines.video.gpu_pipeline import GpuPipeline

    runs = []
    engine = types.SimpleNamespace(infer=lambda data, stream=None: runs.append(data.shape[0]))

    for batch in (64, 64, 8, 64, 64):
        GpuPipeline._warm_up(types.SimpleNamespace(engine=engine, batch=batch), [np.ones((batch, 3, 4, 4))],
                             _NullStream())
    assert runs == [64, 8, 64]


def test_no_warm_up_for_an_engine_that_quick_starts():
    """An ONNX Runtime engine with quick start (engine.warms_itself) warmed its quick session at open and prepares the
    tuned one in the background: the pipeline runs no batch of zeros before its first frames (it would only delay
    the first result, by 0.33 s a batch of 64 for Lite0 on an H100's default-algorithm session)."""
    from engines.video.gpu_pipeline import GpuPipeline

    runs = []
    engine = types.SimpleNamespace(infer=lambda data, stream=None: runs.append(data.shape[0]), warms_itself=True)

    GpuPipeline._warm_up(types.SimpleNamespace(engine=engine, batch=64), [np.ones((64, 3, 4, 4))], _NullStream())
    assert runs == []
    engine.warms_itself = False  # the tuned session alone (quick_start=False): warmed as before
    GpuPipeline._warm_up(types.SimpleNamespace(engine=engine, batch=64), [np.ones((64, 3, 4, 4))], _NullStream())
    assert runs == [64]


def test_an_engine_that_binds_its_inputs_runs_every_buffer_before_the_clock():
    """The compiled PyTorch engine keeps a CUDA graph per input address (engine.binds_inputs): each pipeline runs every
    one of its input buffers once while warming up, also when the engine's last pipeline ran the same batch size
    (new buffers may lie at new addresses), so that no graph is captured mid-stream. Other engines warm one."""
    from engines.video.gpu_pipeline import GpuPipeline

    seen = []
    engine = types.SimpleNamespace(infer=lambda data, stream=None: seen.append(id(data)), binds_inputs=True)
    bufs = [np.ones((8, 3, 4, 4)) for _ in range(5)]
    for _ in range(2):
        GpuPipeline._warm_up(types.SimpleNamespace(engine=engine, batch=8), bufs, _NullStream())
    assert seen == [id(b) for b in bufs] * 2
    assert all((b == 0).all() for b in bufs)  # run on zeros, not on whatever the buffers held
    seen.clear()
    engine.binds_inputs = False
    engine._trtc_last_batch = None
    GpuPipeline._warm_up(types.SimpleNamespace(engine=engine, batch=8), bufs, _NullStream())
    assert seen == [id(bufs[0])]


def test_a_files_frame_times_on_the_gpu_path_are_the_fraction_formula_to_the_last_bit(tmp_path):
    """NvdecSource.stamp_index (the SimpleDecoder path's pts and seconds from a frame's display index) computes
    round(index / (fps x time_base)) and float(pts x time_base) without a Fraction per frame: the same numbers, bit for
    bit, as the Fraction arithmetic, for common time bases and rates (25, 29.97, 59.94, 23.976 fps), also past a day
    of frames, and after the source's time base changes (a looped or reopened file)."""
    from fractions import Fraction

    from engines.preprocess import ColorSpace
    from engines.video.sources import NvdecSource, SourceInfo

    src = NvdecSource(str(tmp_path / "x.mp4"))
    cases = [(25.0, Fraction(1, 12800), 0), (30000 / 1001, Fraction(1, 90000), 1001), (60000 / 1001, Fraction(1, 15360), 0),
             (24000 / 1001, Fraction(1, 1000), 42), (25.0, Fraction(1, 25), 3)]
    for fps, tb, start in cases:
        src.info = SourceInfo("x.mp4", "h264", 640, 272, fps, None, ColorSpace("bt601", "limited"))
        src.time_base, src.start_pts = tb, start
        for index in [*range(0, 3000), 86_400 * 60 + 7, 10**7 + 1]:
            pts = start + int(round(index / (fps * tb)))
            assert src.stamp_index(index) == (pts, float(pts * tb)), (fps, tb, index)
    src.time_base = None
    assert src.stamp_index(50) == (None, 50 / src.info.fps)


def test_small_frames_are_decoded_sixteen_a_call_and_large_ones_eight(monkeypatch):
    """Frames per SimpleDecoder call follow the source's size: at 640x272 the calls themselves (each needs the
    interpreter lock the decoder threads share) held 16 streams to 0.70x of decode-only with 8 a call (H100)."""
    from engines.video.assembler import SlotAssembler
    from engines.video.gpu_pipeline import DECODE_BATCH, GpuPipeline, frames_per_call
    from engines.video.sources import SourceInfo

    cs = ColorSpace("bt601", "limited")
    assert frames_per_call(SourceInfo("a", "h264", 640, 272, 25.0, None, cs)) == 16
    assert frames_per_call(SourceInfo("a", "h264", 1920, 1080, 25.0, None, cs)) == DECODE_BATCH == 8
    assert frames_per_call(SourceInfo("a", "h264", 1280, 720, 25.0, None, cs)) == 8
    assert frames_per_call(None) == 8

    log = _Log()
    cp = _fake_cupy(monkeypatch, log)
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", types.ModuleType("PyNvVideoCodec"))
    cp.cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: 1)
    asked = []

    class Src:
        batched, info, damaged = True, None, 0

        def __init__(self, name, w, h):
            self.name, self.size = name, (w, h)

        def probe(self):
            self.info = SourceInfo(self.name, "h264", *self.size, 25.0, None, cs)
            return f"h264 {self.size}"

        def run_batches(self, stream_ptr, n, on_frames, decoder=None):
            asked.append((self.name, n))

    stats = types.SimpleNamespace(decode_stage={}, infer_stage={})
    pipe = GpuPipeline([], types.SimpleNamespace(device_id=0), None, 8, 1, None, None, 4, 10.0, stats, [], (8, 8),
                       lambda *a: None, lambda *a: None)
    for src in (Src("small", 640, 272), Src("hd", 1920, 1080)):
        asm = SlotAssembler([], 8)
        asm.sources_live = 1
        pipe.counts[src.name] = 0
        pipe._decode_stage(src, None, asm, np.float32)
    assert asked == [("small", 16), ("hd", 8)]


def test_a_file_nvdec_decodes_without_a_sign_is_called_damaged_from_its_framing(monkeypatch, bikes, tmp_path):
    """The decode stage on a file NVDEC printed nothing about (a stand-in decoder): bikes.mp4 with 512 bytes zeroed
    inside its 100th packet (placed by PyAV's packet positions) is a problem naming that packet and counted damaged;
    bikes.mp4 itself is not."""
    av = __import__("pytest").importorskip("av")
    from engines.video.assembler import SlotAssembler
    from engines.video.gpu_pipeline import GpuPipeline

    with av.open(str(bikes)) as c:
        pos, size = [(p.pos, p.size) for p in c.demux(c.streams.video[0]) if p.size][100]
    data = bytearray(bikes.read_bytes())
    data[pos + size // 2:pos + size // 2 + 512] = bytes(512)
    zeroed = tmp_path / "zeroed.mp4"
    zeroed.write_bytes(bytes(data))

    cp = _fake_cupy(monkeypatch, _Log())
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", types.ModuleType("PyNvVideoCodec"))
    cp.cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: 1)

    class Src:
        batched, live, damaged = False, False, 0

        def __init__(self, name):
            self.name = name

        def run(self, stream_ptr, on_frame):  # NVDEC conceals: every packet decodes, nothing is printed
            pass

    problems = []
    stats = types.SimpleNamespace(decode_stage={}, infer_stage={})
    pipe = GpuPipeline([], types.SimpleNamespace(device_id=0), None, 8, 1, None, None, 4, 10.0, stats, [], (8, 8),
                       lambda name, why, frames: problems.append((name, why)), lambda *a: None)
    for path in (bikes, zeroed):
        src = Src(str(path))
        asm = SlotAssembler([], 8)
        asm.sources_live = 1
        pipe.counts[src.name] = 0
        pipe._decode_stage(src, None, asm, np.float32)
        assert src.damaged == (path == zeroed)
    assert len(problems) == 1 and problems[0][0] == str(zeroed), problems
    assert "packet 100" in problems[0][1] and "framing" in problems[0][1], problems
