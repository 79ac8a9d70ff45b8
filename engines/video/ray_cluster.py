"""The video runtime on a Ray cluster: one Ray actor per GPU (or per CPU slot) holds an engine and runs the ordinary
pipeline (:func:`engines.video.classify`) on the sources it is given; the driver shares sources out as Ray tasks
and merges the results. Same interface as :class:`engines.video.workers.WorkerPool`, so ``trtc run`` uses either:

    with RayPool("resnet50.fp16.onnx", address="auto", device="cuda") as pool:   # one actor per GPU of the cluster
        run = pool.classify(["/data/cam1.mp4", "rtsp://cam2/live", ...], batch=64)
        for pred in run: ...
        run.placement      # {source: the actor that classified it}

Design (docs/CLUSTER.md has the numbers):

- A *job* is up to ``streams`` sources given to one actor as one streaming-generator task
  (``num_returns="streaming"``); the actor runs them through one pipeline and yields results in chunks (every
  256 results or 50 ms). A source lives in one job, so its results arrive in order; the driver waits on every busy
  actor's generator at once (``ray.wait``) and hands the next job to whichever actor is free (a folder of
  thousands of videos keeps every actor busy to the end).
- Only compressed video is read by the actors, each from its own path or URL: files must be readable at the same
  path on every node; no pixels cross the network, only (k indices, k scores) per classified frame.
- A source the pipeline cannot read (missing, corrupt, cut off) is reported by name in ``run.problems``; it would
  fail the same way anywhere, so it is not retried. An actor that dies (node lost, process killed, out of memory)
  or a job that fails as a whole is reported by name in ``run.failures`` and each of its sources is run ONCE more
  on another actor, continuing after the last frame the driver already has (the frames before are decoded again
  but not classified): nothing is duplicated and nothing is missing. A second failure of a source is a problem.
- Lines are the single-process run's lines (no ``device`` field); where each source ran is in ``run.placement``.
- ``keep="NAME"`` (``trtc run --ray auto --ray-keep NAME``): the actors are named, detached actors of a running
  cluster (namespace ``trtc``, names ``NAME.0``, ``NAME.1``, ...) that outlive the job; the next job with the same
  name and the same model file, device, batch and engine options uses them as they are (no engine open), and
  one that asks for anything else is refused naming both. :func:`stop_service` ends them.
- Start-up is timed by phase from the process's start (:attr:`RayPool.marks`, logged at info level): connect,
  placement (every actor's process running), engine open (every cold actor's engine open; none on warm actors),
  first batch (in an actor) and first result (in the driver).

``ray`` is imported only here, when a pool is made (extra ``trtc[ray]``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import deque

from ..errors import EngineError, UsageProblem, first_line
from .pipeline import RunStats, SourceProblem
from .live import is_network
from .results import LINE_MODES, BlockRun

log = logging.getLogger("trtc")

_SEND_EVERY_S = 0.05  # an actor yields what it has at least this often, or every 256 results
_SEND_EVERY_N = 256
LOCAL = ("", "local", None)
NAMESPACE = "trtc"  # the Ray namespace of kept engine services' named actors


def process_started_at() -> float | None:
    """When this process started, as Unix time (Linux: its start in /proc/self/stat against CLOCK_BOOTTIME, to the
    kernel's 10 ms tick), so that start-up phases count what the user waits for, imports included; None where that
    cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age


_STARTED_AT = process_started_at()


def _ray():
    from .._deps import require

    return require("ray", "Running the video pipeline on a Ray cluster", extra="ray", package="ray")


class _EngineActor:
    """Lives in a Ray worker process: one engine, one job at a time (Ray runs an actor's tasks one after the other)."""

    def __init__(self, model: str, device: str, engine_options: dict, key: dict | None = None, size: int = 1):
        import socket

        import ray

        self.placed_at = time.time()  # the actor's process runs this job's code: placed
        self.key, self.size, self.asked = key, size, 0  # a kept service's identity and size; where() calls so far
        self.host = socket.gethostname()
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        # Ray sets CUDA_VISIBLE_DEVICES to the GPU(s) it gave this actor, so inside it the GPU is cuda:0
        self.device = "cuda:0" if device != "cpu" else "cpu"
        self.engine = self.labels = self.error = None
        t0 = time.perf_counter()
        try:
            import engines
            from engines.video.pipeline import _manifest_of

            self.engine = engines.open_engine(model, device=self.device, **engine_options)
            manifest = _manifest_of(self.engine)
            self.labels = manifest.labels if manifest is not None else None
        except BaseException as exc:  # noqa: BLE001 - reported to the driver, which names the actor
            self.error = f"{type(exc).__name__}: {exc}"
        self.open_s = time.perf_counter() - t0  # imports and engine open, in the actor
        self.opened_at = time.time()

    def where(self) -> dict:
        """Where it runs and how its start went; ``warm``: a job asked before (a kept actor found by a later job)."""
        self.asked += 1
        return {"host": self.host, "gpus": self.gpu_ids, "labels": self.labels, "error": self.error,
                "open_s": round(self.open_s, 3), "placed_at": self.placed_at, "opened_at": self.opened_at,
                "key": self.key, "size": self.size, "warm": self.asked > 1}

    def run(self, sources: list, options: dict):
        """A streaming generator: ("block", ResultBlock) chunks of results (with their JSON lines when
        ``options["lines"]`` asks for them; sources named as the driver's caller named them, ``options["names"]``),
        live sources' ("event", dict), then ("end", problems, stats, failure)."""
        from engines.video.pipeline import classify

        from .results import ResultBlock

        options = dict(options)
        line_mode, names = options.pop("lines", None), options.pop("names", None) or {}
        out, last, run, failure, first = [], time.perf_counter(), None, None, True

        def block():
            for p in out:
                p.source = names.get(p.source, p.source)
            chunk = ("block", ResultBlock.pack(out, None, line_mode))
            out.clear()
            return chunk

        try:
            if self.engine is None:
                raise EngineError(self.error or "no engine")
            run = classify(sources, self.engine, events=True, **options)
            for p in run:
                if not hasattr(p, "frame"):  # a live source's SourceEvent: after the predictions before it
                    if out:
                        yield block()
                        last = time.perf_counter()
                    yield ("event", p.to_dict())
                    continue
                if first:  # the job's first batch is classified: when, by this node's clock
                    yield ("first", time.time())
                    first = False
                out.append(p)
                now = time.perf_counter()
                if len(out) >= _SEND_EVERY_N or now - last > _SEND_EVERY_S:
                    yield block()
                    last = now
        except BaseException as exc:  # noqa: BLE001 - the job failed as a whole; the driver retries its sources
            failure = f"{type(exc).__name__}: {exc}"
        if out:
            yield block()
        problems = [(q.source, q.reason, q.frames) for q in run.problems] if run is not None else []
        yield ("end", problems, run.stats.for_pool() if run is not None else {}, failure)


class _Actor:
    def __init__(self, index: int, handle, kind: str):
        self.index = index
        self.handle = handle
        self.kind = kind
        self.name = f"actor {index}"
        self.labels = None
        self.alive = True

    def placed(self, where: dict) -> None:
        dev = f"GPU {','.join(where['gpus'])}" if self.kind == "gpu" else "cpu"
        self.name = f"actor {self.index} ({where['host']} {dev})"
        self.labels = where["labels"]


class RayRun(BlockRun):
    """A :class:`VideoRun` that also says where each source ran (``placement``), which actors failed and what was
    redone (``failures``: one line each), and calls ``on_source_done(source, ok)`` as each source ends."""

    def __init__(self, blocks_factory, stats, problems):
        super().__init__(blocks_factory, stats, problems)
        self.placement: dict = {}
        self.failures: list[str] = []
        self.retried: list[str] = []


def _host_port(address: str) -> tuple[str, int] | None:
    """"host:port" (also "ray://host:port") -> (host, port); None for anything else ("auto", a bad form)."""
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Before ray.init: a TCP connection to host:port, so that a wrong address or a cluster that is not running is
    a one-line error at once (Ray itself keeps retrying the head node's GCS for minutes, printing its own logs)."""
    import socket

    hp = _host_port(address)
    if hp is None:
        raise UsageProblem(f"--ray {address}: not a Ray address",
                           "use --ray (a local instance), --ray auto (the cluster of this node) or --ray HOST:PORT")
    try:
        socket.create_connection(hp, timeout=timeout).close()
    except OSError as exc:
        why = "nothing listens there" if isinstance(exc, ConnectionRefusedError) else (
            "no answer" if isinstance(exc, TimeoutError | socket.timeout) else (exc.strerror or str(exc)))
        raise EngineError(f"no Ray cluster answers at {address} ({why})",
                          "check the address (`ray status` on the head node), or start the head there with "
                          f"`ray start --head --port={hp[1]}`; --ray alone starts a local instance") from None


def connect(address: str | None = None, **init_options) -> bool:
    """Join the Ray cluster at ``address`` ("auto", "host:port", "ray://host:port") or start a local instance
    (None/"local"); returns True when this call started or joined it (and so should shut it down). A Ray already
    initialised in this process is used as it is. "host:port" and "ray://host:port" must answer a TCP connection
    within 5 s first."""
    ray = _ray()
    if ray.is_initialized():
        return False
    if address not in LOCAL and address != "auto":
        _check_reachable(address)
    kw = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    kw.update(init_options)
    try:
        if address in LOCAL:
            ray.init(**kw)
        else:
            ray.init(address=address, **kw)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
        where = "a local Ray instance" if address in LOCAL else f"the Ray cluster at {address}"
        first = str(exc).splitlines()[0] if str(exc) else repr(exc)
        if "ray[client]" in str(exc):
            from .._deps import dist_version

            version = dist_version("ray")
            raise EngineError(f"could not join {where}: a ray:// address needs Ray Client, which is not installed",
                              f'pip install "ray[client]{"==" + version if version else ""}", or run on a node of '
                              "the cluster with --ray auto") from exc
        if _auth_failed(exc):
            raise EngineError(f"could not join {where}: it uses Ray's token authentication and this process sent "
                              "no valid token", "export RAY_AUTH_MODE=token with the cluster's token in "
                              "~/.ray/auth_token or RAY_AUTH_TOKEN (a head started where ~/.ray/auth_token exists "
                              "asks for it), or start the head with RAY_AUTH_MODE=disabled") from exc
        raise EngineError(f"could not start or join {where}: {first}",
                          "start it with `ray start --head` (then `ray start --address=HEAD:6379` on each other "
                          "node) and use --ray auto on a node of the cluster") from exc
    return True


def _auth_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it came from) is Ray's refusal of a missing or wrong token."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _placement(ray, kind: str, actors: int | None, cpus: float, gpus: int, ncpu: float,
               checked: bool = True) -> tuple[int, dict]:
    """How many actors and the resources each asks for; refused (UsageProblem) where the cluster cannot hold them.
    ``checked=False``: a kept service's actors, which exist already (their CPUs are taken)."""
    if kind == "gpu":
        if not gpus:
            raise UsageProblem("the Ray cluster has no GPU", "use --device cpu, or add GPU nodes")
        actors = actors or gpus
        if actors > gpus:
            raise UsageProblem(f"{actors} GPU actors asked for, but the Ray cluster has {gpus} GPU(s)",
                               f"use --ray-actors {gpus} or fewer")
        return actors, {"num_gpus": 1, "num_cpus": cpus}
    actors = actors or max(1, sum(1 for n in ray.nodes() if n.get("Alive")))
    if checked and actors * cpus > ncpu:
        raise UsageProblem(f"{actors} CPU actors of {cpus:g} CPU each need {actors * cpus:g} CPUs, the "
                           f"Ray cluster has {ncpu:g}", f"use --ray-actors {max(1, int(ncpu // cpus))}")
    return actors, {"num_cpus": cpus}


class RayPool:
    """Engine actors of ``model`` on a Ray cluster; ``classify()`` spreads sources over them.

    ``address``: None/"local" (a local Ray instance), "auto" (the cluster this node belongs to), "host:port" or
    "ray://host:port". ``device``: "cuda" (one actor per GPU, ``num_gpus=1``), "cpu" (``num_cpus=cpus`` each, the
    CPU pipeline) or "auto" (cuda when the cluster has GPUs). ``actors``: how many (default: every GPU; on CPUs one
    per node). ``streams``: sources one actor runs at once in one pipeline (default 8 on a GPU, 1 on a CPU).

    ``keep``: the name of a kept engine service on a running cluster (not a local instance, which ends with the
    pool): its actors are detached and stay after :meth:`close`; a later pool with the same name, model file,
    device, ``batch`` and ``engine_options`` uses them as they are, and one with anything else is refused
    (:class:`UsageProblem`, naming both). ``batch`` is then the batch every ``classify`` of the pool runs.
    ``started_at``: the Unix time start-up phases count from (default: this process's start).
    """

    def __init__(self, model, address: str | None = None, device: str = "auto", actors: int | None = None,
                 streams: int | None = None, cpus: float = 1, engine_options: dict | None = None,
                 start_timeout: float = 300.0, init_options: dict | None = None, keep: str | None = None,
                 batch: int | None = None, started_at: float | None = None):
        t0 = time.perf_counter()
        self.started_at = started_at or _STARTED_AT or time.time()
        self.marks: dict = {}  # phase -> Unix time it ended: connect, placement, engine_open (cold actors only)
        if keep is not None:
            check_service_name(keep)
            if address in LOCAL:
                raise UsageProblem(f"--ray-keep {keep}: a local Ray instance ends with the command, so nothing "
                                   "could be kept", "start a cluster once with `ray start --head`, then use "
                                   f"--ray auto --ray-keep {keep}")
        self.keep, self.batch, self.warm = keep, batch, False
        ray = _ray()
        self.model = _absolute(str(model))  # the actors' working folder is not the driver's
        kind = _kind(device)
        if streams is not None and streams < 1:
            raise UsageProblem(f"a Ray actor runs at least one source at a time (got {streams})")
        self.startup: dict = {"import_s": round(time.perf_counter() - t0, 3)}  # where start-up went (docs/CLUSTER.md)
        t1 = time.perf_counter()
        self._shutdown = connect(address, **(init_options or {}))
        self.address = "local" if address in LOCAL else address
        self.startup["connect_s"] = round(time.perf_counter() - t1, 3)
        self.marks["connect"] = time.time()
        log.info("ray: %s at %.2f s from the process's start (connect %.2f s, import ray %.2f s)",
                 "started a local instance" if self._shutdown and address in LOCAL else
                 f"joined the cluster ({address})", self.since(self.marks["connect"]), self.startup["connect_s"],
                 self.startup["import_s"])
        try:
            res = ray.cluster_resources()
            gpus, ncpu = int(res.get("GPU", 0)), float(res.get("CPU", 0))
            if kind == "auto":
                kind = "gpu" if gpus else "cpu"
            self.kind = kind
            key = self._key(engine_options or {}) if keep is not None else None
            found = self._find_service(ray, key, actors, start_timeout) if keep is not None else None
            if found is not None:
                actors = found
            actors, opts = _placement(ray, kind, actors, cpus, gpus, ncpu, checked=found is None)
            self.streams = streams or (8 if kind == "gpu" else 1)
            handles = self._make_actors(ray, actors, opts, engine_options or {}, key)
            self.actors = [_Actor(i, h, kind) for i, h in enumerate(handles)]
            self._lock = threading.Lock()
            self._start(ray, start_timeout, key)
        except BaseException:
            self.close()
            raise

    def _make_actors(self, ray, actors: int, opts: dict, engine_options: dict, key) -> list:
        remote = ray.remote(max_restarts=0, max_task_retries=0)(_EngineActor)
        device_name = "cuda" if self.kind == "gpu" else "cpu"
        if self.keep is None:
            return [remote.options(**opts).remote(self.model, device_name, engine_options) for _ in range(actors)]
        # the service's actors: those there are found, those missing (none at first) made
        return [remote.options(name=f"{self.keep}.{i}", namespace=NAMESPACE, lifetime="detached",
                               get_if_exists=True, **opts)
                .remote(self.model, device_name, engine_options, key, actors)
                for i in range(actors)]

    def since(self, t: float | None) -> float | None:
        """Seconds from :attr:`started_at` (the process's start) to the Unix time ``t``."""
        return None if t is None else round(t - self.started_at, 3)

    def phases(self, run=None) -> dict:
        """Start-up by phase, in seconds from the process's start: connect, placement, engine_open (absent when
        every actor was warm), and with ``run`` (a :class:`RayRun` of this pool) first_batch and first_result."""
        out = {k: self.since(v) for k, v in self.marks.items() if v is not None}
        if run is not None:
            for phase, key in (("first_batch", "first_batch_at"), ("first_result", "first_result_at")):
                if run.timing.get(key) is not None:
                    out[phase] = self.since(run.timing[key])
        return out

    def _key(self, engine_options: dict) -> dict:
        """What a kept service is kept for: the model file (path, size, modification time), its precision (from
        its manifest), the device kind, the batch and the engine options."""
        from ..manifest import read_manifest_if_any

        try:
            st = os.stat(self.model)
        except OSError as exc:
            raise UsageProblem(f"model not found: {self.model} ({exc.strerror})",
                               "the model must be at the same path on every node") from None
        try:
            manifest = read_manifest_if_any(self.model, verify_hash=False)
            precision = manifest.precision.get("mode") if manifest is not None else None
        except Exception:  # noqa: BLE001 - an unreadable manifest: the engine open says why
            precision = None
        return {"model": self.model, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "precision": precision or "?",
                "device": "cuda" if self.kind == "gpu" else "cpu", "batch": self.batch,
                "engine_options": sorted((str(k), repr(v)) for k, v in engine_options.items())}

    def _find_service(self, ray, key: dict, actors: int | None, timeout: float) -> int | None:
        """The size of the kept service ``self.keep`` when it exists (refused when it holds anything else than
        ``key``, or another number of actors than ``actors`` asks); None when there is none yet."""
        found = _service_actors(ray, self.keep)
        if not found:
            return None
        try:  # an actor answers once the job it runs (another driver's) ends
            where = ray.get(ray.get_actor(found[0], namespace=NAMESPACE).where.remote(), timeout=timeout)
        except (ValueError, ray.exceptions.RayError) as exc:
            raise EngineError(f"Ray engine service {self.keep!r} did not answer within {timeout:.0f} s "
                              f"({first_line(exc)})", "wait for the job running on it to end, give another "
                              f"--ray-keep name, or stop it: {stop_command(self.address, self.keep)}") from None
        if where["key"] != key:
            raise _refused(self.keep, where["key"], key, self.address)
        if actors is not None and actors != where["size"]:
            raise UsageProblem(f"Ray engine service {self.keep!r} has {where['size']} actor(s); this job asks for "
                               f"{actors}", f"leave --ray-actors out, or stop it first: "
                               f"{stop_command(self.address, self.keep)}")
        return int(where["size"])

    def _start(self, ray, timeout: float, key: dict | None = None) -> None:
        t0 = time.perf_counter()
        refs = {a.handle.where.remote(): a for a in self.actors}
        ready, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        self.startup["actors_s"] = round(time.perf_counter() - t0, 3)
        answered = time.time()
        errors, placed, opened, warm = [], [], [], []
        for ref in waiting:
            a = refs[ref]
            a.alive = False
            errors.append(f"{a.name}: not placed within {timeout:.0f} s (the cluster has no free resources for it)")
        for ref in ready:
            a = refs[ref]
            try:
                where = ray.get(ref)
            except ray.exceptions.RayError as exc:
                a.alive = False
                errors.append(f"{a.name}: {first_line(exc)}")
                continue
            a.placed(where)
            if key is not None and where["key"] != key:  # made by another job meanwhile, for another model
                raise _refused(self.keep, where["key"], key, self.address)
            warm.append(where["warm"])
            if not where["warm"]:  # made for this job: it was placed and opened its engine now
                placed.append(where["placed_at"])
                opened.append(where["opened_at"])
                self.startup.setdefault("engine_open_s", []).append(where.get("open_s"))
            if where["error"]:
                a.alive = False
                errors.append(f"{a.name}: {where['error']}")
                if self.keep is not None:  # a broken actor is not kept for the next job
                    ray.kill(a.handle, no_restart=True)
        self.warm = bool(warm) and all(warm)
        # every actor placed: by its own clock when made now; warm ones were placed before, found when they answered
        self.marks["placement"] = max(placed + ([answered] if any(warm) else []), default=answered)
        self.marks["engine_open"] = max(opened) if opened else None
        live = [a for a in self.actors if a.alive]
        if not live:
            raise EngineError(f"no Ray actor could open {self.model}: {errors[0]}",
                              "the model must be readable at the same path on every node; check a node with "
                              "`trtc doctor`")
        for e in errors:  # the others go on
            log.warning("Ray %s; going on with %d actor(s)", e, len(live))
        self.start_errors = errors
        service = f" of the kept service {self.keep!r}" if self.keep is not None else ""
        log.info("ray: %d actor(s)%s placed at %.2f s", len(live), service, self.since(self.marks["placement"]))
        if self.marks["engine_open"] is not None:
            log.info("ray: engines open at %.2f s (imports and engine open in the actors: %s s)",
                     self.since(self.marks["engine_open"]),
                     ", ".join(f"{x:.2f}" for x in self.startup.get("engine_open_s", []) if x is not None))
        else:
            log.info("ray: every actor warm: no engine to open")

    # -------------------------------------------------------------------------------------------------- jobs
    def classify(self, sources, on_source_done=None, events: bool = False, lines: str | None = None,
                 **options) -> RayRun:
        """Like :func:`engines.video.classify` (same options, minus the engine), spread over the actors.
        ``on_source_done(source, ok)`` is called in the caller's thread as each source ends. ``events``: live
        sources' SourceEvents come through too (always in ``run.events``). ``lines`` ("plain" or "latency"): the
        actors also format each prediction's JSON line (:meth:`RayRun.blocks`), as ``trtc run`` writes it."""
        if lines not in LINE_MODES:
            raise UsageProblem(f"unknown line mode {lines!r}", "use None, 'plain' or 'latency'")
        if self.keep is not None and options.get("batch") != self.batch:
            raise UsageProblem(f"the kept Ray engine service {self.keep!r} runs batch {self.batch or 'auto'}, this "
                               f"classify() asks for batch {options.get('batch') or 'auto'}",
                               "open a RayPool with that batch (another keep name)")
        if isinstance(sources, (str, bytes)) or not hasattr(sources, "__iter__"):
            sources = [sources]
        sources = [str(s) for s in sources]
        if not sources:
            raise UsageProblem("no video sources given")
        if len(set(sources)) != len(sources):
            raise UsageProblem("a source is listed twice", "give each video once (results are keyed by source)")
        live = [a for a in self.actors if a.alive]
        stats = RunStats(path=f"ray ({self.address}): {len(live)} {self.kind} actor(s), {self.streams} source(s) "
                              "each at a time")
        problems: list[SourceProblem] = []
        run = RayRun(None, stats, problems)
        options = dict(options, lines=lines)
        run._blocks_factory = lambda: self._run(sources, options, run, on_source_done, events)
        return run

    def _run(self, sources, options, run: RayRun, on_done, yield_events: bool = False):
        """Hand jobs to idle actors, take every ready chunk of results in one wait, until no source is left."""
        ray = _ray()
        if not self._lock.acquire(blocking=False):
            raise UsageProblem("this Ray pool is already running a classify() call", "iterate it to the end first")
        d = _Dispatch(self, sources, options, run, on_done)
        try:
            while d.pending or d.busy:
                d.hand_out()
                if not d.busy:  # sources left that no live actor may take
                    d.nobody_left()
                    break
                # every generator with something ready, in one call (a call costs ~100 us + ~1.6 us per busy actor,
                # measured: docs/CLUSTER.md); if none is, block until one is
                ready, _ = ray.wait(list(d.busy), num_returns=len(d.busy), timeout=0)
                if not ready:
                    ready, _ = ray.wait(list(d.busy), num_returns=1, timeout=1.0)
                for gen in ready:
                    for item in d.receive(ray, gen):
                        if yield_events or not hasattr(item, "event"):
                            yield item
        finally:
            run.stats.seconds = time.perf_counter() - d.start
            run.stats.per_source = dict(d.counts)
            for actor, _job in d.busy.values():  # the caller left early: these actors are mid-job
                actor.alive = False
                ray.kill(actor.handle, no_restart=True)
            self._lock.release()

    # ------------------------------------------------------------------------------------------------- life
    def describe(self) -> list[dict]:
        return [{"actor": a.name, "alive": a.alive} for a in getattr(self, "actors", [])]

    def close(self) -> None:
        if not getattr(self, "actors", None) and not getattr(self, "_shutdown", False):
            return
        ray = _ray()
        t0 = time.perf_counter()
        # a cluster that goes on: free its GPUs (shutdown ends them all); a kept service's actors stay
        if not getattr(self, "_shutdown", False) and getattr(self, "keep", None) is None:
            for a in getattr(self, "actors", []):
                try:
                    ray.kill(a.handle, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self.actors = []
        if getattr(self, "_shutdown", False):
            ray.shutdown()
            self._shutdown = False
        log.info("ray: closed in %.2f s", time.perf_counter() - t0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _kind(device: str) -> str:
    d = (device or "auto").strip().lower()
    if d in ("auto", "cpu"):
        return d
    if d in ("cuda", "gpu", "cuda:all"):
        return "gpu"
    raise UsageProblem(f"--device {device} with --ray: Ray gives each actor its GPU",
                       "use --device cuda (one actor per GPU of the cluster), cpu, or auto")


def _absolute(source: str) -> str:
    """A relative file path as an absolute one (the same path must exist on every node); URLs as they are."""
    import os

    return source if "://" in source or os.path.isabs(source) else os.path.abspath(source)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def check_service_name(name: str) -> str:
    """A kept service's name: letters, digits, '-' and '_' (up to 64; Ray names its actors NAME.0, NAME.1...)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageProblem(f"{name!r} is not a name for a kept Ray engine service",
                           "use letters, digits, '-' and '_' (up to 64), e.g. --ray-keep r50-fp16")
    return name


def stop_command(address, name: str) -> str:
    return f"trtc run --ray {address or 'auto'} --ray-stop {name}"


def _service_actors(ray, name: str) -> list[str]:
    """The names of the live actors of the kept service ``name`` (NAME.0, NAME.1, ...), in index order."""
    prefix = f"{name}."
    return sorted((n for n in _named(ray) if n.startswith(prefix) and n[len(prefix):].isdigit()),
                  key=lambda n: int(n[len(prefix):]))


def describe_key(key: dict | None, full: bool = False) -> str:
    """A kept service's key in words: "lite0.onnx (fp32, cpu, batch 16)"; ``full``: the model's whole path."""
    if not key:
        return "an unknown model"
    options = ", ".join(f"{k}={v}" for k, v in key.get("engine_options") or [])
    model = key["model"] if full else os.path.basename(key["model"])
    return f"{model} ({key['precision']}, {key['device']}, batch {key['batch'] or 'auto'}" + (
        f", {options})" if options else ")")


def _refused(name: str, held: dict | None, asked: dict, address) -> UsageProblem:
    # two files of one name in different folders are told apart by their paths
    full = bool(held) and held["model"] != asked["model"] and (os.path.basename(held["model"]) ==
                                                               os.path.basename(asked["model"]))
    what = describe_key(held, full)
    if held and held["model"] == asked["model"] and (held["size"], held["mtime_ns"]) != (asked["size"],
                                                                                          asked["mtime_ns"]):
        what += ", opened before the file changed"
    return UsageProblem(f"Ray engine service {name!r} holds {what}; this job asks for {describe_key(asked, full)}",
                        f"run it with the same model and options, give another --ray-keep name, or stop that one: "
                        f"{stop_command(address, name)}")


def stop_service(name: str, address: str = "auto", timeout: float = 5.0) -> dict:
    """End the kept engine service ``name`` on the running cluster at ``address``: {"name", "actors" (how many were
    stopped), "held" (its key in words; "busy" when its actor was running a job and did not answer in
    ``timeout``)}. A name that is not there is refused, naming those that are."""
    check_service_name(name)
    if address in LOCAL:
        raise UsageProblem("--ray-stop ends a kept service of a running cluster, not of a local instance",
                           f"name the cluster: {stop_command('auto', name)}")
    ray = _ray()
    joined = connect(address)
    try:
        found = _service_actors(ray, name)
        if not found:
            names = sorted({n.rsplit(".", 1)[0] for n in _named(ray) if n.rsplit(".", 1)[-1].isdigit()})
            raise UsageProblem(f"no Ray engine service {name!r} on the cluster ({address})",
                               f"the services there: {', '.join(names)}" if names else
                               "none is running there; --ray-keep NAME starts one with a job")
        handles = [ray.get_actor(n, namespace=NAMESPACE) for n in found]
        try:
            held = describe_key(ray.get(handles[0].where.remote(), timeout=timeout)["key"])
        except Exception:  # noqa: BLE001 - busy with a job, or dying: it is stopped all the same
            held = "busy"
        for h in handles:
            ray.kill(h, no_restart=True)
        return {"name": name, "actors": len(handles), "held": held}
    finally:
        if joined:
            ray.shutdown()


def _named(ray) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a.get("namespace") == NAMESPACE]


class _Dispatch:
    """The driver's book-keeping for one :meth:`RayPool.classify` run: the sources still to run (``pending``), the
    actors' jobs in flight (``busy``: generator -> (actor, job)), each source's last frame with the caller, and the
    retries. ``receive`` turns one actor's message into Predictions, events, problems and retries."""

    def __init__(self, pool: RayPool, sources, options, run: RayRun, on_done):
        self.pool, self.run, self.on_done = pool, run, on_done
        # seconds from the process's start, for the log (a pool made without RayPool's start counts from the process)
        self.since = getattr(pool, "since", None) or (lambda t: round(t - (_STARTED_AT or t), 3))
        self.start = time.perf_counter()
        self.options = dict(options)
        base_done = {str(k): int(v) for k, v in (self.options.pop("done", None) or {}).items()}
        self.last = dict(base_done)  # source -> last frame index the caller has (earlier run + this one)
        self.counts = dict.fromkeys(sources, 0)
        self.pending = deque(sources)
        self.tries = dict.fromkeys(sources, 0)
        self.avoid: dict = {}  # source -> the actor it failed on
        self.wire = {s: _absolute(s) for s in sources}  # what the actors open: relative paths made absolute
        self.back = {w: s for s, w in self.wire.items()}  # ...and the caller's names again
        self.busy: dict = {}  # generator -> (actor, job)
        # live sources re-run after a failed job: a new connection, its frames numbered on from here (not resumed)
        self.offset: dict = {}
        live = self.options.get("live")
        self.live = {s for s in sources if (bool(live) if live is not None else is_network(s))}

    def finish(self, source, ok) -> None:
        if self.on_done is not None:
            self.on_done(source, ok)

    def retry_or_give_up(self, actor, job, why) -> None:
        """Each source of a failed job runs once more on another actor, or is a problem of the run."""
        redo = []
        for s in job:
            if self.tries[s] < 2 and any(a.alive and a is not actor for a in self.pool.actors):
                self.avoid[s] = actor
                redo.append(s)
            else:
                reason = f"{s}: {actor.name} {why}" + ("; it failed before on another actor" if self.tries[s] > 1
                                                      else "; no other actor is left to redo it")
                self.run.problems.append(SourceProblem(s, reason, self.counts[s]))
                self.finish(s, False)
        self.pending.extendleft(reversed(redo))  # redone first
        line = f"{actor.name} {why}" + (f": redoing {', '.join(redo)} on another actor" if redo else "")
        self.run.failures.append(line)
        self.run.retried += redo
        log.warning("%s", line)

    def hand_out(self) -> None:
        """A job for every idle actor (O(idle actors x streams): thousands of sources, hundreds of actors)."""
        working = {id(b) for b, _ in self.busy.values()}
        for a in self.pool.actors:
            if not self.pending:
                return
            if not a.alive or id(a) in working:
                continue
            job, passed = [], []
            while self.pending and len(job) < self.pool.streams:
                s = self.pending.popleft()
                (passed if self.avoid.get(s) is a else job).append(s)  # a redone source goes to ANOTHER actor
            self.pending.extendleft(reversed(passed))
            if not job:
                continue
            for s in job:
                self.tries[s] += 1
                self.run.placement[s] = a.name
            for s in job:
                if s in self.live and s in self.last:  # a redo: the new connection's frame 0 follows the last one
                    self.offset[s] = self.last[s] + 1
            done = {self.wire[s]: self.last[s] for s in job if s in self.last and s not in self.live}
            names = {self.wire[s]: s for s in job if self.wire[s] != s}  # the lines name sources as the caller did
            gen = a.handle.run.options(num_returns="streaming").remote([self.wire[s] for s in job],
                                                                      dict(self.options, done=done, names=names))
            self.busy[gen] = (a, job)

    def nobody_left(self) -> None:
        for s in list(self.pending):
            self.run.problems.append(SourceProblem(s, f"{s}: no Ray actor left to run it", self.counts[s]))
            self.finish(s, False)
        self.pending.clear()

    def receive(self, ray, gen):
        """One message of an actor's generator: Predictions (and SourceEvents) to pass on; the end of a job."""
        actor, job = self.busy[gen]
        try:
            msg = ray.get(next(gen))
        except StopIteration:  # ended without its "end" message: treat as a failed job
            msg = ("end", [], {}, "the task ended early")
        except ray.exceptions.RayActorError as exc:
            del self.busy[gen]
            actor.alive = False
            ray.kill(actor.handle, no_restart=True)  # unavailable may come back: not for this run
            self.retry_or_give_up(actor, job, f"died ({first_line(exc)})")
            return
        except ray.exceptions.RayError as exc:
            del self.busy[gen]
            self.retry_or_give_up(actor, job, f"failed ({first_line(exc)})")
            return
        if msg[0] == "first":
            if "first_batch_at" not in self.run.timing:
                self.run.timing["first_batch_at"] = msg[1]
                log.info("ray: first batch at %.2f s (%s)", self.since(msg[1]), actor.name)
        elif msg[0] == "event":
            from .live import SourceEvent

            ev = SourceEvent.from_dict(dict(msg[1], source=self.back.get(msg[1]["source"], msg[1]["source"])))
            self.run.events.append(ev)
            yield ev
        elif msg[0] == "block":
            block = self._kept(actor, msg[1])
            if block is not None:
                yield block
        else:
            del self.busy[gen]
            self._job_ended(actor, job, msg)

    def _kept(self, actor, block):
        """The rows of an actor's block the caller does not have yet (a redone source repeats none), counted;
        None when none is left."""
        block.renamed(self.back)
        block.labels = actor.labels
        block = block.shifted(self.offset)
        last = self.last
        block = block.keep(lambda s, f: f > last.get(s, -1))  # frames rise within a source in a block
        if not len(block):
            return None
        for s, (n, f) in block.per_source().items():
            last[s] = f
            self.counts[s] += n
        self.run.stats.frames += len(block)
        self.run.stats.seconds = time.perf_counter() - self.start
        now = time.time()
        if "first_result_at" not in self.run.timing:
            self.run.timing["first_result_at"] = now
            log.info("ray: first result at %.2f s", self.since(now))
        self.run.timing["last_result_at"] = now
        return block

    def _job_ended(self, actor, job, msg) -> None:
        _, probs, wstats, failure = msg
        self.run.stats.merge_from(wstats, names=self.back)
        if failure:
            self.retry_or_give_up(actor, job, f"failed: {failure}")
            return
        bad = set()
        for s, reason, _frames in probs:
            s = self.back.get(s, s)
            self.run.problems.append(SourceProblem(s, reason, self.counts.get(s, 0)))
            bad.add(s)
        for s in job:
            self.finish(s, s not in bad)
