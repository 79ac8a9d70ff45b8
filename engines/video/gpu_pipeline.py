"""The GPU path of :func:`engines.video.classify`, one function per stage:

    decode_stage (a thread per source)
        a file's NVDEC decoder is taken from the decoder-reuse stage (engines.video.decoders) when an earlier
        source of its format left one, and given back when the file was decoded to the end
        NVDEC -> up to 8 frames of one source at a time (DECODE_BATCH) -> ONE preprocessing kernel on the source's
        stream writes them into a reserved run of slots of an input buffer -> an event recorded after it
    infer_stage (one thread)
        a full (or timed-out partial) buffer -> the inference stream waits on the writers' events
        -> engine.infer(buffer) -> the buffer's "free" event -> the buffer goes back (nothing else: this thread's
        host time between engine calls is what a host-bound engine waits for)
    collect_stage (the caller's thread)
        top-k on the GPU, on its own stream after the batch's inference, waits for it, copies (batch, k) indices
        and scores to the host, yields Predictions

The stages after the decoders (slots, the kernel's write, inference, collection) are :class:`GpuBatches`, which
:class:`engines.video.push.FramePusher` shares for frames an app pushes.

Files are decoded by PyNvVideoCodec's SimpleDecoder (Python once per batch of up to 8 frames; its ThreadedDecoder
crashed the process, see :meth:`~engines.video.sources.NvdecSource.run_batches`); live-paced sources, low-latency
decoding and URLs use the packet loop (Python once per packet). The per-frame Python work of the first design (a
DLPack import, a kernel launch, an event and two lock round trips per frame, competing with 16 decoder threads for
the interpreter lock) is what held 16 streams at 0.54x of the NVDEC ceiling; see docs/BENCHMARKS.md.

Zero copy: only compressed packets go in and (batch, k) results come out; no frame crosses between host and
device. A buffer is reused only after its next writers' streams wait, on the GPU, for inference's free event.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import numpy as np

from ..base import input_layout
from ..errors import UsageProblem
from ..preprocess import MAX_FRAMES_PER_LAUNCH, GpuPreprocessor
from ..topk import unpack
from .assembler import InputBuffer, SlotAssembler, Stopped
from .bitstream import Auditor, file_damage
from .decoders import DECODERS
from .live import LagStats, reader_started
from .native_out import TAP
from .sources import BatchUnavailable, SourceError, surface_format

log = logging.getLogger("trtc")

# frames per SimpleDecoder call (and so per kernel launch, at most MAX_FRAMES_PER_LAUNCH): the decoder decodes a
# call's frames in the calling thread and sits idle while the thread hands them on, so smaller calls keep NVDEC
# busier. H200, ResNet-50 FP16, 1080p, 3 runs each: 32 streams 3416 fps with 8 against 3120 with 16; 1, 8 and 16
# streams the same within 1%; 4 was no better than 8 (docs/BENCHMARKS.md)
DECODE_BATCH = 8
# ... but small frames decode so fast that the calls themselves become the limit: each call and its hand-on of frames
# needs the interpreter lock, which the decoder threads share with inference. 16 streams of 640x272 (~22k fps on an
# H100) ran the pipeline with a null engine at 0.70-0.72x of decode-only in two of three processes with 8 frames a
# call, and at 0.93-1.05x with 16 (docs/BENCHMARKS.md). Frames under this many pixels are decoded
# twice as many a call. More does not pay: decode-only alone ran at the same rate with 8 to 64 frames a call, and the
# pipeline with 32 no faster than with 16 (H100, 2026-11-27).
SMALL_FRAME_PIXELS = 960 * 540


def frames_per_call(info) -> int:
    """Frames per SimpleDecoder call for a source of this geometry (``info``: its SourceInfo, or None)."""
    if info is not None and info.width and info.height and info.width * info.height < SMALL_FRAME_PIXELS:
        return min(2 * DECODE_BATCH, MAX_FRAMES_PER_LAUNCH)
    return DECODE_BATCH


def _gpu_count(cp) -> int:
    """GPUs CUDA can see, from the runtime (microseconds; nvidia-smi, twice, cost ~50 ms per classify() call, 5% of
    a one-stream run of a 600-frame clip on the H200)."""
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no driver, no device: CuPy raises its own CUDA errors
        return 0


class GpuBatches:
    """Batches on the GPU, whoever writes the frames: rotating input buffers handed out by a
    :class:`SlotAssembler`, the preprocessing kernel writing runs of slots on the writer's stream (:meth:`write`),
    one inference thread (:meth:`infer_stage`) and the results to the host (:meth:`collect_stage`).
    :class:`GpuPipeline` feeds it from NVDEC; :class:`engines.video.push.FramePusher` from frames an app pushes.

    ``policy``: "block" (a writer waits for a free slot) or "drop-oldest" (a frame that finds no free slot, or a
    full batch already waiting for inference, is dropped on arrival and counted in ``dropped``)."""

    def __init__(self, engine, spec, batch, topk, buffers, max_wait_ms, stats, input_shape, make_prediction,
                 policy: str = "drop-oldest", event_log: list | None = None, yield_events: bool = False):
        from .._deps import require

        self.cp = require("cupy", "The GPU video pipeline")
        self.engine, self.spec, self.batch, self.topk = engine, spec, batch, topk
        self.n_buffers, self.max_wait = buffers, max_wait_ms / 1000.0
        self.stats, self.input_shape, self.make_prediction = stats, input_shape, make_prediction
        self.lock = threading.Lock()
        self.counts: dict = {}  # frames classified per source
        self.stop = threading.Event()
        self.policy = policy
        self.dropped: dict = {}  # frames dropped under drop-oldest, per source
        self.events: deque = deque()  # SourceEvents from the decoder threads, for the caller's thread
        self.event_log = event_log if event_log is not None else []
        self.yield_events = yield_events
        self.device_id = getattr(engine, "device_id", 0)
        if self.device_id >= _gpu_count(self.cp):
            raise UsageProblem(f"no NVIDIA GPU {self.device_id} found", "use --device cpu")

    def write(self, asm: SlotAssembler, pre: GpuPreprocessor, plan, ptrs, metas, stream, wait: bool, on_error,
              clock: dict | None = None) -> int:
        """Enqueue the preprocessing of the frames at device addresses ``ptrs`` into the next free slots, ONE
        kernel per run of consecutive slots, on ``stream`` after it waits (on the GPU) for each buffer's "free"
        event. ``wait=False``: frames that find no slot are dropped, not waited for; returns how many. A launch
        that fails calls ``on_error(frames, exc)``, and its slots are marked lost."""
        pos = 0
        while pos < len(ptrs):
            t0 = time.perf_counter()
            got = asm.reserve(metas[pos:pos + MAX_FRAMES_PER_LAUNCH], wait=wait)
            if got is None:
                return len(ptrs) - pos
            buf, start, m = got
            if clock is not None:
                clock["slots"] += time.perf_counter() - t0
            ev = None
            try:
                stream.wait_event(buf.free)  # inference has read this buffer's previous batch (GPU-side wait)
                pre.launch(plan, ptrs[pos:pos + m], buf.data.data.ptr + start * buf.slot_bytes, stream)
                ev = buf.event_for(stream.ptr)
                ev.record(stream)
            except Exception as exc:  # noqa: BLE001 - the run's frames are lost, the writer goes on
                on_error(m, exc)
                ev = None
            finally:
                asm.commit(buf, start, m, stream.ptr, ev)
            pos += m
        return 0

    def infer_stage(self, asm: SlotAssembler, infer_stream, results: queue.Queue, errors: list,
                    warm_up: bool = False) -> None:
        """With ``warm_up`` (what :meth:`open` starts) the engine's warm-up first (:meth:`_warm_up`, then
        ``self.warmed`` is set; a failure is left in ``errors``); then full (or timed-out) buffers -> engine (its
        outputs to collect_stage, which enqueues top-k). Runs in one thread, on the engine's GPU: every engine call
        of a pipeline comes from this thread, the warm-up's too, so what an engine keeps per thread is made once
        (torch's cuDNN execution plans: the compiled PyTorch engine's quick start runs its first batches eagerly).
        Each engine call returns arrays of its own (every backend allocates its outputs per call), so the next call
        cannot overwrite a batch's outputs before its top-k reads them."""
        with self.cp.cuda.Device(self.device_id):
            if warm_up:
                try:
                    self.warm_done = self._warm_up(self.slot_arrays, infer_stream)
                except BaseException as exc:  # noqa: BLE001 - raised by open() in the caller's thread
                    errors.append(exc)
                    return
                finally:
                    self.warmed.set()
            self._infer_stage(asm, infer_stream, results, errors)

    def _infer_stage(self, asm: SlotAssembler, infer_stream, results: queue.Queue, errors: list) -> None:
        # where the inference thread's time goes (host seconds), reported in RunStats.infer_stage
        prof = self.stats.infer_stage
        prof.update(waiting_for_batches_s=0.0, engine_call_s=0.0, waiting_for_collect_s=0.0, topk_call_s=0.0)
        try:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                buf = asm.take(self.max_wait)
                t1 = time.perf_counter()
                prof["waiting_for_batches_s"] += t1 - t0
                if buf is None:
                    break
                n = buf.filled
                for ev in buf.last_event.values():
                    infer_stream.wait_event(ev)
                # always the full batch, also for a partial one (rows past n hold stale frames whose outputs are
                # dropped): ONNX Runtime's CUDA EP re-selects cuDNN algorithms whenever the input shape changes,
                # measured at ~120 ms per call for ResNet-50 on an H200 when batch sizes alternate; one fixed
                # shape also keeps CUDA graphs possible
                t2 = time.perf_counter()
                out = self.engine.infer(buf.data, stream=infer_stream)[0]
                prof["engine_call_s"] += time.perf_counter() - t2
                buf.free.record(infer_stream)  # the buffer's next writers wait for this on the GPU
                done = infer_stream.record()
                meta = buf.meta
                asm.release(buf)
                # top-k is enqueued by the collecting thread (collect_stage), not here: this thread's host time
                # between two engine calls is what the engine waits for when the host is the limit
                t3 = time.perf_counter()
                results.put((meta, out[:n], done))  # blocks while collect_stage is a queue's length behind
                prof["waiting_for_collect_s"] += time.perf_counter() - t3
        except BaseException as exc:  # noqa: BLE001 - surfaced in the caller's thread
            errors.append(exc)
            self.stop.set()
        finally:
            results.put(None)

    def _events_out(self):
        while self.events:
            ev = self.events.popleft()
            ev.say()  # here, in the caller's thread: a decoder thread never waits on stderr
            self.event_log.append(ev)
            if self.yield_events:
                yield ev

    def collect_stage(self, results: queue.Queue, errors: list, start: float):
        """Batches' top-k -> host -> Predictions (and live sources' events), in the caller's thread."""
        cp, topk_stream = self.cp, self.topk_stream
        while True:
            try:  # a short wait, so that a live source's events come out while it has no frames
                item = results.get(timeout=0.2)
            except queue.Empty:
                yield from self._events_out()
                continue
            yield from self._events_out()
            if item is None:
                break
            meta, out, done = item
            t0 = time.perf_counter()
            topk_stream.wait_event(done)  # the engine's outputs are written (each call's own arrays)
            packed = self.topk.device_packed(out, stream=topk_stream)
            self.stats.infer_stage["topk_call_s"] += time.perf_counter() - t0
            topk_stream.synchronize()
            idx_h, sc_h = unpack(cp.asnumpy(packed))  # (n, 2k) int32: the only device->host copy
            del out, packed
            now = time.perf_counter()  # the results are on the host
            self.stats.note_batch(len(meta))
            for m, i_row, s_row in zip(meta, idx_h.tolist(), sc_h.tolist(), strict=True):
                if m is None:  # lost in preprocessing (reported by decode_stage)
                    continue
                name, index, pts, t, fed_at, out_at, received = m[:7]  # pushed frames add the frame's owner
                self.counts[name] = self.counts.get(name, 0) + 1
                self.stats.frames += 1
                if len(m) > 8 and m[8] is not None:  # a live frame: capture -> result
                    self._lag(name, m[8])
                latency = decode = None
                if fed_at is not None:
                    latency = (now - fed_at) * 1000.0
                    decode = (out_at - fed_at) * 1000.0 if out_at is not None else None
                yield self.make_prediction(name, index, pts, t, i_row, s_row, latency, decode, received)
            self.stats.seconds = time.perf_counter() - start
        if errors:
            raise errors[0]

    def _lag(self, name: str, captured) -> None:
        lag = self.stats.lag.get(name)
        if lag is None:
            lag = self.stats.lag[name] = LagStats()
        lag.add_capture(time.time(), captured)

    def _warm_up(self, slots: list, stream) -> None:
        """Run the batch once before the clock starts, unless the engine's last pipeline ran this batch size too.
        ONNX Runtime's CUDA EP searches cuDNN algorithms on the first run of a shape and again at every change of
        shape, also back to one it ran before (0.2-1.7 s a change for ResNet-50 and Lite0 on an H100): seconds that
        must not land mid-stream. (Keeping a set of sizes once warmed, as this did, missed those changes back.)
        ``slots``: the input buffers' arrays. An engine that binds its inputs (``engine.binds_inputs``: the compiled
        PyTorch engine's CUDA graph per input address) runs every one of them, each pipeline, so that its graphs are
        captured here and not mid-stream. Returns an event recorded on ``stream`` after the warm-up's work (None when
        nothing ran), for the caller to wait for: :meth:`open` does, in its own thread, so that the inference
        thread, which runs the warm-up, makes no host synchronisation."""
        binds = bool(getattr(self.engine, "binds_inputs", False))
        if not binds:
            if getattr(self.engine, "_trtc_last_batch", None) == self.batch:
                return None
            if getattr(self.engine, "warms_itself", False):
                # e.g. ONNX Runtime's quick start: the first batches of a new size run on a session already warmed
                # at open while the tuned one prepares that size in the background; a warm-up here only delays the
                # first result
                return None
            slots = slots[:1]
        for data in slots:
            with stream:
                data.fill(0)
            self.engine.infer(data, stream=stream)
        done = stream.record()
        try:
            self.engine._trtc_last_batch = self.batch
        except AttributeError:
            pass
        return done

    def open(self, sources: int) -> None:
        """Make the preprocessor, the rotating input buffers and their assembler (expecting ``sources`` writers
        to call ``asm.source_done()`` when they finish), the inference stream; warm the engine up; start the
        clock. Call on the engine's GPU."""
        cp = self.cp
        h, w = self.input_shape
        self.dtype = dtype = self.engine.inputs[0].numpy_dtype
        if dtype not in (np.float32, np.float16):
            raise UsageProblem(f"the model input is {dtype}; the GPU preprocessor writes float32 or float16")
        # the layout the engine reads best (the compiled PyTorch engine: NHWC, no transpose before its first
        # convolution); the kernel writes it directly
        self.layout = input_layout(self.engine)
        self.pre = GpuPreprocessor(self.spec, layout=self.layout)
        bufs = [InputBuffer(cp, (self.spec.channels, h, w), dtype, self.batch, self.layout)
                for _ in range(self.n_buffers)]
        self.slot_arrays = [b.data for b in bufs]  # what the warm-up runs
        self.asm = SlotAssembler(bufs, self.batch)
        self.asm.sources_live = sources
        self.results: queue.Queue = queue.Queue(maxsize=self.n_buffers)
        self.infer_stream = getattr(self.engine, "stream", None) or cp.cuda.Stream(non_blocking=True)
        self.topk_stream = cp.cuda.Stream(non_blocking=True)  # top-k, enqueued by collect_stage's thread
        self.errors: list = []
        self.warmed, self.warm_done, t0 = threading.Event(), None, time.perf_counter()
        # the inference thread warms the engine up before it takes batches; the clock starts when that work is done
        self._infer_thread = threading.Thread(target=self.infer_stage, daemon=True, name="trtc-infer",
                                              args=(self.asm, self.infer_stream, self.results, self.errors, True))
        self._infer_thread.start()
        try:
            self._wait_for_warm_up()
        except BaseException:  # e.g. Ctrl-C during a long warm-up: the thread must not wait for batches for ever
            self.stop.set()
            self.asm.halt()
            raise
        if self.errors:
            raise self.errors[0]
        if self.warm_done is not None:
            self.warm_done.synchronize()
            log.info("warmed up batch %d in %.2f s", self.batch, time.perf_counter() - t0)
        self.start = time.perf_counter()

    def _wait_for_warm_up(self) -> None:
        self.warmed.wait()

    def start_inference(self) -> threading.Thread:
        """The inference thread, started (and the engine warmed up on it) by :meth:`open`."""
        return self._infer_thread

    def shutdown(self, threads) -> None:
        """Stop every stage (frames not yet run are left), wait for the threads, settle the counts."""
        self.stop.set()
        self.asm.halt()
        while True:  # let a blocked inference thread finish
            try:
                self.results.get_nowait()
            except queue.Empty:
                break
        for t in threads:
            t.join(timeout=10)
        self.stats.seconds = time.perf_counter() - self.start
        self.stats.per_source = dict(self.counts)


class GpuPipeline(GpuBatches):
    """:class:`GpuBatches` fed by a decoder thread per source (:meth:`decode_stage`)."""

    def __init__(self, srcs, engine, spec, batch, stride, topk, labels, buffers, max_wait_ms, stats, problems,
                 input_shape, report_problem, make_prediction, done: dict | None = None, policy: str = "drop-oldest",
                 event_log: list | None = None, yield_events: bool = False):
        from .._deps import require

        super().__init__(engine, spec, batch, topk, buffers, max_wait_ms, stats, input_shape, make_prediction,
                         policy, event_log, yield_events)
        require("PyNvVideoCodec", "Decoding video on the GPU")
        self.srcs, self.stride, self.labels = srcs, stride, labels
        self.problems, self.report_problem = problems, report_problem
        self.done = done or {}  # {source: last frame already classified} (a resumed run): decoded, not classified
        self.counts = {s.name: 0 for s in srcs}
        # live sources: frames that find no free input slot are dropped unless the policy is "block"
        self.dropped = {s.name: 0 for s in srcs}

    def run(self):
        with self.cp.cuda.Device(self.device_id):
            yield from self._run()

    # ----------------------------------------------------------------------------------------------- stages
    def decode_stage(self, src, pre: GpuPreprocessor, asm: SlotAssembler, out_dtype) -> None:
        """One source: decode, preprocess into reserved slots, record events. Runs in its own thread, on the
        engine's GPU (CuPy's current device is per thread: without this a stream for GPU 1 was made on GPU 0)."""
        with self.cp.cuda.Device(self.device_id):
            self._decode_stage(src, pre, asm, out_dtype)

    def _decode_stage(self, src, pre: GpuPreprocessor, asm: SlotAssembler, out_dtype) -> None:
        """Take a kept decoder (files) or make a stream, decode with the SimpleDecoder (files) or the packet loop,
        and always: finish the stream's work, give a cleanly ended decoder back, release the source's share."""
        cp = self.cp
        src.stop = self.stop
        src.on_event = self.events.append
        writer = _SourceWriter(self, src, pre, asm, out_dtype)
        stream = fmt = reused = kept = None
        live = getattr(src, "live", False)
        watch = None if live else TAP.begin(src.name)  # damage NVDEC concealed (native_out)
        audit = None if live else Auditor(src.name, self.stop)  # damage it decodes without a sign (bitstream)
        try:
            if src.batched:  # a decoder kept from an earlier source of this format comes with its own stream
                fmt = src.probe()
                stream, reused = DECODERS.take(self.device_id, fmt)
            # normal priority and one stream for the decoder's copies and our kernel: a higher priority, a separate
            # decoder stream and a larger decoder ring were measured on the H200 and changed nothing (BENCHMARKS.md)
            stream = writer.stream = stream or cp.cuda.Stream(non_blocking=True)
            with stream:
                batched = src.batched
                if batched:
                    try:
                        kept = src.run_batches(stream.ptr, frames_per_call(src.info), writer.on_frames,
                                               decoder=reused)
                    except BatchUnavailable as exc:
                        log.info("%s; decoding it packet by packet", exc)
                        batched = False
                if not batched:
                    src.run(stream.ptr, writer.on_frame)
            ended, watch = watch, None  # ended here, whatever the verdict does
            if not live:
                self._concealed(src, ended, audit)
        except Stopped:
            return
        except SourceError as exc:
            if not self.stop.is_set():
                self.report_problem(src.name, str(exc), self.counts[src.name])
        except Exception as exc:  # noqa: BLE001 - report, keep the other sources going
            self.report_problem(src.name, f"{src.name}: {type(exc).__name__}: {exc}", self.counts[src.name])
        finally:
            if watch is not None:
                watch.end()
            if stream is not None:
                stream.synchronize()
            if kept is not None:  # decoded to the end without an error: the next source of its format takes it
                DECODERS.give(self.device_id, fmt, stream, kept)
            asm.source_done()  # whatever happened: the run must not wait for this source forever
            self._add_decode_time(writer.clock, reused is not None)

    def _concealed(self, src, watch, audit) -> None:
        """A file NVDEC decoded to its end: whatever made it damaged (:func:`file_damage`) is its problem, as the
        CPU path's decoder errors are. ``watch`` is None where fd 1 could not be tapped (NVDEC's lines are not
        counted then; the other signs are)."""
        printed, others = watch.end() if watch is not None else (0, set())
        if self.stop.is_set():
            return
        found = audit.result() if audit is not None else None
        lost = getattr(src, "lost", 0)
        add, why = file_damage(printed, others, found, src.damaged - lost, lost=lost)
        src.damaged += add
        if why:
            self.report_problem(src.name, f"{src.name}: {why}", self.counts[src.name])

    def _add_decode_time(self, clock: dict, reused: bool) -> None:
        """Where a decoder thread's time went, summed over sources in ``stats.decode_stage``."""
        with self.lock:
            st = self.stats.decode_stage
            for k, name in (("decoder", "waiting_for_decoder_s"), ("slots", "waiting_for_slots_s"),
                            ("launch", "preprocess_call_s")):
                st[name] = st.get(name, 0.0) + clock[k]
            st["decoders_reused"] = st.get("decoders_reused", 0) + int(reused)

    # ------------------------------------------------------------------------------------------------- wiring
    @staticmethod
    def _seconds(src, index: int):
        fps = src.info.fps if src.info is not None else None
        return index / fps if fps else None

    def _run(self):
        self.open(sources=len(self.srcs))
        threads = [threading.Thread(target=self.decode_stage, args=(s, self.pre, self.asm, self.dtype), daemon=True,
                                    name=f"trtc-nvdec-{i}") for i, s in enumerate(self.srcs)]
        for t in threads:
            t.start()
            reader_started(t)
        threads.append(self.start_inference())
        try:
            yield from self.collect_stage(self.results, self.errors, self.start)
        finally:
            self.shutdown(threads)
            self.event_log.extend(self.events)
            self.events.clear()
            for src in self.srcs:
                self.stats.add_source(src, dropped=self.dropped.get(src.name, 0))


class _SourceWriter:
    """One source's frames into the input buffers: the decoders' callbacks (``on_frames`` for the SimpleDecoder,
    ``on_frame`` for the packet loop) and ``write``, which enqueues ONE preprocessing kernel per run of slots on
    the source's stream (``stream``, set by the decode stage before decoding starts)."""

    def __init__(self, pipe: GpuPipeline, src, pre: GpuPreprocessor, asm: SlotAssembler, out_dtype):
        self.pipe, self.src, self.pre, self.asm, self.out_dtype = pipe, src, pre, asm, out_dtype
        self.stream = None
        self.clock = {"out": time.perf_counter(), "decoder": 0.0, "slots": 0.0, "launch": 0.0}
        self.drop = getattr(src, "live", False) and pipe.policy != "block"
        self.skip_to = pipe.done.get(src.name, -1)
        self.batch_plan = None

    def write(self, ptrs, metas, plan) -> None:
        """Enqueue the preprocessing of these surfaces into the next free slots, as few runs as possible. A live
        source under drop-oldest never waits for a slot: a frame that finds none is dropped (counted)."""
        pipe, src = self.pipe, self.src

        def lost(m, exc):
            pipe.report_problem(src.name, f"{src.name}: {m} frame(s) lost: preprocessing failed: "
                                          f"{type(exc).__name__}: {exc}", pipe.counts[src.name])

        pipe.dropped[src.name] += pipe.write(self.asm, self.pre, plan, ptrs, metas, self.stream, not self.drop, lost,
                                             self.clock)

    def plan_of(self, frame):
        fmt = surface_format(frame)
        surface = self.pipe.cp.from_dlpack(frame)  # no copy; the decoder writes on this stream, so no wait is added
        info = self.src.info  # pre.plan() caches per kind of surface
        return self.pre.plan(fmt, surface.shape, surface.dtype, info.height, info.width, info.colorspace,
                             self.out_dtype, getattr(self.src, "turn", None)), surface  # turned in the kernel

    def on_frames(self, first, frames):  # SimpleDecoder: one batch of one source
        pipe, src = self.pipe, self.src
        t_in = time.perf_counter()
        self.clock["decoder"] += t_in - self.clock["out"]
        if pipe.stop.is_set():
            return False
        # one DLPack import per source, not per batch: a file's surfaces keep the geometry its demuxer reported,
        # and every extra call into PyNvVideoCodec costs interpreter-lock traffic
        if self.batch_plan is None:
            self.batch_plan = self.plan_of(frames[0])[0]
        ptrs, metas = [], []
        received = time.time()
        for i, frame in enumerate(frames):
            index = first + i
            if index % pipe.stride or index <= self.skip_to:
                continue
            ptrs.append(frame.GetPtrToPlane(0))
            pts, t = src.stamp_index(index) if hasattr(src, "stamp_index") else (frame.getPTS(), None)
            metas.append((src.name, index, pts, t if t is not None else pipe._seconds(src, index), None, None,
                          received))
        if ptrs:
            self.write(ptrs, metas, self.batch_plan)
        self.clock["out"] = time.perf_counter()
        self.clock["launch"] += self.clock["out"] - t_in
        return True  # frame references die with this call, before the next get_batch_frames

    def on_frame(self, index, pts, t, frame, fed_at):  # packet loop: one frame
        out_at = time.perf_counter()
        if self.pipe.stop.is_set():
            return False
        if index % self.pipe.stride or index <= self.skip_to:
            return True
        plan, surface = self.plan_of(frame)
        meta = (self.src.name, index, pts, t, fed_at, out_at, time.time())
        if self.src.live:  # its capture time (a pushed frame's meta has its owner at 7)
            meta += (None, getattr(self.src, "captured", None))
        self.write([surface.data.ptr], [meta], plan)
        return True  # surface and frame references die here, before the next Decode
