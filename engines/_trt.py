"""Finding TensorRT: the full library (10.x / 11.x) or TensorRT-RTX, under either import name.

NVIDIA's own installs give ``tensorrt`` / ``tensorrt_rtx``; the PyPI wheels (``tensorrt-cu13-bindings``,
``tensorrt-rtx-cu13-bindings``) give ``tensorrt_bindings`` / ``tensorrt_rtx_bindings``. The classes are the same.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass

from .errors import MissingDependency, UsageProblem

log = logging.getLogger("trtc")
FLAVORS = {"tensorrt": ("tensorrt", "tensorrt_bindings"), "tensorrt-rtx": ("tensorrt_rtx", "tensorrt_rtx_bindings")}
# runtime-only flavours of TensorRT 10/11 (no builder): they run version-compatible plans built by full TensorRT.
# The lean runtime (`tensorrt-lean-cu13`, ~100 MB installed) is what an edge box needs; the dispatch runtime is
# smaller still and runs plans that carry their lean runtime (built without --exclude-lean-runtime).
RUNTIME_FLAVORS = {"tensorrt-lean": ("tensorrt_lean", "tensorrt_lean_bindings"),
                   "tensorrt-dispatch": ("tensorrt_dispatch", "tensorrt_dispatch_bindings")}
ALL_FLAVORS = {**FLAVORS, **RUNTIME_FLAVORS}
EXTRAS = {"tensorrt": "trt", "tensorrt-rtx": "rtx", "tensorrt-lean": "edge", "tensorrt-dispatch": "edge"}
BACKENDS = ("auto", *FLAVORS)
NAMES = {"tensorrt": "TensorRT", "tensorrt-rtx": "TensorRT-RTX", "tensorrt-lean": "TensorRT lean runtime",
         "tensorrt-dispatch": "TensorRT dispatch runtime"}
MIN_TENSORRT = (10, 0)  # strong typing, execute_async_v3, the tensor-name API: older TensorRT is refused
# The lean runtime the `edge` extra pins in pyproject.toml (tests/unit/test_edge_versions.py checks that they agree).
# It loads version-compatible plans built by TensorRT of this version or older: `trtc build --version-compatible`
# warns when its TensorRT is newer, and records in the plan's manifest which lean runtime will run it.
EDGE_LEAN_VERSION = "11.4.0.106"


@dataclass
class Backend:
    module: object
    flavor: str  # "tensorrt", "tensorrt-rtx", "tensorrt-lean" or "tensorrt-dispatch"
    import_name: str
    version: str

    @property
    def major(self) -> int:
        try:
            return int(self.version.split(".")[0])
        except ValueError:
            return 0

    @property
    def rtx(self) -> bool:
        return self.flavor == "tensorrt-rtx"

    @property
    def runtime_only(self) -> bool:
        return self.flavor in RUNTIME_FLAVORS

    def describe(self) -> str:
        return f"{NAMES[self.flavor]} {self.version} ({self.import_name})"


def version_tuple(version: str) -> tuple:
    """'11.4.0.106' -> (11, 4, 0, 106), for ordering versions (a part that is not a number counts as 0)."""
    return tuple(int(part) if part.isdigit() else 0 for part in str(version).split("."))


def runtime_pip_line(flavor: str, version: str) -> str:
    """The pip line that installs ``flavor``'s runtime (``tensorrt-lean`` or ``tensorrt-dispatch``) of ``version``
    from PyPI, for the CUDA major of the one installed here (CUDA 13, the edge extra's, when none is)."""
    from ._deps import dist_version

    kind = flavor.removeprefix("tensorrt-")
    cuda = "cu12" if dist_version(f"tensorrt-{kind}-cu12-bindings") else "cu13"
    return f"pip install tensorrt-{kind}-{cuda}-bindings=={version} tensorrt-{kind}-{cuda}-libs=={version}"


def installed(flavor: str) -> str | None:
    """The import name under which ``flavor`` is installed (found without importing it), or None."""
    for name in ALL_FLAVORS[flavor]:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except (ImportError, ValueError):
            continue
    return None


def load_runtime_backend(flavor: str, purpose: str = "Running TensorRT plans") -> Backend:
    """A runtime for plans built by ``flavor``: the same flavour, or for TensorRT plans the lean, then the dispatch
    runtime when full TensorRT is absent (they run version-compatible plans only; the caller checks)."""
    order = [flavor] + (list(RUNTIME_FLAVORS) if flavor == "tensorrt" else [])
    for f in order:
        if installed(f) is not None:
            return load_backend(f, purpose=purpose)
    raise MissingDependency(ALL_FLAVORS[flavor][0], EXTRAS[flavor], purpose)


def load_backend(name: str = "auto", purpose: str = "Building TensorRT engines") -> Backend:
    """Import TensorRT (``tensorrt``) or TensorRT-RTX (``tensorrt-rtx``); ``auto`` prefers the full library."""
    if name not in BACKENDS and name not in RUNTIME_FLAVORS:
        raise UsageProblem(f"unknown backend {name!r}", f"use one of {', '.join(BACKENDS)}")
    order = list(FLAVORS) if name == "auto" else [name]
    for flavor in order:
        import_name = installed(flavor)
        if import_name is None:
            continue
        try:
            module = importlib.import_module(import_name)
        except Exception as exc:  # a broken install: missing .so, wrong CUDA
            raise MissingDependency(import_name, EXTRAS[flavor], f"{purpose} ({import_name} failed to import: "
                                    f"{str(exc).splitlines()[0][:120]})") from exc
        backend = Backend(module, flavor, import_name, str(getattr(module, "__version__", "0")))
        if not backend.rtx and backend.major < MIN_TENSORRT[0]:
            raise UsageProblem(f"{backend.describe()} is too old: trtc needs TensorRT 10 or newer (strong typing, "
                               "the tensor-name API, execute_async_v3)", 'pip install -U "trtc[trt]"')
        return backend
    if name == "auto":
        err = MissingDependency("tensorrt", "trt", purpose)
        err.reason = f"{purpose} needs TensorRT or TensorRT-RTX, and neither is installed"
        err.fix = ('pip install "trtc[rtx]" (TensorRT-RTX, from PyPI) or pip install "trtc[trt]" (TensorRT 10/11; '
                   "its libraries come from NVIDIA's package index)")
        err.args = (err.reason,)
        raise err
    raise MissingDependency(ALL_FLAVORS[name][0], EXTRAS[name], purpose)


def make_logger(trt, error_level: int = logging.ERROR):
    """A ``trt.ILogger`` that sends TensorRT's messages to the ``trtc`` logger at the matching level and keeps the
    errors (``.errors``) to explain a failure; ``error_level`` is the level those errors are logged at."""

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            S = trt.ILogger.Severity
            if severity <= S.ERROR:
                self.errors.append(str(msg))
                log.log(error_level, "tensorrt: %s", msg)
            elif severity == S.WARNING:
                log.warning("tensorrt: %s", msg)
            elif severity == S.INFO:
                log.info("tensorrt: %s", msg)
            else:
                log.debug("tensorrt: %s", msg)

    return Logger()


def rtx_targets(module) -> list[str]:
    """Compute capabilities TensorRT-RTX can build for, e.g. ['SM75', 'SM80', ...] (RTX 1.7 has no SM90)."""
    enum = getattr(module, "ComputeCapability", None)
    members = getattr(enum, "__members__", {}) if enum is not None else {}
    return [m for m in members if m.startswith("SM")]


def sm_name(compute_capability: str) -> str:
    """'8.9' -> 'SM89'."""
    major, _, minor = str(compute_capability).partition(".")
    return f"SM{major}{minor or '0'}"
