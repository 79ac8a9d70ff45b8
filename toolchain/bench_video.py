"""Video pipeline speed side by side: `trtc bench VIDEO --model M --streams 1,8`.

Three pipelines run on the same file, in the same process, one after the other, each N copies of the file at
once (one thread per stream), after a warm-up pass of each:

- ``decode-only``: NVDEC into device memory, frames counted and dropped, two ways: PyNvVideoCodec's demuxer and
  core decoder in a Python loop per stream (what a hand-written pipeline does; new decoders every run), and its
  SimpleDecoder (batches of 16 frames, what trtc uses for files) with its decoders reused from run to run, as
  trtc's are (:mod:`engines.video.decoders`). The faster of the two is the ceiling that ``vs decode-only``
  divides by.
  PyNvVideoCodec's ThreadedDecoder is not measured: it crashed the process in a third of the test processes on
  the H200 (docs/BENCHMARKS.md), and a ceiling nobody can ship is not a ceiling.

Every pipeline is timed from before it opens its sources to its last result, so opening demuxers and decoders
counts the same everywhere. NVDEC decoders open one after another (~60 ms each on the H200), so the warm-up makes
as many as the largest stream count for the SimpleDecoder and trtc pipelines, which then reuse them in every
timed run, as a long-running trtc process (a worker, a Ray actor, a service) does after its first sources. With
``repeat`` > 1 the decode-only and trtc pipelines run that many times, interleaved, and each row shows the run
with the median fps (all runs' fps in ``fps_runs``): on the H200 one run in three can still be ~10% off the
other two.
- ``usual``: what people write by hand: OpenCV ``cv2.VideoCapture`` decodes on the CPU (one thread per stream),
  frames are stacked on the host, copied to the GPU with torch, resized (bilinear, short side), centre-cropped and
  normalised with torch ops, and run by the same model as ours in a session of its own (ONNX Runtime CUDA EP,
  device pointers), batch 32 (or the model's largest when smaller). Its last batch is padded to the full size, as
  trtc's are: ONNX Runtime 1.31's CUDA EP searches cuDNN algorithms again whenever the input shape changes, also
  back to a shape it ran before (0.2-1.3 s a switch for ResNet-50 and Lite0 on an H100), and neither pipeline
  should be timed on that.
- ``trtc``: :func:`engines.video.classify`: NVDEC -> CuPy kernel into the engine's input buffer -> engine ->
  top-k, zero-copy.

With ``devices`` (``--devices cuda:0,cuda:1``), each stream count also runs N streams on every GPU at once, two
ways, each with a process per GPU started and warmed before any clock: decode-only (the SimpleDecoder loop above,
its processes told to start at the same instant) and trtc (:class:`engines.video.WorkerPool`). ``vs 1 GPU``
divides each by the same pipeline on one GPU, and trtc's ``vs decode-only`` by the several-GPU decode-only, so the
table shows both how trtc scales and how far decoding alone scales on that host.

- ``engine-only``: the same engine alone, on the batches the trtc pipeline ran in its run (as many, of the same
  size: on the GPU every batch runs on the full input buffer, so the row times that many full batches on one
  device-resident batch of the pipeline's input shape and dtype, made once with CuPy, the host waiting only at the
  end; on the CPU the pipeline's own batch sizes, on host numpy batches), no decode. Its fps is the pipeline's
  frames over that time. trtc's row then says which of decode-only (the faster loop) and engine-only is lower,
  ``limited_by``, and ``vs_limit``: trtc's fps over that lower one.

With ``ort_tuning`` "both" an ONNX Runtime model also runs trtc and engine-only on a session opened with
``tuning="off"`` (the options before the tuning, "untuned" in the row names), in the same interleaved runs.
``baseline`` (``--baseline M``): another model's trtc and engine-only rows in the same interleaved runs, after the
model's, opened as trtc opens it (``baseline_tuning`` "auto") or, for an ONNX model, with ONNX Runtime's options
before the tuning ("off"); each of the model's trtc rows then has ``vs_baseline``, its fps over the baseline's trtc
fps. Two separate runs differ by more than the pipelines do: decode-only alone varied 20.5k-25.3k fps between two
processes on one H100 (2026-11-27), so a comparison belongs in one run. The baseline has no
usual, latency, memory, several-GPU or time-to-first-result rows.
``first_result``: the time to first result of `trtc run`, measured in a fresh Python process (nothing warm in the
process; caches on disk are), twice: from just before ``engines.open_engine`` to the first Prediction of
``engines.video.classify`` on the clip, at the bench's batch, and the import of ``engines`` separately
(:mod:`toolchain.first_result`). The second run is the one with warm caches.

On the CPU (``device="cpu"``): decode-only is PyAV's decoder (frames counted, a thread per stream), trtc is the
CPU pipeline (PyAV -> numpy -> ONNX Runtime CPU), engine-only as above on host batches; no usual pipeline (it
needs a GPU for torch), no latency run (it splits off NVDEC's part), no several-GPU rows.

Reported per (pipeline, streams): frames, seconds, aggregate fps, host CPU cores busy per stream (process CPU time
/ wall time / streams) and the ratios ours/decode-only and ours/usual. Then latency: one stream fed at the file's
frame rate (``realtime``), packet in -> top-k on the host, p50/p99/max over ``latency_frames`` frames. Numbers are
only comparable within one run on one GPU: the report names the GPU and the versions.
"""

from __future__ import annotations

import platform
import queue
import resource
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engines._deps import dist_version, require
from engines.errors import EngineError
from engines._gpu import device as gpu_device
from engines._gpu import memory_used_mib

from ._ui import Reporter
from .errors import UsageProblem


@dataclass
class VideoBenchRow:
    pipeline: str
    streams: int
    frames: int
    seconds: float
    fps: float
    vs_decode: float | None = None
    vs_usual: float | None = None
    vs_one_gpu: float | None = None  # several GPUs: this row's fps / its pipeline's on one GPU, same streams per GPU
    cores_per_stream: float | None = None  # host CPU cores busy (process CPU time / wall time) / streams
    fps_runs: list[float] | None = None  # every run's fps when the row is the median of several
    batches: int | None = None  # trtc and engine-only rows: the batches the engine ran
    limited_by: str | None = None  # trtc rows: "decode" or "engine", the lower of decode-only and engine-only
    vs_limit: float | None = None  # trtc rows: fps / min(decode-only, engine-only), same run
    vs_baseline: float | None = None  # trtc rows of the model (--baseline): fps / the baseline's trtc fps, same runs


@dataclass
class VideoBenchReport:
    video: str
    model: str
    device: str
    batch: int
    rows: list[VideoBenchRow]
    latency: dict
    memory: dict
    machine: dict
    versions: dict
    date: str
    warnings: list[str] = field(default_factory=list)
    first_result: dict = field(default_factory=dict)  # time to first result in a fresh process (see the module)
    baseline: dict = field(default_factory=dict)  # --baseline: {"model", "tuning"}; its rows end each stream count

    def to_dict(self) -> dict:
        return asdict(self)


def _each_stream_timed(streams: int, work) -> tuple[int, float]:
    """Run ``work(i) -> frames`` for every stream at once, a thread each: (frames of all streams, seconds). The clock
    starts before the threads, like the other pipelines': opening the decoders is part of the time."""
    counts = [0] * streams

    def one(i):
        counts[i] = work(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - t0


def _decode_only(video: str, streams: int, gpu: int) -> tuple[int, float]:
    nvc = require("PyNvVideoCodec", "Decoding video on the GPU")
    cp = require("cupy", "The GPU video pipeline")

    def work(_i):
        with cp.cuda.Device(gpu):
            stream = cp.cuda.Stream(non_blocking=True)
            dmx = nvc.CreateDemuxer(filename=video)
            dec = nvc.CreateDecoder(gpuid=gpu, codec=dmx.GetNvCodecId(), cudacontext=0, cudastream=stream.ptr,
                                    usedevicememory=True)
            n = 0
            for packet in dmx:
                n += len(dec.Decode(packet))
            stream.synchronize()
            return n

    return _each_stream_timed(streams, work)


def _decode_only_batched(video: str, streams: int, gpu: int, batch: int = 16) -> tuple[int, float]:
    """SimpleDecoder per stream, with decoders reused between runs through trtc's own decoder cache."""
    nvc = require("PyNvVideoCodec", "Decoding video on the GPU")
    cp = require("cupy", "The GPU video pipeline")
    from engines.video.decoders import DECODERS
    from engines.video.sources import NvdecSource

    fmt = NvdecSource(video, gpu).probe()

    def work(_i):
        with cp.cuda.Device(gpu):
            stream, dec = DECODERS.take(gpu, fmt)
            if dec is None:
                stream = cp.cuda.Stream(non_blocking=True)
                dec = nvc.SimpleDecoder(video, gpu_id=gpu, cuda_context=0, cuda_stream=stream.ptr,
                                        use_device_memory=True)
            else:
                dec.reconfigure_decoder(video)
            total = len(dec)  # never ask past it: the SimpleDecoder prints "INVALID INDEX" for each such frame
            n = 0
            while n < total:
                frames = dec.get_batch_frames(min(batch, total - n))
                if not frames:
                    break
                n += len(frames)
                del frames
            stream.synchronize()
            if n == total:
                DECODERS.give(gpu, fmt, stream, dec)
            del dec
            return n

    return _each_stream_timed(streams, work)


def _decode_only_process(conn, video: str, device: str, warm: int) -> None:
    """One GPU's decode-only process for the several-GPU ceiling: sees only its GPU (CUDA_VISIBLE_DEVICES set before
    CUDA loads, as trtc's workers do), opens ``warm`` decoders, then on each (streams, start_at) waits for the
    shared start and runs :func:`_decode_only_batched`, answering (frames, monotonic end time)."""
    import os

    from engines.video.workers import _visible_device

    visible, _local = _visible_device(device, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    try:
        video_frames, _ = _decode_only_batched(video, warm, 0)
        conn.send(("ready", video_frames))
        while True:
            job = conn.recv()
            if job is None:
                break
            streams, start_at = job
            time.sleep(max(0.0, start_at - time.monotonic()))  # CLOCK_MONOTONIC is the same in every process
            frames, _ = _decode_only_batched(video, streams, 0)
            conn.send(("done", (frames, time.monotonic())))
    except Exception as exc:  # noqa: BLE001 - reported by the parent, which names the GPU
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class DecodeOnlyOnGpus:
    """The decode-only ceiling of several GPUs at once: a process per device, each started, warmed (``warm``
    decoders opened, to be reused like trtc's) and then told to start at the same instant; fps is all their
    frames over the time from that instant to the last one's end."""

    def __init__(self, video: str, devices: list[str], warm: int):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.devices = list(devices)
        self.procs, self.conns = [], []
        for d in self.devices:
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_decode_only_process, args=(theirs, video, d, warm), daemon=True,
                            name=f"trtc-decode-only-{d}")
            p.start()
            theirs.close()
            self.procs.append(p)
            self.conns.append(mine)
        for d, c in zip(self.devices, self.conns, strict=True):
            self._answer(d, c, "ready")

    def _answer(self, device, conn, want):
        fix = "run trtc bench without --devices on that GPU to see its own error"
        try:
            kind, value = conn.recv()
        except EOFError:
            proc = self.procs[self.conns.index(conn)]
            proc.join(timeout=5)
            self.close()
            raise EngineError(f"the decode-only process for {device} ended without an answer (exit code "
                              f"{proc.exitcode})", fix) from None
        if kind != want:
            self.close()
            raise EngineError(f"decode-only on {device} failed: {value}", fix)
        return value

    def run(self, streams_each: int) -> tuple[int, float]:
        start_at = time.monotonic() + 0.25  # time enough for every process to read its job and sleep until then
        for c in self.conns:
            c.send((streams_each, start_at))
        done = [self._answer(d, c, "done") for d, c in zip(self.devices, self.conns, strict=True)]
        return sum(f for f, _ in done), max(end for _, end in done) - start_at

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        self.conns, self.procs = [], []


def _ours_pool(pool, video: str, streams: int, batch: int) -> tuple[int, float, list]:
    return _consume(pool.classify([video] * streams, batch=batch, top_k=5))


def _timed_row(name: str, streams: int, fn) -> VideoBenchRow:
    """Run ``fn() -> (frames, seconds, ...)`` and make its row, with the host CPU it kept busy."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - w0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    f, s = out[0], out[1]
    return VideoBenchRow(name, streams, f, round(s, 3), round(f / s, 1),
                         cores_per_stream=round(cpu / wall / streams, 3) if wall > 0 else None)


def _median_rows(runs: list[list[VideoBenchRow]], ceilings: tuple[int, ...] = ()) -> list[VideoBenchRow]:
    """Rows of several interleaved runs of the same pipelines -> one row per pipeline: its median-fps run (a real
    run, not an average), with every run's fps in ``fps_runs``. With an even count, the slower middle run, except
    for the rows at ``ceilings`` (the decode-only ones that ratios divide by), which take the faster one: an
    even count never flatters trtc."""
    out = []
    for i, same in enumerate(zip(*runs, strict=True)):
        ranked = sorted(same, key=lambda r: r.fps)
        row = ranked[len(ranked) // 2 if i in ceilings else (len(ranked) - 1) // 2]
        if len(same) > 1:
            row.fps_runs = [r.fps for r in same]
        out.append(row)
    return out


def _usual(video: str, streams: int, engine, spec, batch: int = 32) -> tuple[int, float]:
    """OpenCV CPU decode -> torch preprocessing on the GPU -> the same engine (device pointers)."""
    import cv2
    import torch
    import torch.nn.functional as F

    q: queue.Queue = queue.Queue(maxsize=4 * batch)
    done = object()

    def read(_i):
        cap = cv2.VideoCapture(video)
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            q.put(frame)
        cap.release()
        q.put(done)

    dev = torch.device(f"cuda:{engine.device_id}")
    c = spec.channels
    mean, std = (torch.tensor(v, device=dev).view(1, c, 1, 1) for v in (spec.mean, spec.std))
    grey = torch.tensor([0.299, 0.587, 0.114], device=dev).view(1, 3, 1, 1)  # engines.preprocess.GREY_WEIGHTS
    half = engine.inputs[0].dtype == "float16"
    h, w = spec.size

    def run(frames):
        n = len(frames)
        if n < batch:  # the last batch, padded: ONNX Runtime's CUDA EP searches cuDNN again at each new shape
            frames = frames + [frames[-1]] * (batch - n)
        x = torch.from_numpy(np.stack(frames)).to(dev)  # N, H, W, 3 uint8 BGR
        x = x[..., [2, 1, 0]].permute(0, 3, 1, 2).float() / 255.0
        sh, sw = x.shape[2:]
        s = (spec.resize or min(h, w)) / min(sh, sw)
        x = F.interpolate(x, size=(round(sh * s), round(sw * s)), mode="bilinear", align_corners=False)
        top, left = (x.shape[2] - h) // 2, (x.shape[3] - w) // 2
        x = x[:, :, top:top + h, left:left + w]
        x = (x * grey).sum(1, keepdim=True) if c == 1 else x
        x = ((x - mean) / std).contiguous()
        x = x.half() if half else x
        out = engine.infer(x, stream=torch.cuda.current_stream().cuda_stream)[0]
        top1 = out[:n].argmax(axis=1)
        return int(top1.shape[0])

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    live, n, pending = streams, 0, []
    while live:
        item = q.get()
        if item is done:
            live -= 1
        else:
            pending.append(item)
        if len(pending) >= batch or (not live and pending):
            n += run(pending)
            pending = []
    torch.cuda.synchronize()
    return n, time.perf_counter() - t0


def _ours(video: str, streams: int, engine, batch: int, limit: int | None = None,
          **kw) -> tuple[int, float, list, list]:
    from engines.video import classify

    return _consume(classify([video] * streams, engine, batch=batch, top_k=5, **kw), limit)


def _consume(run, limit: int | None = None) -> tuple[int, float, list, list]:
    """Iterate a VideoRun (up to ``limit`` predictions): (predictions, seconds, [(latency_ms, decode_ms)], the
    sizes of the batches it ran); a source problem fails the benchmark."""
    t0 = time.perf_counter()
    n = 0
    lat = []
    for pred in run:
        n += 1
        if pred.latency_ms is not None:
            lat.append((pred.latency_ms, pred.decode_ms))
        if limit and n >= limit:
            break
    seconds = time.perf_counter() - t0
    if run.problems:
        raise UsageProblem(f"the benchmark video failed: {run.problems[0]}")
    return n, seconds, lat, list(getattr(getattr(run, "stats", None), "batch_sizes", None) or [])


def _several_gpus(pool, dec_pool, video: str, n: int, k: int, batch: int, repeat: int, reporter, dec_one,
                  ours_one) -> list[VideoBenchRow]:
    """The rows for ``n`` streams on each of ``k`` GPUs, measured ``repeat`` times interleaved like the one-GPU
    rows: decode-only (a process per GPU, decoders reused, started together), then trtc (a worker per GPU). ``vs 1
    GPU`` divides each by its own pipeline on one GPU; trtc's ``vs decode-only`` by the several-GPU decode-only."""
    runs = []
    for r in range(repeat):
        again = f" (run {r + 1} of {repeat})" if repeat > 1 else ""
        with reporter.phase(f"{n} stream(s) on each of {k} GPUs: decode-only{again}"):
            dec = _timed_row(f"decode-only on {k} GPUs (SimpleDecoder, reused, a process per GPU)", n * k,
                             lambda: dec_pool.run(n))
        with reporter.phase(f"{n} stream(s) on each of {k} GPUs: trtc{again}"):
            multi = _timed_row(f"trtc on {k} GPUs ({n} streams each, a worker per GPU)", n * k,
                               lambda: _ours_pool(pool, video, n * k, batch))
        dec.cores_per_stream = multi.cores_per_stream = None  # the work is in other processes: not measured
        runs.append([dec, multi])
    dec, multi = _median_rows(runs, ceilings=(0,))
    dec.vs_one_gpu = round(dec.fps / dec_one.fps, 3)
    multi.vs_one_gpu = round(multi.fps / ours_one.fps, 3)
    multi.vs_decode = round(multi.fps / dec.fps, 3)
    return [dec, multi]


def _batches(engine, manifest, batch: int | None, usual_batch: int, latency_batch: int) -> tuple[int, int, int]:
    """The batch sizes to run, known before any warm-up: ``batch`` None is 64, or the model's largest when that is
    smaller (its only one when its batch is fixed); a given ``batch`` is checked against the model. The usual
    pipeline's and the latency run's are cut to what the model takes."""
    from engines.video.pipeline import _check_batch, _fixed_batch

    fixed = _fixed_batch(engine)
    largest = fixed or (manifest.batch.max if manifest.batch is not None and manifest.batch.max else None)

    def fit(b: int) -> int:
        return fixed or (min(b, largest) if largest else b)

    if batch is None:
        batch = fit(64)
    else:
        _check_batch(engine, manifest, batch)
    return batch, fit(usual_batch), fit(latency_batch)


@dataclass
class _Bench:
    """One video bench's settings, and what it opens beyond its engine: the several-GPU processes and the usual
    pipeline's session, closed by :meth:`close` whatever ends the run."""
    video: str
    engine: object
    spec: object
    gpu: int
    batch: int
    usual_batch: int
    repeat: int
    reporter: Reporter
    pool: object = None
    dec_pool: object = None
    usual_engine: object = None
    usual_ok: bool = True
    on_gpu: bool = True
    untuned: object = None  # --ort-tuning both: the same model on a session opened with tuning="off"
    suffix: str = ""  # in the trtc and engine-only rows' names: ", onnxruntime untuned" for --ort-tuning off
    baseline: tuple | None = None  # --baseline: (name suffix, engine, its preprocessing spec)

    def engines(self) -> list[tuple[str, object, object]]:
        """(name suffix, engine, preprocessing spec) of each engine trtc and engine-only run with, the baseline's
        last."""
        ours = [(self.suffix, self.engine, self.spec)]
        if self.untuned is not None:
            ours.append((", onnxruntime untuned", self.untuned, self.spec))
        return ours + ([self.baseline] if self.baseline is not None else [])

    def close(self) -> None:
        if self.baseline is not None:
            self.baseline[1].close()
        if self.untuned is not None:
            self.untuned.close()
        if self.usual_engine is not None:
            self.usual_engine.close()
        if self.dec_pool is not None:
            self.dec_pool.close()
        if self.pool is not None:
            self.pool.close()


def bench_video(video: str, model: str, *, streams=(1, 8, 16, 32), device: str = "cuda:0", batch: int | None = None,
                usual_batch: int = 32, latency_frames: int = 300, latency_video: str | None = None,
                latency_batch: int = 8, decode_latency: str = "native", memory_loops: int = 0,
                devices: list[str] | None = None, repeat: int = 3, ort_tuning: str = "auto",
                first_result: bool = True, baseline: str | None = None, baseline_tuning: str = "auto",
                reporter: Reporter | None = None) -> VideoBenchReport:
    """See the module docstring. ``batch``: trtc's batch (default 64, or the model's largest when smaller). The
    latency run uses ``latency_video`` (default: ``video``) at batch ``latency_batch`` with NVDEC's
    ``decode_latency`` mode ("low" only for streams without B-frames). ``ort_tuning``: "auto", "off" or "both".
    ``baseline``: another model timed in the same runs (``baseline_tuning`` "auto" or "off").

    The steps: check the request, open the engine(s) and fit the batches, time to first result, warm every
    pipeline up, the rows of each stream count, the latency run, the memory run, the report."""
    import engines

    from .bench import _tunings

    reporter = reporter or Reporter()
    devices = _check_request(device, repeat, devices)
    tunings = _tunings(ort_tuning)
    baseline_options = _baseline_options(model, baseline, baseline_tuning, tunings[0]) if baseline else None
    engine = engines.open_engine(model, device=device, **engine_options(model, tunings[0]), **program_options(model))
    manifest = engines.read_manifest(engines.split_engine(model)[1])  # torch-fp16:m.pt2 -> m.pt2's manifest
    batch, usual_batch, latency_batch = _batches(engine, manifest, batch, usual_batch, latency_batch)
    bench = _Bench(video, engine, manifest.preprocess, getattr(engine, "device_id", 0), batch, usual_batch, repeat,
                   reporter, on_gpu=device.startswith("cuda"))
    if tunings == ["off"] and engine_options(model, "off"):
        bench.suffix = ", onnxruntime untuned"
    rows: list[VideoBenchRow] = []
    warnings: list[str] = []
    first: dict = {}
    try:
        if len(tunings) > 1 and engine_options(model, "off"):
            bench.untuned = engines.open_engine(model, device=device, **engine_options(model, "off"))
        if baseline:
            bench.baseline = _open_baseline(baseline, baseline_tuning, baseline_options, device, batch)
        if first_result:
            from .first_result import first_result as time_first_result

            with reporter.phase("time to first result: 2 fresh processes (engine open + first batch)"):
                first = time_first_result(model, video, device, batch)
        clip_frames = _warm_up(bench, model, device, devices, max(streams), warnings)
        for n in streams:
            rows += _stream_rows(bench, n, devices)
        latency = {}
        if latency_frames and bench.on_gpu:
            latency = _latency(bench, latency_video or video, latency_batch, latency_frames, decode_latency)
        elif latency_frames:
            warnings.append("no latency run on the CPU (it splits off NVDEC's part): run it on a GPU")
        memory = _memory(bench, memory_loops, clip_frames) if memory_loops else {}
    finally:
        bench.close()
    report = _report(video, model, device, batch, rows, latency, memory, bench.gpu, warnings)
    report.first_result = first
    report.baseline = {"model": str(baseline), "tuning": baseline_tuning} if baseline else {}
    return report


def _baseline_options(model: str, baseline: str, tuning: str, model_tuning: str) -> dict:
    """``engines.open_engine``'s options for the baseline, or a UsageProblem before anything opens: a tuning
    that is not auto or off, "off" for a model ONNX Runtime does not run, or the model itself opened as the model
    is (at ``model_tuning``)."""
    from engines import split_engine

    if tuning not in ("auto", "off"):
        raise UsageProblem(f"--baseline-tuning {tuning!r} is not auto or off", "e.g. --baseline-tuning off")
    options = engine_options(baseline, tuning)
    if tuning == "off" and not options:
        raise UsageProblem(f"--baseline-tuning off is ONNX Runtime's options of before, and {baseline} does not "
                           "run on ONNX Runtime", "leave --baseline-tuning out, or give an .onnx --baseline")
    (a, a_path, _), (b, b_path, _) = split_engine(model), split_engine(baseline)
    if a == b and Path(a_path).resolve() == Path(b_path).resolve() and tuning == model_tuning:
        raise UsageProblem(f"--baseline {baseline} is the model itself, opened the same way",
                           "give another model, or --baseline-tuning off for ONNX Runtime's options of before")
    return {**options, **program_options(baseline)}


def _open_baseline(baseline: str, tuning: str, options: dict, device: str, batch: int) -> tuple:
    """(name suffix, engine, preprocessing spec) of the baseline, checked to take the bench's batch."""
    import engines
    from engines.video.pipeline import _check_batch

    path = engines.split_engine(baseline)[1]  # torch-fp16:m.pt2 -> m.pt2, whose manifest it reads
    eng = engines.open_engine(baseline, device=device, **options)
    try:
        manifest = engines.read_manifest(path)
        try:
            _check_batch(eng, manifest, batch)
        except UsageProblem as exc:  # "the model takes ...": say which model
            raise UsageProblem(f"the baseline {Path(path).name}: {exc.reason}",
                               f"{exc.fix}, or a --baseline that takes it" if exc.fix else None) from None
    except BaseException:
        eng.close()
        raise
    untuned = ", onnxruntime untuned" if tuning == "off" else ""
    return f", baseline {Path(path).name}{untuned}", eng, manifest.preprocess


def program_options(model: str) -> dict:
    """``engines.open_engine``'s options for a program (the compiled PyTorch engine) whose rows are timed: no quick
    start, so that no timed batch runs eagerly while its precompiled function loads; none for other models."""
    from engines import PROGRAM_SUFFIXES, TORCH_PREFIXES, split_engine

    prefix, path, _ = split_engine(model)
    return {"quick_start": False} if prefix in TORCH_PREFIXES or Path(path).suffix.lower() in PROGRAM_SUFFIXES else {}


def engine_options(model: str, tuning: str) -> dict:
    """``engines.open_engine``'s options for ``model`` at ONNX Runtime ``tuning``: those of
    :func:`toolchain.bench.ort_options` for an ONNX Runtime model, none for others (opencv:, plans, programs)."""
    from engines import split_engine
    from engines.manifest import read_manifest_if_any

    from .bench import ort_options

    prefix, path, _ = split_engine(model)
    if prefix is not None or Path(path).suffix.lower() != ".onnx":
        return {}
    m = read_manifest_if_any(path, verify_hash=False) if Path(path).exists() else None
    return ort_options(tuning) if m is None or m.kind == "onnx" else {}


def _check_request(device: str, repeat: int, devices) -> list[str] | None:
    """The options checked before anything opens (a GPU device, a repeat count, a GPU here, several GPUs in
    ``devices``); returns ``devices`` as a list ("cuda:0,cuda:1" or "cuda:all", as --devices gives it, parsed)."""
    if device != "cpu" and not device.startswith("cuda"):
        raise UsageProblem(f"unknown device {device!r} for the video benchmark", "use --device cuda:0 or --device cpu")
    if repeat < 1:
        raise UsageProblem(f"--repeat must be at least 1, got {repeat}")
    if device == "cpu":
        if devices:
            raise UsageProblem("--devices compares several GPUs, and --device cpu runs on the CPU",
                               "leave --devices out, or give --device cuda:0")
        return None
    from engines._gpu import gpus

    if not gpus()["devices"]:
        raise UsageProblem("the video benchmark measures NVDEC and GPU pipelines, and this machine has no NVIDIA GPU",
                           "run it on a machine with one; here, trtc bench VIDEO --model M --device cpu times the "
                           "CPU pipeline (trtc run VIDEO --model M --device cpu prints its fps)")
    if isinstance(devices, str):  # "cuda:0,cuda:1" or "cuda:all", as --devices gives it
        from engines.video.workers import parse_devices

        devices = parse_devices(devices)
    if devices is not None:
        if any(not d.startswith("cuda") for d in devices):
            raise UsageProblem(f"--devices lists GPUs to compare, and {', '.join(devices)} is not all GPUs",
                               "use e.g. --devices cuda:0,cuda:1 or --devices cuda:all")
        if len(devices) < 2:
            raise UsageProblem(f"--devices compares several GPUs with one, and {', '.join(devices) or 'nothing'} is "
                               "one", "list two or more (cuda:0,cuda:1), or leave --devices out on a one-GPU machine")
    return devices


def _warm_up(bench: _Bench, model: str, device: str, devices: list[str] | None, most: int,
             warnings: list[str]) -> int:
    """Each pipeline once, leaving ``most`` decoders to reuse, the several-GPU processes started and warmed (kept in
    ``bench``) and the usual pipeline's own session opened (or skipped, with a warning); returns the clip's
    frames."""
    import engines

    video, gpu, batch = bench.video, bench.gpu, bench.batch
    if not bench.on_gpu:
        with bench.reporter.phase("warm-up (each pipeline once)"):
            clip_frames, _ = _decode_only_cpu(video, 1)
            for _suffix, eng, _spec in bench.engines():
                _ours(video, 1, eng, batch)
        bench.usual_ok = False
        warnings.append("no usual pipeline on the CPU (it preprocesses with torch on a GPU)")
        return clip_frames
    with bench.reporter.phase(f"warm-up (each pipeline once; {most} decoders to reuse)"):
        clip_frames, _ = _decode_only(video, 1, gpu)
        _decode_only_batched(video, most, gpu)  # leaves `most` decoders for both SimpleDecoder pipelines
        if devices and len(devices) > 1:  # a process per GPU for each pipeline, started and warmed before a clock
            from engines.video import WorkerPool

            bench.pool = WorkerPool(model, devices=devices)
            list(bench.pool.classify([video] * (most * len(devices)), batch=batch))  # each worker keeps its decoders
            bench.dec_pool = DecodeOnlyOnGpus(video, devices, most)
        for _suffix, eng, _spec in bench.engines():
            _ours(video, 1, eng, batch)  # to the end: a source stopped early does not keep its decoder
        bench.usual_ok = True
        try:
            # the usual pipeline gets a session of its own, as a hand-written one has: sharing trtc's, it
            # left the session on another input shape, and back on the full batch ONNX Runtime's CUDA EP
            # searched cuDNN algorithms again, which cost the next trtc run ~1.2 s (Lite0, H100)
            bench.usual_engine = engines.open_engine(model, device=device)
            _usual(video, 1, bench.usual_engine, bench.spec, bench.usual_batch)
        except ImportError as exc:
            bench.usual_ok = False
            warnings.append(f"usual pipeline skipped: {exc}")
    return clip_frames


def _stream_rows(bench: _Bench, n: int, devices: list[str] | None) -> list[VideoBenchRow]:
    """The rows of ``n`` streams: the decode-only ceilings, then per engine trtc and engine-only (``repeat`` runs
    interleaved, median rows), the usual pipeline, trtc's ratios and limit, then the several-GPU rows when there is
    a pool."""
    video, reporter = bench.video, bench.reporter
    runs = []
    for r in range(bench.repeat):
        again = f" (run {r + 1} of {bench.repeat})" if bench.repeat > 1 else ""
        runs.append(_decode_rows(bench, n, again))
        for suffix, engine, spec in bench.engines():
            runs[-1] += _engine_rows(bench, n, engine, spec, suffix, again)
    k = len(runs[0]) - 2 * len(bench.engines())  # the decode-only rows come first
    rows = _median_rows(runs, ceilings=(*range(k), *range(k + 1, len(runs[0]), 2)))
    decs, pairs = rows[:k], [rows[i:i + 2] for i in range(k, len(rows), 2)]
    usual = None
    if bench.usual_ok:
        with reporter.phase(f"{n} stream(s): usual (OpenCV CPU decode + torch)"):
            usual = _timed_row(f"usual (cv2 + torch, bs {bench.usual_batch})", n,
                               lambda: _usual(video, n, bench.usual_engine, bench.spec, bench.usual_batch))
    decode_fps = max(d.fps for d in decs)
    for ours, only in pairs:
        ours.vs_decode = round(ours.fps / decode_fps, 3)
        limit(ours, decode_fps, only.fps)
        if usual is not None:
            ours.vs_usual = round(ours.fps / usual.fps, 2)
    if bench.baseline is not None:
        base = pairs[-1][0]
        for ours, _only in pairs[:-1]:
            ours.vs_baseline = round(ours.fps / base.fps, 3) if base.fps > 0 else None
    out = decs + ([usual] if usual else []) + [row for pair in pairs for row in pair]
    if bench.pool is not None:
        dec_b, ours = decs[-1], pairs[0][0]
        out += _several_gpus(bench.pool, bench.dec_pool, video, n, len(devices), bench.batch, bench.repeat,
                             reporter, dec_b, ours)
    return out


def limit(ours: VideoBenchRow, decode_fps: float, engine_fps: float) -> None:
    """Which of decoding and the engine limits the pipeline (the lower fps of decode-only and engine-only), and
    trtc's fps over that lower one."""
    lower = min(decode_fps, engine_fps)
    ours.limited_by = "decode" if decode_fps <= engine_fps else "engine"
    ours.vs_limit = round(ours.fps / lower, 3) if lower > 0 else None


def _decode_rows(bench: _Bench, n: int, again: str) -> list[VideoBenchRow]:
    """One run of the decode-only ceilings of ``n`` streams: NVDEC's two loops on a GPU, PyAV's on the CPU."""
    video, gpu, reporter = bench.video, bench.gpu, bench.reporter
    if not bench.on_gpu:
        with reporter.phase(f"{n} stream(s): decode-only (PyAV){again}"):
            return [_timed_row("decode-only (PyAV, CPU, frames counted)", n, lambda: _decode_only_cpu(video, n))]
    with reporter.phase(f"{n} stream(s): decode-only (core decoder loop){again}"):
        dec = _timed_row("decode-only (NVDEC, core decoder loop, new decoders)", n,
                         lambda: _decode_only(video, n, gpu))
    with reporter.phase(f"{n} stream(s): decode-only (SimpleDecoder batches){again}"):
        dec_b = _timed_row("decode-only (NVDEC, SimpleDecoder batches of 16, reused)", n,
                           lambda: _decode_only_batched(video, n, gpu))
    return [dec, dec_b]


def _engine_rows(bench: _Bench, n: int, engine, spec, suffix: str, again: str) -> list[VideoBenchRow]:
    """One run of trtc on ``n`` streams with ``engine``, then engine-only on the batches that run ran (input of
    ``spec``'s size)."""
    video, batch, reporter = bench.video, bench.batch, bench.reporter
    got: dict = {}

    def ours():
        out = _ours(video, n, engine, batch)
        got["sizes"] = list(out[3]) if len(out) > 3 else []
        return out

    path = "NVDEC + kernel + engine" if bench.on_gpu else "PyAV + numpy + engine"
    with reporter.phase(f"{n} stream(s): trtc{suffix}{again}"):
        row = _timed_row(f"trtc ({path}, bs {batch}{suffix})", n, ours)
    sizes = got["sizes"]
    row.batches = len(sizes)
    where = "device-resident" if bench.on_gpu and not getattr(engine, "host_arrays_only", False) else "host numpy"
    with reporter.phase(f"{n} stream(s): engine-only{suffix}, {len(sizes)} batches{again}"):
        only = _timed_row(f"engine-only (bs {batch}, {where} input, no decode{suffix})", n,
                          lambda: _engine_only(engine, spec, sizes, batch, where == "device-resident"))
    only.batches = len(sizes)
    return [row, only]


def _engine_only(engine, spec, sizes: list[int], batch: int, on_device: bool) -> tuple[int, float]:
    """The engine alone on the pipeline's batches: (their frames, seconds). On the device every batch runs on the
    full input buffer, as the GPU pipeline's do: ``len(sizes)`` calls on one batch of ``batch`` made on the GPU in
    the layout the pipeline writes for the engine, the host waiting once at the end; on the host, a numpy batch of
    each recorded size."""
    dtype = engine.inputs[0].numpy_dtype
    shape = (spec.channels, *spec.size)
    rng = np.random.default_rng(0)
    if not on_device:
        xs = {b: rng.standard_normal((b, *shape), dtype=np.float32).astype(dtype) for b in set(sizes)}
        for x in xs.values():  # a shape's first run is not timed, as none of the pipeline's is
            engine.infer(x)
        t0 = time.perf_counter()
        for b in sizes:
            engine.infer(xs[b])
        return sum(sizes), time.perf_counter() - t0
    cp = require("cupy", "The GPU video pipeline")
    from .bench import in_preferred_layout

    with cp.cuda.Device(engine.device_id):
        # laid out as the pipeline's slots are for this engine (NHWC for the compiled PyTorch engine)
        x = cp.asarray(rng.standard_normal((batch, *shape), dtype=np.float32).astype(dtype))
        x, _ = in_preferred_layout(cp, x, engine)
        stream = cp.cuda.Stream(non_blocking=True)
        engine.infer(x, stream=stream)
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in sizes:
            engine.infer(x, stream=stream)
        stream.synchronize()
        return sum(sizes), time.perf_counter() - t0


def _decode_only_cpu(video: str, streams: int) -> tuple[int, float]:
    """PyAV decoding on the CPU, a thread per stream, frames counted and dropped (threads as the pipeline's)."""
    av = require("av", "Decoding video on the CPU")

    def work(_i):
        with av.open(video) as c:
            s = c.streams.video[0]
            s.thread_type = "AUTO"
            return sum(1 for _ in c.decode(s))

    return _each_stream_timed(streams, work)


def _latency(bench: _Bench, lat_video: str, latency_batch: int, latency_frames: int, decode_latency: str) -> dict:
    """One stream fed at the file's frame rate after a warm-up: packet in -> top-k on the host, p50/p99/max, and the
    same split at the decoder's output."""
    engine, reporter = bench.engine, bench.reporter
    with reporter.phase("latency: warm-up (30 frames)"):  # the batch shape's first run is not a camera's
        _ours(lat_video, 1, engine, latency_batch, limit=30, max_wait_ms=0.0, latency=decode_latency)
    with reporter.phase(f"latency: 1 stream at the file's frame rate, {latency_frames} frames"):
        _, _, lat, _ = _ours(lat_video, 1, engine, latency_batch, limit=latency_frames, realtime=True,
                             max_wait_ms=0.0, latency=decode_latency)
    a = np.asarray(lat)
    total, dec = a[:, 0], a[:, 1]
    after = total - dec

    def pct(x, q):
        return round(float(np.percentile(x, q)), 2)

    return {"frames": int(len(a)), "p50_ms": pct(total, 50), "p99_ms": pct(total, 99),
            "max_ms": round(float(total.max()), 2), "decoder_p50_ms": pct(dec, 50),
            "decoder_p99_ms": pct(dec, 99), "after_decoder_p50_ms": pct(after, 50),
            "after_decoder_p99_ms": pct(after, 99), "video": lat_video, "batch": latency_batch,
            "input": f"paced at the file's frame rate, NVDEC {decode_latency} latency, batches run at once"}


def _memory(bench: _Bench, memory_loops: int, clip_frames: int) -> dict:
    """GPU memory used after each pass of one stream over the clip, ``memory_loops`` times ({} when unreadable)."""
    memory = {}
    with bench.reporter.phase(f"memory: 1 stream, the clip {memory_loops} times"):
        from engines.video import classify

        samples = []
        run = classify([bench.video], bench.engine, batch=bench.batch, loop=memory_loops)
        for i, _pred in enumerate(run, 1):
            if i % clip_frames == 0:  # after each pass over the clip
                samples.append(memory_used_mib(bench.gpu))
        samples = [x for x in samples if x is not None]
        if samples:
            memory = {"loops": memory_loops, "used_mb_after_first": samples[0], "used_mb_at_end": samples[-1],
                      "growth_mb": round(samples[-1] - samples[0], 1), "samples": samples}
    return memory


def _report(video: str, model: str, device: str, batch: int, rows: list[VideoBenchRow], latency: dict, memory: dict,
            gpu: int, warnings: list[str]) -> VideoBenchReport:
    """The report, with the GPU, the driver and the versions of the packages measured."""
    g = gpu_device(gpu) or {}
    import datetime

    versions = {k: dist_version(k) for k in ("onnxruntime-gpu", "pynvvideocodec", "cupy-cuda13x", "torch",
                                              "opencv-python", "opencv-python-headless", "numpy")}
    return VideoBenchReport(video=video, model=str(model), device=device, batch=batch, rows=rows, latency=latency,
                            memory=memory, machine={"gpu": g.get("name"), "driver": g.get("driver"),
                                                    "python": platform.python_version()},
                            versions={k: v for k, v in versions.items() if v},
                            date=datetime.date.today().isoformat(), warnings=warnings)
