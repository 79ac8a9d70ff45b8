"""OpenCV dnn backend: the same classifier through ``cv2.dnn.readNetFromONNX``, behind the Engine interface.

For users moving from OpenCV dnn to trtc: ``trtc validate --reference opencv:model.onnx --candidate model.onnx``
shows whether trtc's engines agree with what they run today, ``trtc bench opencv:model.onnx model.onnx`` how much
faster they are. numpy in, numpy out (OpenCV dnn takes host arrays only).

Backend and target come from ``device``: ``cpu`` -> DNN_BACKEND_OPENCV / DNN_TARGET_CPU; ``cuda:N`` ->
DNN_BACKEND_CUDA / DNN_TARGET_CUDA, or DNN_TARGET_CUDA_FP16 with ``fp16=True`` (the ``opencv-fp16:`` prefix). CUDA
needs an OpenCV built with CUDA and cuDNN: the opencv-python wheels on PyPI never are, and that is said as such.

OpenCV 5 has two dnn engines: the new one (``ENGINE_NEW``, CPU only, tried first by ``ENGINE_AUTO``) and the
classic one of OpenCV 4 (``ENGINE_CLASSIC``, the only one with the CUDA backend). ``dnn_engine`` picks one
("auto", "new", "classic"); on OpenCV 4 there is only the classic one.

What OpenCV cannot load or run (an op it lacks, an FP16 tensor a classic layer refuses, a shape it computes wrong
for another batch size) raises :class:`EngineError` naming the layer and op, parsed from OpenCV's exception and,
where the exception leaves the layer out, from OpenCV's own error log captured while the failing call is repeated.
The net is run once on zeros when it is opened, so such failures surface there and not in the middle of a run.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from ._deps import require
from .base import EngineBase, TensorSpec
from .errors import EngineError, UsageProblem

PURPOSE = "Running ONNX models with OpenCV dnn"
NO_CUDA_FIX = ("build OpenCV with CUDA and cuDNN (-D WITH_CUDA=ON -D WITH_CUDNN=ON -D OPENCV_DNN_CUDA=ON, with "
               "opencv_contrib), or run the model on the GPU with trtc's own engines: the .onnx without the "
               "opencv: prefix (ONNX Runtime CUDA EP, pip install \"trtc[gpu]\") or a TensorRT plan (trtc build)")
_CV_TYPES = {"CV_16F": "FP16", "CV_16FC1": "FP16", "CV_8S": "INT8", "CV_8SC1": "INT8", "CV_8U": "UINT8",
             "CV_8UC1": "UINT8", "CV_64F": "FP64"}


def _cv2():
    return require("cv2", PURPOSE, extra="opencv", package="opencv-python-headless")


def cuda_status(cv2=None) -> dict:
    """What this OpenCV can do on CUDA: {"version", "dnn_cuda", "devices", "reason"}. ``devices`` is
    ``cv2.cuda.getCudaEnabledDeviceCount()`` (0 without a CUDA build or without a GPU, -1 when the driver is
    missing or too old); ``dnn_cuda``: the dnn module has the CUDA backend (built with CUDA and cuDNN) and a
    device to run it on."""
    cv2 = cv2 or _cv2()
    build = cv2.getBuildInformation() if hasattr(cv2, "getBuildInformation") else ""
    cuda_built = bool(re.search(r"NVIDIA CUDA:\s*YES", build))
    count_fn = getattr(getattr(cv2, "cuda", None), "getCudaEnabledDeviceCount", None)
    try:
        devices = int(count_fn()) if count_fn is not None else 0
    except Exception:  # noqa: BLE001 - a broken CUDA runtime: no device
        devices = 0
    targets = []
    try:
        targets = list(cv2.dnn.getAvailableTargets(cv2.dnn.DNN_BACKEND_CUDA))
    except Exception:  # noqa: BLE001 - builds without the CUDA backend may not know the constant
        targets = []
    dnn_cuda = bool(targets) and devices > 0
    if dnn_cuda:
        reason = ""
    elif not cuda_built:
        reason = (f"this OpenCV {cv2.__version__} was built without CUDA (no opencv-python wheel on PyPI "
                  "has CUDA)")
    elif not targets:
        reason = f"this OpenCV {cv2.__version__} has CUDA but its dnn module has no CUDA backend (no cuDNN)"
    elif devices < 0:
        reason = "OpenCV finds no usable CUDA driver (getCudaEnabledDeviceCount() = -1)"
    else:
        reason = "OpenCV sees no CUDA device"
    return {"version": cv2.__version__, "cuda_built": cuda_built, "dnn_cuda": dnn_cuda, "devices": devices,
            "reason": reason}


class _Log:
    """OpenCV's log level, silenced around our calls (its warnings and error dumps go straight to the process's
    stderr) and restored after."""

    def __init__(self, cv2, level: str = "LOG_LEVEL_SILENT"):
        self.log = getattr(getattr(cv2, "utils", None), "logging", None)
        self.level = level

    def __enter__(self):
        if self.log is not None:
            self.old = self.log.getLogLevel()
            self.log.setLogLevel(getattr(self.log, self.level))
        return self

    def __exit__(self, *exc):
        if self.log is not None:
            self.log.setLogLevel(self.old)


def _native_stderr(cv2, fn) -> str:
    """Run ``fn`` (a call that just failed) again with OpenCV's log at warning level and file descriptor 2
    captured; returns what OpenCV wrote (it names the failing layer where its exception does not)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        return ""
    with tempfile.TemporaryFile() as tmp:
        try:
            os.dup2(tmp.fileno(), 2)
            with _Log(cv2, "LOG_LEVEL_WARNING"):
                try:
                    fn()
                except Exception:  # noqa: BLE001 - the failure is expected: we want its log
                    pass
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode("utf-8", "replace")


_NODE = re.compile(r"\[([\w.@]+)\]:\(onnx_node!([^)]*)\)")


def describe_cv2_error(text: str, log: str = "") -> str:
    """One line from a cv2.error message (and OpenCV's log): the layer, its op, and OpenCV's own reason."""
    where = ""
    m = _NODE.search(text) or _NODE.search(log)
    if m:
        op, node = m.group(1).split("@")[0], m.group(2)
        where = f"layer {node} ({op})"
    unsupported = re.search(r"Unsupported operations:\s*((?:\s*\S+\n?)+)", log)
    if not where and unsupported:
        ops = [o for o in unsupported.group(1).split() if o]
        where = f"unsupported op{'s' if len(ops) > 1 else ''} {', '.join(ops)}"
    # OpenCV's reason: the text after the last "error: (code:kind)", without the C++ signature, plus the "> ..."
    # lines that explain an assertion
    tail = re.split(r"error: \(-?\d+:[^)]*\)", text)[-1] if "error: (" in text else text
    tail = re.sub(r"\s*in function '[^']*'", "", tail)
    lines = [ln.strip().lstrip(">").strip() for ln in tail.splitlines()]
    lines = [ln for ln in lines if ln and ln != ":" and not ln.startswith("Node [")]
    reason = re.sub(r"\s+", " ", " ".join(lines)).strip()
    wrong_type = re.search(r"where '(\w+)' is \d+ \((CV_\w+?)(C1)?\)", reason)
    if wrong_type and wrong_type.group(2) in _CV_TYPES:
        reason = (f"its {wrong_type.group(1)} is {_CV_TYPES[wrong_type.group(2)]} ({wrong_type.group(2)}), a type "
                  "this layer does not take")
    if reason.startswith("Can't create layer"):
        reason = "OpenCV dnn has no layer for this op"
    for cv_type, name in _CV_TYPES.items():
        reason = re.sub(rf"is \d+ \({cv_type}\)", f"is {name} ({cv_type})", reason)
    if len(reason) > 240:
        reason = reason[:237] + "..."
    return f"{where}: {reason}" if where and reason else where or reason


class OpenCVEngine(EngineBase):
    """A classifier run by OpenCV dnn. ``infer(batch)`` takes a numpy batch (or a dict of them) and returns a list
    of numpy outputs in ``outputs`` order."""

    host_arrays_only = True  # the video pipeline feeds it host batches (PyAV decode) also on CUDA

    def __init__(self, path: str | os.PathLike, device: str = "cpu", fp16: bool = False, dnn_engine: str = "auto"):
        cv2 = _cv2()
        from ._gpu import parse_device

        self.path = Path(path)
        self.device = device
        kind, self.device_id = parse_device(device)
        self.fp16 = fp16
        self._cv2 = cv2
        self._lock = threading.Lock()
        if dnn_engine not in ("auto", "new", "classic"):
            raise UsageProblem(f"unknown OpenCV dnn engine {dnn_engine!r}", "use auto, new or classic")
        if kind == "cuda":
            status = cuda_status(cv2)
            if not status["dnn_cuda"]:
                raise EngineError(f"OpenCV dnn cannot run on {device}: {status['reason']}", NO_CUDA_FIX)
            if dnn_engine == "new":
                raise UsageProblem("OpenCV's new dnn engine runs on the CPU only", "use dnn_engine='classic' on CUDA")
            dnn_engine = "classic"  # the new engine has no CUDA backend
            from ._gpu import check_gpu_index

            check_gpu_index(self.device_id)
            cv2.cuda.setDevice(self.device_id)
        elif fp16:
            raise UsageProblem("the OpenCV FP16 target (opencv-fp16:) is a CUDA target",
                               "use opencv: on the CPU, or --device cuda:N")
        self.dnn_engine = dnn_engine
        if not self.path.exists():
            raise UsageProblem(f"model not found: {self.path}")
        from .manifest import read_manifest_if_any

        self.manifest = read_manifest_if_any(self.path, verify_hash=False)
        self.net = self._load()
        if kind == "cuda":  # on the CPU OpenCV's defaults are DNN_BACKEND_OPENCV / DNN_TARGET_CPU
            self.net.setPreferableBackend(cv2.dnn.DNN_BACKEND_CUDA)
            self.net.setPreferableTarget(cv2.dnn.DNN_TARGET_CUDA_FP16 if fp16 else cv2.dnn.DNN_TARGET_CUDA)
        self.inputs, self.outputs = self._specs()
        self._output_names = [o.name for o in self.outputs]
        # run once now, so that what OpenCV cannot compute fails here, with the layer named, not mid-run
        probe = {s.name: np.zeros([d if isinstance(d, int) else 1 for d in s.shape], s.numpy_dtype)
                 for s in self.inputs}
        self.infer(probe)

    @property
    def target(self) -> str:
        """OpenCV's backend/target pair, as OpenCV names them."""
        if self.device.startswith("cuda"):
            return "DNN_BACKEND_CUDA/" + ("DNN_TARGET_CUDA_FP16" if self.fp16 else "DNN_TARGET_CUDA")
        return "DNN_BACKEND_OPENCV/DNN_TARGET_CPU"

    def _what(self) -> str:
        return f"OpenCV dnn {self._cv2.__version__} ({self.dnn_engine} engine, {self.device})"

    def _load(self):
        cv2 = self._cv2
        args = [os.fspath(self.path)]
        if hasattr(cv2.dnn, "ENGINE_AUTO"):  # OpenCV 5
            args.append({"auto": cv2.dnn.ENGINE_AUTO, "new": cv2.dnn.ENGINE_NEW,
                         "classic": cv2.dnn.ENGINE_CLASSIC}[self.dnn_engine])
        elif self.dnn_engine == "new":
            raise UsageProblem(f"OpenCV {cv2.__version__} has only the classic dnn engine", "use dnn_engine='auto'")

        def load():
            return cv2.dnn.readNetFromONNX(*args)

        try:
            with _Log(cv2):
                net = load()
        except cv2.error as exc:
            raise EngineError(f"{self._what()} cannot load {self.path.name}: "
                              f"{describe_cv2_error(str(exc), _native_stderr(cv2, load))}", self._fix()) from exc
        if net.empty():  # the new engine returns an empty net for a graph it cannot parse, without an exception
            log = _native_stderr(cv2, load)
            raise EngineError(f"{self._what()} cannot load {self.path.name}: "
                              f"{describe_cv2_error('', log) or 'OpenCV returned an empty network'}", self._fix())
        return net

    def _fix(self) -> str:
        return ("run this model with trtc's own engines (the .onnx without the opencv: prefix, or a TensorRT plan); "
                "OpenCV dnn runs FP32 graphs best: give it the FP32 .onnx"
                + (" (on CUDA, FP16 is the opencv-fp16: target, not an FP16 graph)" if self.device != "cpu" else ""))

    def _specs(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """Input and output tensors: from the manifest where there is one, else read from the ONNX graph."""
        if self.manifest is not None and self.manifest.inputs and self.manifest.outputs:
            return list(self.manifest.inputs), list(self.manifest.outputs)
        onnx = require("onnx", "Reading the inputs of an ONNX model without a manifest", extra="export")
        model = onnx.load(os.fspath(self.path), load_external_data=False)
        graph = model.graph
        inits = {i.name for i in graph.initializer}

        def spec(v) -> TensorSpec:
            t = v.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim)
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).name
            return TensorSpec(v.name, dtype, dims)

        return [spec(v) for v in graph.input if v.name not in inits], [spec(v) for v in graph.output]

    def infer(self, batch) -> list[np.ndarray]:
        """Run one batch (numpy; a dict name -> array for several inputs). Returns numpy outputs."""
        feeds = batch if isinstance(batch, dict) else {self.inputs[0].name: batch}
        for x in feeds.values():
            if not isinstance(x, np.ndarray) and (hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__")):
                raise UsageProblem("OpenCV dnn takes host (numpy) arrays, not device arrays",
                                   "pass numpy arrays (in trtc run: --decoder pyav, or --device cpu)")
        arrays = {}
        for spec in self.inputs:
            if spec.name not in feeds:
                raise UsageProblem(f"no data for model input {spec.name!r}")
            arrays[spec.name] = np.ascontiguousarray(feeds[spec.name], dtype=spec.numpy_dtype)
        cv2 = self._cv2

        def run():
            for name, x in arrays.items():
                self.net.setInput(x, name)
            return self.net.forward(self._output_names)

        with self._lock:
            if self.device.startswith("cuda"):
                cv2.cuda.setDevice(self.device_id)  # the current device is per thread
            try:
                with _Log(cv2):
                    outs = run()
            except cv2.error as exc:
                shape = "x".join(str(d) for d in next(iter(arrays.values())).shape)
                raise EngineError(f"{self._what()} cannot run {self.path.name} on a {shape} input: "
                                  f"{describe_cv2_error(str(exc), _native_stderr(cv2, run))}", self._fix()) from exc
        n = next(iter(arrays.values())).shape[0]
        results = []
        for spec, out in zip(self.outputs, outs, strict=True):
            out = np.asarray(out)
            if out.ndim == 0 or out.shape[0] != n:
                raise EngineError(f"{self._what()} returned {out.shape} for a batch of {n} from {self.path.name}",
                                  self._fix())
            results.append(out)
        return results

    def close(self) -> None:
        self.net = None
