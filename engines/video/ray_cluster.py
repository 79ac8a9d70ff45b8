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

``ray`` is imported only here, when a pool is made (extra ``trtc[ray]``).
"""

from __future__ import annotations

import logging
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


def _ray():
    from .._deps import require

    return require("ray", "Running the video pipeline on a Ray cluster", extra="ray", package="ray")


class _EngineActor:
    """Lives in a Ray worker process: one engine, one job at a time (Ray runs an actor's tasks one after the other)."""

    def __init__(self, model: str, device: str, engine_options: dict):
        import socket

        import ray

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

    def where(self) -> dict:
        return {"host": self.host, "gpus": self.gpu_ids, "labels": self.labels, "error": self.error,
                "open_s": round(self.open_s, 3)}

    def run(self, sources: list, options: dict):
        """A streaming generator: ("block", ResultBlock) chunks of results (with their JSON lines when
        ``options["lines"]`` asks for them; sources named as the driver's caller named them, ``options["names"]``),
        live sources' ("event", dict), then ("end", problems, stats, failure)."""
        from engines.video.pipeline import classify

        from .results import ResultBlock

        options = dict(options)
        line_mode, names = options.pop("lines", None), options.pop("names", None) or {}
        out, last, run, failure = [], time.perf_counter(), None, None

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
        raise EngineError(f"could not start or join {where}: {first}",
                          "start it with `ray start --head` (then `ray start --address=HEAD:6379` on each other "
                          "node) and use --ray auto on a node of the cluster") from exc
    return True


class RayPool:
    """Engine actors of ``model`` on a Ray cluster; ``classify()`` spreads sources over them.

    ``address``: None/"local" (a local Ray instance), "auto" (the cluster this node belongs to), "host:port" or
    "ray://host:port". ``device``: "cuda" (one actor per GPU, ``num_gpus=1``), "cpu" (``num_cpus=cpus`` each, the
    CPU pipeline) or "auto" (cuda when the cluster has GPUs). ``actors``: how many (default: every GPU; on CPUs one
    per node). ``streams``: sources one actor runs at once in one pipeline (default 8 on a GPU, 1 on a CPU).
    """

    def __init__(self, model, address: str | None = None, device: str = "auto", actors: int | None = None,
                 streams: int | None = None, cpus: float = 1, engine_options: dict | None = None,
                 start_timeout: float = 300.0, init_options: dict | None = None):
        t0 = time.perf_counter()
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
        log.info("ray: %s in %.2f s (import ray %.2f s)", "started a local instance" if self._shutdown and
                 address in LOCAL else "joined the cluster", self.startup["connect_s"], self.startup["import_s"])
        try:
            res = ray.cluster_resources()
            gpus, ncpu = int(res.get("GPU", 0)), float(res.get("CPU", 0))
            if kind == "auto":
                kind = "gpu" if gpus else "cpu"
            nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
            if kind == "gpu":
                if not gpus:
                    raise UsageProblem("the Ray cluster has no GPU", "use --device cpu, or add GPU nodes")
                actors = actors or gpus
                if actors > gpus:
                    raise UsageProblem(f"{actors} GPU actors asked for, but the Ray cluster has {gpus} GPU(s)",
                                       f"use --ray-actors {gpus} or fewer")
                opts = {"num_gpus": 1, "num_cpus": cpus}
            else:
                actors = actors or max(1, nodes)
                if actors * cpus > ncpu:
                    raise UsageProblem(f"{actors} CPU actors of {cpus:g} CPU each need {actors * cpus:g} CPUs, the "
                                       f"Ray cluster has {ncpu:g}", f"use --ray-actors {max(1, int(ncpu // cpus))}")
                opts = {"num_cpus": cpus}
            self.kind, self.streams = kind, streams or (8 if kind == "gpu" else 1)
            remote = ray.remote(max_restarts=0, max_task_retries=0)(_EngineActor)
            self.actors = [_Actor(i, remote.options(**opts).remote(self.model, "cuda" if kind == "gpu" else "cpu",
                                                                   engine_options or {}), kind)
                           for i in range(actors)]
            self._lock = threading.Lock()
            self._start(ray, start_timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, ray, timeout: float) -> None:
        t0 = time.perf_counter()
        refs = {a.handle.where.remote(): a for a in self.actors}
        ready, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        self.startup["actors_s"] = round(time.perf_counter() - t0, 3)
        errors = []
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
            self.startup.setdefault("engine_open_s", []).append(where.get("open_s"))
            if where["error"]:
                a.alive = False
                errors.append(f"{a.name}: {where['error']}")
        live = [a for a in self.actors if a.alive]
        if not live:
            raise EngineError(f"no Ray actor could open {self.model}: {errors[0]}",
                              "the model must be readable at the same path on every node; check a node with "
                              "`trtc doctor`")
        for e in errors:  # the others go on
            log.warning("Ray %s; going on with %d actor(s)", e, len(live))
        self.start_errors = errors
        log.info("ray: %d actor(s) ready in %.2f s (imports and engine open in the actors: %s s)", len(live),
                 self.startup["actors_s"], ", ".join(f"{x:.2f}" for x in self.startup.get("engine_open_s", []) if x))

    # -------------------------------------------------------------------------------------------------- jobs
    def classify(self, sources, on_source_done=None, events: bool = False, lines: str | None = None,
                 **options) -> RayRun:
        """Like :func:`engines.video.classify` (same options, minus the engine), spread over the actors.
        ``on_source_done(source, ok)`` is called in the caller's thread as each source ends. ``events``: live
        sources' SourceEvents come through too (always in ``run.events``). ``lines`` ("plain" or "latency"): the
        actors also format each prediction's JSON line (:meth:`RayRun.blocks`), as ``trtc run`` writes it."""
        if lines not in LINE_MODES:
            raise UsageProblem(f"unknown line mode {lines!r}", "use None, 'plain' or 'latency'")
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
        if not getattr(self, "_shutdown", False):  # a cluster that goes on: free its GPUs (shutdown ends them all)
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


class _Dispatch:
    """The driver's book-keeping for one :meth:`RayPool.classify` run: the sources still to run (``pending``), the
    actors' jobs in flight (``busy``: generator -> (actor, job)), each source's last frame with the caller, and the
    retries. ``receive`` turns one actor's message into Predictions, events, problems and retries."""

    def __init__(self, pool: RayPool, sources, options, run: RayRun, on_done):
        self.pool, self.run, self.on_done = pool, run, on_done
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
        if msg[0] == "event":
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
        self.run.timing.setdefault("first_result_at", now)
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
