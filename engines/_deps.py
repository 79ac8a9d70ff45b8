"""The one place where optional heavy packages are imported.

``require("onnxruntime", extra="cpu", purpose="Running ONNX models")`` returns the module or raises
:class:`MissingDependency` naming the extra that installs it. Modules call it inside the function or constructor
that needs the package, so importing ``engines`` or ``toolchain.cli`` never loads torch, onnx, onnxruntime,
tensorrt, cupy or PyNvVideoCodec.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from types import ModuleType

from .errors import MissingDependency, UsageProblem

# module -> (extra, pip package) for the messages
KNOWN = {
    "torch": ("export", "torch"),
    "torchvision": ("export", "torchvision"),
    "onnx": ("export", "onnx"),
    "onnxscript": ("export", "onnxscript"),
    "onnxruntime": ("cpu", "onnxruntime"),
    "cupy": ("gpu", "cupy-cuda13x"),
    "PyNvVideoCodec": ("gpu", "pynvvideocodec"),
    "av": ("video-cpu", "av"),
    "cv2": ("opencv", "opencv-python-headless"),
    "timm": ("timm", "timm"),
    "tensorrt": ("trt", "tensorrt"),
    "tensorrt_rtx": ("rtx", "tensorrt-rtx-cu13-bindings"),
    "ray": ("ray", "ray"),
}


def require(module: str, purpose: str, extra: str | None = None, package: str | None = None) -> ModuleType:
    """Import ``module`` or raise MissingDependency with the install line."""
    known_extra, known_pkg = KNOWN.get(module, (None, None))
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        # a package that is installed but broken must not be reported as missing
        if importlib.util.find_spec(module.split(".")[0]) is not None:
            raise MissingDependency(module, extra or known_extra, f"{purpose} (import failed: {exc})",
                                    package or known_pkg) from exc
        raise MissingDependency(module, extra or known_extra, purpose, package or known_pkg) from exc


def cpu_threads() -> int | None:
    """TRTC_CPU_THREADS: the CPU threads of each ONNX Runtime session, for a machine that several processes share
    or a container with a CPU quota (ONNX Runtime's default is one per core of the host). None when unset."""
    raw = os.environ.get("TRTC_CPU_THREADS", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise UsageProblem(f"TRTC_CPU_THREADS={raw!r} is not a number of threads",
                           "set it to a whole number of 1 or more, or unset it for one thread per core")
    return int(raw)


def is_installed(module: str) -> bool:
    """True when ``module`` can be found, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def dist_version(*names: str) -> str | None:
    """The installed version of the first of these distributions that is installed (no import)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def package_dir(module: str) -> str | None:
    """Where an installed package lives, found without importing it (its data files are read from there)."""
    spec = importlib.util.find_spec(module) if is_installed(module) else None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]
