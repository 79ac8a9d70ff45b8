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
    kind: str  # pytorch | onnx | plan | opencv (an ONNX file run by OpenCV dnn) | torch (a .pt2, compiled)
    precision: str
    manifest: Manifest | None = None
    weights: str | None = None  # a PyTorch reference's trained weights (--reference-weights)
    num_classes: int | None = None  # the classes of the head it is built with (--num-classes), before its weights


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
    layers: dict | None = None  # per-layer parity (toolchain.layers), when asked for


@dataclass
class ValidateReport:
    schema: int
    reference: dict
    data: dict
    candidates: list[CandidateResult]
    passed: bool
    warnings: list[str] = field(default_factory=list)
    scores: str = "logits"  # "probabilities": the outputs end in a Softmax, used as they are (no second softmax)
    contracts: int = 1  # distinct preprocessing contracts the models ran with (each model its own)

    def to_dict(self) -> dict:
        return asdict(self)


def _classify(spec: str) -> ModelRef:
    from engines import split_engine

    engine, path, _ = split_engine(spec)
    torch_ref = _torch_program(spec, engine, path)
    if torch_ref is not None:
        return torch_ref
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


def _torch_program(spec: str, engine: str | None, path: str) -> ModelRef | None:
    """``torch:m.pt2``/``torch-fp16:m.pt2``, or a .pt2 whose manifest says ``program`` (trtc export --program): the
    compiled PyTorch engine. A .pt2 without one stays a PyTorch source (run eagerly, as a reference)."""
    from engines import PROGRAM_SUFFIXES, TORCH_PREFIXES

    p = Path(path)
    if engine not in TORCH_PREFIXES and not (p.suffix.lower() in PROGRAM_SUFFIXES and p.is_file()):
        return None
    if not p.is_file():
        raise UsageProblem(f"model not found: {p}", f"give an existing .pt2 after the {engine}: prefix")
    m = read_manifest_if_any(p)
    if engine is None and (m is None or m.kind != "program"):
        return None
    return ModelRef(spec, "torch", "fp16" if engine == "torch-fp16" else "fp32", m)


class Runner:
    """numpy batch in, logits out, for each kind of model (validate and bench share it). ``shape`` is the input
    shape without the batch; ``fixed``: the model takes exactly ``batch`` samples."""

    batch_range = None  # (min, max) batch a plan's profile accepts

    def __init__(self, ref: ModelRef, device: str, exact: bool = False):
        """``exact``: the reference of ``trtc validate``, whose FP32 is computed in full FP32 (ONNX Runtime's CUDA
        EP otherwise runs FP32 convolutions in TF32, which is how a deployed model runs)."""
        self.ref = ref
        if ref.kind in ("onnx", "opencv"):
            if ref.kind == "opencv":  # OpenCV dnn: numpy in and out, like ONNX Runtime's host path
                from engines import open_engine

                self.engine = open_engine(ref.spec, device=device)
            else:
                from engines.onnxruntime_engine import OnnxRuntimeEngine

                # no quick start: every batch through the tuned session, whichever batch comes first
                self.engine = OnnxRuntimeEngine(ref.spec, device=device, tf32=not exact, quick_start=False)
            first = self.engine.inputs[0].shape
            self.fixed = isinstance(first[0], int)
            self.batch = first[0] if self.fixed else 32
            self.shape = tuple(first[1:])
            self.fn = lambda x: self.engine.infer(x)[0]
        elif ref.kind == "torch":  # the compiled PyTorch engine: numpy in and out, its batch range from the manifest
            from engines import open_engine

            # no quick start: every batch through the compiled function, none eagerly while it loads
            self.engine = open_engine(ref.spec, device=device, quick_start=False)
            first = self.engine.inputs[0].shape
            self.fixed = isinstance(first[0], int)
            lo, hi = self.engine.batch_range or (1, 32)
            self.batch_range = None if self.fixed else (lo, hi)
            self.batch = first[0] if self.fixed else min(32, hi)
            self.shape = tuple(first[1:])
            self.fn = lambda x: self.engine.infer(x)[0]
        elif ref.kind == "pytorch":
            from .reference import TorchReference

            from .model_source import input_channels

            self.engine = TorchReference(ref.spec, device=device, weights=ref.weights, num_classes=ref.num_classes)
            size = self.engine.loaded.defaults.get("size", 224)
            self.fixed, self.batch = False, 32
            channels = input_channels(self.engine.loaded) or 3
            self.shape = (channels, *((size, size) if isinstance(size, int) else tuple(size)))
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
    from engines.ort_session import providers_for

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
             reporter: Reporter | None = None, each=None, reference_weights: str | None = None,
             reference_num_classes: int | None = None) -> ValidateReport:
    """Run the reference and each candidate on the same inputs and judge each candidate. ``each(candidate, reference,
    x, ref_logits, result)``, when given, is called after each candidate is judged, with the inputs both ran on (the
    per-layer comparison of toolchain.layers adds to the result there). ``reference_weights``: the trained weights
    (a state_dict or checkpoint) of a reference built by code (torchvision:ARCH, timm:NAME, file.py:factory), which
    is refused without them: its random weights would make every comparison meaningless. ``reference_num_classes``:
    such a reference is built with a head of that many classes (as ``trtc export --num-classes``) before its weights
    are loaded; refused for any other reference.

    The steps: check the arguments, read the models and their manifests (each model's preprocessing contract),
    load the data once per contract, run the reference, then run and judge each candidate."""
    reporter = reporter or Reporter()
    _check_arguments(candidates, data, thresholds)
    ref = _classify(reference)
    ref.weights = _reference_weights(ref, reference_weights)
    ref.num_classes = _reference_classes(ref, reference_num_classes)
    cands = [_classify(c) for c in candidates]
    models = [ref, *cands]
    spec_from = _contract_source(ref, cands)
    _check_declared(ref, cands)  # from the manifests: before any data is read or any model runs
    warnings: list[str] = []
    # each model runs with its own preprocessing contract; one without a manifest borrows one (said once)
    contract = {id(m): _contract_of(m, models, spec_from, warnings) for m in models}
    label_names, label_from = _label_names(models)
    datasets = _datasets(data, models, contract, label_names, label_from, count, seed, reporter, warnings)
    dataset = datasets[_contract_key(contract[id(ref)])]
    for other in datasets.values():
        if other.origins != dataset.origins:
            raise UsageProblem("the models' preprocessing contracts read different samples from the data",
                               "give data that every model can read (images or videos)")
    if len(datasets) > 1:
        log.info("the models run with %d different preprocessing contracts, each with its own", len(datasets))

    x = _inputs_of(ref, datasets, contract)
    with reporter.phase(f"reference {model_label(ref.spec)} on {len(x)} samples", total=len(x)) as bar:
        runner = Runner(ref, device, exact=True)
        _check_runner(runner, ref, x, _data_from(ref, contract, ref, cands), ref, cands)
        ref_logits = _run_checked(runner, ref, x, bar, _data_from(ref, contract, ref, cands), ref, cands)
    probabilities = parity.looks_like_probabilities(ref_logits)
    chance = _chance_problem(ref_logits, dataset.labels, warnings)
    results = []
    for c in cands:
        results.append(_candidate(c, ref, cands, ref_logits, datasets, contract, dataset, label_names, thresholds,
                                  probabilities, chance, device, warnings, reporter))
        if each is not None:
            each(c, ref, x, ref_logits, results[-1])
    return ValidateReport(schema=SCHEMA, reference={"model": ref.spec, "kind": ref.kind, "precision": ref.precision},
                          data={"sources": dataset.sources, "samples": len(x), "labelled": dataset.labels is not None,
                                "skipped": dataset.skipped, "rotated": dataset.rotated, "device": device},
                          candidates=results, passed=all(r.passed for r in results), warnings=warnings,
                          scores="probabilities" if probabilities else "logits", contracts=len(datasets))


def _built_by_code(ref: ModelRef) -> bool:
    """A PyTorch reference that its code builds (torchvision:ARCH, timm:NAME, file.py:factory): its weights and
    its head are the user's to give."""
    if ref.kind != "pytorch":
        return False
    from .model_source import parse_source

    return parse_source(ref.spec).kind in ("torchvision", "timm", "pyfile")


def _reference_weights(ref: ModelRef, weights: str | None) -> str | None:
    """--reference-weights for a PyTorch reference built by code: required there (refused without, by name), and
    refused for any other reference (which carries its own weights)."""
    built = _built_by_code(ref)
    if weights is None:
        if built:
            raise UsageProblem(f"the reference {ref.spec} is built by its code with random weights, which would make "
                               "the comparison meaningless", "give its trained weights: --reference-weights FILE (a "
                               "state_dict or checkpoint); or give the trained model as --reference (its fp32 .onnx, "
                               "or a TorchScript .pt or .pt2 file of it)")
        return None
    if not built:
        raise UsageProblem(f"--reference-weights applies to a reference built by code (torchvision:ARCH, timm:NAME, "
                           f"file.py:factory), and {ref.spec} carries its own weights", "drop --reference-weights")
    if not Path(weights).is_file():
        raise UsageProblem(f"reference weights not found: {weights}", "check the --reference-weights path")
    return weights


def _reference_classes(ref: ModelRef, num_classes: int | None) -> int | None:
    """--num-classes: the head a reference built by code gets before its weights are loaded (export's meaning);
    any other reference has its classes already."""
    if num_classes is None or _built_by_code(ref):
        return num_classes
    kind = {"onnx": "an ONNX model", "opencv": "an ONNX model", "plan": "a TensorRT plan",
            "torch": "a compiled PyTorch program"}.get(ref.kind, "a saved model")
    raise UsageProblem(f"--num-classes replaces the head of a reference built by code (torchvision:ARCH, timm:NAME, "
                       f"file.py:factory), and {ref.spec} is {kind} with its own classes", "drop --num-classes")


def _check_arguments(candidates: list[str], data: list[str], thresholds: dict | None) -> None:
    if not candidates:
        raise UsageProblem("no candidate to validate", "add --candidate MODEL (repeatable)")
    if not data:
        raise UsageProblem("no data to validate on", "add --data IMAGES_FOLDER_OR_VIDEO_OR_NPZ")
    for k in (thresholds or {}):
        if k not in DEFAULT_THRESHOLDS["fp32"]:
            raise UsageProblem(f"unknown threshold {k!r}", f"use {', '.join(DEFAULT_THRESHOLDS['fp32'])}")
    cal.check_sources(data)
    for d in data:  # a folder without a single image is a wrong --data (exit 2), as a missing one is
        p = Path(d)
        if p.is_dir() and not any(q.suffix.lower() in cal.IMAGE_SUFFIXES and q.is_file() for q in p.rglob("*")):
            raise UsageProblem(f"no images (jpg/png/bmp/webp/gif/tiff) in {p}", "give --data a folder of images (class "
                               "subfolders give labels), a video or a .npy/.npz file")


def _contract_source(ref: ModelRef, cands: list[ModelRef]) -> Manifest:
    """The manifest a model without one borrows its preprocessing from: the first candidate's, else the
    reference's; refused when no model has one."""
    spec_from = next((m.manifest for m in [*cands, ref] if m.manifest is not None), None)
    if spec_from is None:
        foreign = ref.spec.split(":", 1)[1] if ref.kind == "opencv" else ref.spec
        raise UsageProblem("no model has a manifest, so the preprocessing and labels are unknown",
                           f"adopt the model once: trtc export {foreign} --labels FILE --mean ... --std ... "
                           "--color ... (writes its manifest; see docs/BRING-YOUR-OWN-ONNX.md), or validate models "
                           "made by trtc export/quantize/build")
    return spec_from


def _label_names(models: list[ModelRef]) -> tuple[list[str] | None, str]:
    """The class names (a manifest's, else an ONNX model's metadata) and where they come from."""
    label_names = next((m.manifest.labels for m in models if m.manifest is not None and m.manifest.labels), None)
    label_from = "the manifest"
    if label_names is None:
        label_names, label_from = _metadata_labels(models)
    return label_names, label_from


def _datasets(data, models: list[ModelRef], contract: dict, label_names, label_from, count, seed, reporter,
              warnings) -> dict:
    """The data, loaded once per preprocessing contract (by its key)."""
    classes = next((c for c in (classes_of(m.manifest.outputs) for m in models if m.manifest is not None) if c), None)
    datasets: dict = {}
    for m in models:
        owner = contract[id(m)]
        key = _contract_key(owner)
        if key not in datasets:
            dims = [1, *[d if isinstance(d, int) else 1 for d in owner.inputs[0].shape[1:]]]
            datasets[key] = _load(data, owner, dims, count, seed, reporter, warnings, label_names, label_from,
                                  classes)
    return datasets


def _inputs_of(m: ModelRef, datasets: dict, contract: dict) -> np.ndarray:
    return datasets[_contract_key(contract[id(m)])].x


def _data_from(m: ModelRef, contract: dict, ref: ModelRef, cands: list[ModelRef]) -> ModelRef:
    """The model whose manifest gives ``m`` its preprocessing contract."""
    return next(o for o in [m, *cands, ref] if o.manifest is contract[id(m)])


def _candidate(c: ModelRef, ref: ModelRef, cands: list[ModelRef], ref_logits, datasets: dict, contract: dict,
               dataset: cal.DataSet, label_names, thresholds, probabilities: bool, chance: dict | None, device: str,
               warnings: list[str], reporter: Reporter) -> CandidateResult:
    """Run one candidate on its inputs and judge it against the reference's logits (and, for an ONNX model, in a
    default ONNX Runtime session too)."""
    t0 = time.perf_counter()
    xc = _inputs_of(c, datasets, contract)
    with reporter.phase(f"candidate {model_label(c.spec)} ({c.precision})", total=len(xc)) as bar:
        runner = Runner(c, device)
        _check_runner(runner, c, xc, _data_from(c, contract, ref, cands), ref, [c], ref_logits.shape[1])
        got = _run_checked(runner, c, xc, bar, _data_from(c, contract, ref, cands), ref, [c], ref_logits.shape[1])
    result = _result(c, ref_logits, got, dataset, label_names, thresholds, time.perf_counter() - t0, probabilities)
    if chance is not None:
        result.failures.append(chance)
        result.passed = False
    if c.kind == "onnx":
        _default_session_check(result, c, runner, got, xc, device, reporter, warnings)
    return result


def _model_path(m: ModelRef) -> Path | None:
    if m.kind == "pytorch":
        return None
    from engines import split_engine

    return Path(split_engine(m.spec)[1])  # without an engine prefix (opencv:, torch-fp16:)


def _contract_of(m: ModelRef, models: list[ModelRef], fallback: Manifest, warnings: list[str]) -> Manifest:
    """The manifest whose preprocessing ``m`` runs with: its own; for a model without one, the manifest of a model
    made from it (its parent sha256 is ``m``'s), else ``fallback``'s, with a warning naming what is assumed."""
    if m.manifest is not None:
        return m.manifest
    path = _model_path(m)
    if path is not None and path.is_file():
        from engines._io import sha256_file

        sha = sha256_file(path)
        child = next((o.manifest for o in models if o.manifest is not None
                      and (o.manifest.parent or {}).get("sha256") == sha), None)
        if child is not None:
            return child
    from .export import describe_contract

    owner = next(o for o in models if o.manifest is fallback)
    warnings.append(f"{model_label(m.spec)} has no manifest: it runs with the preprocessing of "
                    f"{model_label(owner.spec)}'s manifest ({describe_contract(fallback.preprocess)})")
    return fallback


def _contract_key(manifest: Manifest) -> str:
    import json

    return json.dumps([manifest.preprocess.to_dict(), [d if isinstance(d, int) else None
                                                       for d in manifest.inputs[0].shape[1:]]], sort_keys=True)


def _metadata_labels(models: list[ModelRef]) -> tuple[list[str] | None, str]:
    """Class names from an ONNX model's metadata (a model made elsewhere, adopted or not)."""
    from .export import onnx_labels

    for m in models:
        path = _model_path(m)
        if path is not None and path.suffix.lower() == ".onnx":
            labels, key = onnx_labels(path)
            if labels:
                return labels, f"{path.name}'s ONNX metadata ({key!r})"
    return None, ""


# the reference's accuracy is "at chance" below chance + this share of the distance from chance to 100%
CHANCE_MARGIN = 0.25


def _chance_problem(ref_logits: np.ndarray, labels, warnings: list[str]) -> dict | None:
    """A reference accuracy near chance (what its predictions and the labels give when they are unrelated) means
    the labels do not belong to the model's classes (class folders mapped to the wrong classes, other data): every
    accuracy figure is then wrong, and the candidates cannot pass on it. The failure entry, or None."""
    if labels is None or len(labels) < 2:
        return None
    pred = ref_logits.argmax(1)
    labels = np.asarray(labels)
    acc = float(np.mean(pred == labels))
    classes = np.union1d(pred, labels)
    chance = float(sum(np.mean(pred == k) * np.mean(labels == k) for k in classes))
    if chance >= 1.0:  # one class in both: nothing to tell apart
        return None
    bound = chance + CHANCE_MARGIN * (1.0 - chance)
    if acc > bound:
        return None
    warnings.append(f"the reference's accuracy {acc:.2%} is at chance level ({chance:.2%} if its predictions and the "
                    "labels were unrelated): the labels do not match the model's classes, so no accuracy figure "
                    "means anything; name the class folders as the model's labels (or give labels in order)")
    return {"metric": "reference_accuracy", "value": acc, "threshold": bound, "by": bound - acc}


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
        from engines import split_engine

        path = Path(split_engine(c.spec)[1]).parent / name
        if path.is_file() and str(path) != ref.spec:
            return f"{base}: {model_label(c.spec)} was made from {path}, so give --reference {path}"
    if ref.kind == "pytorch" and ref.spec.split(":", 1)[0] in ("torchvision", "timm"):
        head = f"{ref_classes}-class" if ref_classes else "standard"
        return (f"{base}: {ref.spec} is built with its {head} head, so give your own model as --reference (its "
                "fp32 .onnx, or a TorchScript .pt or .pt2 file of it)")
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


def _load(data, manifest: Manifest, dims, count, seed, reporter, warnings, label_names=None, label_from="",
          classes=None) -> cal.DataSet:
    """Calibration's loader, plus labels from class subfolders (mapped by :func:`class_folder_indices`)."""
    sets = []
    for src in data:
        p = Path(src)
        subdirs = sorted(d for d in p.iterdir() if d.is_dir()) if p.is_dir() else []
        if subdirs and not any(f.is_file() and f.suffix.lower() in cal.IMAGE_SUFFIXES for f in p.iterdir()):
            indices, note = class_folder_indices([d.name for d in subdirs], label_names, classes, p.name, label_from)
            if note and note not in warnings:
                warnings.append(note)
            for d, idx in zip(subdirs, indices):
                part = cal.load_data([d], manifest.preprocess, dims, manifest.inputs[0].name, want=count, seed=seed,
                                     reporter=reporter, what="validation")
                part.labels = np.full(len(part), idx, np.int64)
                sets.append(part)
        else:
            sets.append(cal.load_data([p], manifest.preprocess, dims, manifest.inputs[0].name, want=count, seed=seed,
                                      reporter=reporter, what="validation"))
    labelled = all(s.labels is not None for s in sets)
    return cal.DataSet(np.concatenate([s.x for s in sets]), [o for s in sets for o in s.origins],
                       [str(d) for d in data], np.concatenate([s.labels for s in sets]) if labelled else None,
                       [k for s in sets for k in s.skipped], [r for s in sets for r in s.rotated])


def _number(name: str) -> float | None:
    try:
        return float(name)
    except ValueError:
        return None


def class_folder_indices(names: list[str], labels: list[str] | None, classes: int | None, where: str = "the data",
                         label_from: str = "the manifest") -> tuple[list[int], str | None]:
    """The class index of each class folder, and a note when the mapping is a guess. In this order:

    - the model's labels (manifest, or ONNX metadata) name every folder: by label;
    - some folders are labels and some are not: refused (a typo or another model's data);
    - names that are numbers: a whole number within the class count is the index itself (MNIST's 0..9, a subset
      included); otherwise, with one folder per class, numeric order (0, 90, 180, 270: never text order);
    - other names, one folder per class (ImageNet's wnids): sorted order, with a note;
    - anything else is refused: the mapping cannot be known."""
    what = f"the class folders of {where} ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})"
    fix_rename = "name the class folders as the model's labels" + (f" ({', '.join(labels[:6])}"
                                                                      f"{', ...' if len(labels) > 6 else ''})"
                                                                      if labels else "")
    if labels:
        if all(n in labels for n in names):
            return [labels.index(n) for n in names], None
        known = [n for n in names if n in labels]
        if known:
            missing = [n for n in names if n not in labels]
            raise UsageProblem(f"{what}: {', '.join(missing[:3])} {'is' if len(missing) == 1 else 'are'} not among "
                               f"the model's labels (from {label_from}) while {known[0]} is", fix_rename)
    numbers = [_number(n) for n in names]
    if all(v is not None for v in numbers):
        if classes and all(v == int(v) and 0 <= v < classes for v in numbers):
            return [int(v) for v in numbers], (f"{what} are not the model's labels: folder N = class index N"
                                               if labels else None)
        if classes is None or len(names) == classes:
            order = sorted(range(len(names)), key=lambda i: numbers[i])
            idx = [0] * len(names)
            for rank, i in enumerate(order):
                idx[i] = rank
            note = (f"{what} are not the model's labels: label i = the i-th folder in numeric order"
                    if labels or classes is None else None)
            return idx, note
    if classes is None or len(names) == classes:
        return list(range(len(names))), (f"{what} are not the model's labels: label i = the i-th folder in sorted "
                                         "order")
    reason = ("are not the model's labels" + (f" (from {label_from})" if labels else "") if labels
              else "cannot be matched to the model's classes (it has no labels)")
    raise UsageProblem(f"{what} {reason}, and {len(names)} folders for {classes} classes give no order to go by",
                       fix_rename if labels else "adopt the model with its labels (trtc export MODEL.onnx --labels "
                       "FILE) and name the folders as those labels, or name them by class index (0, 1, ...)")


def _result(c: ModelRef, ref, got, dataset: cal.DataSet, label_names, overrides, seconds,
            probabilities: bool = False) -> CandidateResult:
    """``probabilities``: the outputs are probabilities already (a Softmax in the graph; decided on the reference's
    outputs by the rule of ``trtc run --scores auto``), so no second softmax is applied."""
    p = parity.compare(ref, got, probabilities=probabilities)
    metrics = {k: v for k, v in p.to_dict().items() if k != "flips"}
    pr, pc = parity.scores(ref, probabilities), parity.scores(got, probabilities)
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
