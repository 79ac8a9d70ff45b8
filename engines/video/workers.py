"""Worker processes for the video runtime: each holds its own engine on one device and runs the ordinary pipeline
(:func:`engines.video.classify`) on the sources it is given; the parent shares sources out and merges the results.

Why processes: in one process every decoder thread, the inference thread and the caller share one Python
interpreter lock, and at 16-32 streams the threads spend most of their time waiting for it (docs/BENCHMARKS.md).
Each worker has its own interpreter. The same mechanism spreads sources over several GPUs of one host (one or
more workers per device). Only compressed video is read by the workers and only (k indices, k scores) per frame
comes back through a pipe: no pixels cross between processes.

    with WorkerPool("resnet50.fp16.onnx", devices=["cuda:0", "cuda:1"]) as pool:
        run = pool.classify(["cam1.mp4", ...], batch=64)
        for pred in run: ...            # pred.device says which worker's device classified it

Results arrive in order per source (a source lives in one worker); between sources they interleave. A worker
that fails (its process dies, its engine cannot open) is reported as a problem of each of its sources; the other
workers go on. Workers start with the "spawn" method (CUDA cannot be used in a forked child) and are reused by
every ``classify`` call until :meth:`WorkerPool.close`.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time
from multiprocessing.connection import wait as wait_for

from ..errors import EngineError, UsageProblem
from .live import SourceEvent
from .pipeline import RunStats, SourceProblem
from .results import LINE_MODES, BlockRun, ResultBlock

log = logging.getLogger("trtc")

_SEND_EVERY_S = 0.02  # a worker sends what it has at least this often (latency), or every 256 results


def _visible_device(device: str, inherited: str | None = None) -> tuple[str | None, str]:
    """("cuda:1") -> ("1", "cuda:0"): the CUDA_VISIBLE_DEVICES a worker for ``device`` sets before any CUDA library
    loads, and the device it then opens. Without it the worker for cuda:1 also made a context on GPU 0 (518 MiB
    there, seen with nvidia-smi on the 2-GPU H200 host), time-sharing GPU 0 with that GPU's own worker. CPU workers
    change nothing. When the parent already runs under CUDA_VISIBLE_DEVICES (``inherited``, e.g. "2,3"), cuda:N is
    the N-th GPU of that list, as it is for the parent."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or not index.isdigit():
        return None, device
    listed = [x.strip() for x in (inherited or "").split(",") if x.strip()]
    if listed and int(index) < len(listed):
        return listed[int(index)], "cuda:0"
    return index, "cuda:0"


def _parse_cpulist(text: str) -> set[int]:
    """"0-3,8,10-11" (Linux's cpulist format) -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part.strip():
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _gpu_local_cpus(physical: str) -> set[int] | None:
    """The CPUs on the same NUMA node as GPU ``physical`` (an nvidia-smi index), from the PCI device's
    local_cpulist in sysfs; None where that cannot be read."""
    from .._gpu import _run

    bus = _run(["nvidia-smi", f"--id={physical}", "--query-gpu=pci.bus_id", "--format=csv,noheader"])
    if not bus or ":" not in bus:
        return None
    address = bus.strip().lower()[-12:]  # "00000000:18:00.0" -> "0000:18:00.0", sysfs's form
    try:
        with open(f"/sys/bus/pci/devices/{address}/local_cpulist") as f:
            return _parse_cpulist(f.read())
    except (OSError, ValueError):
        return None


def _pin_to_gpu(physical: str) -> str:
    """Keep this process (and the threads it starts later) on its GPU's NUMA-local CPUs; says what it did."""
    import os

    local = _gpu_local_cpus(physical)
    if not local:
        return "not pinned: the GPU's local CPUs are unknown"
    allowed = os.sched_getaffinity(0)
    cpus = local & allowed
    if not cpus or cpus == allowed:
        return f"not pinned: its local CPUs leave {len(cpus)} of the {len(allowed)} allowed"
    os.sched_setaffinity(0, cpus)
    return f"pinned to {len(cpus)} CPUs near GPU {physical}"


def _worker_main(conn, model: str, device: str, engine_options: dict, pin: bool = False) -> None:
    """A worker process: open the engine, then run jobs until told to stop."""
    import os

    visible, local = _visible_device(device, os.environ.get("CUDA_VISIBLE_DEVICES"))
    pinned = "not pinned"
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible  # before CuPy, ONNX Runtime or PyNvVideoCodec load
        if pin:
            pinned = _pin_to_gpu(visible)
    try:
        import engines
        from engines.video.pipeline import _manifest_of

        engine = engines.open_engine(model, device=local, **engine_options)
        manifest = _manifest_of(engine)
        labels = manifest.labels if manifest is not None else None
        conn.send(("ready", device, labels, pinned))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which names the device
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if msg[0] == "stop":
            return
        _, sources, options = msg
        _run_job(conn, engine, device, sources, options)


def _run_job(conn, engine, device: str, sources: list, options: dict) -> None:
    """One job in a worker: its predictions go to the parent as :class:`ResultBlock` messages (every 256 results
    or 20 ms, with their JSON lines when ``options["lines"]`` asks for them), then ("end", problems, stats,
    failure, the wall-clock time its pipeline started: after the engine's warm-up, as a single process counts)."""
    from engines.video.pipeline import classify

    options = dict(options)
    line_mode = options.pop("lines", None)
    out, last = [], time.perf_counter()
    run = None

    def flush():
        conn.send(("block", ResultBlock.pack(out, device, line_mode)))
        out.clear()

    try:
        run = classify(sources, engine, events=True, **options)
        for p in run:
            if isinstance(p, SourceEvent):  # a live source's event: after the predictions before it
                if out:
                    flush()
                conn.send(("event", p.to_dict()))
                continue
            out.append(p)
            now = time.perf_counter()
            if len(out) >= 256 or now - last > _SEND_EVERY_S:
                flush()
                last = now
        failure = None
    except BaseException as exc:  # noqa: BLE001 - the job failed; the parent reports it per source
        failure = f"{type(exc).__name__}: {exc}"
    if out:
        flush()
    problems = [(q.source, q.reason, q.frames) for q in run.problems] if run is not None else []
    started = time.time() - run.stats.seconds if run is not None and run.stats.frames else None
    conn.send(("end", problems, run.stats.for_pool() if run is not None else {}, failure, started))


def parse_devices(text: str) -> list[str]:
    """"cuda:0,cuda:1" -> ["cuda:0", "cuda:1"]; "cuda:all" -> every GPU this process sees (nvidia-smi's list,
    CUDA_VISIBLE_DEVICES applied); "cpu,cpu" is allowed (two CPU workers). A GPU index that does not exist is
    refused naming the GPUs there are."""
    from .._gpu import cuda_gpus, gpus, no_such_gpu

    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise UsageProblem("no device given", "use e.g. --device cuda:0,cuda:1 or --device cuda:all")
    found = None
    out: list[str] = []
    for p in parts:
        if p == "cpu":
            out.append(p)
            continue
        if not p.startswith("cuda:"):
            raise UsageProblem(f"unknown device {p!r}", "use cpu, cuda:N, a comma-separated list, or cuda:all")
        if found is None:
            found = cuda_gpus(gpus()["devices"])
        if p == "cuda:all":
            if not found:
                raise no_such_gpu(p, found)
            out += [f"cuda:{i}" for i in range(len(found))]
            continue
        index = p[5:]
        if not index.isdigit():
            raise UsageProblem(f"unknown device {p!r}", "use cpu, cuda:N, a comma-separated list, or cuda:all")
        if int(index) >= len(found):
            raise no_such_gpu(p, found, ", or cuda:all")
        out.append(p)
    return out


def source_weights(sources, live: bool = False, threads: int = 8) -> list[float | None]:
    """How much decoding each source holds, to share sources out: width x height x frames (from its container, no
    frame decoded), so that a long 1080p file weighs more than a short one; each distinct file read once, several
    at a time. Live sources (``live``), URLs, or any file whose frame count the container does not say: width x
    height x frame rate for all (how heavy a stream is per second). None: unknown (read as the median)."""
    from concurrent.futures import ThreadPoolExecutor

    distinct = list(dict.fromkeys(sources))
    with ThreadPoolExecutor(max(1, min(threads, len(distinct)))) as pool:
        found = dict(zip(distinct, pool.map(_probe_load, distinct), strict=True))
    known = [f for f in found.values() if f is not None]
    by_frames = not live and known and all(frames for _rate, frames in known)
    return [None if found[s] is None else (found[s][1] * found[s][0][1] if by_frames else found[s][0][0])
            for s in sources]


def _probe_load(name: str):
    """((pixels per second, pixels per frame), frames or None) of a file's first video stream; None for a URL or a
    file PyAV cannot open (the worker that opens it reports why)."""
    from .._deps import is_installed
    from .live import is_network

    if is_network(name) or "://" in name or not is_installed("av"):
        return None
    import av

    try:
        with av.open(name) as container:
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or stream.base_rate or 30)
            pixels = float(stream.codec_context.width * stream.codec_context.height)
            frames = int(stream.frames or 0)
            if not frames and stream.duration and stream.time_base:
                frames = int(float(stream.duration * stream.time_base) * rate)
            return (pixels * rate, pixels), frames or None
    except Exception:  # noqa: BLE001 - unreadable here: the worker that opens it reports why
        return None


class PoolRun(BlockRun):
    """A :class:`~engines.video.results.BlockRun` of a :class:`WorkerPool`: iterating gives Predictions (each with
    its ``device``); :meth:`blocks` the same a block at a time."""


class _Worker:
    def __init__(self, ctx, model: str, device: str, engine_options: dict, pin: bool = False):
        self.device = device
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, model, device, engine_options, pin), daemon=True,
                                   name=f"trtc-worker-{device}")
        self.process.start()
        child.close()
        self.labels = None
        self.pinned = "not pinned"
        self.alive = True


class WorkerPool:
    """``per_device`` worker processes on each of ``devices``, each with its own engine of ``model``. With
    ``pin_cpus`` each GPU worker keeps to the CPUs of its GPU's NUMA node (read from sysfs)."""

    def __init__(self, model, devices=("cuda:0",), per_device: int = 1, engine_options: dict | None = None,
                 start_timeout: float = 300.0, pin_cpus: bool = False):
        devices = [devices] if isinstance(devices, str) else list(devices)
        if not devices or per_device < 1:
            raise UsageProblem("a worker pool needs at least one device and one worker per device")
        ctx = mp.get_context("spawn")
        self.model = str(model)
        self.workers = [_Worker(ctx, self.model, d, engine_options or {}, pin_cpus)
                        for d in devices for _ in range(per_device)]
        self._lock = threading.Lock()  # one classify() at a time: a worker runs one job at a time
        deadline = time.monotonic() + start_timeout
        errors = []
        for w in self.workers:
            if not w.conn.poll(max(0.0, deadline - time.monotonic())):
                errors.append(f"{w.device}: the worker did not start within {start_timeout:.0f} s")
                continue
            try:
                msg = w.conn.recv()
            except EOFError:
                msg = ("error", f"the worker process exited (code {w.process.exitcode})")
            if msg[0] == "ready":
                w.labels, w.pinned = msg[2], msg[3]
                log.debug("worker on %s: %s", w.device, w.pinned)
            else:
                errors.append(f"{w.device}: {msg[1]}")
        if errors:
            self.close()
            raise EngineError(f"{len(errors)} of {len(self.workers)} worker(s) could not open {self.model}: "
                              f"{errors[0]}", "check the device list and the model with `trtc doctor`")

    # -------------------------------------------------------------------------------------------------- jobs
    def share(self, sources: list[str], weights: list[float | None] | None = None) -> list[list[str]]:
        """Sources per worker, balanced by count (shares differ by at most one source), then by ``weights`` (e.g.
        :func:`~engines.video.sources.pixel_rate`; an unknown weight counts as the median): the heaviest source
        goes first to the least loaded worker that may take one more. Each share keeps the order given. Without
        weights: round robin."""
        k = len(self.workers)
        if weights is None:
            weights = [None] * len(sources)
        known = sorted(w for w in weights if w)
        typical = known[len(known) // 2] if known else 1.0
        load = [0.0] * k
        shares: list[list[int]] = [[] for _ in range(k)]
        cap = [len(sources) // k + (1 if j < len(sources) % k else 0) for j in range(k)]
        for i in sorted(range(len(sources)), key=lambda i: -(weights[i] or typical)):  # stable: ties keep order
            j = min((j for j in range(k) if len(shares[j]) < cap[j]), key=lambda j: (load[j], len(shares[j]), j))
            shares[j].append(i)
            load[j] += weights[i] or typical
        return [[sources[i] for i in sorted(share)] for share in shares]

    def classify(self, sources, events: bool = False, lines: str | None = None, weights: list | None = None,
                 **options) -> PoolRun:
        """Like :func:`engines.video.classify` (same options, minus the engine), spread over the workers; with
        ``events`` the live sources' SourceEvents come through too, in order with each worker's predictions.
        ``lines`` ("plain" or "latency"): the workers also format each prediction's JSON line, as ``trtc run``
        writes it (see :meth:`PoolRun.blocks`). ``weights``: :func:`source_weights` of ``sources`` when the caller
        read them already (e.g. while the workers started); read here otherwise."""
        if isinstance(sources, (str, bytes)) or not hasattr(sources, "__iter__"):
            sources = [sources]
        sources = [s if isinstance(s, str) else str(s) for s in sources]  # an Address keeps its url (pickled)
        if not sources:
            raise UsageProblem("no video sources given")
        if lines not in LINE_MODES:
            raise UsageProblem(f"unknown line mode {lines!r}", "use None, 'plain' or 'latency'")
        on = ", ".join(sorted({w.device for w in self.workers}))
        stats = RunStats(path=f"{len(self.workers)} worker process(es) on {on}")
        problems: list[SourceProblem] = []
        run = PoolRun(None, stats, problems, [])
        options = dict(options, lines=lines)
        run._blocks_factory = lambda: self._run(sources, options, run, weights, events)
        return run

    def _jobs(self, sources, weights, live: bool, problems: list) -> dict:
        """{connection: (worker, its share)} for each live worker with sources; a dead worker's are problems."""
        if len(self.workers) > 1 and weights is None:
            weights = source_weights(sources, live=live)
        busy: dict = {}
        for w, share in zip(self.workers, self.share(sources, weights if len(self.workers) > 1 else None),
                            strict=True):
            if not share:
                continue
            if not w.alive:
                problems.extend(SourceProblem(s, f"{s}: its worker on {w.device} is gone", 0) for s in share)
                continue
            busy[w.conn] = (w, share)
        return busy

    def _run(self, sources, options, run: PoolRun, weights, yield_events: bool = False):
        if not self._lock.acquire(blocking=False):
            raise UsageProblem("this worker pool is already running a classify() call", "iterate it to the end first")
        problems, start = run.problems, time.perf_counter()
        busy: dict = {}
        counts: dict = {}  # source -> predictions received
        starts: list = []  # wall-clock times the workers' pipelines started (after their warm-up)
        try:
            busy = self._jobs(sources, weights, bool(options.get("live")), problems)
            for w, share in busy.values():
                w.conn.send(("run", share, options))
            while busy:
                for conn in wait_for(list(busy)):
                    w, share = busy[conn]
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        w.alive = False
                        del busy[conn]
                        problems.extend(SourceProblem(s, f"{s}: the worker on {w.device} died (exit code "
                                                         f"{w.process.exitcode})", counts.get(s, 0)) for s in share)
                        continue
                    if msg[0] == "block":
                        yield self._received(msg[1], w, counts, run, start)
                    elif msg[0] == "event":
                        ev = SourceEvent.from_dict(msg[1])
                        run.events.append(ev)
                        if yield_events:
                            yield ev
                    elif msg[0] == "end":
                        del busy[conn]
                        self._ended(msg, w, share, counts, run, starts)
        finally:
            self._finish(run, start, starts, counts, sources, busy)
            self._lock.release()

    @staticmethod
    def _received(block: ResultBlock, w: _Worker, counts: dict, run: PoolRun, start: float) -> ResultBlock:
        block.device, block.labels = w.device, w.labels
        for s, (n, _last) in block.per_source().items():
            counts[s] = counts.get(s, 0) + n
        run.stats.frames += len(block)
        now = time.time()
        run.timing.setdefault("first_result_at", now)
        run.timing["last_result_at"] = now
        run.stats.seconds = time.perf_counter() - start
        return block

    @staticmethod
    def _ended(msg, w: _Worker, share, counts: dict, run: PoolRun, starts: list) -> None:
        _, probs, wstats, failure, started = msg
        run.problems.extend(SourceProblem(*p) for p in probs)
        if failure:
            run.problems.extend(SourceProblem(s, f"{s}: the worker on {w.device} failed: {failure}", counts.get(s, 0))
                                for s in share)
        run.stats.merge_from(wstats)
        if started is not None:
            starts.append(started)

    @staticmethod
    def _finish(run: PoolRun, start: float, starts: list, counts: dict, sources, busy: dict) -> None:
        """The run's statistics; workers still mid-job (the caller left early) are stopped: they cannot be reused.
        The frames/s span is that of a single process: from the first worker's pipeline start (after its engine's
        warm-up) to the last result; start-up and the sources' probing are outside it (``run.timing``)."""
        run.stats.seconds = time.perf_counter() - start
        if starts and not busy and "last_result_at" in run.timing:
            run.timing["pipeline_started_at"] = min(starts)
            run.stats.seconds = max(run.timing["last_result_at"] - min(starts), 1e-9)
        run.stats.per_source = {s: counts.get(s, 0) for s in sources}
        for w, _share in busy.values():
            w.alive = False
            w.process.terminate()

    # ------------------------------------------------------------------------------------------------- life
    def close(self) -> None:
        for w in getattr(self, "workers", []):
            if w.process.is_alive():
                try:
                    w.conn.send(("stop",))
                except (OSError, BrokenPipeError):
                    pass
        for w in getattr(self, "workers", []):
            w.process.join(timeout=10)
            if w.process.is_alive():
                w.process.terminate()
            w.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
