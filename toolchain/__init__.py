"""trtc's offline toolchain: export, quantize, build, validate, bench, doctor, and the `trtc` CLI.

The library functions live in their modules (``toolchain.export.export_onnx`` ...); importing this package
loads nothing heavy.
"""

from engines import __version__

__all__ = ["__version__"]
