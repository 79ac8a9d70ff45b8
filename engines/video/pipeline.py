"""Classify video frames: decode -> preprocess -> batch -> engine -> top-k, for many sources at once.

GPU path (engine on ``cuda:N``, PyNvVideoCodec and CuPy installed), per source one thread:

    demux + NVDEC decode on the source's CUDA stream
      -> cupy.from_dlpack(frame) (no copy) -> one fused kernel, same stream, writes slot s of input buffer b
      -> CUDA event recorded for (b, s)
    inference thread: a full (or timed-out partial) buffer -> its stream waits on the sources' events
      -> engine.infer(buffer, stream) -> top-k on the GPU -> "buffer free" event
    the caller's thread: waits for that batch's event, copies (batch, k) indices and scores to the host.

The decoder writes each surface with copies on the source's stream, and the preprocessing kernel is enqueued on
that same stream before the next ``Decode`` call: a frame is read before its surface can be reused, with no host
synchronisation. At least two input buffers (default 4) rotate, so decoding and preprocessing batch n+1 overlaps
inference of batch n; a source thread only waits on the host when it needs a buffer that inference has not
finished reading, which with enough buffers does not happen in steady state. Only compressed packets go in and
(batch, k) results come out: no frame crosses between host and device.

CPU path (engine on the CPU, or no NVDEC): PyAV decodes each source in a thread, the numpy reference of the same
preprocessing maths (:func:`engines.preprocess.preprocess_yuv`) fills host batches, ONNX Runtime's CPU provider
runs them. Same outputs within float tolerance.

Results carry the source, frame index (display order, counting every decoded frame), timestamp and top-k. A
source that fails (cannot be opened, unsupported by NVDEC, corrupt, cut off) is reported in ``run.problems`` and
the others go on; every result already computed is still yielded.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .._gpu import device as gpu_device
from ..errors import TrtcError, UsageProblem
from ..preprocess import GpuPreprocessor, PreprocessSpec, preprocess_yuv
from ..topk import TopK
from .sources import SourceError, make_sources, surface_format

log = logging.getLogger("trtc")


@dataclass
class Prediction:
    source: str
    frame: int
    pts: int | None
    time: float | None  # seconds from the start of the source
    indices: list[int]
    scores: list[float]
    labels: list[str] | None = None
    latency_ms: float | None = None  # packet into the decoder -> result on the host (GPU path)
    decode_ms: float | None = None  # the decoder's share of it: packet in -> frame out of NVDEC

    def to_dict(self, latency: bool = False) -> dict:
        d = {"source": self.source, "frame": self.frame, "pts": self.pts,
             "time": None if self.time is None else round(self.time, 6),
             "top_k": [{"index": int(i), "label": (self.labels[n] if self.labels else None), "score": round(float(s), 6)}
                       for n, (i, s) in enumerate(zip(self.indices, self.scores, strict=True))]}
        if latency and self.latency_ms is not None:
            d["latency_ms"] = round(self.latency_ms, 3)
            d["decode_ms"] = round(self.decode_ms, 3)
        return d


@dataclass
class SourceProblem:
    source: str
    reason: str
    frames: int  # frames classified from this source before the problem

    def __str__(self) -> str:
        return f"{self.reason} (after {self.frames} frames)"


@dataclass
class RunStats:
    frames: int = 0
    batches: int = 0
    seconds: float = 0.0
    per_source: dict = field(default_factory=dict)
    path: str = ""
    batch_sizes: list = field(default_factory=list)
    decoded: dict = field(default_factory=dict)  # frames each source's decoder produced (before the stride)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        mean_batch = float(np.mean(self.batch_sizes)) if self.batch_sizes else 0.0
        return {"frames": self.frames, "batches": self.batches, "seconds": round(self.seconds, 3),
                "fps": round(self.fps, 1), "mean_batch": round(mean_batch, 2), "path": self.path,
                "per_source": self.per_source, "decoded": self.decoded}


class VideoRun:
    """Iterate for :class:`Prediction` objects; afterwards ``problems``, ``stats`` and ``ok`` say how it went."""

    def __init__(self, gen_factory, stats: RunStats, problems: list):
        self._factory = gen_factory
        self.stats = stats
        self.problems: list[SourceProblem] = problems
        self._started = False

    def __iter__(self):
        if self._started:
            raise UsageProblem("a VideoRun can be iterated once", "call classify() again")
        self._started = True
        return self._factory()

    @property
    def ok(self) -> bool:
        return not self.problems


def default_device(index: int = 0) -> str:
    """"cuda:N" when GPU ``index`` exists and the GPU video stack (CuPy, PyNvVideoCodec) is installed, else "cpu"."""
    from .._deps import is_installed

    if gpu_device(index) is not None and is_installed("cupy") and is_installed("PyNvVideoCodec"):
        return f"cuda:{index}"
    return "cpu"


def classify(sources, engine, *, batch: int | None = None, top_k: int = 5, stride: int = 1, scores: str = "auto",
             preprocess: PreprocessSpec | None = None, labels: list[str] | None = None, decoder: str = "auto",
             colorspace: str | None = None, buffers: int = 4, max_wait_ms: float = 100.0, loop: int = 1,
             realtime: bool = False, latency: str = "native", done: dict | None = None) -> VideoRun:
    """Classify every ``stride``-th frame of each source with ``engine`` (from :func:`engines.open_engine`).

    ``decoder``: "nvdec" (GPU; needs a CUDA engine), "pyav" (CPU), or "auto" (NVDEC when the engine is on a GPU).
    ``batch``: frames per inference (default: the manifest's optimum, capped at 64). ``max_wait_ms``: how long a
    partly filled batch waits for more frames before it runs anyway. ``loop``: read each source this many times.
    ``realtime``: feed packets at the stream's frame rate (to measure latency as a live camera would see it).
    ``latency``: NVDEC output latency, "native" (display order, a few frames of lag) or "low" (no lag; only for
    streams without B-frames). Preprocessing and labels default to the model's manifest. ``done``: {source: last
    frame index already classified} (a resumed run): those frames are decoded again but not classified.
    """
    if isinstance(sources, (str, bytes)) or not hasattr(sources, "__iter__"):
        sources = [sources]
    sources = [str(s) for s in sources]
    if not sources:
        raise UsageProblem("no video sources given")
    if stride < 1:
        raise UsageProblem(f"--stride must be at least 1, got {stride}")
    if buffers < 2:
        raise UsageProblem(f"at least two input buffers are needed (got {buffers})")
    manifest = _manifest_of(engine)
    spec = preprocess or (manifest.preprocess if manifest is not None else PreprocessSpec())
    labels = labels if labels is not None else (manifest.labels if manifest is not None else None)
    batch = batch or _default_batch(engine, manifest)
    _check_batch(engine, manifest, batch)
    on_gpu = str(getattr(engine, "device", "cpu")).startswith("cuda")
    if decoder == "auto":
        decoder = "nvdec" if on_gpu else "pyav"
    if decoder not in ("nvdec", "pyav"):
        raise UsageProblem(f"unknown decoder {decoder!r}", "use auto, nvdec or pyav")
    if decoder == "nvdec" and not on_gpu:
        raise UsageProblem("NVDEC decoding feeds a GPU engine, but this engine runs on the CPU",
                           "open the model with device='cuda:0', or use decoder='pyav'")
    from .._deps import require

    if decoder == "nvdec":
        require("cupy", "The GPU video pipeline")
        require("PyNvVideoCodec", "Decoding video on the GPU")
    else:
        require("av", "Decoding video on the CPU")
    gpu_index = getattr(engine, "device_id", 0)
    srcs = make_sources(sources, decoder, gpu_index, colorspace, loop, realtime, latency)
    topk = TopK(top_k, scores)
    stats = RunStats(path=f"{decoder} -> {type(engine).__name__} ({getattr(engine, 'device', 'cpu')})")
    problems: list[SourceProblem] = []
    done = {str(k): int(v) for k, v in (done or {}).items()}
    if decoder == "nvdec":
        def factory():
            return _GpuPipeline(srcs, engine, spec, batch, stride, topk, labels, buffers, max_wait_ms, stats,
                                problems, done).run()
    else:
        def factory():
            return _cpu_pipeline(srcs, engine, spec, batch, stride, topk, labels, max_wait_ms, stats, problems,
                                 done)
    return VideoRun(factory, stats, problems)


def _manifest_of(engine):
    m = getattr(engine, "manifest", None)
    if m is not None:
        return m
    path = getattr(engine, "path", None)
    if path is None:
        return None
    from ..manifest import read_manifest_if_any

    try:
        return read_manifest_if_any(path, verify_hash=False)
    except TrtcError:
        return None


def _default_batch(engine, manifest) -> int:
    fixed = _fixed_batch(engine)
    if fixed:
        return fixed
    if manifest is not None and manifest.batch is not None:
        return max(1, min(64, manifest.batch.opt or 8))
    return 8


def _fixed_batch(engine) -> int | None:
    d = engine.inputs[0].shape[0] if engine.inputs and engine.inputs[0].shape else None
    return d if isinstance(d, int) and d > 0 else None


def _check_batch(engine, manifest, batch: int) -> None:
    if batch < 1:
        raise UsageProblem(f"--batch must be at least 1, got {batch}")
    fixed = _fixed_batch(engine)
    if fixed and batch != fixed:
        raise UsageProblem(f"the model takes batches of exactly {fixed}, not {batch}", f"use --batch {fixed}")
    if manifest is not None and manifest.batch is not None and manifest.batch.max and batch > manifest.batch.max:
        raise UsageProblem(f"--batch {batch} is above the model's largest batch ({manifest.batch.max})",
                           f"use --batch {manifest.batch.max} or less")


def _input_shape(engine, spec: PreprocessSpec) -> tuple[int, int]:
    shape = engine.inputs[0].shape
    if len(shape) == 4 and all(isinstance(d, int) for d in shape[2:]):
        if tuple(shape[2:]) != tuple(spec.size):
            raise UsageProblem(f"the model takes {shape[2]}x{shape[3]} inputs but the preprocessing makes "
                               f"{spec.size[0]}x{spec.size[1]}", "fix the manifest's preprocess size")
    return spec.size


def _problem(problems, lock, source, reason, frames):
    with lock:
        problems.append(SourceProblem(source, reason, frames))
    log.warning("%s (after %d frames)", reason, frames)


# ------------------------------------------------------------------------------------------------------- CPU path
def _cpu_pipeline(srcs, engine, spec, batch, stride, topk, labels, max_wait_ms, stats, problems, done=None):
    """Decode threads (PyAV, numpy preprocessing) -> host batches -> engine.infer -> top-k on the host."""
    dtype = engine.inputs[0].numpy_dtype
    _input_shape(engine, spec)
    q: queue.Queue = queue.Queue(maxsize=4 * batch)
    lock = threading.Lock()
    stop = threading.Event()
    done_marker = object()
    counts = {s.name: 0 for s in srcs}

    done = done or {}

    def worker(src):
        skip_to = done.get(src.name, -1)
        try:
            for index, pts, t, planes in src.frames():
                if stop.is_set():
                    return
                if index % stride or index <= skip_to:
                    continue
                cs = src.info.colorspace
                x = preprocess_yuv(planes, spec, cs, dtype)
                q.put((src.name, index, pts, t, x))
        except SourceError as exc:
            _problem(problems, lock, src.name, exc.reason, counts[src.name])
        except Exception as exc:  # noqa: BLE001 - keep the other sources going
            _problem(problems, lock, src.name, f"{src.name}: {type(exc).__name__}: {exc}", counts[src.name])
        finally:
            q.put(done_marker)

    threads = [threading.Thread(target=worker, args=(s,), daemon=True, name=f"trtc-decode-{i}")
               for i, s in enumerate(srcs)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    live = len(threads)
    pending: list = []
    wait = max_wait_ms / 1000.0
    try:
        while live or pending:
            item = None
            if live:
                try:
                    item = q.get(timeout=wait if pending else None)
                except queue.Empty:
                    item = None
            if item is done_marker:
                live -= 1
            elif item is not None:
                pending.append(item)
            if pending and (len(pending) >= batch or item is None or not live):
                chunk, pending = pending[:batch], pending[batch:]
                x = np.stack([c[4] for c in chunk])
                out = engine.infer(x)[0]
                idx, sc = topk.host(out)
                stats.batches += 1
                stats.batch_sizes.append(len(chunk))
                for (name, index, pts, t, _), i, s in zip(chunk, idx, sc, strict=True):
                    counts[name] += 1
                    stats.frames += 1
                    yield Prediction(name, index, pts, t, i.tolist(), s.tolist(), _names(labels, i))
                stats.seconds = time.perf_counter() - start
    finally:
        stop.set()
        while True:  # unblock workers stuck on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                break
        stats.seconds = time.perf_counter() - start
        stats.per_source = dict(counts)
        for src in srcs:
            stats.decoded[src.name] = stats.decoded.get(src.name, 0) + src.decoded


def _names(labels, idx):
    if not labels:
        return None
    return [labels[int(i)] if 0 <= int(i) < len(labels) else str(int(i)) for i in idx]


# ------------------------------------------------------------------------------------------------------- GPU path
class _Buffer:
    def __init__(self, cp, shape, dtype, batch):
        self.data = cp.empty((batch, *shape), dtype)
        self.events = [cp.cuda.Event(block=False, disable_timing=True) for _ in range(batch)]
        self.free = cp.cuda.Event(block=False, disable_timing=True)
        self.free_pending = False  # free has been recorded and may not have fired yet
        self.reset()

    def reset(self):
        self.filled = 0  # slots handed out
        self.writing = 0  # slots handed out whose kernel launch has not been enqueued yet
        self.closed = False  # no more slots: full, or taken partial
        self.meta: list = []
        self.last_event: dict = {}  # source stream ptr -> the last slot event recorded from it


class _Stopped(Exception):
    """The run was stopped (the caller left the loop or something failed)."""


class _Assembler:
    """Hands out batch slots in order and passes full (or timed-out) buffers to inference.

    A slot is reserved under the lock; the kernel launch that fills it happens outside, so eight decoder threads
    do not queue behind one another's launches. A closed buffer becomes ready when its last launch is enqueued.
    """

    def __init__(self, buffers: list, batch: int):
        self.batch = batch
        self.free = deque(buffers)
        self.ready: deque = deque()
        self.current = None
        self.cond = threading.Condition()
        self.sources_live = 0
        self.first_put_at = None
        self.stopped = False

    def put(self, launch, meta, stream):
        """Reserve the next slot, enqueue ``launch(slot_view)`` on ``stream`` and record the slot's event."""
        with self.cond:
            # loop: another source may have opened a buffer while this one waited for a free one
            while self.current is None:
                if self.stopped:
                    raise _Stopped
                if not self.free:
                    self.cond.wait(0.1)
                    continue
                buf = self.free.popleft()
                if buf.free_pending:
                    buf.free.synchronize()  # inference has read this buffer's previous batch; rarely waits
                    buf.free_pending = False
                buf.reset()
                self.current = buf
                self.first_put_at = time.perf_counter()
            buf = self.current
            slot = buf.filled
            buf.filled += 1
            buf.writing += 1
            buf.meta.append(meta)
            if buf.filled == self.batch:
                buf.closed = True
                self.current = None
            if buf.filled == 1:
                self.cond.notify_all()  # starts the partial-batch clock in take()
        ev = None
        try:
            launch(buf.data[slot])
            ev = buf.events[slot]
            ev.record(stream)
        finally:
            with self.cond:
                if ev is not None:
                    buf.last_event[stream.ptr] = ev
                buf.writing -= 1
                if buf.closed and buf.writing == 0:
                    self.ready.append(buf)
                    self.cond.notify_all()

    def take(self, max_wait: float):
        """The next buffer to run, a partial one ``max_wait`` s after its first frame, or None when every source
        is done. Waits on the condition (put() notifies on a buffer's first frame and when one is ready)."""
        with self.cond:
            while not self.stopped:
                if self.ready:
                    return self.ready.popleft()
                cur = self.current
                if cur is not None and cur.filled:
                    remaining = max_wait - (time.perf_counter() - self.first_put_at)
                    if self.sources_live == 0 or remaining <= 0:
                        self.current = None
                        cur.closed = True
                        if cur.writing == 0:
                            return cur
                        continue  # its last launches are being enqueued; put() moves it to ready
                    self.cond.wait(remaining)
                elif self.sources_live == 0:
                    return None
                else:
                    self.cond.wait(0.5)
            return None

    def halt(self):
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def release(self, buf):
        with self.cond:
            buf.free_pending = True
            self.free.append(buf)
            self.cond.notify_all()

    def source_done(self):
        with self.cond:
            self.sources_live -= 1
            self.cond.notify_all()


class _GpuPipeline:
    def __init__(self, srcs, engine, spec, batch, stride, topk, labels, buffers, max_wait_ms, stats, problems,
                 done=None):
        self.done = done or {}
        from .._deps import require

        self.cp = require("cupy", "The GPU video pipeline")
        require("PyNvVideoCodec", "Decoding video on the GPU")
        self.srcs, self.engine, self.spec, self.batch = srcs, engine, spec, batch
        self.stride, self.topk, self.labels = stride, topk, labels
        self.n_buffers, self.max_wait = buffers, max_wait_ms / 1000.0
        self.stats, self.problems = stats, problems
        self.lock = threading.Lock()
        self.counts = {s.name: 0 for s in srcs}
        self.stop = threading.Event()
        self.device_id = getattr(engine, "device_id", 0)
        if gpu_device(self.device_id) is None:
            raise UsageProblem(f"no NVIDIA GPU {self.device_id} found", "use --device cpu")

    def run(self):
        cp = self.cp
        with cp.cuda.Device(self.device_id):
            yield from self._run(cp)

    def _warm_up(self, data, stream) -> None:
        """Run the batch once before the clock starts (once per engine and batch size): the first run of a shape
        includes ONNX Runtime's cuDNN algorithm search, seconds that must not land mid-stream."""
        warmed = getattr(self.engine, "_trtc_warm_batches", None)
        if warmed is None:
            warmed = set()
            try:
                self.engine._trtc_warm_batches = warmed
            except AttributeError:
                pass
        if self.batch in warmed:
            return
        t0 = time.perf_counter()
        with stream:
            data.fill(0)
        self.engine.infer(data, stream=stream)
        stream.synchronize()
        warmed.add(self.batch)
        log.info("warmed up batch %d in %.2f s", self.batch, time.perf_counter() - t0)

    def _run(self, cp):
        h, w = _input_shape(self.engine, self.spec)
        dtype = self.engine.inputs[0].numpy_dtype
        if dtype not in (np.float32, np.float16):
            raise UsageProblem(f"the model input is {dtype}; the GPU preprocessor writes float32 or float16")
        pre = GpuPreprocessor(self.spec)
        bufs = [_Buffer(cp, (3, h, w), dtype, self.batch) for _ in range(self.n_buffers)]
        asm = _Assembler(bufs, self.batch)
        asm.sources_live = len(self.srcs)
        results: queue.Queue = queue.Queue(maxsize=self.n_buffers)
        infer_stream = getattr(self.engine, "stream", None) or cp.cuda.Stream(non_blocking=True)
        errors: list = []
        self._warm_up(bufs[0].data, infer_stream)
        start = time.perf_counter()

        def decode(src):
            # normal priority: giving decoder streams the highest priority was measured slower on the H200
            # (8 streams: 2209 fps vs 2437-2734 fps)
            stream = cp.cuda.Stream(non_blocking=True)
            info = None

            def on_frame(index, pts, t, frame, fed_at):
                nonlocal info
                out_at = time.perf_counter()
                if self.stop.is_set():
                    return False
                if index % self.stride or index <= self.done.get(src.name, -1):
                    return True
                fmt = surface_format(frame)
                surface = cp.from_dlpack(frame)  # no copy; on this stream, which the decoder also uses
                info = info or src.info

                def launch(slot):
                    pre(surface, fmt, info.height, info.width, info.colorspace, slot)

                asm.put(launch, (src.name, index, pts, t, fed_at, out_at), stream)
                return True  # surface and frame references die here, before the next Decode

            try:
                with stream:
                    src.run(stream.ptr, on_frame)
            except _Stopped:
                return
            except SourceError as exc:
                _problem(self.problems, self.lock, src.name, exc.reason, self.counts[src.name])
            except Exception as exc:  # noqa: BLE001 - report, keep the other sources going
                _problem(self.problems, self.lock, src.name, f"{src.name}: {type(exc).__name__}: {exc}",
                         self.counts[src.name])
            finally:
                stream.synchronize()  # our kernels read the decoder's surfaces: finish before it is freed
                asm.source_done()

        def infer():
            try:
                while not self.stop.is_set():
                    buf = asm.take(self.max_wait)
                    if buf is None:
                        break
                    n = buf.filled
                    for ev in buf.last_event.values():
                        infer_stream.wait_event(ev)
                    # always the full batch, also for a partial one (rows past n hold stale frames whose
                    # outputs are dropped): ONNX Runtime's CUDA EP re-selects cuDNN algorithms whenever the
                    # input shape changes, measured at ~120 ms per call for ResNet-50 on an H200 when batch
                    # sizes alternate; one fixed shape also keeps CUDA graphs possible
                    x = buf.data
                    out = self.engine.infer(x, stream=infer_stream)[0]
                    idx, sc = self.topk.device(out[:n], stream=infer_stream)
                    buf.free.record(infer_stream)
                    done = infer_stream.record()
                    meta = buf.meta
                    asm.release(buf)
                    results.put((meta, idx, sc, done))
            except BaseException as exc:  # noqa: BLE001 - surfaced in the caller's thread
                errors.append(exc)
                self.stop.set()
            finally:
                results.put(None)

        threads = [threading.Thread(target=decode, args=(s,), daemon=True, name=f"trtc-nvdec-{i}")
                   for i, s in enumerate(self.srcs)]
        threads.append(threading.Thread(target=infer, daemon=True, name="trtc-infer"))
        for t in threads:
            t.start()
        try:
            while True:
                item = results.get()
                if item is None:
                    break
                meta, idx, sc, done = item
                done.synchronize()
                idx_h, sc_h = cp.asnumpy(idx), cp.asnumpy(sc)  # (n, k): the only device->host copies
                now = time.perf_counter()  # the results are on the host
                self.stats.batches += 1
                self.stats.batch_sizes.append(len(meta))
                for (name, index, pts, t, fed_at, out_at), i, s in zip(meta, idx_h, sc_h, strict=True):
                    self.counts[name] += 1
                    self.stats.frames += 1
                    yield Prediction(name, index, pts, t, i.tolist(), s.tolist(), _names(self.labels, i),
                                     (now - fed_at) * 1000.0, (out_at - fed_at) * 1000.0)
                self.stats.seconds = time.perf_counter() - start
            if errors:
                raise errors[0]
        finally:
            self.stop.set()
            asm.halt()
            while True:  # let a blocked inference thread finish
                try:
                    results.get_nowait()
                except queue.Empty:
                    break
            for t in threads:
                t.join(timeout=10)
            self.stats.seconds = time.perf_counter() - start
            self.stats.per_source = dict(self.counts)
            for src in self.srcs:
                self.stats.decoded[src.name] = self.stats.decoded.get(src.name, 0) + src.decoded
