"""ONNX Runtime backend.

CPU execution provider for machines without a GPU; CUDA execution provider where onnxruntime-gpu is installed.
This first version feeds host (numpy) batches; zero-copy IOBinding on device buffers comes with the video
runtime.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ._deps import dist_version, require
from .base import EngineBase, TensorSpec
from .errors import EngineError, UsageProblem

_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int32)": "int32", "tensor(int64)": "int64",
              "tensor(bool)": "bool"}


def _spec(arg) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else (d or "?") for d in arg.shape)
    return TensorSpec(arg.name, _ORT_TYPES.get(arg.type, arg.type), shape)


def parse_device(device: str) -> tuple[str, int]:
    d = (device or "cpu").strip().lower()
    if d == "cpu":
        return "cpu", 0
    if d == "cuda":
        return "cuda", 0
    if d.startswith("cuda:") and d[5:].isdigit():
        return "cuda", int(d[5:])
    raise UsageProblem(f"unknown device {device!r}", "use cpu, cuda or cuda:N")


def providers_for(device: str) -> list:
    ort = require("onnxruntime", "Running ONNX models")
    kind, index = parse_device(device)
    available = ort.get_available_providers()
    if kind == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        both = dist_version("onnxruntime") and dist_version("onnxruntime-gpu")
        if both:
            raise EngineError("both onnxruntime and onnxruntime-gpu are installed; they provide the same module and "
                              "the CPU build won, so the CUDA execution provider is missing",
                              "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu")
        raise EngineError(f"ONNX Runtime here has no CUDA execution provider (it has {', '.join(available)})",
                          'pip uninstall -y onnxruntime && pip install "trtc[gpu]", or use --device cpu')
    if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from the nvidia-* wheels (e.g. torch's) when not on the path
        try:
            ort.preload_dlls()
        except Exception:  # noqa: BLE001 - best effort; the session reports what is really missing
            pass
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]


def qdq_fusion_safe(path, device: str) -> bool:
    """Whether ONNX Runtime may rewrite this model's Q/DQ pairs with its QDQ graph transformers.

    ONNX Runtime 1.31 rewrites DequantizeLinear -> Conv -> QuantizeLinear groups (into integer kernels on the
    CPU). With FP16 scales (INT8 models whose other layers compute in FP16, trtc's default) the rewritten graph
    returned wrong logits here: 0% top-1 agreement on EfficientNet-Lite0 on the CPU and under the CUDA EP, while
    the same graph run op by op agrees like its FP32-scale twin. TensorRT does its own fusion; for ONNX Runtime
    such models run op by op (``session.disable_quant_qdq``), which computes exactly what the graph says."""
    from .manifest import manifest_path

    mp = manifest_path(path)
    try:
        import json

        precision = json.loads(mp.read_text()).get("precision") or {}
    except (OSError, ValueError):
        return True
    return qdq_fusion_ok(precision)


def qdq_fusion_ok(precision: dict) -> bool:
    """The rule of :func:`qdq_fusion_safe` for a precision recipe: not for INT8 whose other layers are FP16."""
    return not (precision.get("mode") == "int8" and precision.get("high_precision") == "fp16")


def session_options(ort, threads: int | None = None, qdq_fusion: bool = True):
    # ONNX Runtime's process-wide logger prints provider chatter at warning level (e.g. one line per CUDA
    # session in 1.31); errors still raise
    ort.set_default_logger_severity(3)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    if not qdq_fusion:
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
    return opts


class OnnxRuntimeEngine(EngineBase):
    def __init__(self, path: str | os.PathLike, device: str = "cpu", threads: int | None = None,
                 qdq_fusion: bool | None = None):
        ort = require("onnxruntime", "Running ONNX models")
        self.path = Path(path)
        self.device = device
        if qdq_fusion is None:
            qdq_fusion = qdq_fusion_safe(self.path, device)
        opts = session_options(ort, threads, qdq_fusion)
        try:
            self.session = ort.InferenceSession(os.fspath(self.path), sess_options=opts,
                                                providers=providers_for(device))
        except EngineError:
            raise
        except Exception as exc:  # ORT raises its own exception types for bad graphs
            raise EngineError(f"ONNX Runtime cannot load {self.path.name}: {str(exc).splitlines()[0]}",
                              "check the model with `trtc inspect` or re-export it") from exc
        self.inputs = [_spec(a) for a in self.session.get_inputs()]
        self.outputs = [_spec(a) for a in self.session.get_outputs()]
        self._output_names = [o.name for o in self.outputs]

    def infer(self, batch) -> list[np.ndarray]:
        feeds = batch if isinstance(batch, dict) else {self.inputs[0].name: batch}
        casted = {}
        for spec in self.inputs:
            if spec.name not in feeds:
                raise UsageProblem(f"no data for model input {spec.name!r}")
            casted[spec.name] = np.ascontiguousarray(feeds[spec.name], dtype=spec.numpy_dtype)
        return self.session.run(self._output_names, casted)
