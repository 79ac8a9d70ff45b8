"""How trtc opens an ONNX Runtime session: the execution providers for a device and the session options. The engine
(engines.onnxruntime_engine) opens its sessions with them, and so do the toolchain's own sessions (calibration, the
quantizer's checks, validation's references), without importing the engine."""

from __future__ import annotations

import contextlib

from ._deps import cpu_threads, dist_version, require
from ._gpu import gpus, parse_device
from .errors import EngineError, UsageProblem


def providers_for(device: str) -> list:
    ort = require("onnxruntime", "Running ONNX models")
    kind, index = parse_device(device)
    available = ort.get_available_providers()
    if kind == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        if dist_version("onnxruntime") and dist_version("onnxruntime-gpu"):
            raise EngineError("both onnxruntime and onnxruntime-gpu are installed; they provide the same module and "
                              "the CPU build won, so the CUDA execution provider is missing",
                              "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu")
        found = gpus()
        if not found["devices"]:  # installing trtc[gpu] would not give this machine a GPU
            raise UsageProblem(f"{device}: no NVIDIA GPU found here ({found.get('reason')}), and ONNX Runtime here "
                               "has no CUDA execution provider", 'use --device cpu (on a machine with an NVIDIA GPU: '
                               'pip uninstall -y onnxruntime && pip install "trtc[gpu]")')
        raise EngineError(f"ONNX Runtime here has no CUDA execution provider (it has {', '.join(available)})",
                          'pip uninstall -y onnxruntime && pip install "trtc[gpu]", or use --device cpu')
    if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from the nvidia-* wheels (e.g. torch's) when not on the path
        with contextlib.suppress(Exception):  # best effort; the session reports what is really missing
            ort.preload_dlls()
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]


def session_options(ort, threads: int | None = None, qdq_fusion: bool = True, spin: bool = False):
    """``spin=False`` (every CPU session): intra-op threads sleep between runs, leaving the cores to others."""
    ort.set_default_logger_severity(3)  # the process-wide logger prints provider chatter at warning level
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    threads = threads or cpu_threads()
    if threads:
        opts.intra_op_num_threads = threads
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not qdq_fusion:
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
    return opts
