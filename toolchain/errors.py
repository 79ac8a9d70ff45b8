"""Errors of the offline toolchain. The base classes live in :mod:`engines.errors` (the runtime must not import
the toolchain); they are re-exported here so that ``from toolchain.errors import TrtcError`` works too."""

from engines.errors import EngineError, ManifestError, MissingDependency, TrtcError, UsageProblem, first_line


class ExportError(TrtcError):
    """The PyTorch model could not be loaded or exported to ONNX, or the export disagrees with PyTorch."""


class QuantizeError(TrtcError):
    """An FP16 or INT8 model could not be made."""


class BuildError(TrtcError):
    """A TensorRT engine could not be built."""


class ParityFailure(TrtcError):
    """A candidate disagrees with its reference beyond the thresholds."""


__all__ = ["TrtcError", "UsageProblem", "MissingDependency", "ManifestError", "EngineError", "ExportError",
           "QuantizeError", "BuildError", "ParityFailure", "first_line"]
