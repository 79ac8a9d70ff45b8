"""TensorRT plans: the manifest check that comes before deserialization, and loading.

A plan only runs on the TensorRT flavour and version that built it (unless built version-compatible, and then
only on the same or a newer runtime) and on the GPU it was built for (unless built hardware-compatible). Asking
TensorRT to deserialize anything else ends in a log line and a None, or worse; so the runtime reads the plan's
manifest first and says which side differs and how to rebuild. TensorRT-RTX builds for a list of compute
capabilities and version 1.7 has none for 9.0 (H100/H200).

The execution engine (contexts per stream, ``set_tensor_address``, ``execute_async_v3``) is the runtime issue's;
this module gives it :func:`load_plan`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ._gpu import device as gpu_device
from ._trt import Backend, load_backend, make_logger, rtx_targets, sm_name
from .errors import EngineError, ManifestError
from .manifest import Manifest, read_manifest

log = logging.getLogger("trtc")


def rebuild_command(manifest: Manifest, plan: str | Path, problems: list[str] | None = None) -> str:
    """How to get a plan that runs here (or where to run this one)."""
    if any("cannot run on compute capability" in p for p in problems or []):
        targets = ", ".join((manifest.builder or {}).get("compute_capabilities", [])) or "a supported GPU"
        return (f"run it on a GPU it was built for ({targets}), or build for this GPU with TensorRT: "
                f"trtc build {(manifest.parent or {}).get('file', 'model.onnx')} --backend tensorrt")
    parent = (manifest.parent or {}).get("file", "model.onnx")
    b = manifest.builder or {}
    mode = (manifest.precision or {}).get("mode", "fp32")
    cmd = f"trtc build {parent} -o {Path(plan).name} --force --backend {b.get('flavor', 'auto')}"
    if mode != "fp32" and not str(parent).endswith(f".{mode}.onnx"):
        cmd += f" --precision {mode}"
    return cmd + " (on this machine)"


def _version_tuple(v: str) -> tuple:
    out = []
    for part in str(v).split("."):
        out.append(int(part) if part.isdigit() else 0)
    return tuple(out)


def plan_problems(manifest: Manifest, backend: Backend | None, gpu: dict | None) -> list[str]:
    """Why this machine cannot run the plan (empty when it can, as far as the manifest tells)."""
    b = manifest.builder or {}
    problems = []
    flavor = b.get("flavor")
    built = str(b.get("version", "?"))
    if backend is None:
        problems.append(f"{'TensorRT-RTX' if flavor == 'tensorrt-rtx' else 'TensorRT'} is not installed here "
                        f"(the plan needs {flavor} {built})")
    elif backend.flavor != flavor:
        problems.append(f"the plan was built with {flavor} {built}; this machine has {backend.describe()}")
    elif backend.version != built:
        compatible = b.get("flags", {}).get("version_compatible")
        newer = _version_tuple(backend.version) > _version_tuple(built)
        if not (compatible and newer and not backend.rtx):
            problems.append(f"the plan was built with {flavor} {built}; this machine has {flavor} {backend.version}"
                            + (" (only a newer runtime can load a version-compatible plan)" if compatible else ""))
    if gpu is None:
        problems.append("no NVIDIA GPU found here")
    else:
        cc = str(gpu.get("compute_capability"))
        if flavor == "tensorrt-rtx":
            targets = [t.upper() for t in b.get("compute_capabilities", [])]
            if "CURRENT" in targets:
                targets = [sm_name(b.get("gpu", {}).get("compute_capability", "0.0"))]
            if targets and sm_name(cc) not in targets:
                problems.append(f"the plan was built for {', '.join(targets)}; this GPU ({gpu.get('name')}) is "
                                f"{sm_name(cc)}")
            if backend is not None and backend.rtx and sm_name(cc) not in rtx_targets(backend.module):
                problems.append(f"TensorRT-RTX {backend.version} cannot run on compute capability {cc} "
                                f"({gpu.get('name')}); it supports {', '.join(rtx_targets(backend.module))}")
        else:
            level = b.get("flags", {}).get("hardware_compatibility", "none")
            built_cc = str(b.get("gpu", {}).get("compute_capability", "?"))
            if level == "none" and built_cc != cc:
                problems.append(f"the plan was built on a GPU of compute capability {built_cc} "
                                f"({b.get('gpu', {}).get('name', '?')}); this one is {cc} ({gpu.get('name')})")
            if level == "ampere+" and _version_tuple(cc) < (8, 0):
                problems.append(f"an Ampere-or-newer plan cannot run on compute capability {cc}")
    return problems


def load_plan(path: str | Path, device: int = 0, backend: Backend | None = None):
    """Check the manifest against this machine, then deserialize. Returns (backend, runtime, engine, manifest)."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.kind != "plan":
        raise ManifestError(f"{path.name} is a {manifest.kind} artifact, not a TensorRT plan",
                            "give the .plan made by trtc build")
    flavor = (manifest.builder or {}).get("flavor", "tensorrt")
    if backend is None:
        try:
            backend = load_backend(flavor, purpose="Running TensorRT plans")
        except Exception as exc:  # MissingDependency: reported with the other problems below
            log.debug("no %s: %s", flavor, exc)
            backend = None
    problems = plan_problems(manifest, backend, gpu_device(device))
    if problems:
        raise ManifestError(f"{path.name} cannot run here: " + "; ".join(problems),
                            rebuild_command(manifest, path, problems))
    trt = backend.module
    logger = make_logger(trt, error_level=logging.DEBUG)  # the reason is in the error raised below
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise EngineError(f"{backend.describe()} could not deserialize {path.name}: "
                          + ("; ".join(logger.errors[-2:]) or "no reason given"), rebuild_command(manifest, path))
    return backend, runtime, engine, manifest
