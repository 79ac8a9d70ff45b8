"""Classify video frames: decode -> preprocess -> batch -> engine -> top-k, for many sources at once.

GPU path (engine on ``cuda:N``, PyNvVideoCodec and CuPy installed): :mod:`engines.video.gpu_pipeline`. A thread
per source decodes with NVDEC (files: PyNvVideoCodec's SimpleDecoder, up to 8 frames at a time; live or
low-latency sources: the packet loop) and writes each group of frames with ONE preprocessing kernel into a run of
slots of a rotating input buffer (:mod:`engines.video.assembler`); one inference thread runs full buffers and
top-k on the GPU; the caller's thread copies only (batch, k) results to the host. No frame crosses between host
and device, and no stage waits on the host for another in steady state.

CPU path (engine on the CPU, or no NVDEC): :mod:`engines.video.cpu_pipeline`. PyAV decodes each source in a thread,
the numpy reference of the same preprocessing maths (:func:`engines.preprocess.preprocess_yuv`) fills host batches,
ONNX Runtime's CPU provider runs them. Same outputs within float tolerance.

Results carry the source, frame index (display order, counting every decoded frame), timestamp and top-k. A
source that fails (cannot be opened, unsupported by NVDEC, corrupt, cut off) is reported in ``run.problems`` and
the others go on; every result already computed is still yielded.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._gpu import device as gpu_device
from ..errors import TrtcError, UsageProblem
from ..manifest import CLASSIFIER_FIX, classes_of, not_a_classifier
from ..preprocess import PreprocessSpec
from ..topk import TopK, resolve_k
from .live import LiveOptions
from .image_source import is_image
from .orientation import check_rotate
from .sources import make_sources

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
    device: str | None = None  # the device that classified it, when a WorkerPool spread sources over several
    received: float | None = None  # wall-clock time (Unix seconds) the frame came out of the decoder

    def to_dict(self, latency: bool = False) -> dict:
        d = {"source": self.source, "frame": self.frame, "pts": self.pts, "time": _finite(self.time, 6),
             "received": _finite(self.received, 3),
             "top_k": [{"index": int(i), "label": (self.labels[n] if self.labels else None), "score": round(float(s), 6)}
                       for n, (i, s) in enumerate(zip(self.indices, self.scores, strict=True))]}
        if self.device is not None:
            d["device"] = self.device
        if latency and self.latency_ms is not None:
            d["latency_ms"] = _finite(self.latency_ms, 3)
            d["decode_ms"] = _finite(self.decode_ms, 3)
        return d


def _finite(x, digits: int):
    """``x`` rounded, or None when it is missing or not a finite number (JSON has no NaN)."""
    if x is None:
        return None
    x = float(x)
    return round(x, digits) if math.isfinite(x) else None


@dataclass
class SourceProblem:
    source: str
    reason: str
    frames: int  # frames classified from this source before the problem

    def __str__(self) -> str:
        return f"{self.reason} (after {self.frames} frames)"


class LagFigures(dict):
    """A worker's lag figures for one source (p50, p99, max, frames), kept as they came."""

    def to_dict(self) -> dict:
        return dict(self)


BATCH_SIZES_KEPT = 100_000  # batch sizes a run keeps for its mean (the first ones)
EVENTS_KEPT = 1000  # live sources' events a run keeps in ``run.events`` (the last ones; every one is also yielded)


@dataclass
class RunStats:
    frames: int = 0
    batches: int = 0
    seconds: float = 0.0
    per_source: dict = field(default_factory=dict)
    path: str = ""
    batch_sizes: list = field(default_factory=list)
    decoded: dict = field(default_factory=dict)  # frames each source's decoder produced (before the stride)
    infer_stage: dict = field(default_factory=dict)  # GPU path: the inference thread's host seconds, by activity
    decode_stage: dict = field(default_factory=dict)  # GPU path: the decoder threads' seconds, summed, by activity
    decoder: str = ""  # nvdec or pyav; a pool's stats: those its workers or actors used, e.g. "nvdec,pyav"
    dropped: dict = field(default_factory=dict)  # live sources: frames dropped because inference lagged (policy)
    missing: dict = field(default_factory=dict)  # live sources: frames the stream's timestamps say never arrived
    damaged: dict = field(default_factory=dict)  # frames or packets the decoder could not read (not classified)
    lagged: dict = field(default_factory=dict)  # live sources: frames skipped because they were past --max-lag
    cut: dict = field(default_factory=dict)  # live sources: frames made up from data trtc's read timeout cut short
    lag: dict = field(default_factory=dict)  # live sources: LagStats of capture -> result
    rotation: dict = field(default_factory=dict)  # how each source's frames were turned to be shown

    def for_pool(self) -> dict:
        """What a worker process or Ray actor sends back at the end of a job: :meth:`to_dict` with the batch sizes,
        for :meth:`merge_from` on the pool's side."""
        return {**self.to_dict(), "batch_sizes": list(self.batch_sizes)}

    def merge_from(self, other: dict, names: dict | None = None) -> None:
        """Add a worker's or actor's :meth:`for_pool` to these pool-wide stats; ``names`` maps the source names it
        used back to the caller's."""
        names = names or {}
        self.batches += int(other.get("batches", 0))
        self.batch_sizes += other.get("batch_sizes") or []
        used = {d for d in (self.decoder.split(",") if self.decoder else []) + [other.get("decoder") or ""] if d}
        self.decoder = ",".join(sorted(used))
        for field_name in ("decoded", "dropped", "missing", "damaged", "lagged", "cut"):
            mine = getattr(self, field_name)
            for k, v in (other.get(field_name) or {}).items():
                k = names.get(k, k)
                mine[k] = mine.get(k, 0) + v
        for k, v in (other.get("rotation") or {}).items():
            self.rotation[names.get(k, k)] = v
        for k, v in (other.get("lag_s") or {}).items():  # a source runs in one worker at a time: its figures whole
            if v:
                self.lag[names.get(k, k)] = LagFigures(v)

    def add_source(self, src, dropped: int = 0) -> None:
        """Add what a source's decoder counted (decoded, and the live/damage counts ``missing`` and ``damaged``) and
        the frames the pipeline ``dropped`` of it, keyed by its name."""
        self.decoded[src.name] = self.decoded.get(src.name, 0) + src.decoded
        rotation = getattr(getattr(src, "info", None), "rotation", None)
        if rotation is not None:
            self.rotation[src.name] = rotation
        for field_name, n in (("dropped", dropped), ("missing", getattr(src, "missing", 0)),
                              ("damaged", getattr(src, "damaged", 0)), ("lagged", getattr(src, "lagged", 0)),
                              ("cut", getattr(src, "cut", 0))):
            if n:
                d = getattr(self, field_name)
                d[src.name] = d.get(src.name, 0) + n

    def note_batch(self, size: int) -> None:
        """One more batch of ``size`` frames; the sizes of the first BATCH_SIZES_KEPT are kept (a live run of months
        keeps counts, not a list that grows by one a batch)."""
        self.batches += 1
        if len(self.batch_sizes) < BATCH_SIZES_KEPT:
            self.batch_sizes.append(size)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        mean_batch = float(np.mean(self.batch_sizes)) if self.batch_sizes else 0.0
        return {"frames": self.frames, "batches": self.batches, "seconds": round(self.seconds, 3),
                "fps": round(self.fps, 1), "mean_batch": round(mean_batch, 2), "path": self.path,
                "decoder": self.decoder,
                "per_source": self.per_source, "decoded": self.decoded, "dropped": self.dropped,
                "missing": self.missing, "damaged": self.damaged, "lagged": self.lagged, "cut": self.cut,
                "rotation": self.rotation,
                "lag_s": {k: v.to_dict() for k, v in self.lag.items()},
                "infer_stage": {k: round(v, 3) for k, v in self.infer_stage.items()},
                "decode_stage": {k: round(v, 3) for k, v in self.decode_stage.items()}}


class VideoRun:
    """Iterate for :class:`Prediction` objects; afterwards ``problems``, ``stats`` and ``ok`` say how it went."""

    def __init__(self, gen_factory, stats: RunStats, problems: list, events: list | None = None):
        self._factory = gen_factory
        self.stats = stats
        self.problems: list[SourceProblem] = problems
        # live sources' SourceEvents, in order: the last EVENTS_KEPT of them
        self.events = events if events is not None else deque(maxlen=EVENTS_KEPT)
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


def classify(sources, engine, *, batch: int | None = None, top_k: int | None = None, stride: int = 1, scores: str = "auto",
             preprocess: PreprocessSpec | None = None, labels: list[str] | None = None, decoder: str = "auto",
             colorspace: str | None = None, buffers: int | None = None, max_wait_ms: float = 100.0, loop: int = 1,
             realtime: bool = False, latency: str = "native", done: dict | None = None, live: bool | None = None,
             live_options: LiveOptions | None = None, events: bool = False, rotate: str | int = "auto") -> VideoRun:
    """Classify every ``stride``-th frame of each source with ``engine`` (from :func:`engines.open_engine`).

    ``top_k``: classes per frame, by default min(5, the model's classes); more than the model has is refused.
    ``decoder``: "nvdec" (GPU; needs a CUDA engine), "pyav" (CPU), or "auto" (NVDEC when the engine is on a GPU).
    ``batch``: frames per inference (default: the manifest's optimum, capped at 64). ``max_wait_ms``: how long a
    partly filled batch waits for more frames before it runs anyway. ``buffers``: GPU input buffers that rotate
    (default: enough for every source to hand over 16 frames one and a half times over, at least 4). ``loop``:
    read each source this many times.
    ``realtime``: feed packets at the stream's frame rate (to measure latency as a live camera would see it).
    ``latency``: NVDEC output latency, "native" (display order, a few frames of lag) or "low" (no lag; only for
    streams without B-frames). Preprocessing and labels default to the model's manifest. ``done``: {source: last
    frame index already classified} (a resumed run): those frames are decoded again but not classified.

    Live sources (:mod:`engines.video.live`): network URLs, or every source with ``live=True`` (``live=False``
    reads URLs as files). ``live_options`` (:class:`~engines.video.live.LiveOptions`): transport, timeouts,
    reconnection and the policy for frames inference cannot take yet (drop-oldest or block). ``events``: the
    iterator also yields each live source's :class:`~engines.video.live.SourceEvent` (disconnected, reconnected,
    gave_up) in order with the predictions; they are always in ``run.events`` too.

    ``rotate``: "auto" turns each frame as the stream's display matrix (rotation metadata) says; 0, 90, 180 or 270
    turns it clockwise by that instead (:mod:`engines.video.orientation`); ``run.stats.rotation`` says, per source,
    what was applied. The CPU path (PyAV) turns each decoded frame; the GPU path (NVDEC) turns it inside the
    preprocessing kernel, in the same pass (a file's matrix is read from its first frame; a live URL is not turned
    by metadata there, only by a number).
    """
    sources = _check_arguments(sources, stride, buffers, max_wait_ms, colorspace)
    rotate = check_rotate(rotate)
    check_classifier(engine)
    live_options = (live_options or LiveOptions()).check()
    manifest = _manifest_of(engine)
    spec = model_spec(engine, manifest, preprocess)
    labels = labels if labels is not None else (manifest.labels if manifest is not None else None)
    batch = batch or _default_batch(engine, manifest)
    _check_batch(engine, manifest, batch)
    topk = TopK(resolve_k(top_k, model_classes(engine, manifest), model_name(engine)), scores)
    if buffers is None:
        # every source can hand over a group of up to 16 frames (one kernel launch) one and a half times over
        # without waiting for inference: 4 buffers of 64 made 32 sources wait for slots 18% of their time (H200)
        buffers = max(4, -(-len(sources) * 16 * 3 // (2 * batch)))
    decoder = _images_on_the_cpu(decoder, _pick_decoder(engine, decoder), sources, engine)
    _cpu_only(decoder, sources, rotate)
    _announce(engine, batch, "device" if decoder == "nvdec" else "host")  # before the decoder's imports: they overlap
    _require_decoder(decoder)
    srcs = make_sources(sources, decoder, getattr(engine, "device_id", 0), colorspace, loop, realtime, latency, live,
                        live_options, rotate)
    if any(s.live for s in srcs) and done:
        raise UsageProblem("a live source cannot be resumed: its frames are not the ones of the earlier run",
                           "start a new output for live sources")
    size = _input_shape(engine, spec, "the preprocess argument" if preprocess is not None else
                        ("manifest" if manifest is not None else None))
    return _start(srcs, engine, decoder, spec, batch, stride, topk, labels, buffers, max_wait_ms, size,
                  {str(k): int(v) for k, v in (done or {}).items()}, live_options, events)


def _check_arguments(sources, stride, buffers, max_wait_ms, colorspace) -> list[str]:
    """The caller's arguments that need no engine: refused here, once, before any source starts."""
    if isinstance(sources, (str, bytes)) or not hasattr(sources, "__iter__"):
        sources = [sources]
    sources = [s if isinstance(s, str) else str(s) for s in sources]  # an Address keeps its url
    if not sources:
        raise UsageProblem("no video sources given")
    if stride < 1:
        raise UsageProblem(f"--stride must be at least 1, got {stride}")
    if buffers is not None and buffers < 2:
        raise UsageProblem(f"at least two input buffers are needed (got {buffers})")
    if not 0 <= max_wait_ms <= 3_600_000:  # also refuses nan
        raise UsageProblem(f"--max-wait-ms must be between 0 and 3600000 (an hour), got {max_wait_ms}",
                           "e.g. --max-wait-ms 100")
    if colorspace and colorspace != "auto":
        from ..preprocess import ColorSpace

        ColorSpace.parse(colorspace)  # a bad name is the caller's mistake, said once, not a problem of each source
    return sources


def _images_on_the_cpu(asked: str, decoder: str, sources, engine) -> str:
    """The decoder for a run with image sources: where NVDEC was only picked by default (``asked`` "auto"), images
    make it PyAV's (they are read and preprocessed on the host; inference stays on the engine's device), and a
    video among them is decoded there too, which is said; an explicit nvdec is refused by :func:`_cpu_only`."""
    images = [s for s in sources if is_image(s)]
    if asked != "auto" or decoder != "nvdec" or not images:
        return decoder
    videos = len(sources) - len(images)
    device = getattr(engine, "device", "the GPU")
    if videos:
        log.warning("images are read on the CPU, so this run's %d video source(s) are decoded there too (PyAV), "
                    "not by NVDEC; inference stays on %s. Run the videos apart to decode them on the GPU.",
                    videos, device)
    else:
        log.info("images are read and preprocessed on the CPU; inference runs on %s", device)
    return "pyav"


def _cpu_only(decoder: str, sources, rotate: str) -> None:
    """What NVDEC cannot read, refused where it was asked for by name: image sources (by default a run with images
    reads them on the CPU: :func:`_images_on_the_cpu`). (``rotate`` is applied on both paths: the GPU path's
    preprocessing kernel turns NVDEC's frames.)"""
    if decoder == "nvdec" and any(is_image(s) for s in sources):
        raise UsageProblem(f"{next(s for s in sources if is_image(s))} is an image: images are read and preprocessed "
                           "on the CPU (NVDEC decodes video only)", "leave --decoder out (or --decoder pyav): the "
                           "inference still runs on the GPU")


def _pick_decoder(engine, decoder: str) -> str:
    """"nvdec" or "pyav" for this engine (``decoder``: auto, nvdec or pyav); its packages: _require_decoder."""
    on_gpu = str(getattr(engine, "device", "cpu")).startswith("cuda")
    host_only = getattr(engine, "host_arrays_only", False)  # OpenCV dnn on CUDA: numpy in, numpy out
    if decoder == "auto":
        decoder = "nvdec" if on_gpu and not host_only else "pyav"
    if decoder == "nvdec" and host_only:
        raise UsageProblem(f"{type(engine).__name__} takes host arrays, so NVDEC's device frames cannot feed it",
                           "use decoder='pyav' (--decoder pyav)")
    if decoder not in ("nvdec", "pyav"):
        raise UsageProblem(f"unknown decoder {decoder!r}", "use auto, nvdec or pyav")
    if decoder == "nvdec" and not on_gpu:
        raise UsageProblem("NVDEC decoding feeds a GPU engine, but this engine runs on the CPU",
                           "open the model with device='cuda:0', or use decoder='pyav'")
    return decoder


def _require_decoder(decoder: str) -> None:
    """Import the packages ``decoder`` needs (a missing one is said with its install line)."""
    from .._deps import require

    if decoder == "nvdec":
        require("cupy", "The GPU video pipeline")
        require("PyNvVideoCodec", "Decoding video on the GPU")
    else:
        require("av", "Decoding video on the CPU")


def _start(srcs, engine, decoder, spec, batch, stride, topk, labels, buffers, max_wait_ms, size, done, live_options,
           events) -> VideoRun:
    """The VideoRun whose iteration runs the GPU or the CPU pipeline over ``srcs``."""
    stats = RunStats(path=f"{decoder} -> {type(engine).__name__} ({getattr(engine, 'device', 'cpu')})",
                     decoder=decoder)
    problems: list[SourceProblem] = []
    lock = threading.Lock()

    def report_problem(source, reason, frames):
        _problem(problems, lock, source, reason, frames)

    def make_prediction(name, index, pts, t, indices, scores, latency_ms, decode_ms, received=None):
        return Prediction(name, index, pts, t, indices, scores, label_names(labels, indices), latency_ms, decode_ms,
                          received=received)

    event_log: deque = deque(maxlen=EVENTS_KEPT)

    if decoder == "nvdec":
        from .gpu_pipeline import GpuPipeline

        def factory():
            return GpuPipeline(srcs, engine, spec, batch, stride, topk, labels, buffers, max_wait_ms, stats,
                               problems, size, report_problem, make_prediction, done, live_options.policy,
                               event_log, events).run()
    else:
        from .cpu_pipeline import cpu_pipeline

        def factory():
            return cpu_pipeline(srcs, engine, spec, batch, stride, topk, max_wait_ms, stats, report_problem,
                                make_prediction, done, live_options.policy, live_options.queue_frames, event_log,
                                events)
    return VideoRun(factory, stats, problems, event_log)


def model_name(engine) -> str:
    """The model file's name (for messages), or the engine's kind where it has no file."""
    path = getattr(engine, "path", None)
    return Path(str(path)).name if path else type(engine).__name__


def model_classes(engine, manifest) -> int | None:
    """The class count: the engine's first output (batch, classes), else the manifest's, else None (unknown)."""
    return classes_of(getattr(engine, "outputs", None)) or (classes_of(manifest.outputs) if manifest else None)


def check_classifier(engine) -> None:
    """Only classifiers run: a model whose first output is not (batch, classes) (a detector's boxes, a segmenter's
    map, [N, C, 1, 1]) is refused with the message ``trtc export`` gives when adopting it, manifest or not."""
    outputs = getattr(engine, "outputs", None)
    if not outputs:
        return
    problem = not_a_classifier(model_name(engine), outputs[0].shape)
    if problem is not None:
        raise UsageProblem(*problem)


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


def _announce(engine, batch: int, form: str) -> None:
    """Tell ``engine`` the batch size and input form it will run (:meth:`engines.base.EngineBase.expect`) before its
    first batch, so that it prepares that shape and no other; an engine without ``expect`` is left alone."""
    expect = getattr(engine, "expect", None)
    if expect is not None:
        expect(batch, form)


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


def model_channels(engine) -> int | None:
    """The channels of the model's (N, C, H, W) input where fixed (1 or 3), else None."""
    shape = engine.inputs[0].shape if engine.inputs else ()
    c = shape[1] if len(shape) == 4 else None
    return c if isinstance(c, int) and c in (1, 3) else None


def model_spec(engine, manifest, preprocess: PreprocessSpec | None) -> PreprocessSpec:
    """The preprocessing frames get: ``preprocess``, else the manifest's, else the defaults for the model's channels
    (ImageNet's for colour; :data:`engines.preprocess.GREY_MEAN`/``GREY_STD`` for a one-channel model)."""
    if preprocess is not None:
        return preprocess
    if manifest is not None:
        return manifest.preprocess
    return PreprocessSpec(channels=model_channels(engine) or 3)


def _suggested_spec(shape) -> str:
    """The PreprocessSpec a model of input ``shape`` (N, C, H, W) can take, as Python text."""
    size = f"size=({shape[2]}, {shape[3]}), " if all(isinstance(d, int) for d in shape[2:]) else ""
    if shape[1] == 1:
        return f"PreprocessSpec({size}channels=1, mean=(M,), std=(S,))"
    return f"PreprocessSpec({size}mean=..., std=...)"


def _input_shape(engine, spec: PreprocessSpec, origin: str | None) -> tuple[int, int]:
    """The model's fixed input channels, H and W must be what the preprocessing makes. ``origin``: where ``spec``
    came from ("manifest", "the preprocess argument", or None: no manifest, so the defaults)."""
    shape = engine.inputs[0].shape
    if len(shape) == 4 and isinstance(shape[1], int) and shape[1] != spec.channels:
        _wrong_channels(engine, shape, spec, origin)
    if len(shape) == 4 and all(isinstance(d, int) for d in shape[2:]):
        if tuple(shape[2:]) != tuple(spec.size):
            takes = f"the model takes {shape[2]}x{shape[3]} inputs"
            makes = f"{spec.size[0]}x{spec.size[1]}"
            name = Path(str(getattr(engine, "path", "the model"))).name
            python = f"in Python, classify(..., preprocess={_suggested_spec(shape)})"
            if origin is None:
                grey = " (one value each: it is a greyscale model)" if shape[1] == 1 else ""
                kind = "greyscale" if spec.channels == 1 else "ImageNet"
                raise UsageProblem(f"{name} has no manifest, so its frames get the {kind} default preprocessing "
                                   f"({makes}), but {takes}", f"adopt it once: trtc export {name} --mean ... --std ..."
                                   f"{grey}, which writes its manifest (preprocessing, labels) beside it; or {python}")
            if origin == "manifest":
                raise UsageProblem(f"{takes}, but its manifest's preprocessing makes {makes}",
                                   "re-create the manifest with the trtc command that made the model; or " + python)
            raise UsageProblem(f"{takes}, but the preprocess argument makes {makes}",
                               f"give {_suggested_spec(shape)}")
    return spec.size


def _wrong_channels(engine, shape, spec: PreprocessSpec, origin: str | None) -> None:
    """A model whose input has other channels than the preprocessing writes: refused with a contract it can take."""
    name = Path(str(getattr(engine, "path", "the model"))).name
    takes = f"{name} takes {shape[1]}-channel inputs {tuple(shape)}"
    if shape[1] not in (1, 3):
        raise UsageProblem(f"{takes}; trtc classifies greyscale (1-channel) and colour (3-channel) images",
                           CLASSIFIER_FIX)
    where = {"manifest": "its manifest's preprocessing", None: "the default preprocessing"}.get(origin, origin)
    fix = (f"re-create the manifest: trtc export {name} --channels {shape[1]} --mean ... --std ... (it reads the "
           f"channels from the model); in Python, classify(..., preprocess={_suggested_spec(shape)})")
    raise UsageProblem(f"{takes}, but {where} makes {spec.channels}-channel inputs", fix)


def _problem(problems, lock, source, reason, frames):
    with lock:
        problems.append(SourceProblem(source, reason, frames))
    log.warning("%s", reason)  # the final frame count is in the summary (frames in flight still arrive)


def label_names(labels, idx) -> list | None:
    """The labels written for class indices ``idx``: None without labels, the index as text past their end."""
    if not labels:
        return None
    return [labels[int(i)] if 0 <= int(i) < len(labels) else str(int(i)) for i in idx]


