"""`trtc run`: classify video sources and write one JSON line per classified frame.

    summary = run_video(["cam1.mp4", "cam2.mp4"], "model.onnx", device="cuda:0", output="preds.jsonl")

A thin layer over :func:`engines.video.classify`: picks the device, opens the engine, streams predictions to the
output (stdout, or a file: a temporary file beside it, fsync'd and renamed at the end, also when a source failed
or the user pressed Ctrl-C, so every complete line computed is kept; ``resume`` continues such a file), and
returns a summary with per-source counts, the last frame each source got to, and problems.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engines import PLAN_SUFFIXES, VIDEO_SUFFIXES
from engines.errors import TrtcError
from engines.video import default_device
from engines.video.results import ResultBlock, json_line
from engines.video.workers import WorkerPool, parse_devices

from ._ui import Reporter
from .errors import UsageProblem


@dataclass
class RunSummary:
    model: str
    device: str
    decoder: str
    sources: list[str]
    frames: int
    batches: int
    seconds: float
    fps: float
    mean_batch: float
    per_source: dict
    problems: list[dict]
    output: str | None
    latency_ms: dict = field(default_factory=dict)
    interrupted: bool = False  # stopped by Ctrl-C: the output holds every frame classified before
    last_frame: dict = field(default_factory=dict)  # source -> last frame index in the output (None: none yet)
    resumed_lines: int = 0  # lines kept from the earlier run (--resume)
    ray: dict = field(default_factory=dict)  # --ray: address, actors, failures, retried sources, skipped videos
    dropped: dict = field(default_factory=dict)  # live sources: frames dropped because inference lagged
    missing: dict = field(default_factory=dict)  # live sources: frames their timestamps say never arrived
    damaged: dict = field(default_factory=dict)  # packets or frames the decoder could not read
    lagged: dict = field(default_factory=dict)  # live sources: frames skipped for being past --max-lag
    cut: dict = field(default_factory=dict)  # live sources: frames made up from data trtc's read timeout cut short
    lag_s: dict = field(default_factory=dict)  # live sources: capture -> result, seconds: p50, p99, max, frames
    # each source: received (decoded), classified, dropped by reason (queue: inference lagged; lag: past --max-lag;
    # cut: made up from data trtc's own read timeout cut short),
    # missing, damaged, lag_s, outages (disconnected events) and status ("ok", "interrupted" or its problem)
    by_source: dict = field(default_factory=dict)
    events: int = 0  # live sources' event records (disconnected, reconnected, gave_up) written with the lines
    signal: str | None = None  # "SIGTERM" when a stop signal (not Ctrl-C) ended the run
    live: list = field(default_factory=list)  # the sources read as live (they cannot be resumed)
    # seconds from the start of run_video: engine(s), workers or actors ready ("ready_s"), first and last prediction
    # written; "started_at": that start, Unix seconds. Start-up is outside "seconds" (the frames/s span)
    timing: dict = field(default_factory=dict)
    # -o could not be written to the end (a full disk, an I/O error): {"reason", "lines" (complete lines kept),
    # "left" (the file holding them when it could not be moved onto -o, else None)}; the run stopped there
    write_error: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and not self.interrupted and not self.write_error

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def pick_device(device: str) -> str:
    """"auto": cuda:0 when there is an NVIDIA GPU and the GPU video stack (CuPy, PyNvVideoCodec) is installed."""
    if device != "auto":
        return device
    return default_device()


def read_progress(path: Path) -> tuple[dict, int, int, set, set, dict]:
    """What a kept (e.g. interrupted) output already holds: ({source: last frame index}, complete lines, bytes of
    complete lines, the strides seen (the gap between the first two frames of each source with two), the top-k
    lengths seen, {class index: the label first written for it}). A last line cut short is not counted (it is
    dropped when the run resumes)."""
    last: dict = {}
    first: dict = {}
    strides: set = set()
    ks: set = set()
    names: dict = {}
    lines = 0
    good = 0
    with path.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                d = json.loads(raw)
                src, frame = str(d["source"]), int(d["frame"])
            except (ValueError, KeyError, TypeError) as exc:
                raise UsageProblem(f"{path} line {lines + 1} is not a trtc run prediction ({exc})",
                                   "--resume continues a file written by trtc run -o; give another -o") from None
            last[src] = max(frame, last.get(src, -1))
            if isinstance(d.get("top_k"), list):
                ks.add(len(d["top_k"]))
                for item in d["top_k"]:
                    if isinstance(item, dict) and isinstance(item.get("index"), int):
                        names.setdefault(item["index"], item.get("label"))
            if src not in first:
                first[src] = frame
            elif first[src] is not None:
                strides.add(frame - first[src])
                first[src] = None
            lines += 1
            good += len(raw)
    return last, lines, good, strides, ks, names


def _check_resumed_options(out_path: Path, model, strides: set, ks: set, stride: int, top_k: int | None,
                           names: dict | None = None) -> None:
    """A resumed output must go on as it was written: the same --stride (from its frame gaps), --top-k (from its
    lines' lengths; a model with fewer classes than k writes them all, so its class count is read from the
    manifest when there is one) and model labels (``names``: {class index: label} as the lines wrote them, against
    the labels of ``model``'s manifest). Two models with the same labels cannot be told apart from the lines."""
    def refuse(option, was, now):
        was_text = ", ".join(str(s) for s in sorted(was))
        raise UsageProblem(f"{out_path} was written with {option} {was_text}, and this run asks for {option} {now}: "
                           "resuming would mix the two", f"resume with {option} {was_text}, or give another -o"
                           if len(was) == 1 else "give another -o")

    if strides and strides != {stride}:
        refuse("--stride", strides, stride)
    if not ks:
        return
    from engines import split_engine
    from engines.manifest import classes_of, read_manifest_if_any
    from engines.video.pipeline import label_names

    try:
        manifest = read_manifest_if_any(split_engine(os.fspath(model))[1], verify_hash=False)
        classes = classes_of(manifest.outputs) if manifest is not None else None
        labels = manifest.labels if manifest is not None else None
    except TrtcError:  # a bad manifest is reported when the model is opened
        classes = labels = None
    else:
        for index, was in sorted((names or {}).items()):
            now = label_names(labels, [index])[0] if labels else None
            if was != now:
                raise UsageProblem(f"{out_path} was written by a model with other labels (class {index} is "
                                   f"{json.dumps(was)} there, {json.dumps(now)} for {Path(str(model)).name}): resuming "
                                   "would mix two models", "resume with the model of the earlier run, or give "
                                   "another -o")
    from engines.topk import DEFAULT_K

    k = top_k if top_k is not None else DEFAULT_K  # the default: min(5, classes)
    expected = min(k, classes) if classes else None
    if (expected is not None and ks != {expected}) or (expected is None and max(ks) > k):
        refuse("--top-k", ks, k)


def _refuse_top_k_over_classes(model, top_k: int | None) -> None:
    """--top-k above the model's class count (its manifest says how many) would silently give fewer: refused before
    the engine opens (classify() refuses it too, from the model itself, by the same rule: engines.topk.resolve_k)."""
    from engines import split_engine
    from engines.manifest import classes_of, read_manifest_if_any
    from engines.topk import resolve_k

    try:
        manifest = read_manifest_if_any(split_engine(os.fspath(model))[1], verify_hash=False)
        classes = classes_of(manifest.outputs) if manifest is not None else None
    except TrtcError:  # a bad manifest is reported when the model is opened
        return
    resolve_k(top_k, classes, Path(str(model)).name)


def _say_what_is_assumed(model) -> None:
    """An ONNX model without a manifest runs with the pipeline's defaults: said once, in the words trtc quantize
    uses (trtc validate refuses such a model unless another model's manifest gives the contract)."""
    from engines import split_engine
    from engines.manifest import manifest_path
    from engines.preprocess import PreprocessSpec

    path = Path(split_engine(os.fspath(model))[1])
    if path.suffix.lower() != ".onnx" or not path.is_file() or manifest_path(path).exists():
        return
    import logging

    from .export import no_manifest_note

    logging.getLogger("trtc").warning("%s", no_manifest_note(path, PreprocessSpec(channels=_onnx_channels(path))))


def _onnx_channels(path: Path) -> int:
    """The channels of an ONNX model's (N, C, H, W) input: 1 for a greyscale model, else 3 (what the run assumes)."""
    try:
        from engines._deps import require

        from .precision import graph as G

        onnx = require("onnx", "Reading ONNX models")
        dims = G.input_dims(G.graph_inputs(onnx.load(str(path), load_external_data=False))[0])
    except Exception:  # noqa: BLE001 - no onnx, or a file that opening the model reports on
        return 3
    return 1 if len(dims) == 4 and dims[1] == 1 else 3


def run_video(sources, model, *, device: str = "auto", batch: int | None = None, top_k: int | None = None,
              stride: int = 1,
              output: str | None = None, decoder: str = "auto", colorspace: str | None = None, scores: str = "auto",
              max_wait_ms: float = 100.0, loop: int = 1, realtime: bool = False, latency: str = "native",
              with_latency: bool = False, force: bool = False, resume: bool = False, reporter: Reporter | None = None,
              stream=None, ray: str | None = None, ray_actors: int | None = None,
              ray_streams: int | None = None, ray_keep: str | None = None, live: bool = False,
              live_options=None, credentials=None, rotate: str = "auto") -> RunSummary:
    """Classify ``sources`` with ``model``; predictions go to ``output`` (a .jsonl path) or ``stream``.

    With ``output``, every complete line is kept whatever happens (a source fails, Ctrl-C): the lines go to a
    temporary file beside it, which is flushed, fsync'd and renamed onto ``output`` at the end. Ctrl-C returns a
    summary with ``interrupted`` set. ``resume``: ``output`` already holds lines of an earlier run of the same
    sources; they are kept and each source continues after the last frame it has there.

    ``ray``: run on a Ray cluster (see :mod:`engines.video.ray_cluster`): "local" (a local instance), "auto" (the
    cluster of this node), "host:port" or "ray://host:port"; one engine actor per GPU (``ray_actors`` to say how
    many), ``ray_streams`` sources per actor at once. Sources may then be folders (their videos) and ``@list.txt``
    files (one source a line); with ``resume`` the videos that ``output`` holds complete are skipped (see
    :func:`batch_sources`). ``ray_keep``: the name of a kept engine service on the running cluster (its actors stay
    after the run, and the next run with the same name, model, device and batch uses them with no engine open;
    :func:`stop_ray_service` ends it). The summary's ``ray.startup.phases`` times the start-up by phase from the
    process's start (connect, placement, engine_open, first_batch, first_result), also logged at info level.

    Live sources (network URLs; every source with ``live``) reconnect as ``live_options``
    (:class:`engines.video.LiveOptions`) say; their outages and recoveries are written as event lines
    (``{"event": "disconnected", ...}``) among the predictions, and they cannot be resumed. ``NAME=URL`` names a
    source; a URL's user info never reaches an output (its name there is ``rtsp://***@host/...``); ``credentials``
    (a netrc-format file) and the TRTC_RTSP_USER/TRTC_RTSP_PASSWORD variables give RTSP URLs without user info theirs
    (:mod:`engines.video.credentials`).

    ``rotate``: "auto" turns frames as each video's rotation metadata says, "0".."270" clockwise instead
    (:func:`engines.video.classify`); each source's ``by_source[...]["rotation"]`` says what was applied.
    """
    reporter = reporter or Reporter()
    started_at = time.time()
    if ray_keep is not None and ray is None:
        raise UsageProblem("--ray-keep goes with --ray on a running cluster", f"add --ray auto --ray-keep {ray_keep}")
    sources = _addresses(sources, credentials)
    sources, out_path, live_sources = _check_request(sources, model, device, output, resume, live, ray)
    with contextlib.ExitStack() as held:
        if out_path is not None:
            held.enter_context(_one_writer(out_path))
        return _run_video(sources, model, out_path, live_sources, started_at, device=device, batch=batch,
                          top_k=top_k, stride=stride, decoder=decoder, colorspace=colorspace, scores=scores,
                          max_wait_ms=max_wait_ms, loop=loop, realtime=realtime, latency=latency,
                          with_latency=with_latency, force=force, resume=resume, reporter=reporter, stream=stream,
                          ray=ray, ray_actors=ray_actors, ray_streams=ray_streams, ray_keep=ray_keep, live=live,
                          live_options=live_options, rotate=rotate)


@contextlib.contextmanager
def _one_writer(out_path: Path):
    """The lock of ``-o`` for the whole run (:func:`engines._io.output_lock`): a second run on the same output is
    refused at once, naming the one writing it; a lock left by a run that is gone is taken over, said once."""
    import logging

    from engines._io import OutputBusy, output_lock

    def who(h):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["started"])) if h.get("started") else "?"
        return f"PID {h.get('pid', '?')} on {h.get('host', '?')} since {since}"

    with contextlib.ExitStack() as stack:
        try:
            got = stack.enter_context(output_lock(out_path))
        except OutputBusy as busy:
            raise UsageProblem(f"{out_path} is being written by another trtc run ({who(busy.holder)})",
                               f"wait for that run to end (or stop it: kill {busy.holder.get('pid', '<pid>')}), or "
                               "give another -o") from None
        except OSError:  # the folder refuses the lock file: the output check says why, with its fix
            from .outputs import check_output_path

            check_output_path(out_path, True, suffix=None)
            raise
        if got.get("stale"):
            logging.getLogger("trtc").warning("%s: took over its lock, left by a trtc run that is no longer "
                                              "running (%s)", out_path, who(got["stale"]))
        yield


def _run_video(sources, model, out_path, live_sources, started_at, *, device, batch, top_k, stride, decoder,
               colorspace, scores, max_wait_ms, loop, realtime, latency, with_latency, force, resume, reporter,
               stream, ray, ray_actors, ray_streams, ray_keep, live, live_options, rotate) -> RunSummary:
    prior = _prior_output(out_path, model, sources, stride, top_k, force, resume, ray, reporter)
    options = dict(batch=batch, top_k=top_k, stride=stride, decoder=decoder, colorspace=colorspace, scores=scores,
                   max_wait_ms=max_wait_ms, loop=loop, realtime=realtime, latency=latency, done=prior.done,
                   live=True if live else None, live_options=live_options, rotate=rotate)
    _refuse_top_k_over_classes(model, top_k)
    finished: list = []  # --ray: (source, ok) of the sources that ended, in order
    run, closer, device, ray_info = _start(model, device, (ray, ray_keep), ray_actors, ray_streams, sources,
                                           prior.complete, options, finished, reporter, with_latency)
    _say_what_is_assumed(model)  # once the model opened: a file that is no model gets its error alone
    ready_at = time.time()
    try:
        lines = _Lines(out_path, prior, stream, with_latency, live=bool(live_sources))
        interrupted = _write_lines(run, lines, reporter, sources, device, ray, prior.complete, finished)
        if ray is not None and lines.out_path is not None:  # the videos the output holds complete (--resume skips)
            from engines._io import atomic_write_text

            whole = sorted(prior.complete | {s for s, ok in finished if ok})
            atomic_write_text(done_file(lines.out_path), "".join(f"{s}\n" for s in whole))
        summary = _summary(model, device, sources, run, lines, prior, interrupted, ray_info, live_sources)
        summary.timing = _timing(started_at, ready_at, lines)
        summary.by_source = _by_source(summary, lines.outages, dict(getattr(run.stats, "decoded", {}) or {}))
        for source, turn in (getattr(run.stats, "rotation", None) or {}).items():  # how its frames were turned
            summary.by_source.get(source, {})["rotation"] = turn
        return summary
    finally:
        closer()


def _addresses(sources, credentials) -> list:
    """Each source as the run names it (:func:`engines.video.credentials.source_address`): user info hidden, NAME=URL
    named, credentials for RTSP URLs without them from the environment or the ``credentials`` file."""
    from engines.video.credentials import read_credentials, source_address

    table = read_credentials(credentials) if credentials else None
    out = [source_address(s, table) for s in sources]
    names = [str(s) for s in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice and len({url_of(s) for s in out}) == len(out):  # two addresses under one name
        raise UsageProblem(f"two sources are named {twice[0]}", "give each camera its own NAME=rtsp://... name")
    return out


def url_of(source) -> str:
    return getattr(source, "url", source)


def _check_request(sources, model, device, output, resume, live, ray):
    """(sources, the output path or None, the live sources), each refused here with its fix when wrong."""
    sources = [s if isinstance(s, str) else os.fspath(s) for s in sources]  # an Address keeps its url
    if not str(device).strip():
        raise UsageProblem("--device is empty", "use auto, cpu, cuda:N, a list such as cuda:0,cuda:1, or cuda:all")
    _refuse_non_model(model)
    sources = batch_sources(sources) if ray is not None else _no_batch(sources, model)
    if not sources:
        raise UsageProblem("no video sources given", "trtc run clip.mp4 --model model.onnx")
    out_path = Path(output) if output and output != "-" else None
    if out_path is not None:
        from .outputs import refuse_special

        refuse_special(out_path, suffix=".jsonl")  # before the lock file beside it (/dev/null: not in /dev)
        _refuse_writing_over_inputs(out_path, model, sources)
    if resume and out_path is None:
        raise UsageProblem("--resume continues an output file", "give the file of the earlier run with -o")
    from engines.video.live import is_network

    live_sources = [s for s in sources if live or is_network(s)]
    if resume and live_sources:
        raise UsageProblem(f"--resume cannot continue a live source ({live_sources[0]}): a camera sends new frames, "
                           "not the ones the earlier run missed", "run live sources without --resume, into a new -o")
    return sources, out_path, live_sources


@dataclass
class _Prior:
    """What the output of an earlier run holds (--resume): {source: last frame}, its complete lines and their bytes,
    and under --ray the videos it holds complete."""

    done: dict = field(default_factory=dict)
    lines: int = 0
    bytes: int = 0
    complete: set = field(default_factory=set)


def _prior_output(out_path, model, sources, stride, top_k, force, resume, ray, reporter) -> _Prior:
    """Check the output (exists, --force, --resume) and read what an earlier run left in it."""
    from .outputs import check_output_path

    prior = _Prior()
    if out_path is None:
        return prior
    _orphans(out_path, resume, reporter)
    if ray is not None and out_path.exists() and not (force or resume):
        raise UsageProblem(f"{out_path} already exists", "add --resume to skip the videos it holds complete "
                                                         "and go on, or --force to start over")
    check_output_path(out_path, force or (resume and out_path.exists()), suffix=None)
    if ray is not None and done_file(out_path).is_dir():
        raise UsageProblem(f"{done_file(out_path)} is a folder, where --ray keeps the list of the videos "
                           f"{out_path.name} holds complete", "move the folder away, or give another -o")
    if resume and out_path.exists():
        prior.done, prior.lines, prior.bytes, strides, ks, names = read_progress(out_path)
        _check_resumed_options(out_path, model, strides, ks, stride, top_k, names)
        foreign = sorted(set(prior.done) - set(sources))
        if foreign:
            raise UsageProblem(f"{out_path} holds predictions of other sources ({', '.join(foreign[:3])})",
                               "resume with the same sources as the earlier run, or give another -o")
        if ray is not None:
            prior.complete = read_complete(out_path) & set(prior.done)
    if ray is not None and not resume:
        done_file(out_path).unlink(missing_ok=True)  # a stale record must not outlive its output
    return prior


def _start(model, device, ray, ray_actors, ray_streams, sources, complete, options, finished, reporter,
           with_latency=False):
    """(run, closer, device text, ray info): on Ray, in a worker process per device, or in this process.
    ``ray``: (address or None, kept service name or None)."""
    ray, keep = ray
    if ray is not None:
        return _ray_run(model, ray, device, ray_actors, ray_streams, sources, complete, options, finished, reporter,
                        with_latency, keep)
    devices = parse_devices(device) if ("," in device or device.endswith(":all")) else [pick_device(device)]
    if len(devices) > 1:  # one worker process (engine + pipeline) per device, sources shared out between them
        check_devices_can_run(model, devices)
        return _pool_run(model, devices, sources, options, with_latency, reporter)
    import engines
    from engines.video import classify

    engine = engines.open_engine(model, device=devices[0])
    return classify(sources, engine, events=True, **options), engine.close, ",".join(devices), {}


def _pool_run(model, devices, sources, options, with_latency, reporter):
    """A worker per device; the sources' containers are read (to share them out by the decoding they hold) while
    the workers start, and the workers format the JSON lines (the parent writes a block of them at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    from engines.video.workers import source_weights

    with ThreadPoolExecutor(1) as probe:
        weights = probe.submit(source_weights, sources, bool(options.get("live")))
        with reporter.phase(f"starting {len(devices)} workers ({', '.join(devices)})"):
            pool = WorkerPool(model, devices=devices)
        try:
            run = pool.classify(sources, events=True, lines="latency" if with_latency else "plain",
                                weights=weights.result(), **options)
        except BaseException:
            pool.close()
            raise
    return run, pool.close, ",".join(devices), {}


class _Lines:
    """Where the lines go: stdout (or ``stream``), or a temporary file beside ``-o`` that starts with the earlier
    run's complete lines (--resume), is fsync'd at least once a second, and is renamed onto ``-o`` at the end - or
    removed when there is nothing to keep (then ``out_path`` becomes None: no empty file blocks the next command).

    A run with live sources (``live``) writes ``-o`` itself instead, a whole line at a time, each flushed as it is
    written (fsync'd at least once a second): a camera's results can be read (``tail -F``) while the run goes on,
    which may be for months (docs/CONVENTIONS.md). A failed write cuts it after its last complete line."""

    def __init__(self, out_path, prior: _Prior, stream, with_latency: bool, live: bool = False):
        self.out_path, self.kept_bytes, self.with_latency = out_path, prior.bytes, with_latency
        self.live = live and out_path is not None
        self.tmp = None
        self.error: OSError | None = None  # the write that failed (-o only); the run stops at it
        self.kept_lines = 0  # after a failed write: the complete lines kept
        self.left: Path | None = None  # where the complete lines stayed when they could not be moved onto -o
        self.written = self.events = 0  # lines this run wrote; of them, events
        self.last_event: dict = {}  # live source -> its latest event
        self.outages: dict = {}  # live source -> disconnected events written
        self.last = dict(prior.done)  # source -> last frame in the output
        self.latencies: list = []
        self.synced = 0.0
        self.first_at = self.last_at = None  # wall-clock times of the first and the last prediction written
        if out_path is None:
            self.sink = stream or sys.stdout
            return
        self.tmp = out_path if self.live else out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
        self.sink = self.tmp.open("wb")
        left = prior.bytes
        if left:  # the earlier run's complete lines, in chunks (the file may be large)
            with out_path.open("rb") as old:
                while left:
                    chunk = old.read(min(left, 1 << 22))
                    self.sink.write(chunk)
                    left -= len(chunk)

    def write(self, item) -> bool:
        """One prediction or event as a whole line; True for a prediction."""
        frame = hasattr(item, "frame")
        # a worker may have formatted a prediction's line (pred.line); an event's .line() is its stderr sentence
        line = getattr(item, "line", None) if frame else None
        if not isinstance(line, str):
            line = json_line(item, self.with_latency)
        if not frame:  # kept before the line goes out: a stop signal may come as soon as it is read
            self.last_event[item.source] = item
            if item.event == "disconnected":
                self.outages[item.source] = self.outages.get(item.source, 0) + 1
        self._put(line)  # one whole line per call
        self.written += 1
        if not frame:  # a live source's event: a line of its own among the predictions, on disk at once (an
            self.events += 1  # outage has no predictions after it to flush it out)
            if self.tmp is None:
                self.sink.flush()
            else:
                self._sync()
            return False
        self.last[item.source] = item.frame
        if item.latency_ms is not None:
            self.latencies.append(item.latency_ms)
        self._written_one()
        return True

    def write_block(self, block) -> int:
        """A worker's block of predictions (:class:`engines.video.results.ResultBlock`, its lines formatted there)
        with one write of whole lines; returns how many."""
        text = "".join(block.lines if block.lines is not None else
                       (json_line(p, self.with_latency) for p in block.predictions()))
        self._put(text)
        self.written += len(block)
        for source, (_n, last) in block.per_source().items():
            self.last[source] = last
        if self.with_latency:
            self.latencies += [x for x in block.latency if x is not None]
        self._written_one()
        return len(block)

    def _put(self, text: str) -> None:
        if self.tmp is None:
            self.sink.write(text)
            return
        try:
            self.sink.write(text.encode())
            if self.live:  # readable at once: a whole line reaches the file with each write
                self.sink.flush()
        except OSError as exc:
            self.error = exc
            raise _WriteFailed from exc

    def _written_one(self) -> None:
        """After predictions were written: their times, and complete lines on disk at least once a second."""
        now = time.perf_counter()
        self.first_at = self.first_at or time.time()
        self.last_at = time.time()
        if self.tmp is not None and now - self.synced > 1.0:  # complete lines on disk in the temporary file
            self._sync()
            self.synced = now

    def _sync(self) -> None:
        """The temporary file's complete lines on disk; a failure stops the run as a failed write does."""
        try:
            self.sink.flush()
            os.fsync(self.sink.fileno())
        except OSError as exc:
            self.error = exc
            raise _WriteFailed from exc

    def close(self) -> None:
        if self.tmp is None:
            self.sink.flush()
            return
        if self.error is None:
            try:
                self.sink.flush()
                os.fsync(self.sink.fileno())
            except OSError as exc:
                self.error = exc
        if self.error is not None:
            self._keep_complete_lines()
            return
        self.sink.close()
        if self.written or self.kept_bytes:
            if not self.live:  # a live run wrote -o itself
                os.replace(self.tmp, self.out_path)
        else:
            self.tmp.unlink(missing_ok=True)
            self.out_path = None

    def _keep_complete_lines(self) -> None:
        """After a failed write: the temporary file cut after its last complete line (cutting needs no space),
        then moved onto -o; where even the rename fails, it stays where it is and ``left`` names it."""
        with contextlib.suppress(OSError):
            self.sink.close()  # its buffer cannot be written either: what is on disk is what there is
        with self.tmp.open("r+b") as f:
            size = f.seek(0, os.SEEK_END)
            end = size
            while end > 0:  # back to the last newline, a block at a time
                start = max(0, end - (1 << 16))
                f.seek(start)
                at = f.read(end - start).rfind(b"\n")
                if at >= 0:
                    end = start + at + 1
                    break
                end = start
            f.truncate(end)
            with contextlib.suppress(OSError):
                os.fsync(f.fileno())
        self.kept_lines = self._reread(end)
        if end == 0:
            self.tmp.unlink(missing_ok=True)
            self.out_path = None
            return
        if self.live:
            return
        try:
            os.replace(self.tmp, self.out_path)
        except OSError:
            self.left = self.tmp

    def _reread(self, end: int) -> int:
        """The complete lines kept, and each source's last frame among them (the summary's "last frame" and the
        next --resume must agree with the file, not with what was handed to the failed write)."""
        n = 0
        last: dict = {}
        with self.tmp.open("rb") as f:
            for raw in f:
                n += 1
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    d = json.loads(raw)
                    if "frame" in d:
                        last[str(d["source"])] = int(d["frame"])
        self.last = last
        return n


class _WriteFailed(Exception):
    """-o could not be written (``_Lines.error`` says why): the run stops, keeping every complete line."""


def _write_lines(run, lines: _Lines, reporter, sources, device, ray, complete, finished) -> bool:
    """Every prediction and event of ``run`` into ``lines`` under a progress bar; every complete line is kept also
    after a failure or Ctrl-C/SIGTERM. Returns whether the run was interrupted."""
    t0 = time.perf_counter()
    preds = run.blocks() if hasattr(run, "blocks") else iter(run)  # a pool's: a block of lines at a time
    interrupted = False
    try:
        with reporter.phase(f"classifying {len(sources)} source(s) on {device}",
                            total=len(sources) if ray is not None else None) as bar:
            shown, i = 0.0, 0
            if ray is not None:  # the bar counts videos: the skipped ones are done
                bar.advance(len(complete))
                getattr(run, "hooks", {})["done"] = lambda _s, _ok: bar.advance()
            for pred in preds:
                n = lines.write_block(pred) if isinstance(pred, ResultBlock) else lines.write(pred)
                if not n:
                    continue
                i += n
                if ray is None:
                    bar.advance(n)
                now = time.perf_counter()
                if now - shown > 0.5:
                    rate = f"{i / max(now - t0, 1e-9):.0f} fps"
                    bar.describe(f"{i} frames, {rate}" if ray is None else
                                 f"{len(finished) + len(complete)}/{len(sources)} videos, {i} frames, {rate}")
                    shown = now
            if run.problems and len({p.source for p in run.problems}) >= len(sources):
                bar.failed = "every source failed"
    except KeyboardInterrupt:
        interrupted = True
    except _WriteFailed:
        pass  # lines.error says why; close() keeps every complete line
    finally:
        preds.close()  # stops the decoder threads and fills in the run's statistics
        lines.close()
    return interrupted


def _summary(model, device, sources, run, lines: _Lines, prior: _Prior, interrupted, ray_info, live_sources):
    import numpy as np

    from ._signals import stop_signal

    stats = run.stats.to_dict()
    lat = {}
    if lines.latencies:
        a = np.asarray(lines.latencies)
        lat = {"p50": round(float(np.percentile(a, 50)), 2), "p99": round(float(np.percentile(a, 99)), 2),
               "max": round(float(a.max()), 2)}
    per_source = {s: stats["per_source"].get(s, 0) for s in sources}
    return RunSummary(model=str(model), device=device, decoder=stats.get("decoder") or "?", sources=sources,
                      frames=stats["frames"], batches=stats["batches"], seconds=stats["seconds"],
                      fps=stats["fps"], mean_batch=stats["mean_batch"], per_source=per_source,
                      # the frames of a source with a problem: all it gave, also those still in flight then
                      problems=[{"source": p.source, "reason": plain_reason(p.source, p.reason),
                                 "frames": per_source.get(p.source, p.frames)} for p in run.problems]
                      + _lost_at_stop(lines.last_event, run.problems, per_source)
                      + _damaged_live(live_sources, stats.get("damaged") or {}, lines.last_event, run.problems,
                                      per_source)
                      + _connecting_at_stop(live_sources if interrupted else [], stats.get("decoded") or {},
                                            lines.last_event, run.problems, stats["seconds"]),
                      output=str(lines.out_path) if lines.out_path else None, latency_ms=lat,
                      interrupted=interrupted, last_frame={s: lines.last.get(s) for s in sources},
                      resumed_lines=prior.lines, ray=_ray_summary(ray_info, run, prior.complete),
                      # frames dropped because inference lagged: a live source's; a file's frames are never
                      # dropped (those decoded when a run stops are simply not classified)
                      dropped={s: n for s, n in (stats.get("dropped") or {}).items() if s in live_sources},
                      missing=dict(stats.get("missing") or {}),
                      damaged=dict(stats.get("damaged") or {}), events=lines.events,
                      lagged=dict(stats.get("lagged") or {}), lag_s=dict(stats.get("lag_s") or {}),
                      cut=dict(stats.get("cut") or {}),
                      signal=stop_signal() if interrupted else None, live=live_sources,
                      write_error=None if lines.error is None else {
                          "reason": lines.error.strerror or type(lines.error).__name__,
                          "lines": lines.kept_lines, "left": str(lines.left) if lines.left else None})


def _by_source(summary: "RunSummary", outages: dict, decoded: dict) -> dict:
    """The summary's counts, one entry per source (what ``--summary`` holds for each camera or file)."""
    problems = {p["source"]: p["reason"] for p in summary.problems}
    out = {}
    for src in summary.sources:
        status = problems.get(src) or ("interrupted" if summary.interrupted else "ok")
        if status.startswith(f"{src}: auth_failed:"):  # the server refused the credentials or the client: its own
            status = "auth_failed"  # status (the reason is in problems)
        out[src] = {"received": decoded.get(src), "classified": summary.per_source.get(src, 0),
                    "dropped": {"queue": summary.dropped.get(src, 0), "lag": summary.lagged.get(src, 0),
                                "cut": summary.cut.get(src, 0)},
                    "missing": summary.missing.get(src, 0), "damaged": summary.damaged.get(src, 0),
                    "lag_s": summary.lag_s.get(src, {}), "outages": outages.get(src, 0), "status": status}
    return out


def _lost_at_stop(last_event: dict, problems, per_source: dict) -> list[dict]:
    """The live sources without frames when the run ended (their latest event a ``disconnected`` or a
    ``connect_failed``, not yet given up): problems too, whatever ended the run (a stop signal included)."""
    reported = {p.source for p in problems}
    out = []
    for source, ev in last_event.items():
        if source in reported or ev.event not in ("disconnected", "connect_failed"):
            continue
        without = time.time() - ev.received + (ev.outage_s or 0.0)
        what = "never connected" if ev.event == "connect_failed" else "lost"
        out.append({"source": source, "frames": per_source.get(source, ev.frames),
                    "reason": f"{what}: {ev.reason}; no frame for {without:.1f} s when the run ended"})
    return out


def _connecting_at_stop(live_sources, decoded: dict, last_event: dict, problems, seconds: float) -> list[dict]:
    """The live sources still in their first connection attempt when a stop signal ended the run (no frame, no
    event yet): problems, "never connected", as those that had failed an attempt already."""
    reported = {p.source for p in problems} | set(last_event)
    return [{"source": s, "frames": 0,
             "reason": f"never connected: no frame in the {seconds:.1f} s before the run ended (still connecting)"}
            for s in live_sources if not decoded.get(s) and s not in reported]


def _damaged_live(live_sources, damaged: dict, last_event: dict, problems, per_source: dict) -> list[dict]:
    """The live sources that lost frames or packets to damage in the stream (said while the run went on by
    ``damaged`` events) and have no other problem: problems too, with the count."""
    reported = {p.source for p in problems} | {s for s, ev in last_event.items()
                                               if ev.event in ("disconnected", "connect_failed")}
    return [{"source": s, "frames": per_source.get(s, 0),
             "reason": f"damaged: {damaged[s]} frame(s) or packet(s) of the stream could not be decoded (not "
                       "classified; see the damaged events)"}
            for s in live_sources if damaged.get(s) and s not in reported]


def _timing(started_at: float, ready_at: float, lines: _Lines) -> dict:
    """When things happened, in seconds from the start of run_video (what the frames/s span leaves out)."""
    def since(t):
        return round(t - started_at, 3) if t is not None else None

    return {"started_at": round(started_at, 3), "ready_s": since(ready_at), "first_result_s": since(lines.first_at),
            "last_result_s": since(lines.last_at)}


def _orphans(out_path: Path, resume: bool, reporter) -> None:
    """Temporary files of an earlier run on the same output that was killed (SIGKILL, a power loss) before it could
    rename its file into place: ``.NAME.PID.tmp`` whose process is gone. With --resume and no output yet, the
    newest one becomes the output (its complete lines are kept; the last, cut line is dropped on resume); any
    other is named in a warning, with what to do. A file of a run still going is left alone."""
    import glob
    import logging

    log = logging.getLogger("trtc")
    found = []
    for f in glob.glob(os.path.join(glob.escape(str(out_path.parent)), f".{glob.escape(out_path.name)}.*.tmp")):
        pid = f.rsplit(".", 2)[-2]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        found.append(Path(f))
    if not found:
        return
    found.sort(key=lambda p: p.stat().st_mtime)
    if resume and not out_path.exists():
        newest = found.pop()
        os.replace(newest, out_path)
        log.warning("%s: resuming from %s, left by an earlier run that could not finish the file (killed, or its "
                    "disk was full)",
                    out_path, newest.name)
    for f in found:
        log.warning("%s was left by an earlier trtc run on %s that did not finish it (killed, or its disk was full; "
                    "%d bytes); it is not used: delete it, or rename it to %s and add --resume to continue from it",
                    f, out_path.name, f.stat().st_size, out_path.name)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def check_devices_can_run(model, devices: list[str]) -> None:
    """A plan is tied to its GPU: refuse the devices whose GPU the manifest rules out, naming those that can run it
    (ONNX models run anywhere)."""
    from engines._gpu import cuda_gpus, gpus
    from engines.manifest import read_manifest_if_any

    manifest = read_manifest_if_any(model, verify_hash=False)
    if manifest is None or manifest.kind != "plan":
        return
    from engines.tensorrt_engine import plan_problems

    found = cuda_gpus(gpus()["devices"])  # cuda:N as this process numbers them
    built_on = dict((manifest.builder or {}).get("gpu") or {})
    # what the manifest says about the runtime is the same for every device: keep only what differs by GPU
    common = set(plan_problems(manifest, None, built_on or None))

    def gpu_problems(gpu):
        return sorted(set(plan_problems(manifest, None, gpu)) - common)

    bad = []
    for d in devices:
        index = int(d[5:]) if d.startswith("cuda:") else None
        gpu = found[index] if index is not None and index < len(found) else None
        why = ["a TensorRT plan runs on a GPU"] if index is None else gpu_problems(gpu)
        if why:
            bad.append(f"{d}: {why[0]}")
    if bad:
        able = [f"cuda:{i}" for i, g in enumerate(found) if not gpu_problems(g)]
        raise UsageProblem(f"{Path(model).name} cannot run on {bad[0]}",
                           f"use the devices that can run it: {','.join(able)}" if able else
                           "rebuild the plan on this machine's GPUs with trtc build")


# ------------------------------------------------------------------------------------------------------ --ray


def is_ray_address(text: str) -> bool:
    """"local", "auto", "ray://HOST:PORT" or "HOST:PORT", HOST also "[IPv6]" (what ``--ray`` takes; anything else is
    a source)."""
    import re

    return bool(re.fullmatch(r"local|auto|ray://\S+|([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):\d{1,5}", text))


def batch_sources(sources: list[str]) -> list[str]:
    """A folder -> its video files (by suffix, recursively, sorted); ``@list.txt`` -> one source a line (blank
    lines and lines starting with # skipped; relative paths are relative to the list's folder); anything else
    (a file, a URL) as it is. Duplicates are refused: results are keyed by source."""
    out: list[str] = []
    for s in sources:
        if s.startswith("@"):
            path = Path(s[1:])
            if path.is_dir():
                raise UsageProblem(f"@{path} is a folder, not a list of sources",
                                   f"give the folder without @ ({path}), or @FILE with one video path or URL a line")
            if not path.is_file():
                raise UsageProblem(f"list of sources {path} not found", "give @FILE with one video path or URL a line")
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise UsageProblem(f"@{path} is not a text file (a list of sources has one video path or URL a line)",
                                   f"give the video itself without @ ({path})" if path.suffix.lower() in VIDEO_SUFFIXES
                                   else "give @FILE with one video path or URL a line") from None
            except OSError as exc:
                raise UsageProblem(f"cannot read the list of sources {path}: {exc.strerror or exc}",
                                   "give @FILE with one video path or URL a line") from None
            for line in text.splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    out.append(line if "://" in line or os.path.isabs(line) else str(path.parent / line))
        elif "://" not in s and Path(s).is_dir():
            found = sorted(str(p) for p in Path(s).rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES and p.is_file())
            if not found:
                raise UsageProblem(f"folder {s} holds no video file ({', '.join(sorted(VIDEO_SUFFIXES)[:6])}, ...)",
                                   "give a folder of videos, or the videos themselves")
            out += found
        else:
            out.append(s)
    seen: set = set()
    twice = [s for s in out if s in seen or seen.add(s)]
    if twice:
        raise UsageProblem(f"{twice[0]} is listed twice", "give each video once")
    return out


def _refuse_writing_over_inputs(out_path: Path, model, sources: list[str]) -> None:
    """-o naming the model, its manifest or one of the videos would destroy an input: refused even with --force."""
    from engines import split_engine
    from engines.manifest import manifest_path

    model_path = Path(split_engine(os.fspath(model))[1])
    inputs = [(model_path, "the model"), (manifest_path(model_path), "the model's manifest")]
    inputs += [(Path(s), "a source video") for s in sources if "://" not in url_of(s)]
    target = out_path.resolve()
    for path, what in inputs:
        if path.exists() and path.resolve() == target:
            raise UsageProblem(f"-o {out_path} is {what}: the predictions would be written over it",
                               "give -o another file, e.g. preds.jsonl")


def _no_batch(sources: list[str], model) -> list[str]:
    """The sources, a folder of images given as its images (sorted), each checked here (exit 2) when wrong."""
    from engines.video.image_source import is_image

    out = []
    for s in sources:
        if "://" in url_of(s):  # a network source (NAME=URL too)
            out.append(s)
            continue
        if not s.startswith("@") and Path(s).is_dir():
            out.extend(_folder_images(s))
            continue
        if s.startswith("@"):
            raise UsageProblem(f"{s} is a list of videos (a batch)",
                               "run batches with --ray (a local Ray instance by default; pip install 'trtc[ray]')")
        if os.path.exists(s) and os.path.isfile(s) and not is_image(s):
            _refuse_non_video(s)
        out.append(s)  # a missing or empty file among others is a bad source: the run reports it (exit 1)
    _refuse_nothing_to_read(out)
    seen: set = set()
    twice = [s for s in out if s in seen or seen.add(s)]
    if twice:  # its lines could not be told apart: results are keyed by source and frame
        raise UsageProblem(f"{twice[0]} is listed twice", "give each source once; --loop N reads each one N times")
    return out


def _refuse_non_model(model) -> None:
    """--model naming a file that is plainly no model (a text file, a video, an image): exit 2, said for what it
    is, before any engine is tried."""
    from engines import split_engine

    from .model_source import _WHAT, sniff

    path = Path(split_engine(os.fspath(model))[1])
    if not path.is_file():
        return
    kind = sniff(path)
    if kind in ("onnx", "plan", "torchscript", "exported", "unknown") or kind not in _WHAT:
        return
    if kind == "empty" and path.suffix.lower() in (".onnx", ".pt2", *PLAN_SUFFIXES):
        return  # a model file cut to nothing: a damaged model, said when it is opened
    raise UsageProblem(f"{path} {_WHAT[kind]}", "give --model an .onnx, a .plan or a .pt2 (make one with: trtc "
                       "export pretrained:efficientnet-lite0 -o lite0.onnx)")


# what a file that is plainly no video is (model_source.sniff's kinds), in words
_NOT_VIDEO = {"text": "a text file", "image": "an image", "numpy": "NumPy data", "json": "a JSON file",
              "manifest": "a trtc manifest (JSON)", "onnx": "an ONNX model", "plan": "a TensorRT plan",
              "checkpoint": "PyTorch weights", "torchscript": "a TorchScript model",
              "exported": "a torch.export program", "zip": "a zip archive", "empty": "an empty file (0 bytes)"}


def _refuse_nothing_to_read(sources: list[str]) -> None:
    """When every source named is a missing or empty local file there is nothing to run: exit 2 before the model
    opens, naming the first. Among readable sources they are bad sources, reported by the run (exit 1)."""
    def bad(s):
        return "://" not in url_of(s) and (not os.path.exists(s) or (os.path.isfile(s) and os.path.getsize(s) == 0))

    if not sources or not all(bad(s) for s in sources):
        return
    s = sources[0]
    if not os.path.exists(s):
        raise UsageProblem(f"no such file: {s}", f"check the path (ls {os.path.dirname(s) or '.'})")
    raise UsageProblem(f"{s} is an empty file (0 bytes), not a video",
                       "give a video file or a camera URL (rtsp://...); trtc data copies a sample video "
                       "(trtc-data/bikes.mp4)")


def _refuse_non_video(s: str) -> None:
    """A source file that is plainly no video (a text file, a model, an image) is a mistake on the command line
    (exit 2), said for what it is; a damaged or cut-off video is a bad source, reported by the run (exit 1)."""
    from .model_source import sniff

    kind = sniff(Path(s))
    if Path(s).suffix.lower() in VIDEO_SUFFIXES and kind in ("text", "unknown", "json"):
        return  # a video name over unreadable bytes: a damaged video, judged by the decoder
    if kind == "empty":
        return  # among other sources, a bad source the run reports; alone, _refuse_nothing_to_read says so
    if kind in _NOT_VIDEO:
        where = (" (--model takes models)" if kind in ("onnx", "plan", "torchscript", "exported") else
                 " (an image source needs an image suffix: .jpg, .png, .tif, ...)" if kind == "image" else "")
        raise UsageProblem(f"{s} is {_NOT_VIDEO[kind]}, not a video{where}",
                           "give a video file or a camera URL (rtsp://...); trtc data copies a sample video "
                           "(trtc-data/bikes.mp4)")


def plain_reason(source: str, reason: str) -> str:
    """A source's problem in the user's words: no "[Errno 1094995529]" (FFmpeg's error number), and the file's
    own name where the fix said FILE."""
    import re

    reason = re.sub(r"\[Errno -?\d+\] ", "", reason)
    return reason.replace("ffprobe FILE", f"ffprobe {shlex.quote(source)}")


def _folder_images(s: str) -> list[str]:
    """A folder given as a source without --ray: its images (recursive, sorted, each a source named by its path);
    a folder of videos (a batch: --ray) or of nothing of use is refused, said for what it holds."""
    from engines.preprocess import list_images

    if any(os.path.splitext(f)[1].lower() in VIDEO_SUFFIXES for f in os.listdir(s)):
        raise UsageProblem(f"{s} is a folder of videos (a batch)", f"give the videos one by one (trtc run "
                           f"{os.path.join(s, '*.mp4')} ...), or run the folder as a batch with --ray (a local Ray "
                           "instance by default; pip install 'trtc[ray]')")
    images = [str(p) for p in list_images(s)]
    if not images:
        raise UsageProblem(f"{s} is a folder with no video or image in it",
                           "give a video file, a camera URL (rtsp://...), images or a folder of images")
    return images


def done_file(out_path: Path) -> Path:
    """Beside ``-o`` under --ray: the videos the output holds complete, one a line, rewritten atomically at the end."""
    return out_path.with_name(out_path.name + ".done")


def read_complete(out_path: Path) -> set:
    f = done_file(out_path)
    try:
        return set(f.read_text(encoding="utf-8").splitlines()) - {""} if f.exists() else set()
    except UnicodeDecodeError:
        raise UsageProblem(f"{f} is not the list of complete videos trtc run --ray writes (not text)",
                           f"delete it to resume from {out_path.name} alone, or give another -o") from None


def _ray_run(model, address, device, actors, streams, sources, complete, options, finished, reporter,
             with_latency=False, keep=None):
    from engines.video import RunStats, VideoRun
    from engines.video.ray_cluster import RayPool

    todo = [s for s in sources if s not in complete]
    info = {"address": address, "sources": len(sources), "skipped": len(complete)}
    if keep is not None:
        info["service"] = {"name": keep}
    if not todo:  # everything is in the output already: start nothing
        return (VideoRun(lambda: (p for p in ()), RunStats(path="ray: nothing left to do"), []), (lambda: None),
                f"ray ({address})", info)
    if not Path(model).is_file():
        raise UsageProblem(f"model not found: {model}", "the model must be here, and at the same path on every node")
    what = f"kept service {keep!r}, " if keep is not None else ""
    with reporter.phase(f"starting Ray actors ({what}{address})"):
        pool = RayPool(model, address=address, device=device, actors=actors, streams=streams, keep=keep,
                       batch=options.get("batch"))
    info["actors"] = [a.name for a in pool.actors if a.alive]
    info["start_errors"] = list(pool.start_errors)
    info["startup"] = dict(pool.startup)  # import ray, connect (start or join), actors ready, engine open in each
    info["pool"] = pool  # for the phases once the run ends (taken out of the summary)
    if keep is not None:
        info["service"]["warm"] = pool.warm
    hooks = {"done": lambda _s, _ok: None}  # run_video points it at its progress bar

    def ended(source, ok):
        finished.append((source, ok))
        hooks["done"](source, ok)

    run = pool.classify(todo, on_source_done=ended, events=True, lines="latency" if with_latency else "plain",
                        **options)
    run.hooks = hooks
    return run, pool.close, f"ray ({address}): {len(info['actors'])} {pool.kind} actor(s)", info


def _ray_summary(info: dict, run, complete: set) -> dict:
    if not info:
        return {}
    info = dict(info)
    pool = info.pop("pool", None)
    if pool is not None:  # seconds from the process's start: connect, placement, engine_open (cold), first batch...
        info["startup"] = dict(info["startup"], phases=pool.phases(run))
    return dict(info, failures=list(getattr(run, "failures", [])), retried=list(getattr(run, "retried", [])),
                placement=dict(getattr(run, "placement", {})))


def stop_ray_service(address: str, name: str) -> dict:
    """End the kept Ray engine service ``name`` (``trtc run --ray-keep NAME``) on the cluster at ``address``:
    {"name", "actors" (how many were stopped), "held" (its model and options in words)}."""
    from engines.video.ray_cluster import stop_service

    return stop_service(name, address)
