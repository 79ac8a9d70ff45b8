"""The sidecar manifest ``X.json`` written beside every artifact ``X`` (model.onnx, model.int8.onnx, model.plan).

It is plain JSON, written atomically, never bytes prepended to the artifact (so trtexec, DeepStream and ONNX
tools still read the artifact). It records what produced the artifact and what it expects: the preprocessing
contract, labels, I/O tensors, the batch profile, the precision recipe, the builder and GPU for plans, and the
parent artifact's sha256. ``read_manifest`` checks that the artifact is the one the manifest describes.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ._io import atomic_write_text, defer_until_placed, sha256_file
from .base import TensorSpec
from .errors import ManifestError, UsageProblem
from .preprocess import PreprocessSpec

SCHEMA = 1


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
    kind: str  # "onnx" or "plan"
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
    def from_dict(cls, d: dict) -> "Manifest":
        try:
            if d.get("schema") != SCHEMA:
                raise ManifestError(f"manifest schema {d.get('schema')!r} is not the supported {SCHEMA}",
                                    "re-export the model with this trtc version")
            return cls(kind=d["kind"], model=d["model"], preprocess=PreprocessSpec.from_dict(d["preprocess"]),
                       inputs=[TensorSpec.from_dict(t) for t in d["inputs"]],
                       outputs=[TensorSpec.from_dict(t) for t in d["outputs"]],
                       batch=BatchProfile(**d["batch"]), labels=d.get("labels"),
                       precision=d.get("precision") or {"mode": "fp32"}, producer=d.get("producer") or {},
                       builder=d.get("builder"), parent=d.get("parent"), artifact=d.get("artifact") or {},
                       created=d.get("created", ""), schema=d["schema"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"manifest is malformed ({type(exc).__name__}: {exc})",
                                "re-create it by exporting or building the artifact again") from exc

    def label(self, index: int) -> str:
        if self.labels and 0 <= index < len(self.labels):
            return self.labels[index]
        return str(index)


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
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc}", "re-create it by exporting the model again") from exc
    manifest = Manifest.from_dict(data)
    if verify_hash:
        actual = sha256_file(artifact)
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
