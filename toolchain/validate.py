"""Classifier-level parity between a reference and candidates: `trtc validate`.

    report = validate("lite0.onnx", ["lite0.fp16.onnx", "lite0.int8.onnx"], data=["photos/", "bikes.mp4"])

Every model sees the same preprocessed inputs, built once from the data (image folders, where class subfolders
give labels; videos, sampled evenly; .npy/.npz, optionally with labels). Models: a PyTorch source (the same
specs as `trtc export`), an ONNX file (ONNX Runtime, CPU or CUDA; ``opencv:model.onnx``: OpenCV dnn) or a TensorRT plan (its manifest checked against
this machine first, then run on the GPU by engines.TensorRTEngine, host inputs and outputs). Each candidate is judged against thresholds that depend on its precision (documented in the
README, each overridable); the report says which threshold failed and by how much.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engines._deps import require
from engines.manifest import Manifest, classes_of, read_manifest_if_any

from . import parity
from ._ui import Reporter, model_label
from .errors import TrtcError, UsageProblem
from .precision import calibration as cal

log = logging.getLogger("trtc")
SCHEMA = 1
# default thresholds per candidate precision: min top-1 agreement, min cosine, max accuracy drop (points)
DEFAULT_THRESHOLDS = {
    "fp32": {"min_top1_agreement": 0.99, "min_cosine": 0.9999, "max_accuracy_drop": 0.001},
    "fp16": {"min_top1_agreement": 0.98, "min_cosine": 0.999, "max_accuracy_drop": 0.005},
    "int8": {"min_top1_agreement": 0.95, "min_cosine": 0.98, "max_accuracy_drop": 0.01},
}


@dataclass
class ModelRef:
    spec: str  # what the user gave
    kind: str  # pytorch | onnx | plan | opencv (an ONNX file run by OpenCV dnn)
    precision: str
    manifest: Manifest | None = None


@dataclass
class CandidateResult:
    model: str
    kind: str
    precision: str
    metrics: dict  # parity + accuracy + confidence drift
    per_class_flips: dict
    flips: list[dict]  # {"sample", "reference", "candidate"}
    thresholds: dict
    failures: list[dict]  # {"metric", "value", "threshold", "by"}
    passed: bool
    seconds: float
    confidence: list[list[float]] = field(default_factory=list)  # per sample: [reference, candidate] probability
    # of the reference's top-1 class (rounded; for the HTML report's scatter plot)
    default_session: dict | None = None  # ONNX: the same in a default ONNX Runtime session? (see README)


@dataclass
class ValidateReport:
    schema: int
    reference: dict
    data: dict
    candidates: list[CandidateResult]
    passed: bool
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _classify(spec: str) -> ModelRef:
    from engines import split_engine

    engine, path, _ = split_engine(spec)
    if engine is not None:  # "opencv:model.onnx": the ONNX file through OpenCV dnn
        p = Path(path)
        if p.suffix.lower() != ".onnx":
            raise UsageProblem(f"{engine}: runs ONNX models, not {p.name}", f"give {engine}:model.onnx")
        if not p.is_file():
            raise UsageProblem(f"model not found: {p}", "give an existing .onnx after the opencv: prefix")
        m = read_manifest_if_any(p)
        return ModelRef(spec, "opencv", (m.precision or {}).get("mode", "fp32") if m else "fp32", m)
    p = Path(spec)
    if p.suffix.lower() in (".onnx", ".plan", ".engine") and p.is_file():
        m = read_manifest_if_any(p)
        kind = "onnx" if p.suffix.lower() == ".onnx" else "plan"
        return ModelRef(spec, kind, (m.precision or {}).get("mode", "fp32") if m else "fp32", m)
    if p.suffix.lower() in (".onnx", ".plan", ".engine"):
        raise UsageProblem(f"model not found: {p}", "give an existing .onnx/.plan, or a PyTorch source")
    from .model_source import parse_source

    parse_source(spec)  # raises a UsageProblem for unknown forms
    return ModelRef(spec, "pytorch", "fp32")


class Runner:
    """numpy batch in, logits out, for each kind of model (validate and bench share it). ``shape`` is the input
    shape without the batch; ``fixed``: the model takes exactly ``batch`` samples."""

    batch_range = None  # (min, max) batch a plan's profile accepts

    def __init__(self, ref: ModelRef, device: str):
        self.ref = ref
        if ref.kind in ("onnx", "opencv"):
            if ref.kind == "opencv":  # OpenCV dnn: numpy in and out, like ONNX Runtime's host path
                from engines import open_engine

                self.engine = open_engine(ref.spec, device=device)
            else:
                from engines.onnxruntime_engine import OnnxRuntimeEngine

                self.engine = OnnxRuntimeEngine(ref.spec, device=device)
            first = self.engine.inputs[0].shape
            self.fixed = isinstance(first[0], int)
            self.batch = first[0] if self.fixed else 32
            self.shape = tuple(first[1:])
            self.fn = lambda x: self.engine.infer(x)[0]
        elif ref.kind == "pytorch":
            from .reference import TorchReference

            self.engine = TorchReference(ref.spec, device=device)
            size = self.engine.loaded.defaults.get("size", 224)
            self.fixed, self.batch = False, 32
            self.shape = (3, *((size, size) if isinstance(size, int) else tuple(size)))
            self.fn = self.engine.infer  # returns host arrays: the GPU work is finished when it returns
        else:  # a TensorRT plan: its manifest is checked against this machine first (the reason if it cannot run)
            from engines.tensorrt_engine import TensorRTEngine

            self.engine = TensorRTEngine(ref.spec, device=device)
            first = self.engine.inputs[0].shape
            self.fixed = isinstance(first[0], int)
            profile = self.engine.manifest.batch
            self.batch_range = None if self.fixed else (profile.min, profile.max)
            self.batch = first[0] if self.fixed else min(32, profile.max)
            self.shape = tuple(first[1:])
            self.fn = lambda x: self.engine.infer(x)[0]  # host in, host out: synchronised when it returns

    def logits(self, x: np.ndarray, bar, first=None) -> np.ndarray:
        """The model's outputs on ``x``; ``first(y)``, when given, sees the first batch's output before the rest
        runs (to stop early on outputs that cannot be compared)."""
        out = []
        for _, n, y in cal.run_batches(self.fn, x, self.batch, self.fixed):
            y = np.asarray(y)
            if first is not None and not out:
                first(y)
            out.append(y[:n])
            bar.advance(n)
        return np.concatenate(out)


def default_session(path, device: str):
    """A session as a user makes it: ``InferenceSession(path, providers=...)``, no session options at all."""
    ort = require("onnxruntime", "Running ONNX models", extra="cpu")
    from engines.onnxruntime_engine import providers_for

    return ort.InferenceSession(str(path), providers=providers_for(device))


def default_session_failures(precision: str, trtc_logits: np.ndarray, default_logits: np.ndarray) -> list[dict]:
    """Where a default ONNX Runtime session's logits part from trtc's (the figures trtc reports) by more than
    the precision's thresholds of ``trtc validate`` (top-1 agreement and cosine; an empty list: they agree)."""
    p = parity.compare(trtc_logits, default_logits)
    th = DEFAULT_THRESHOLDS.get(precision, DEFAULT_THRESHOLDS["int8"])
    return judge({"top1_agreement": p.top1_agreement, "cosine": p.cosine}, th)


def judge(metrics: dict, thresholds: dict) -> list[dict]:
    fails = []
    if metrics["top1_agreement"] < thresholds["min_top1_agreement"]:
        fails.append({"metric": "top1_agreement", "value": metrics["top1_agreement"],
                      "threshold": thresholds["min_top1_agreement"],
                      "by": thresholds["min_top1_agreement"] - metrics["top1_agreement"]})
    if metrics["cosine"] < thresholds["min_cosine"]:
        fails.append({"metric": "cosine", "value": metrics["cosine"], "threshold": thresholds["min_cosine"],
                      "by": thresholds["min_cosine"] - metrics["cosine"]})
    if metrics.get("accuracy_delta") is not None and -metrics["accuracy_delta"] > thresholds["max_accuracy_drop"]:
        fails.append({"metric": "accuracy_drop", "value": -metrics["accuracy_delta"],
                      "threshold": thresholds["max_accuracy_drop"],
                      "by": -metrics["accuracy_delta"] - thresholds["max_accuracy_drop"]})
    return fails


def validate(reference: str, candidates: list[str], data: list[str], *, device: str = "cpu",
             count: int = 512, seed: int = 0, thresholds: dict | None = None,
             reporter: Reporter | None = None) -> ValidateReport:
    """Run the reference and each candidate on the same inputs and judge each candidate."""
    reporter = reporter or Reporter()
    if not candidates:
        raise UsageProblem("no candidate to validate", "add --candidate MODEL (repeatable)")
    if not data:
        raise UsageProblem("no data to validate on", "add --data IMAGES_FOLDER_OR_VIDEO_OR_NPZ")
    for k in (thresholds or {}):
        if k not in DEFAULT_THRESHOLDS["fp32"]:
            raise UsageProblem(f"unknown threshold {k!r}", f"use {', '.join(DEFAULT_THRESHOLDS['fp32'])}")
    cal.check_sources(data)
    ref = _classify(reference)
    cands = [_classify(c) for c in candidates]
    spec_from = next((m.manifest for m in [*cands, ref] if m.manifest is not None), None)
    if spec_from is None:
        raise UsageProblem("no model has a manifest, so the preprocessing is unknown",
                           "validate models made by trtc export/quantize/build")
    data_from = next(m for m in [*cands, ref] if m.manifest is spec_from)
    _check_declared(ref, cands)  # from the manifests: before any data is read or any model runs
    dims = [1, *[d if isinstance(d, int) else 1 for d in spec_from.inputs[0].shape[1:]]]
    warnings = []
    dataset = _load(data, spec_from, dims, count, seed, reporter, warnings)
    x = dataset.x

    with reporter.phase(f"reference {model_label(ref.spec)} on {len(x)} samples", total=len(x)) as bar:
        runner = Runner(ref, device)
        _check_runner(runner, ref, x, data_from, ref, cands)
        ref_logits = _run_checked(runner, ref, x, bar, data_from, ref, cands)
    label_names = spec_from.labels
    results = []
    for c in cands:
        t0 = time.perf_counter()
        with reporter.phase(f"candidate {model_label(c.spec)} ({c.precision})", total=len(x)) as bar:
            runner = Runner(c, device)
            _check_runner(runner, c, x, data_from, ref, [c], ref_logits.shape[1])
            got = _run_checked(runner, c, x, bar, data_from, ref, [c], ref_logits.shape[1])
        results.append(_result(c, ref_logits, got, dataset, label_names, thresholds, time.perf_counter() - t0))
        if c.kind == "onnx":
            _default_session_check(results[-1], c, runner, got, x, device, reporter, warnings)
    return ValidateReport(schema=SCHEMA, reference={"model": ref.spec, "kind": ref.kind, "precision": ref.precision},
                          data={"sources": dataset.sources, "samples": len(x), "labelled": dataset.labels is not None,
                                "skipped": dataset.skipped, "device": device},
                          candidates=results, passed=all(r.passed for r in results), warnings=warnings)


# Reference and candidates must classify the same classes from the same inputs; a mismatch is the user's (two
# unrelated models), found as early as what is known allows: the manifests' declared shapes before anything runs,
# a loaded model's declared shapes before it runs, and the first batch's output before the rest of the data.


def _fixed(shape) -> tuple | None:
    """``shape`` as ints, or None when a dimension is symbolic (a dynamic size: anything goes)."""
    dims = tuple(shape)
    return dims if all(isinstance(d, int) and d > 0 for d in dims) else None


def _size(shape) -> str:
    return "x".join(str(d) for d in shape)


def _role(m: ModelRef, ref: ModelRef) -> str:
    return "reference" if m is ref else "candidate"


def _fix(ref: ModelRef, c: ModelRef, ref_classes: int | None = None) -> str:
    """How to pick two models that can be compared: a model and its own export, build or quantized copy."""
    base = "compare a model with its own export, build or quantized copy"
    parent = (c.manifest.parent or {}) if c.manifest is not None else {}
    name = parent.get("file")
    if name and parent.get("role") != "weights":
        path = Path(c.spec.split(":", 1)[1] if c.kind == "opencv" else c.spec).parent / name
        if path.is_file() and str(path) != ref.spec:
            return f"{base}: {model_label(c.spec)} was made from {path}, so give --reference {path}"
    if ref.kind == "pytorch" and ref.spec.split(":", 1)[0] in ("torchvision", "timm"):
        head = f"{ref_classes}-class" if ref_classes else "standard"
        return (f"{base}: {ref.spec} is built with its {head} head and random weights, so give your own model as "
                "--reference (its fp32 .onnx, or a TorchScript .pt or .pt2 file of it)")
    return f"{base} (e.g. --reference model.onnx --candidate model.int8.onnx)"


def _classes_problem(ref: ModelRef, ref_classes: int, c: ModelRef, classes: int) -> UsageProblem:
    return UsageProblem(f"the reference {model_label(ref.spec)} gives {ref_classes} classes and the candidate "
                        f"{model_label(c.spec)} gives {classes}: they do not classify the same classes",
                        _fix(ref, c, ref_classes))


def _input_problem(m: ModelRef, shape, other: ModelRef, other_shape, ref: ModelRef, cands) -> UsageProblem:
    if m is other:  # the model itself disagrees with its manifest, which set the data
        what = (f"the {_role(m, ref)} {model_label(m.spec)} takes {_size(shape)} inputs but its manifest says "
                f"{_size(other_shape)}")
        return UsageProblem(what, "re-export the model so that the model and its manifest are written together")
    c = m if m is not ref else (other if other is not ref else cands[0])
    first, second = ((m, shape), (other, other_shape)) if m is ref else ((other, other_shape), (m, shape))
    return UsageProblem(f"the {_role(first[0], ref)} {model_label(first[0].spec)} takes {_size(first[1])} inputs "
                        f"and the {_role(second[0], ref)} {model_label(second[0].spec)} takes {_size(second[1])}: "
                        "they cannot run on the same data", _fix(ref, c))


def _check_declared(ref: ModelRef, cands: list[ModelRef]) -> None:
    """Input sizes and class counts that the manifests declare, before any data is read or any model runs."""
    def declared(m: ModelRef):
        if m.manifest is None:
            return None, None
        inputs = m.manifest.inputs
        return (_fixed(inputs[0].shape[1:]) if inputs else None), classes_of(m.manifest.outputs)

    ref_shape, ref_classes = declared(ref)
    first_shape = (ref, ref_shape) if ref_shape else None
    for c in cands:
        shape, classes = declared(c)
        if ref_classes and classes and classes != ref_classes:
            raise _classes_problem(ref, ref_classes, c, classes)
        if shape and first_shape is None:
            first_shape = (c, shape)
        elif shape and shape != first_shape[1]:
            raise _input_problem(c, shape, first_shape[0], first_shape[1], ref, cands)


def _check_runner(runner: Runner, m: ModelRef, x: np.ndarray, data_from: ModelRef, ref: ModelRef,
                  cands: list[ModelRef], ref_classes: int | None = None) -> None:
    """A loaded model's declared input size and class count, before it runs. A PyTorch model declares neither
    (its source's default size is no limit: most classifiers pool to any size)."""
    if m.kind == "pytorch":
        return
    shape = _fixed(runner.shape)
    if shape and shape != tuple(x.shape[1:]):
        raise _input_problem(m, shape, data_from, tuple(x.shape[1:]), ref, cands)
    classes = classes_of(getattr(runner.engine, "outputs", None))
    if classes:
        _check_classes(m, classes, ref, cands, ref_classes)


def _check_classes(m: ModelRef, classes: int, ref: ModelRef, cands: list[ModelRef], ref_classes) -> None:
    """``m`` gives ``classes`` classes: against the reference's (m a candidate), or the candidates' that their
    manifests declare (m the reference)."""
    if m is not ref:
        if ref_classes and classes != ref_classes:
            raise _classes_problem(ref, ref_classes, m, classes)
        return
    for c in cands:
        declared = classes_of(c.manifest.outputs) if c.manifest is not None else None
        if declared and declared != classes:
            raise _classes_problem(ref, classes, c, declared)


def _run_checked(runner: Runner, m: ModelRef, x: np.ndarray, bar, data_from: ModelRef, ref: ModelRef,
                 cands: list[ModelRef], ref_classes: int | None = None) -> np.ndarray:
    """``runner.logits`` that stops after the first batch when its output is no (batch, classes) array that
    matches the other side, and turns a PyTorch model's failure on inputs of another size than its source's
    default into the user's problem it is."""
    seen = []

    def first(y: np.ndarray) -> None:
        seen.append(y.shape)
        if y.ndim != 2:
            raise UsageProblem(f"the {_role(m, ref)} {model_label(m.spec)} gives outputs of shape "
                               f"{_size(y.shape[1:])} per sample, not one logit per class: validate compares "
                               "classifiers", "give models whose first output is (batch, classes) logits")
        _check_classes(m, y.shape[1], ref, cands, ref_classes)

    try:
        return runner.logits(x, bar, first=first)
    except TrtcError:
        raise
    except Exception as exc:
        if seen or m.kind != "pytorch" or tuple(runner.shape) == tuple(x.shape[1:]):
            raise
        msg = (str(exc).strip().splitlines() or [""])[0]
        raise UsageProblem(f"the {_role(m, ref)} {model_label(m.spec)} cannot run on {_size(x.shape[1:])} inputs "
                           f"(the size in {model_label(data_from.spec)}'s manifest; its default is "
                           f"{_size(runner.shape)}): {type(exc).__name__}: {msg}",
                           _fix(ref, cands[0] if m is ref else m)) from exc


def _default_session_check(result: CandidateResult, c: ModelRef, runner: Runner, got, x, device, reporter,
                           warnings) -> None:
    """An ONNX candidate must give the same answers in a default ONNX Runtime session (as a user, Triton's ORT
    backend or another tool runs it) as in trtc's; where trtc's session used no special option it was one."""
    if runner.engine.qdq_fusion:
        result.default_session = {"same_as_candidate": True, "passed": True, "failures": []}
        return
    session = default_session(c.spec, device)
    name = session.get_inputs()[0].name
    with reporter.phase(f"candidate {model_label(c.spec)} in a default ONNX Runtime session", total=len(x)) as bar:
        outs = []
        for _, n, y in cal.run_batches(lambda xb: session.run(None, {name: xb})[0], x, runner.batch, runner.fixed):
            outs.append(np.asarray(y)[:n])
            bar.advance(n)
    fails = default_session_failures(c.precision, got, np.concatenate(outs))
    result.default_session = {"same_as_candidate": False, "passed": not fails, "failures": fails}
    if not fails:
        return
    f = fails[0]
    what = (f"{model_label(c.spec)}: a default ONNX Runtime session (no trtc session options) gives other answers "
            f"than trtc's run of it: {f['metric'].replace('_', ' ')} {f['value']:.4g} (threshold {f['threshold']})")
    precision = c.manifest.precision if c.manifest is not None else {}
    if "onnxruntime" not in (precision.get("runtimes") or ["onnxruntime"]):
        warnings.append(what + f"; its manifest says it is for {', '.join(precision['runtimes'])} only")
        return
    result.failures.extend({**f, "metric": f"default_session_{f['metric']}"} for f in fails)
    result.passed = False


def _load(data, manifest: Manifest, dims, count, seed, reporter, warnings) -> cal.DataSet:
    """Calibration's loader, plus labels from class subfolders (named like the manifest's labels, else sorted)."""
    sets = []
    for src in data:
        p = Path(src)
        subdirs = sorted(d for d in p.iterdir() if d.is_dir()) if p.is_dir() else []
        if subdirs and not any(f.is_file() and f.suffix.lower() in cal.IMAGE_SUFFIXES for f in p.iterdir()):
            names = [d.name for d in subdirs]
            known = manifest.labels and all(n in manifest.labels for n in names)
            if not known:
                warnings.append(f"class folders of {p.name} are not the model's label names: label i = the i-th "
                                "folder in sorted order")
            for i, d in enumerate(subdirs):
                part = cal.load_data([d], manifest.preprocess, dims, manifest.inputs[0].name, want=count, seed=seed,
                                     reporter=reporter, what="validation")
                idx = manifest.labels.index(d.name) if known else i
                part.labels = np.full(len(part), idx, np.int64)
                sets.append(part)
        else:
            sets.append(cal.load_data([p], manifest.preprocess, dims, manifest.inputs[0].name, want=count, seed=seed,
                                      reporter=reporter, what="validation"))
    labelled = all(s.labels is not None for s in sets)
    return cal.DataSet(np.concatenate([s.x for s in sets]), [o for s in sets for o in s.origins],
                       [str(d) for d in data], np.concatenate([s.labels for s in sets]) if labelled else None,
                       [k for s in sets for k in s.skipped])


def _result(c: ModelRef, ref, got, dataset: cal.DataSet, label_names, overrides, seconds) -> CandidateResult:
    p = parity.compare(ref, got)
    metrics = {k: v for k, v in p.to_dict().items() if k != "flips"}
    pr, pc = parity.softmax(ref), parity.softmax(got)
    r1 = ref.argmax(1)
    rows = np.arange(len(ref))
    metrics["confidence_drift"] = float(np.mean(pc[rows, r1] - pr[rows, r1]))  # mean change of the ref's top-1 prob
    metrics["confidence_abs_drift"] = float(np.mean(np.abs(pc[rows, r1] - pr[rows, r1])))
    if dataset.labels is not None:
        metrics["accuracy_reference"] = parity.accuracy(ref, dataset.labels)
        metrics["accuracy"] = parity.accuracy(got, dataset.labels)
        metrics["accuracy_delta"] = metrics["accuracy"] - metrics["accuracy_reference"]

    def name(i: int) -> str:
        return label_names[i] if label_names and i < len(label_names) else str(int(i))

    c1 = got.argmax(1)
    flips = [{"sample": dataset.origins[i], "reference": name(r1[i]), "candidate": name(c1[i])} for i in p.flips]
    per_class: dict[str, int] = {}
    for f in flips:
        per_class[f["reference"]] = per_class.get(f["reference"], 0) + 1
    th = dict(DEFAULT_THRESHOLDS.get(c.precision, DEFAULT_THRESHOLDS["int8"]))
    th.update(overrides or {})
    fails = judge(metrics, th)
    return CandidateResult(model=c.spec, kind=c.kind, precision=c.precision, metrics=metrics,
                           per_class_flips=dict(sorted(per_class.items(), key=lambda kv: -kv[1])), flips=flips,
                           thresholds=th, failures=fails, passed=not fails, seconds=round(seconds, 2),
                           confidence=[[round(float(a), 4), round(float(b), 4)]
                                       for a, b in zip(pr[rows, r1], pc[rows, r1])])


__all__ = ["DEFAULT_THRESHOLDS", "SCHEMA", "ValidateReport", "validate"]
