"""ONNX Runtime backend.

CPU execution provider for machines without a GPU; CUDA execution provider where onnxruntime-gpu is installed.

``infer(batch)`` with a numpy batch returns numpy outputs (ONNX Runtime copies in and out). ``infer(batch,
outputs=None, stream=None)`` with a device array (CuPy, torch, anything with DLPack or __cuda_array_interface__)
runs zero-copy: IOBinding binds the input's and the outputs' device pointers, ONNX Runtime computes on the
session's own CUDA stream (``user_compute_stream``, fixed when the session is made), and the call returns
without a host synchronisation. Ordering with the caller's ``stream`` goes through CUDA events: the session
stream waits for the caller's work before reading the input, and the caller's stream waits for the outputs. The
outputs are CuPy arrays (the ``outputs`` given, or new ones).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ._cuda import device_input, device_output, external_stream, is_device_array
from ._deps import dist_version, is_installed, require
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
        from ._gpu import gpus

        found = gpus()
        if not found["devices"]:  # installing trtc[gpu] would not give this machine a GPU
            raise UsageProblem(f"{device}: no NVIDIA GPU found here ({found.get('reason')}), and ONNX Runtime here "
                               "has no CUDA execution provider", 'use --device cpu (on a machine with an NVIDIA GPU: '
                               'pip uninstall -y onnxruntime && pip install "trtc[gpu]")')
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
    """The rule of :func:`qdq_fusion_safe` for a precision recipe: not for INT8 with FP16 scales. trtc's default
    INT8 graph keeps Q/DQ and their scales in FP32 (``"scales": "fp32"`` in the manifest) and is right with the
    fusion on; manifests written before that field existed had FP16 scales whenever the rest was FP16."""
    if precision.get("mode") != "int8":
        return True
    scales = precision.get("scales") or ("fp16" if precision.get("high_precision") == "fp16" else "fp32")
    return scales != "fp16"


def runtime_warning(precision: dict, runtime: str) -> str | None:
    """A sentence when the manifest's ``runtimes`` (who computes the graph right) leaves out ``runtime``."""
    runtimes = precision.get("runtimes")
    if runtimes is None or runtime in runtimes:
        return None
    return (f"this model was made for {', '.join(runtimes)} (trtc quantize --target {precision.get('target')}); "
            f"{runtime} runs it only op by op, and a default {runtime} session of your own gives wrong answers")


def _warn_runtime(path) -> None:
    import json
    import logging

    from .manifest import manifest_path

    try:
        precision = json.loads(manifest_path(path).read_text()).get("precision") or {}
    except (OSError, ValueError):
        return
    text = runtime_warning(precision, "onnxruntime")
    if text:
        logging.getLogger("trtc").warning("%s: %s", Path(path).name, text)


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
                 qdq_fusion: bool | None = None, device_buffers: bool | None = None, tf32: bool = True):
        """``device_buffers``: give the session a CUDA stream of its own so device arrays run zero-copy (needs
        CuPy; default: on when the device is CUDA and CuPy is installed). ``tf32``: the CUDA EP computes FP32
        convolutions and matrix products in TF32 on Ampere and later (its default, as PyTorch's cuDNN and
        TensorRT's FP32 builds do); ``tf32=False`` computes them in full FP32 (on an H100, Lite0's softmax against
        the CPU EP: 4.2e-4 with TF32, 3.9e-7 without)."""
        ort = require("onnxruntime", "Running ONNX models")
        self.path = Path(path)
        self.device = device
        kind, self.device_id = parse_device(device)
        if qdq_fusion is None:
            qdq_fusion = qdq_fusion_safe(self.path, device)
            if not qdq_fusion:
                _warn_runtime(self.path)
        self.qdq_fusion = qdq_fusion  # False: runs op by op, unlike a default session (the manifest says why)
        opts = session_options(ort, threads, qdq_fusion)
        if kind == "cuda":  # first: without the GPU, a missing CUDA provider is not the problem to fix
            from ._gpu import check_gpu_index

            check_gpu_index(self.device_id)  # else CuPy or the CUDA EP fails on a missing GPU with errors of their own
        providers = providers_for(device)
        self.stream = None
        if kind == "cuda" and (device_buffers or (device_buffers is None and is_installed("cupy"))):
            cp = require("cupy", "Running ONNX models on device buffers")
            with cp.cuda.Device(self.device_id):
                self.stream = cp.cuda.Stream(non_blocking=True)
            providers[0][1]["user_compute_stream"] = str(self.stream.ptr)
        if kind == "cuda" and not tf32:
            providers[0][1]["use_tf32"] = "0"
        try:
            self.session = ort.InferenceSession(os.fspath(self.path), sess_options=opts, providers=providers)
        except EngineError:
            raise
        except Exception as exc:  # ORT raises its own exception types for bad graphs
            raise EngineError(f"ONNX Runtime cannot load {self.path.name}: {str(exc).splitlines()[0]}",
                              "check the model with `trtc inspect` or re-export it") from exc
        self.inputs = [_spec(a) for a in self.session.get_inputs()]
        self.outputs = [_spec(a) for a in self.session.get_outputs()]
        self._output_names = [o.name for o in self.outputs]

        self._binding = None
        self._run_options = None

    def infer(self, batch, outputs=None, stream=None) -> list:
        """Run one batch. Host arrays in, host arrays out; device arrays in, device (CuPy) arrays out.

        On the device path the call returns once the work is enqueued: the input must stay alive and unchanged
        until ``stream`` (or the current stream) reaches this point, as with any asynchronous CUDA call."""
        first = next(iter(batch.values())) if isinstance(batch, dict) else batch
        if is_device_array(first):
            return self._infer_device(batch, outputs, stream)
        feeds = batch if isinstance(batch, dict) else {self.inputs[0].name: batch}
        casted = {}
        for spec in self.inputs:
            if spec.name not in feeds:
                raise UsageProblem(f"no data for model input {spec.name!r}")
            casted[spec.name] = np.ascontiguousarray(feeds[spec.name], dtype=spec.numpy_dtype)
        return self.session.run(self._output_names, casted)

    def _infer_device(self, batch, outputs, stream):
        if self.stream is None:
            raise UsageProblem(f"{self.path.name} is open on {self.device} without device buffers",
                               "open it with device='cuda:N' (CuPy installed) or pass numpy arrays")
        import cupy as cp

        feeds = batch if isinstance(batch, dict) else {self.inputs[0].name: batch}
        if self._binding is None:
            self._binding = self.session.io_binding()
            ort = require("onnxruntime", "Running ONNX models")
            self._run_options = ort.RunOptions()
            # with our own compute stream ORT need not synchronise after the run: we order through events
            self._run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        io = self._binding
        caller = external_stream(stream, self.device_id) if stream is not None else cp.cuda.get_current_stream()
        if caller.ptr != self.stream.ptr:
            self.stream.wait_event(caller.record())
        n = None
        for spec in self.inputs:
            x = device_input(feeds, spec)
            n = x.shape[0] if n is None else n
            io.bind_input(spec.name, "cuda", self.device_id, x.dtype, tuple(x.shape), x.data.ptr)
        results = []
        for i, spec in enumerate(self.outputs):
            shape = tuple(n if (isinstance(d, str) or d is None or d < 0) and j == 0 else d
                          for j, d in enumerate(spec.shape))
            if any(not isinstance(d, int) for d in shape):
                raise EngineError(f"output {spec.name!r} has dynamic dimensions {spec.shape} besides the batch",
                                  "export the model with a fixed output shape")
            out = device_output(outputs, i, spec, shape, self.stream)
            io.bind_output(spec.name, "cuda", self.device_id, out.dtype, shape, out.data.ptr)
            results.append(out)
        try:
            self.session.run_with_iobinding(io, self._run_options)
        except Exception as exc:  # ORT's own exception types
            raise EngineError(f"ONNX Runtime failed on {self.path.name}: {str(exc).splitlines()[0]}") from exc
        if caller.ptr != self.stream.ptr:
            caller.wait_event(self.stream.record())
        return results

    def close(self) -> None:
        self._binding = None
        self.session = None
