"""trtc's runtime: open an exported or built classifier and run it.

Importing this package loads numpy and nothing heavy; each backend imports its library when it is opened.
"""

from __future__ import annotations

import os
from pathlib import Path

from .base import Engine, TensorSpec
from .errors import EngineError, ManifestError, MissingDependency, TrtcError, UsageProblem
from .manifest import PLAN_SUFFIXES, BatchProfile, Manifest, read_manifest, write_manifest
from .preprocess import PreprocessSpec, preprocess_rgb

__version__ = "0.1.0"


# files a video source or batch folder may be (trtc run --ray folders; telling a video from a model)
VIDEO_SUFFIXES = frozenset({".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".ts", ".mts", ".m2ts", ".flv", ".mpg",
                            ".mpeg", ".wmv", ".3gp", ".h264", ".264", ".h265", ".265", ".hevc", ".ivf", ".y4m"})
PROGRAM_SUFFIXES = (".pt2",)  # torch.export programs: the compiled PyTorch engine (engines.torch_engine)
# "opencv:model.onnx" runs an ONNX model with OpenCV dnn instead of ONNX Runtime; "torch-fp16:model.pt2" runs a
# torch.export program in FP16 with the compiled PyTorch engine; the options each prefix implies
ENGINE_PREFIXES = {"opencv": {}, "opencv-fp16": {"fp16": True}, "torch": {}, "torch-fp16": {"precision": "fp16"}}
TORCH_PREFIXES = ("torch", "torch-fp16")


def split_engine(spec: str | os.PathLike) -> tuple[str | None, str, dict]:
    """``"opencv:m.onnx"`` -> ``("opencv", "m.onnx", {})``; a spec without a known prefix (or an existing file
    whose name happens to hold a colon) -> ``(None, spec, {})``."""
    text = os.fspath(spec)
    head, sep, rest = text.partition(":")
    if sep and head.lower() in ENGINE_PREFIXES and rest and not Path(text).exists():
        return head.lower(), rest, dict(ENGINE_PREFIXES[head.lower()])
    return None, text, {}


def model_not_found_fix(path: str | os.PathLike) -> str:
    """The fix line of a model path that does not exist: the folder's models when there are any, else how to make
    one."""
    p = Path(path)
    folder = p.parent if os.fspath(p.parent) else Path(".")
    try:
        found = sorted(f.name for f in folder.iterdir()
                       if f.suffix.lower() in (".onnx", *PLAN_SUFFIXES, *PROGRAM_SUFFIXES))
    except OSError:
        found = []
    if found:
        shown = ", ".join(found[:5]) + (f" (+{len(found) - 5} more)" if len(found) > 5 else "")
        return f"check the path; {folder} has {shown}"
    return ("check the path, or make the model first: trtc export pretrained:efficientnet-lite0 -o lite0.onnx "
            "(or trtc build model.onnx for a plan)")


def open_engine(path: str | os.PathLike, device: str = "cpu", **options) -> Engine:
    """Open ``path`` with the backend its artifact calls for.

    ``.onnx`` -> :class:`OnnxRuntimeEngine` (CPU EP for ``device="cpu"``, CUDA EP with zero-copy device buffers
    for ``"cuda:N"``); ``.plan``/``.engine`` -> :class:`TensorRTEngine` after its manifest was checked against the
    installed TensorRT flavour and this GPU (the manifest's ``kind`` wins over the suffix when they disagree);
    ``opencv:model.onnx`` (``opencv-fp16:`` for OpenCV's CUDA FP16 target) -> :class:`OpenCVEngine`, OpenCV dnn;
    ``.pt2`` (a torch.export program, manifest kind ``program``; ``torch-fp16:model.pt2`` for FP16) ->
    :class:`TorchEngine`, compiled with Inductor. ``options`` go to the backend (ONNX Runtime: ``threads``;
    TensorRT: ``cuda_graph``; OpenCV: ``dnn_engine``; torch: ``precision``, ``compile``, ``cache``,
    ``warm_beside_load``; see each class). Every backend takes ``batch`` and ``form``: what the caller will run
    (:meth:`engines.base.EngineBase.expect`), so that the engine prepares that shape and no other."""
    said = {k: options.pop(k) for k in ("batch", "form") if k in options}
    engine, path, implied = split_engine(path)
    p = Path(path)
    if not p.exists():
        raise UsageProblem(f"model not found: {p}", model_not_found_fix(p))
    if engine in TORCH_PREFIXES and p.suffix.lower() not in PROGRAM_SUFFIXES:
        raise UsageProblem(f"{engine}: runs torch.export programs (.pt2), not {p.name}",
                           f"give the .pt2 that trtc export --program writes: {engine}:model.pt2")
    if engine is not None and engine not in TORCH_PREFIXES and p.suffix.lower() != ".onnx":
        raise UsageProblem(f"{engine}: runs ONNX models, not {p.name}", f"give a .onnx file: {engine}:model.onnx")
    from .manifest import read_manifest_if_any

    # the manifest says how to feed the model (labels, preprocessing): a manifest of another file is refused here,
    # as every trtc command refuses it (hashed once per process and file; see engines._io.sha256_verified)
    manifest = read_manifest_if_any(p)
    kind = manifest.kind if manifest is not None else None
    if engine in TORCH_PREFIXES or kind == "program" or (kind is None and p.suffix.lower() in PROGRAM_SUFFIXES):
        from .torch_engine import TorchEngine

        return _expecting(TorchEngine(p, device=device, **{**implied, **options}), said)
    if engine is not None:
        from .opencv_engine import OpenCVEngine

        return _expecting(OpenCVEngine(p, device=device, **{**implied, **options}), said)
    if kind == "plan" or (kind is None and p.suffix.lower() in PLAN_SUFFIXES):
        from .tensorrt_engine import TensorRTEngine

        return _expecting(TensorRTEngine(p, device=device, **options), said)
    if kind is not None or p.suffix.lower() == ".onnx":
        from .onnxruntime_engine import OnnxRuntimeEngine

        return OnnxRuntimeEngine(p, device=device, **options, **said)
    raise UsageProblem(f"cannot open {p.name}: unknown model type {p.suffix!r}", "give a .onnx, .plan or .pt2 file")


def _expecting(engine, said: dict):
    """``engine`` told what the caller will run (``said``: ``batch`` and ``form``, when given)."""
    if said:
        engine.expect(**said)
    return engine


__all__ = ["open_engine", "split_engine", "Engine", "TensorSpec", "Manifest", "BatchProfile", "PreprocessSpec",
           "preprocess_rgb", "read_manifest", "write_manifest", "TrtcError", "UsageProblem", "MissingDependency",
           "ManifestError", "EngineError", "__version__"]
