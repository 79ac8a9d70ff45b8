"""Calibration and check data, and the activation ranges INT8 needs.

Data comes from image folders (recursive), video files (frames sampled evenly across the whole file, decoded on
the CPU with PyAV and turned as the video's rotation metadata says, as ``trtc run`` turns them) and .npy/.npz
tensors. Images and frames go through :func:`engines.preprocess.preprocess_rgb` with the model's manifest
preprocessing: the same function the CPU runtime and validation use, so calibration sees exactly what the deployed
model will see. Tensors from .npy/.npz are taken as model inputs as they are.

Ranges (the absolute value each quantized activation is clipped to) come from running the FP32 model in ONNX
Runtime with those activations exposed as outputs:

- ``minmax``: the largest absolute value seen. Nothing clips, but one outlier stretches the scale.
- ``percentile`` (default, 99.99): the value below which that share of all absolute values lies. It ignores the
  rarest outliers and keeps resolution for the bulk; it is the method that held the agreement targets on
  EfficientNet-Lite0 (docs: README "Calibration methods" has the measured comparison).
- ``entropy``: TensorRT's classic method: the clipping threshold whose 128-level quantized histogram has the
  smallest KL divergence from the FP32 histogram (2048 bins).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engines import VIDEO_SUFFIXES
from engines._deps import require
from engines._io import atomic_write_text
from engines.preprocess import IMAGE_SUFFIXES, PreprocessSpec, load_rgb, preprocess_rgb

from .._ui import Reporter
from ..errors import QuantizeError, TrtcError, UsageProblem

if TYPE_CHECKING:
    from engines.video.orientation import Orientation

log = logging.getLogger("trtc")
TENSOR_SUFFIXES = (".npy", ".npz")
METHODS = ("percentile", "entropy", "minmax")
DEFAULT_METHOD = "percentile"
DEFAULT_PERCENTILE = 99.99
HIST_BINS = 2048


@dataclass
class DataSet:
    """Model inputs (N, ...) float32 with where each came from."""

    x: np.ndarray
    origins: list[str]
    sources: list[str]
    labels: np.ndarray | None = None
    skipped: list[dict] = field(default_factory=list)  # {"file", "reason"}
    # videos whose frames were turned upright by their rotation metadata: {"file", "degrees", "mirrored", "from"}
    rotated: list[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.x)

    def subset(self, idx) -> "DataSet":
        idx = np.asarray(idx, dtype=np.int64)
        return DataSet(self.x[idx], [self.origins[i] for i in idx], self.sources,
                       None if self.labels is None else self.labels[idx], self.skipped, self.rotated)

    def describe(self) -> str:
        return f"{len(self)} samples from {', '.join(Path(s).name for s in self.sources)}"


def classify_path(path: str | Path) -> str:
    p = Path(path)
    if p.is_dir():
        return "folder"
    suffix = p.suffix.lower()
    if suffix in TENSOR_SUFFIXES:
        return "tensor"
    if suffix in VIDEO_SUFFIXES:
        return "video"
    if suffix in IMAGE_SUFFIXES:
        return "image"
    raise UsageProblem(f"{p}: not an image folder, image, video (.mp4, .mkv, .mov, .avi, .webm, ...) or "
                       ".npy/.npz file", "give a folder of images, a video file or a tensor file")


def check_sources(paths) -> list[Path]:
    """Resolve data paths before any work starts, so a typo fails in a second."""
    out = []
    for item in paths:
        p = Path(item)
        if not p.exists():
            raise UsageProblem(f"data not found: {p}", "give an image folder, a video file or a .npy/.npz file")
        classify_path(p)
        out.append(p)
    return out


def _evenly(total: int, want: int) -> np.ndarray:
    if want >= total:
        return np.arange(total)
    return np.unique(np.round(np.linspace(0, total - 1, want)).astype(np.int64))


def _check_image_shape(spec: PreprocessSpec, model_shape: list, source: Path) -> None:
    dims = model_shape[1:]
    if len(dims) != 3 or (isinstance(dims[0], int) and dims[0] != spec.channels):
        grey = isinstance(dims[0], int) and dims[0] == 1 if len(dims) == 3 else False
        raise QuantizeError(f"images and video give {spec.channels}-channel inputs (the preprocessing contract's), "
                            f"but the model input is {model_shape}",
                            "adopt the model with its channels (trtc export MODEL.onnx --mean M --std S: a greyscale "
                            "model takes one value each)" if grey else
                            f"pass tensors of the right shape as .npy/.npz instead of {source.name}")
    hw = tuple(dims[1:])
    if all(isinstance(d, int) for d in hw) and hw != tuple(spec.size):
        raise QuantizeError(f"the preprocessing makes {spec.size[0]}x{spec.size[1]} inputs but the model expects "
                            f"{hw[0]}x{hw[1]}", f"fix --input-size (or the manifest) to {hw[0]}")


def _frame_turn(frame, path: Path) -> Orientation:
    """How the frames of ``path`` are turned to be shown: its first frame's display matrix, read as ``trtc run``
    reads it (:func:`engines.video.orientation.frame_orientation`)."""
    from engines.video.orientation import frame_orientation

    try:
        return frame_orientation(frame)
    except UsageProblem as exc:
        raise QuantizeError(f"{path}: {exc.reason}", "re-encode the video upright (ffmpeg -i IN OUT.mp4 turns the "
                            "frames as players show them)") from None


def _video_frames(path: Path, want: int, spec: PreprocessSpec, bar) -> tuple[list[np.ndarray], list[str],
                                                                             Orientation]:
    """Up to ``want`` frames sampled evenly across ``path``, each turned as the video is shown, preprocessed."""
    av = require("av", "Reading calibration frames from video on the CPU", extra="video-cpu")
    try:
        container = av.open(str(path))
    except Exception as exc:  # av.error.* (InvalidDataError, FileNotFoundError, ...)
        raise QuantizeError(f"cannot open video {path}: {exc}", "check the file plays (ffprobe), or re-encode it") \
            from exc
    with container:
        if not container.streams.video:
            raise QuantizeError(f"{path} has no video stream", "give a video file with a video track")
        stream = container.streams.video[0]
        total = stream.frames
        if not total:  # no count in the container: count packets (cheap, no decoding)
            total = sum(1 for pk in container.demux(stream) if pk.size)
            container.seek(0)
        wanted = set(_evenly(total, want).tolist())
        last = max(wanted) if wanted else -1
        out, origins, turn = [], [], None
        try:
            for i, frame in enumerate(container.decode(stream)):
                turn = turn or _frame_turn(frame, path)
                if i in wanted:
                    out.append(preprocess_rgb(turn.plane(frame.to_ndarray(format="rgb24")), spec))
                    origins.append(f"{path.name}#{i}")
                    bar.advance()
                if i >= last:
                    break
        except TrtcError:
            raise
        except Exception as exc:
            if not out:
                raise QuantizeError(f"cannot decode video {path}: {exc}", "check the file plays, or re-encode it") \
                    from exc
            log.warning("%s: decoding stopped at frame %d (%s); using the %d frames read", path, i, exc, len(out))
    if not out:
        raise QuantizeError(f"no frames could be decoded from {path}", "check the file plays, or re-encode it")
    return out, origins, turn


def _tensor_file(path: Path, model_shape: list, input_name: str):
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise QuantizeError(f"cannot read {path}: {exc}", "save the data with numpy.save / numpy.savez") from exc
    labels = None
    if isinstance(data, np.lib.npyio.NpzFile):
        with data:
            keys = list(data.keys())
            for key in ("labels", "y", "label"):
                if key in keys:
                    labels = data[key]
            candidates = [k for k in (input_name, "x", "input", "inputs", "images") if k in keys] or \
                [k for k in keys if k not in ("labels", "y", "label")]
            if not candidates:
                raise QuantizeError(f"{path} holds no input array (keys: {', '.join(keys)})",
                                    f"store the inputs under the key {input_name!r} or 'x'")
            x = data[candidates[0]]
    else:
        x = data
    want = model_shape[1:]
    if x.ndim != len(model_shape) or any(isinstance(w, int) and w != g for w, g in zip(want, x.shape[1:])):
        raise QuantizeError(f"{path.name} holds arrays of shape {tuple(x.shape)}, but the model input "
                            f"{input_name!r} is {model_shape} (batch first)",
                            "save the inputs as one (N, ...) array matching the model input")
    if labels is not None and len(labels) != len(x):
        raise QuantizeError(f"{path.name}: {len(labels)} labels for {len(x)} inputs", "store one label per input")
    return x.astype(np.float32, copy=False), labels


def image_or_skip(path: Path, spec: PreprocessSpec, skipped: list) -> np.ndarray | None:
    """The one rule for the images of a folder (quantize --calib/--check, validate --data, export --check-data): an
    image that cannot be decoded is skipped with a warning naming it, and listed in ``skipped`` ({"file",
    "reason"}); the caller refuses the data when none could be read (:func:`none_readable`)."""
    try:
        return preprocess_rgb(load_rgb(path), spec)
    except TrtcError as exc:
        skipped.append({"file": str(path), "reason": exc.reason})
        log.warning("skipping %s: %s", path, exc.reason)
        return None


def none_readable(count: int, where, skipped: list) -> tuple[str, str]:
    """The reason and fix when none of ``count`` images in ``where`` could be read."""
    return (f"none of the {count} images in {where} could be read (first: {skipped[0]['reason']})",
            "replace the corrupt files or point at another folder")


def load_data(paths, spec: PreprocessSpec | None, model_shape: list, input_name: str, want: int, seed: int = 0,
              reporter: Reporter | None = None, what: str = "calibration") -> DataSet:
    """Up to ``want`` samples from each source (images chosen with ``seed``, frames evenly across each video)."""
    reporter = reporter or Reporter()
    rng = np.random.default_rng(seed)
    xs, origins, sources, skipped, labels_all, rotated = [], [], [], [], [], []
    any_labels = False
    for p in check_sources(paths):
        kind = classify_path(p)
        sources.append(str(p))
        if kind == "tensor":
            x, labels = _tensor_file(p, model_shape, input_name)
            pick = np.sort(rng.permutation(len(x))[:want]) if len(x) > want else np.arange(len(x))
            xs.extend(x[pick])
            origins.extend(f"{p.name}[{i}]" for i in pick)
            if labels is not None:
                any_labels = True
                labels_all.extend(labels[pick])
            else:
                labels_all.extend([None] * len(pick))
            continue
        if spec is None:
            raise UsageProblem(f"{p} needs preprocessing settings, and the model has no manifest",
                               "give --input-size/--resize/--mean/--std/--color, or use a model made by trtc export")
        _check_image_shape(spec, model_shape, p)
        if kind == "video":
            with reporter.phase(f"decoding {what} frames from {p.name}", total=want) as bar:
                frames, names, turn = _video_frames(p, want, spec, bar)
            if not turn.identity:
                rotated.append({"file": str(p), **turn.to_dict()})
            xs.extend(frames)
            origins.extend(names)
            labels_all.extend([None] * len(frames))
            continue
        files = [p] if kind == "image" else sorted(q for q in p.rglob("*")
                                                   if q.suffix.lower() in IMAGE_SUFFIXES and q.is_file())
        if not files:
            raise QuantizeError(f"no images (jpg/png/bmp/webp/gif/tiff) in {p}", f"put {what} images in {p}, or point at "
                                "another folder or a video")
        if len(files) > want:
            files = [files[i] for i in np.sort(rng.permutation(len(files))[:want])]
        got = 0
        with reporter.phase(f"reading {what} images from {p.name}", total=len(files)) as bar:
            for f in files:
                x = image_or_skip(f, spec, skipped)
                if x is not None:
                    xs.append(x)
                    origins.append(str(f))
                    labels_all.append(None)
                    got += 1
                bar.advance()
        if not got:
            raise QuantizeError(*none_readable(len(files), p, skipped))
    if not xs:
        raise QuantizeError(f"no usable {what} data in {', '.join(map(str, paths))}", "give other data")
    labels = None
    if any_labels and all(lb is not None for lb in labels_all):
        labels = np.asarray(labels_all)
    return DataSet(np.stack(xs).astype(np.float32, copy=False), origins, sources, labels, skipped, rotated)


def random_data(model_shape: list, count: int, seed: int) -> DataSet:
    shape = [d if isinstance(d, int) else 1 for d in model_shape[1:]]
    x = np.random.default_rng(seed).standard_normal((count, *shape)).astype(np.float32)
    return DataSet(x, [f"random[{i}]" for i in range(count)], ["random"])


def split(data: DataSet, calib_count: int, seed: int) -> tuple[DataSet, DataSet | None]:
    """Seeded split into calibration samples and the held-out rest."""
    n = len(data)
    if n <= calib_count:
        return data, None
    perm = np.random.default_rng(seed).permutation(n)
    return data.subset(np.sort(perm[:calib_count])), data.subset(np.sort(perm[calib_count:]))


def data_digest(x: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(str((x.shape, str(x.dtype))).encode())
    h.update(np.ascontiguousarray(x).tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------- ranges

def run_batches(fn, x: np.ndarray, batch: int, fixed: bool = False):
    """Yield (start, n, fn(chunk)) over ``x`` in chunks of ``batch``. ``fixed``: the model takes exactly ``batch``
    samples, so the last chunk is filled up by repeating its last sample (only the first n results count)."""
    for i in range(0, len(x), batch):
        xb = x[i:i + batch]
        n = len(xb)
        if fixed and n < batch:
            xb = np.concatenate([xb, np.repeat(xb[-1:], batch - n, 0)])
        yield i, n, fn(xb)


def fixed_batch(session) -> bool:
    """Whether an ONNX Runtime session's first input has a fixed batch dimension."""
    return isinstance(session.get_inputs()[0].shape[0], int)


def percentile_amax(hist: np.ndarray, amax: float, percentile: float) -> float:
    total = hist.sum()
    if total == 0 or amax == 0:
        return float(amax)
    cdf = np.cumsum(hist) / total
    i = int(np.searchsorted(cdf, percentile / 100.0))
    return float(min(amax, (i + 1) * amax / len(hist)))


def entropy_amax(hist: np.ndarray, amax: float, levels: int = 128) -> float:
    """The clip threshold whose ``levels``-level quantization of the histogram keeps the most information."""
    hist = hist.astype(np.float64)
    bins = len(hist)
    if hist.sum() == 0 or amax == 0:
        return float(amax)
    best_kl, best_i = np.inf, bins
    tail = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # tail[i] = sum(hist[i:])
    for i in range(levels, bins + 1):
        ref = hist[:i].copy()
        ref[-1] += tail[i]  # everything beyond the threshold clips into the last bin
        nonzero = hist[:i] > 0
        group = (np.arange(i) * levels) // i
        sums = np.bincount(group, weights=hist[:i], minlength=levels)
        counts = np.bincount(group, weights=nonzero, minlength=levels)
        cand = np.where(nonzero, sums[group] / np.maximum(counts[group], 1), 0.0)
        p = ref / ref.sum()
        if cand.sum() == 0:
            continue
        q = cand / cand.sum()
        mask = p > 0
        q_m = np.where(q[mask] > 0, q[mask], 1e-12)
        kl = float(np.sum(p[mask] * np.log(p[mask] / q_m)))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return float(best_i * amax / bins)


@dataclass
class Stats:
    """What calibration measures per activation: the clip value and the per-channel mean (for bias correction)."""

    ranges: dict[str, float]
    means: dict[str, list[float]]


def _channel_sum(v: np.ndarray) -> np.ndarray | None:
    """Per-channel sum and element count over everything but the channel axis (1 for NCHW, last for (N, K))."""
    if v.ndim == 4:
        return v.sum(axis=(0, 2, 3), dtype=np.float64) / (v.shape[2] * v.shape[3])
    if v.ndim == 2:
        return v.sum(axis=0, dtype=np.float64)
    return None


def collect_stats(model, tensors: list[str], data: np.ndarray, method: str, percentile: float, batch: int,
                  device: str = "cpu", reporter: Reporter | None = None) -> Stats:
    """Clip value (see the module docstring for the methods) and per-channel mean of each tensor."""
    if method not in METHODS:
        raise UsageProblem(f"unknown calibration method {method!r}", f"use one of {', '.join(METHODS)}")
    reporter = reporter or Reporter()
    sess, feed, names = _stats_session(model, tensors, device)

    def batches():
        for start, n, outs in run_batches(lambda xb: sess.run(names, {feed: xb}), data, batch, fixed_batch(sess)):
            vals = {t: o[:n] for t, o in zip(names, outs)}
            if feed in tensors:  # the graph input is the data itself
                vals[feed] = data[start:start + n]
            yield n, vals

    amax = {t: 0.0 for t in tensors}
    sums: dict[str, np.ndarray | None] = {t: None for t in tensors}
    count = 0
    passes = 1 if method == "minmax" else 2
    with reporter.phase(f"calibrating {len(tensors)} activations on {len(data)} samples ({method})",
                        total=len(data) * passes) as bar:
        for n, vals in batches():
            for t, v in vals.items():
                amax[t] = max(amax[t], float(np.max(np.abs(v))) if v.size else 0.0)
                cs = _channel_sum(v)
                if cs is not None:
                    sums[t] = cs if sums[t] is None else sums[t] + cs
            count += n
            bar.advance(n)
        means = {t: (sums[t] / count).tolist() for t in tensors if sums[t] is not None}
        if method == "minmax":
            return Stats(amax, means)
        hists = {t: np.zeros(HIST_BINS, np.int64) for t in tensors}
        for n, vals in batches():
            for t, v in vals.items():
                # exact zeros (ReLU outputs, padding) quantize exactly; left in, their spike would make any clip
                # look harmless to the entropy search
                a = np.abs(v[v != 0])
                if amax[t] > 0 and a.size:
                    h, _ = np.histogram(a, bins=HIST_BINS, range=(0.0, amax[t]))
                    hists[t] += h
            bar.advance(n)
    if method == "percentile":
        ranges = {t: percentile_amax(hists[t], amax[t], percentile) for t in tensors}
    else:
        ranges = {t: entropy_amax(hists[t], amax[t]) for t in tensors}
    return Stats(ranges, means)


def _stats_session(model, tensors: list[str], device: str):
    """An ONNX Runtime session of ``model`` with every tensor of ``tensors`` as an output (but the graph input):
    (session, the input's name, the output names)."""
    onnx = require("onnx", "Calibrating", extra="export")
    require("onnxruntime", "Calibrating", extra="cpu")
    from engines.ort_session import providers_for, session_options

    import onnxruntime as ort

    from .graph import graph_inputs

    aug = onnx.ModelProto()
    aug.CopyFrom(model)
    feed = graph_inputs(aug)[0].name
    existing = {o.name for o in aug.graph.output}
    names = [t for t in tensors if t != feed]
    for t in names:
        if t not in existing:
            aug.graph.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(aug.SerializeToString(), sess_options=session_options(ort),
                                providers=providers_for(device))
    return sess, feed, names


# ---------------------------------------------------------------- cache

def cache_dir() -> Path:
    from engines._io import user_cache_dir
    return user_cache_dir("calibration")


def cache_key(model_sha256: str, digest: str, method: str, percentile: float, tensors: list[str]) -> str:
    recipe = json.dumps({"model": model_sha256, "data": digest, "method": method,
                         "percentile": percentile if method == "percentile" else None,
                         "tensors": sorted(tensors), "version": 2}, sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()


def is_cache_file(path: Path) -> bool:
    """Whether ``path`` holds a calibration cache as :func:`write_cache` writes it (of any model or data)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return False
    return isinstance(data, dict) and isinstance(data.get("key"), str) and isinstance(data.get("ranges"), dict)


def read_cache(path: Path, key: str, tensors: list[str]) -> Stats | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return None
    if not isinstance(data, dict):
        return None
    ranges = data.get("ranges") or {}
    if data.get("key") != key or set(ranges) != set(tensors):
        return None
    return Stats({k: float(v) for k, v in ranges.items()}, data.get("means") or {})


def write_cache(path: Path, key: str, stats: Stats, recipe: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"key": key, "recipe": recipe, "ranges": stats.ranges,
                                        "means": stats.means}) + "\n")
