"""Errors of the offline toolchain. The base classes live in :mod:`engines.errors` (the runtime must not import
the toolchain); they are re-exported here so that ``from toolchain.errors import TrtcError`` works too."""

from engines.errors import EngineError, ManifestError, MissingDependency, TrtcError, UsageProblem, first_line


def from_cli() -> bool:
    """Whether a `trtc` command is running (a click context is current): an error's fix then names options
    (--force); called from Python, it names the function's arguments (force=True)."""
    import sys

    click = sys.modules.get("click")  # never imported here for this
    return click is not None and click.get_current_context(silent=True) is not None


def said_as(cli: str, python: str) -> str:
    """``cli`` in a running `trtc` command, else ``python`` (see :func:`from_cli`)."""
    return cli if from_cli() else python


class ExportError(TrtcError):
    """The PyTorch model could not be loaded or exported to ONNX, or the export disagrees with PyTorch."""


class QuantizeError(TrtcError):
    """An FP16 or INT8 model could not be made."""


class BuildError(TrtcError):
    """A TensorRT engine could not be built."""


class ParityFailure(TrtcError):
    """A candidate disagrees with its reference beyond the thresholds."""


__all__ = ["TrtcError", "UsageProblem", "MissingDependency", "ManifestError", "EngineError", "ExportError",
           "QuantizeError", "BuildError", "ParityFailure", "first_line", "from_cli", "said_as"]
