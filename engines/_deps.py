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
import logging
import os
import re
import sys
import threading
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
    "yaml": ("serve", "pyyaml"),
    "paho.mqtt.client": ("serve", "paho-mqtt"),
    "prometheus_client": ("serve", "prometheus-client"),
}


# The releases of the optional packages trtc is tested with: module -> (shown name, pip package, lowest, highest). The
# lowest is the floor the extras in pyproject.toml allow; the highest is the newest release tested: the test lock's
# (.ci/dev.lock), or the GPU machine's where that is newer (PyAV 19). A release counts as tested when it starts with
# the highest's numbers (5.1 covers 5.1.0.95). tests/unit/test_lock.py holds the table to both files, so a lock
# refreshed to a newer release must change it here too, deliberately.
TESTED = {
    "torch": ("PyTorch", "torch", "2.6", "2.14"),
    "torchvision": ("torchvision", "torchvision", "0.21", "0.29"),
    "onnx": ("onnx", "onnx", "1.17", "1.23"),
    "onnxruntime": ("ONNX Runtime", "onnxruntime", "1.20", "1.32"),
    "av": ("PyAV", "av", "12", "19"),
    "cv2": ("OpenCV", "opencv-python-headless", "4.10", "5.1"),
    "timm": ("timm", "timm", "1.0", "1.0"),
}
log = logging.getLogger("trtc")
_warned: set[str] = set()  # modules warned about, under _warn_lock
_warn_lock = threading.Lock()


def version_tuple(text: str) -> tuple[int, ...]:
    """The release numbers of a version string: "2.14.1+cu130" -> (2, 14, 1), "5.1.0.95" -> (5, 1, 0, 95)."""
    numbers = []
    for part in text.split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        numbers.append(int(m.group()))
        if m.group() != part:  # "0rc1": the release stops at its pre-release tag
            break
    return tuple(numbers)


def is_tested(module: str, version: str | None) -> bool:
    """True when ``version`` of ``module`` lies in :data:`TESTED`'s range (or the module is not in the table)."""
    if module not in TESTED or not version:
        return True
    _, _, low, high = TESTED[module]
    v, hi = version_tuple(version), version_tuple(high)
    return version_tuple(low) <= v and v[:len(hi)] <= hi


def tested_range(module: str) -> str:
    """"4.10 to 5.1.x": the releases of :data:`TESTED` for ``module``."""
    _, _, low, high = TESTED[module]
    return f"{low} to {high}.x" if high.count(".") < 2 else f"{low} to {high}"


def install_tested(module: str) -> str:
    """The pip line that installs a tested release of ``module``."""
    _, package, low, high = TESTED[module]
    hi = version_tuple(high)
    upper = ".".join(map(str, (*hi[:-1], hi[-1] + 1)))
    return f'pip install "{package}>={low},<{upper}"'


def unsupported_message(module: str, version: str) -> tuple[str, str]:
    """("OpenCV 5.2.0 is not supported by this trtc; supported: 4.10 to 5.1.x", the pip line that installs one)."""
    return (f"{TESTED[module][0]} {version} is not supported by this trtc; supported: {tested_range(module)}",
            install_tested(module))


def untested_message(module: str, version: str) -> str:
    return f"{TESTED[module][0]} {version} is outside the releases this trtc is tested with ({tested_range(module)})"


def untested_imports() -> list[tuple[str, str]]:
    """(module, version) of each module of :data:`TESTED` this process has imported at a release outside its range."""
    found = []
    for module in TESTED:
        mod = sys.modules.get(module)
        version = getattr(mod, "__version__", None) if mod is not None else None
        if isinstance(version, str) and not is_tested(module, version):
            found.append((module, version))
    return found


def _warn_if_untested(module: str, mod: ModuleType) -> None:
    version = getattr(mod, "__version__", None)
    if not isinstance(version, str) or is_tested(module, version):
        return
    with _warn_lock:
        if module in _warned:
            return
        _warned.add(module)
    log.warning("%s; it may work; if something fails: %s", untested_message(module, version), install_tested(module))


def require(module: str, purpose: str, extra: str | None = None, package: str | None = None) -> ModuleType:
    """Import ``module`` or raise MissingDependency with the install line. A release outside :data:`TESTED`'s
    range is imported with a warning (once per process) naming the tested range."""
    known_extra, known_pkg = KNOWN.get(module, (None, None))
    try:
        mod = importlib.import_module(module)
        _warn_if_untested(module, mod)
        return mod
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
