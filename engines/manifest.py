"""The sidecar manifest ``X.json`` written beside every artifact ``X`` (model.onnx, model.int8.onnx, model.plan).

It is plain JSON, written atomically, never bytes prepended to the artifact (so trtexec, DeepStream and ONNX
tools still read the artifact). It records what produced the artifact and what it expects: the preprocessing
contract, labels, I/O tensors, the batch profile, the precision recipe, the builder and GPU for plans, and the
parent artifact's sha256. ``read_manifest`` checks that the artifact is the one the manifest describes.
"""

from __future__ import annotations

import datetime as _dt
import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

from ._io import atomic_write_text, defer_until_placed, sha256_file, sha256_verified
from .base import TensorSpec
from .errors import ManifestError, UsageProblem
from .preprocess import PreprocessSpec

SCHEMA = 1
PLAN_SUFFIXES = (".plan", ".engine", ".trt")  # TensorRT plans (engines re-exports it)
QUANT_MARKS = ("QuantizeLinear", "QLinear", "Integer")  # in every quantizing operator's name (DequantizeLinear, ...)


@dataclass(frozen=True)
class BatchProfile:
    min: int
    opt: int
    max: int

    @classmethod
    def parse(cls, text: str) -> "BatchProfile":
        """'8' (fixed), '1:8:32' (min:opt:max) or '1:32' (opt = max)."""
        try:
            parts = [int(p) for p in str(text).split(":")]
        except ValueError:
            parts = []
        if len(parts) == 1:
            parts = parts * 3
        elif len(parts) == 2:
            parts = [parts[0], parts[1], parts[1]]
        if len(parts) != 3 or not (1 <= parts[0] <= parts[1] <= parts[2]):
            raise UsageProblem(f"batch range {text!r} is not MIN:OPT:MAX with 1 <= MIN <= OPT <= MAX",
                               "e.g. --batch 1:8:32, or --batch 1 for a fixed batch of 1")
        return cls(*parts)

    @property
    def dynamic(self) -> bool:
        return self.min != self.max

    def to_dict(self) -> dict:
        return {"min": self.min, "opt": self.opt, "max": self.max}

    def __str__(self) -> str:
        return f"{self.min}:{self.opt}:{self.max}"


@dataclass
class Manifest:
    kind: str  # "onnx", "plan" or "program" (a torch.export .pt2 for the compiled PyTorch engine)
    model: dict  # name, source, num_classes
    preprocess: PreprocessSpec
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batch: BatchProfile
    labels: list[str] | None = None
    precision: dict = field(default_factory=lambda: {"mode": "fp32"})
    producer: dict = field(default_factory=dict)  # how it was made: exporter, versions, checks
    builder: dict | None = None  # plans: TensorRT flavour/version, GPU, CUDA, driver, flags
    parent: dict | None = None  # {"file", "sha256"} of what it was made from
    artifact: dict = field(default_factory=dict)  # file, sha256, bytes (filled by write_manifest)
    created: str = ""
    schema: int = SCHEMA

    def to_dict(self) -> dict:
        return {
            "schema": self.schema,
            "kind": self.kind,
            "artifact": self.artifact,
            "created": self.created,
            "model": self.model,
            "labels": self.labels,
            "preprocess": self.preprocess.to_dict(),
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "batch": self.batch.to_dict(),
            "precision": self.precision,
            "producer": self.producer,
            "builder": self.builder,
            "parent": self.parent,
        }

    @classmethod
    def from_dict(cls, d: dict, artifact: str | os.PathLike | None = None) -> "Manifest":
        """Parse a manifest's JSON. Anything that is not the shape trtc writes (not an object, a field of the wrong
        type, an invalid preprocessing contract) raises a :class:`ManifestError` naming ``artifact``'s manifest and
        what is wrong, never a ``TypeError`` or ``AttributeError`` later in whoever reads the field."""
        name = manifest_path(artifact).name if artifact is not None else "this JSON"
        if not isinstance(d, dict):
            raise ManifestError(f"{name} is not a trtc manifest: it holds {_json_type(d)}, not a JSON object",
                                _recreate_fix(artifact, None))
        fix = _recreate_fix(artifact, d)
        if d.get("schema") != SCHEMA:
            raise ManifestError(f"{name}: manifest schema {d.get('schema')!r} is not the supported {SCHEMA}",
                                "re-export the model with this trtc version")
        problem = _shape_problem(d)
        if problem:
            raise ManifestError(f"{name} is a malformed trtc manifest: {problem}", fix)
        try:
            preprocess = PreprocessSpec.from_dict(d["preprocess"])
        except UsageProblem as exc:  # the contract's own checks, worded for the command line
            raise ManifestError(f"{name} is a malformed trtc manifest: its 'preprocess' is invalid: {exc.reason}",
                                fix) from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{name} is a malformed trtc manifest: its 'preprocess' is invalid "
                                f"({type(exc).__name__}: {exc})", fix) from exc
        try:
            return cls(kind=d["kind"], model=d["model"], preprocess=preprocess,
                       inputs=[TensorSpec.from_dict(t) for t in d["inputs"]],
                       outputs=[TensorSpec.from_dict(t) for t in d["outputs"]],
                       batch=BatchProfile(**d["batch"]), labels=d.get("labels"),
                       precision=d.get("precision") or {"mode": "fp32"}, producer=d.get("producer") or {},
                       builder=d.get("builder"), parent=d.get("parent"), artifact=d.get("artifact") or {},
                       created=d.get("created", ""), schema=d["schema"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{name} is a malformed trtc manifest ({type(exc).__name__}: {exc})", fix) from exc

    def label(self, index: int) -> str:
        if self.labels and 0 <= index < len(self.labels):
            return self.labels[index]
        return str(index)


def _json_type(value) -> str:
    """What a parsed JSON value is, in JSON's words: 'a string', 'a list', 'null'..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# what each field must be: (test, its name in the message)
_OBJECT = (lambda v: isinstance(v, dict), "an object")
_STRING = (lambda v: isinstance(v, str), "a string")
_LIST = (lambda v: isinstance(v, list), "a list")
_INT = (_is_int, "an integer")
_NUMBERS = (lambda v: isinstance(v, list) and all(_is_number(x) for x in v), "a list of numbers")
_INTS = (lambda v: isinstance(v, list) and all(_is_int(x) for x in v), "a list of integers")
_STRINGS = (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings")

# the top-level fields Manifest.from_dict reads: required ones, then those that may be absent or null
_REQUIRED = {"kind": _STRING, "model": _OBJECT, "preprocess": _OBJECT, "inputs": _LIST, "outputs": _LIST,
             "batch": _OBJECT}
_OPTIONAL = {"labels": _STRINGS, "precision": _OBJECT, "producer": _OBJECT, "builder": _OBJECT, "parent": _OBJECT,
             "artifact": _OBJECT, "created": _STRING}
# fields inside them that trtc reads (absent is fine unless required; null only where noted)
_PREPROCESS = {"size": _INTS, "resize": _INT, "color": _STRING, "mean": _NUMBERS, "std": _NUMBERS,
               "layout": _STRING, "interpolation": _STRING, "dtype": _STRING, "input": _STRING, "extra": _OBJECT}
_PREPROCESS_NULLABLE = ("resize", "input")
_TENSOR = {"name": _STRING, "dtype": _STRING, "shape": _LIST}
_BUILDER = {"flags": _OBJECT, "gpu": _OBJECT, "compute_capabilities": _STRINGS}


def _wrong(where: str, value, expected: str) -> str:
    """'its 'labels' is a string, not a list of strings'; for a list, the first item that is wrong."""
    shown = where if "." in where or "[" in where else f"'{where}'"
    item = {"a list of strings": (lambda x: isinstance(x, str), "a string"),
            "a list of numbers": (_is_number, "a number"), "a list of integers": (_is_int, "an integer")}.get(expected)
    if item and isinstance(value, list):
        test, one = item
        i, bad = next((i, x) for i, x in enumerate(value) if not test(x))
        return f"its {where}[{i}] is {_json_type(bad)}, not {one}"
    return f"its {shown} is {_json_type(value)}, not {expected}"


def _check_fields(d: dict, fields: dict, prefix: str, required=(), nullable=()) -> str | None:
    for key, (test, expected) in fields.items():
        where = f"{prefix}{key}"
        if key not in d:
            if key in required:
                return f"it has no '{where}'" if not prefix else f"its {prefix[:-1]} has no '{key}'"
            continue
        value = d[key]
        if value is None and key in nullable:
            continue
        if not test(value):
            return _wrong(where, value, expected)
    return None


def _shape_problem(d: dict) -> str | None:
    """What makes ``d`` not the shape of a manifest trtc writes (None when it is): the top-level fields
    :meth:`Manifest.from_dict` reads, and the parts of them that the runtime reads, checked by type."""
    problem = (_check_fields(d, _REQUIRED, "", required=_REQUIRED)
               or _check_fields(d, _OPTIONAL, "", nullable=_OPTIONAL))
    if problem:
        return problem
    problem = _check_fields(d["preprocess"], _PREPROCESS, "preprocess.", nullable=_PREPROCESS_NULLABLE)
    if problem:
        return problem
    for key in ("inputs", "outputs"):
        for i, t in enumerate(d[key]):
            if not isinstance(t, dict):
                return f"its {key}[{i}] is {_json_type(t)}, not an object"
            problem = _check_fields(t, _TENSOR, f"{key}[{i}].", required=_TENSOR)
            if problem:
                return problem
    problem = _check_fields(d["batch"], {k: _INT for k in ("min", "opt", "max")}, "batch.",
                            required=("min", "opt", "max"))
    if problem:
        return problem
    extra = sorted(set(d["batch"]) - {"min", "opt", "max"})
    if extra:
        return f"its batch has an unknown field '{extra[0]}'"
    shape = d["outputs"][0]["shape"] if d["outputs"] else []
    classes = shape[1] if len(shape) == 2 and _is_int(shape[1]) else None
    if d.get("labels") and classes is not None and len(d["labels"]) != classes:
        return f"its 'labels' names {len(d['labels'])} classes, but its output has {classes}"
    for key, fields, nullable in (("precision", {"mode": _STRING}, ()), ("producer", {"tool": _STRING}, ("tool",)),
                                  ("parent", {"file": _STRING}, ()), ("builder", _BUILDER, ("gpu",))):
        if isinstance(d.get(key), dict):
            problem = _check_fields(d[key], fields, f"{key}.", nullable=nullable)
            if problem:
                return problem
    return None


def _recreate_fix(artifact: str | os.PathLike | None, data) -> str:
    """How to get a good manifest back: the trtc command that made the artifact writes both again."""
    producer = data.get("producer") if isinstance(data, dict) else None
    tool = producer.get("tool") if isinstance(producer, dict) else None
    tool = tool if isinstance(tool, str) and tool.startswith("trtc ") else None
    if artifact is None:
        return f"re-create it with {tool or 'the trtc command that made the model (trtc export, quantize or build)'}"
    artifact = Path(artifact)
    if artifact.suffix.lower() == ".pt2":
        return (f"export it again with its ONNX: trtc export SOURCE -o {artifact.with_suffix('.onnx').name} --program "
                "--force (its manifest carries the preprocessing and the labels)")
    if artifact.suffix.lower() in PLAN_SUFFIXES:
        parent = data.get("parent") if isinstance(data, dict) else None
        onnx = parent.get("file") if isinstance(parent, dict) and isinstance(parent.get("file"), str) else "MODEL.onnx"
        return f"rebuild it: trtc build {onnx} -o {artifact.name} --force (a plan is not loaded without its manifest)"
    made_by = tool or ("trtc quantize" if ".fp16." in artifact.name or ".int8." in artifact.name else "trtc export")
    return (f"re-create it with the {made_by} command that made {artifact.name}, run again with --force; deleting "
            f"{manifest_path(artifact).name} instead runs the model as an ONNX from elsewhere (no labels, default "
            "ImageNet preprocessing)")


def classes_of(outputs) -> int | None:
    """The class count of a first output declared as (batch, classes) (a manifest's or an engine's tensor specs),
    or None where it is not known."""
    if not outputs:
        return None
    shape = tuple(outputs[0].shape)
    return shape[1] if len(shape) == 2 and isinstance(shape[1], int) and shape[1] > 0 else None


CLASSIFIER_FIX = "give an ONNX classifier: one NCHW image input, a (batch, classes) first output"


def not_a_classifier(name: str, shape) -> tuple[str, str] | None:
    """(reason, fix) when a model's first output of ``shape`` is not (batch, classes) - a detector's [N, 84, 8400],
    a segmenter's map, and also [N, C, 1, 1], which every command refuses alike (adopting, running, pushing) -,
    or None when it is (batch, classes) or its rank is not known."""
    if shape is None or len(tuple(shape)) == 2:
        return None
    dims = ", ".join(str(d) for d in shape)
    return f"{name}'s first output is [{dims}] per batch, not (batch, classes)", CLASSIFIER_FIX


def manifest_path(artifact: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(artifact)}.json")


def write_manifest(artifact: str | os.PathLike, manifest: Manifest, hashed_as: str | os.PathLike | None = None) -> Path:
    """Fill the artifact's hash and size and write ``artifact.json`` atomically.

    ``hashed_as`` names the file to hash when the artifact is still at a temporary path; inside that artifact's
    ``atomic_path`` the manifest is then moved into place only after the artifact (never a manifest without it).
    """
    artifact = Path(artifact)
    src = Path(hashed_as) if hashed_as else artifact
    manifest.artifact = {"file": artifact.name, "sha256": sha256_file(src), "bytes": src.stat().st_size}
    if not manifest.created:
        manifest.created = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    target = manifest_path(artifact)
    text = json.dumps(manifest.to_dict(), indent=2) + "\n"
    if not (hashed_as and defer_until_placed(hashed_as, target, text.encode("utf-8"))):
        atomic_write_text(target, text)
    return target


def read_manifest(artifact: str | os.PathLike, verify_hash: bool = True) -> Manifest:
    """Read ``artifact.json`` and check that it describes this artifact (sha256)."""
    artifact = Path(artifact)
    path = manifest_path(artifact)
    if not path.exists():
        raise ManifestError(f"{artifact} has no manifest {path.name} beside it",
                            "make the artifact with trtc export/quantize/build, or keep its .json next to it")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc}",
                            f"make {path.name} readable, or {_recreate_fix(artifact, None)}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path.name} is not a trtc manifest: it is not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                            f"at offset {exc.start})", _recreate_fix(artifact, None)) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path.name} is not a trtc manifest: it is not valid JSON ({exc})",
                            _recreate_fix(artifact, None)) from exc
    except (ValueError, RecursionError) as exc:  # e.g. a number too long to convert, nesting too deep
        raise ManifestError(f"{path.name} is not a trtc manifest: it cannot be parsed as JSON "
                            f"({type(exc).__name__}: {exc})", _recreate_fix(artifact, None)) from exc
    manifest = Manifest.from_dict(data, artifact)
    if verify_hash:
        actual = sha256_verified(artifact)
        if actual != manifest.artifact.get("sha256"):
            raise ManifestError(f"{artifact.name} does not match its manifest (sha256 {actual[:12]}... vs "
                                f"{str(manifest.artifact.get('sha256'))[:12]}...): the file was changed or replaced",
                                "re-export or rebuild the artifact so that the two are written together")
    return manifest


def read_manifest_if_any(artifact: str | os.PathLike, verify_hash: bool = True) -> Manifest | None:
    """:func:`read_manifest`, or None when the artifact has no manifest beside it (an ONNX from elsewhere). A
    manifest that is there but unreadable or does not match still raises."""
    if not manifest_path(artifact).exists():
        return None
    return read_manifest(artifact, verify_hash)


def precision_of(path) -> dict:
    """The precision recipe of ``path``'s manifest ({} without a readable one)."""
    try:
        doc = json.loads(manifest_path(path).read_text())
    except (OSError, ValueError):
        return {}
    return (doc.get("precision") if isinstance(doc, dict) else None) or {}


def is_float_graph(path: str | os.PathLike, precision: dict | None = None) -> bool:
    """Whether the model computes in floating point only, as rewrites made for float graphs assume (the quick copy;
    ONNX Runtime's NHWC layout and conv-bias fusion). Its manifest's precision mode says, where ``precision`` has one
    (no scan of the file); else the file: an op type is stored as its name's bytes, so a file holding none of
    QUANT_MARKS has no quantizing node, and one holding one elsewhere (a doc string) counts as quantized, the safe
    side. False when the file cannot be read. Reads no weights into Python, imports no onnx."""
    mode = (precision or {}).get("mode")
    if mode is not None:
        return mode in ("fp32", "fp16")
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return not any(m.find(mark.encode()) >= 0 for mark in QUANT_MARKS)
    except (OSError, ValueError):
        return False


def qdq_fusion_ok(precision: dict) -> bool:
    """Whether ONNX Runtime may fuse this model's Q/DQ pairs: not with FP16 scales (wrong logits); those run op by op."""
    if precision.get("mode") != "int8":
        return True
    scales = precision.get("scales") or ("fp16" if precision.get("high_precision") == "fp16" else "fp32")
    return scales != "fp16"


def runtime_warning(precision: dict, runtime: str) -> str | None:
    """A sentence when the manifest's ``runtimes`` (who computes the graph right) leaves out ``runtime``."""
    runtimes = precision.get("runtimes")
    if runtimes is None or runtime in runtimes:
        return None
    return (f"this model was made for {', '.join(runtimes)} (trtc quantize --target {precision.get('target')}); "
            f"{runtime} runs it only op by op, and a default {runtime} session of your own gives wrong answers")
