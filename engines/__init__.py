"""trtc's runtime: open an exported or built classifier and run it.

Importing this package loads numpy and nothing heavy; each backend imports its library when it is opened.
"""

from __future__ import annotations

import os
from pathlib import Path

from .base import Engine, TensorSpec
from .errors import EngineError, ManifestError, MissingDependency, TrtcError, UsageProblem
from .manifest import BatchProfile, Manifest, read_manifest, write_manifest
from .preprocess import PreprocessSpec, preprocess_rgb

__version__ = "0.1.0"


def open_engine(path: str | os.PathLike, device: str = "cpu", **options) -> Engine:
    """Open ``path`` with the backend its type calls for (``.onnx``: ONNX Runtime)."""
    p = Path(path)
    if not p.exists():
        raise UsageProblem(f"model not found: {p}")
    if p.suffix.lower() == ".onnx":
        from .onnxruntime_engine import OnnxRuntimeEngine

        return OnnxRuntimeEngine(p, device=device, **options)
    raise UsageProblem(f"cannot open {p.name}: unknown model type {p.suffix!r}", "give a .onnx file")


__all__ = ["open_engine", "Engine", "TensorSpec", "Manifest", "BatchProfile", "PreprocessSpec", "preprocess_rgb",
           "read_manifest", "write_manifest", "TrtcError", "UsageProblem", "MissingDependency", "ManifestError",
           "EngineError", "__version__"]
