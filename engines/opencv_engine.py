"""OpenCV dnn backend: the same classifier through ``cv2.dnn.readNetFromONNX``, behind the Engine interface.

For users moving from OpenCV dnn to trtc: ``trtc validate --reference opencv:model.onnx --candidate model.onnx``
shows whether trtc's engines agree with what they run today, ``trtc bench opencv:model.onnx model.onnx`` how much
faster they are. numpy in, numpy out (OpenCV dnn takes host arrays only).

Backend and target come from ``device``: ``cpu`` -> DNN_BACKEND_OPENCV / DNN_TARGET_CPU; ``cuda:N`` ->
DNN_BACKEND_CUDA / DNN_TARGET_CUDA, or DNN_TARGET_CUDA_FP16 with ``fp16=True`` (the ``opencv-fp16:`` prefix). CUDA
needs an OpenCV built with CUDA and cuDNN: the opencv-python wheels on PyPI never are, and that is said as such.

The dnn engines differ between OpenCV releases, and are found by the constants the installed ``cv2.dnn`` defines, not
by its version string (:func:`dnn_engines`): OpenCV 4 has one engine (the classic one, with the CUDA backend);
5.0 has ``ENGINE_NEW`` (CPU only, tried first by ``ENGINE_AUTO``) and ``ENGINE_CLASSIC`` (OpenCV 4's, the only one
with the CUDA backend); 5.1 has ``ENGINE_OPENCV`` (the new engine, what ``ENGINE_AUTO`` resolves to; CPU only) and
``ENGINE_ORT`` (ONNX Runtime inside OpenCV, in builds made with WITH_ONNXRUNTIME=ON only), and no classic engine.
``dnn_engine`` picks one: "auto", "new" (also "opencv": 5.0's ENGINE_NEW, 5.1's ENGINE_OPENCV), "classic", "ort".

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
from .errors import EngineError, UnsupportedVersion, UsageProblem

PURPOSE = "Running ONNX models with OpenCV dnn"
NO_CUDA_FIX = ("build OpenCV with CUDA and cuDNN (-D WITH_CUDA=ON -D WITH_CUDNN=ON -D OPENCV_DNN_CUDA=ON, with "
               "opencv_contrib), or run the model on the GPU with trtc's own engines: the .onnx without the "
               "opencv: prefix (ONNX Runtime CUDA EP, pip install \"trtc[gpu]\") or a TensorRT plan (trtc build)")
_CV_TYPES = {"CV_16F": "FP16", "CV_16FC1": "FP16", "CV_8S": "INT8", "CV_8SC1": "INT8", "CV_8U": "UINT8",
             "CV_8UC1": "UINT8", "CV_64F": "FP64"}


def _cv2():
    return require("cv2", PURPOSE, extra="opencv", package="opencv-python-headless")


# dnn_engine -> the cv2.dnn constants that name it, in the order tried (5.1 renamed 5.0's ENGINE_NEW ENGINE_OPENCV)
ENGINE_CONSTANTS = {"auto": ("ENGINE_AUTO",), "new": ("ENGINE_NEW", "ENGINE_OPENCV"), "classic": ("ENGINE_CLASSIC",),
                    "ort": ("ENGINE_ORT",)}
DNN_ENGINES = (*ENGINE_CONSTANTS, "opencv")  # "opencv" is "new" under OpenCV 5.1's name


def dnn_engines(cv2=None) -> dict[str, int | None]:
    """The dnn engines this OpenCV offers: ``dnn_engine`` name -> the ``readNetFromONNX`` engine argument (None:
    the call takes none). Found by the constants ``cv2.dnn`` defines: OpenCV 4 defines none and has the classic
    engine alone; ``ort`` is listed only where OpenCV was built with ONNX Runtime. Empty when this OpenCV's
    engine constants are none of those known (see :func:`check_opencv`)."""
    cv2 = cv2 or _cv2()
    if not hasattr(cv2.dnn, "ENGINE_AUTO"):  # OpenCV 4: one engine, no argument
        return {"auto": None, "classic": None}
    found = {}
    for name, constants in ENGINE_CONSTANTS.items():
        value = next((getattr(cv2.dnn, c) for c in constants if hasattr(cv2.dnn, c)), None)
        if value is not None:
            found[name] = int(value)
    if "ort" in found and not re.search(r"ONNX Runtime:\s*YES", _build_info(cv2)):
        del found["ort"]  # the constant exists in every 5.1 build; the wrapper only where ONNX Runtime was built in
    return found if len(found) > 1 else {}


def _build_info(cv2) -> str:
    return cv2.getBuildInformation() if hasattr(cv2, "getBuildInformation") else ""


def check_opencv(cv2=None):
    """The cv2 module; :class:`UnsupportedVersion` when its dnn engines are none that trtc knows (a release after
    the tested ones that renamed them again)."""
    from ._deps import unsupported_message

    cv2 = cv2 or _cv2()
    if not dnn_engines(cv2):
        message, fix = unsupported_message("cv2", cv2.__version__)
        raise UnsupportedVersion(f"{message} (its cv2.dnn engines are none of ENGINE_AUTO with ENGINE_NEW/ENGINE_CLASSIC "
                          "or ENGINE_OPENCV/ENGINE_ORT)", fix)
    return cv2


def cuda_status(cv2=None) -> dict:
    """What this OpenCV can do on CUDA: {"version", "dnn_cuda", "devices", "reason"}. ``devices`` is
    ``cv2.cuda.getCudaEnabledDeviceCount()`` (0 without a CUDA build or without a GPU, -1 when the driver is
    missing or too old); ``dnn_cuda``: the dnn module has the CUDA backend (built with CUDA and cuDNN) and a
    device to run it on."""
    cv2 = cv2 or _cv2()
    build = _build_info(cv2)
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
    classic = "classic" in dnn_engines(cv2)  # the CUDA backend is the classic engine's
    dnn_cuda = bool(targets) and devices > 0 and classic
    if dnn_cuda:
        reason = ""
    elif not cuda_built:
        reason = (f"this OpenCV {cv2.__version__} was built without CUDA (no opencv-python wheel on PyPI "
                  "has CUDA)")
    elif not classic:
        reason = (f"this OpenCV {cv2.__version__} has no classic dnn engine, the only one with the CUDA backend; "
                  "its dnn engines run on the CPU only")
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


def describe_cv2_error(text: str, log: str = "", model: str | os.PathLike | None = None) -> str:
    """One line from a cv2.error message (and OpenCV's log): the layer, its op, and OpenCV's own reason. Where the
    log names only unsupported ops (OpenCV 5's new engine), their layers are read from ``model``'s graph."""
    where = ""
    m = _NODE.search(text) or _NODE.search(log)
    if m:
        op, node = m.group(1).split("@")[0], m.group(2)
        where = f"layer {node} ({op})"
    unsupported = re.search(r"Unsupported operations:\s*((?:\s*\S+\n?)+)", log)
    if not where and unsupported:
        ops = [o for o in unsupported.group(1).split() if o]
        layers = _layers_of(model, ops) if model is not None else []
        where = (f"layer{'s' if len(layers) > 1 else ''} {', '.join(layers)}" if layers else
                 f"unsupported op{'s' if len(ops) > 1 else ''} {', '.join(ops)}")
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
    if reason.startswith("Can't create layer") or (unsupported and not reason):
        reason = "OpenCV dnn has no layer for this op"
    for cv_type, name in _CV_TYPES.items():
        reason = re.sub(rf"is \d+ \({cv_type}\)", f"is {name} ({cv_type})", reason)
    if len(reason) > 240:
        reason = reason[:237] + "..."
    return f"{where}: {reason}" if where and reason else where or reason


def _why_not(dnn_engine: str) -> str:
    return {"ort": " (ONNX Runtime inside OpenCV: only OpenCV 5.1 or later built with WITH_ONNXRUNTIME=ON has it, "
                   "no opencv-python wheel on PyPI does; trtc's own engine, the .onnx without the opencv: prefix, is "
                   "ONNX Runtime)",
            "classic": " (OpenCV 5.1 removed it)",
            "new": " (OpenCV 5.0 or later has it)"}.get(dnn_engine, "")


def _layers_of(model, ops: list[str], most: int = 3) -> list[str]:
    """``"name (Op)"`` of the first ``most`` nodes of ``model``'s graph whose op is one of ``ops``; none where onnx is
    not installed or the file cannot be read (the message then names the ops alone)."""
    from ._deps import is_installed

    if not is_installed("onnx"):
        return []
    import onnx

    try:
        graph = onnx.load(os.fspath(model), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - only for a better message
        return []
    found = [f"{n.name or '#' + str(i)} ({n.op_type})" for i, n in enumerate(graph.node) if n.op_type in ops]
    return found[:most] + ([f"{len(found) - most} more"] if len(found) > most else [])


class OpenCVEngine(EngineBase):
    """A classifier run by OpenCV dnn. ``infer(batch)`` takes a numpy batch (or a dict of them) and returns a list
    of numpy outputs in ``outputs`` order."""

    host_arrays_only = True  # the video pipeline feeds it host batches (PyAV decode) also on CUDA

    def __init__(self, path: str | os.PathLike, device: str = "cpu", fp16: bool = False, dnn_engine: str = "auto"):
        cv2 = check_opencv()
        from ._gpu import parse_device

        self.path = Path(path)
        self.device = device
        kind, self.device_id = parse_device(device)
        self.fp16 = fp16
        self._cv2 = cv2
        self._lock = threading.Lock()
        if dnn_engine not in DNN_ENGINES:
            raise UsageProblem(f"unknown OpenCV dnn engine {dnn_engine!r}", f"use one of {', '.join(DNN_ENGINES)}")
        dnn_engine = "new" if dnn_engine == "opencv" else dnn_engine
        offered = dnn_engines(cv2)
        if kind == "cuda":
            status = cuda_status(cv2)
            if not status["dnn_cuda"]:
                raise EngineError(f"OpenCV dnn cannot run on {device}: {status['reason']}", NO_CUDA_FIX)
            if dnn_engine in ("new", "ort"):
                raise UsageProblem(f"OpenCV's {dnn_engine} dnn engine runs on the CPU only",
                                   "use dnn_engine='classic' on CUDA")
            dnn_engine = "classic"  # the only engine with the CUDA backend
            from ._gpu import check_gpu_index

            check_gpu_index(self.device_id)
            cv2.cuda.setDevice(self.device_id)
        elif fp16:
            raise UsageProblem("the OpenCV FP16 target (opencv-fp16:) is a CUDA target",
                               "use opencv: on the CPU, or --device cuda:N")
        if dnn_engine not in offered:
            raise UsageProblem(f"OpenCV {cv2.__version__} has no {dnn_engine} dnn engine{_why_not(dnn_engine)}",
                               f"use dnn_engine={' or '.join(repr(n) for n in offered)}")
        self._engine_arg = offered[dnn_engine]
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
        args = [os.fspath(self.path)] + ([] if self._engine_arg is None else [self._engine_arg])

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
                              f"{describe_cv2_error('', log, self.path) or 'OpenCV returned an empty network'}",
                              self._fix())
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
