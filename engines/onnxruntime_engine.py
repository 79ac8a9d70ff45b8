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
import threading
from pathlib import Path

import numpy as np

from ._cuda import device_input, device_output, external_stream, is_device_array
from ._deps import dist_version, is_installed, require
from .base import EngineBase, TensorSpec
from .errors import EngineError, UsageProblem, first_line

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


def _manifest_json(path) -> dict | None:
    """``path``'s manifest as JSON, or None without a readable one."""
    import json

    from .manifest import manifest_path

    try:
        doc = json.loads(manifest_path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def manifest_precision(path) -> dict | None:
    """The precision recipe of ``path``'s manifest ({} when it has none), or None without a readable manifest."""
    doc = _manifest_json(path)
    return None if doc is None else (doc.get("precision") or {})


def qdq_fusion_safe(path, device: str) -> bool:
    """Whether ONNX Runtime may rewrite this model's Q/DQ pairs with its QDQ graph transformers.

    ONNX Runtime 1.31 rewrites DequantizeLinear -> Conv -> QuantizeLinear groups (into integer kernels on the
    CPU). With FP16 scales (INT8 models whose other layers compute in FP16, trtc's default) the rewritten graph
    returned wrong logits here: 0% top-1 agreement on EfficientNet-Lite0 on the CPU and under the CUDA EP, while
    the same graph run op by op agrees like its FP32-scale twin. TensorRT does its own fusion; for ONNX Runtime
    such models run op by op (``session.disable_quant_qdq``), which computes exactly what the graph says."""
    return qdq_fusion_ok(manifest_precision(path) or {})


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


def _warn_runtime(path, precision: dict) -> None:
    import logging

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


# ``tuning="auto"``: the CUDA EP options that paid at trtc's fixed shapes, measured side by side on an H100 (ORT
# 1.31.1, FP16, batch 64, device-resident input; docs/BENCHMARKS.md). img/s default -> auto -> auto + CUDA graphs:
# ResNet-50 12,247 -> 16,976 -> 17,923, EfficientNet-Lite0 12,477 -> 15,252 -> 16,364; start-up (session + first
# batch) Lite0 5.72 -> 3.96 s, ResNet-50 0.92 -> 0.76 s. prefer_nhwc gives most of the speed; HEURISTIC cuDNN
# algorithm choice ran as fast as the default EXHAUSTIVE search (within 1%) and starts 1.5-2 s sooner. DEFAULT
# started fastest but ran at 164-2,486 img/s (cuDNN's fallback kernels), so it is not used. fuse_conv_bias (each
# convolution with its bias as one cuDNN frontend graph; H100, 2026-11-27, docs/BENCHMARKS.md): Lite0
# FP16 engine-only 14.8-15.2k -> 22.2-22.4k img/s and its 16-stream video pipeline 12.0-12.6k -> 16.6-17.5k fps (one
# machine, alternating); ResNet-50 FP16 unchanged (16,376 -> 16,418). Top-1 as without it (trtc validate on the GPU:
# 99.6% against FP32, the same one flip). Its cost: the tuned session's first run at a new shape takes ~2.8 s longer
# for Lite0 FP16 (cuDNN builds a plan per fused convolution), which the quick start hides (the quick session is never
# fused); the first result of a video came 0.06-0.08 s later (medians of 8 and 4 fresh processes). Under NCHW
# (without prefer_nhwc) cuDNN refused Lite0's first convolution fused at run time (HEURISTIC_QUERY_FAILED): a cuDNN
# failure of the fused session reopens it unfused (:meth:`OnnxRuntimeEngine._unfuse`), said once.
# ``tuning="graphs"`` adds CUDA graphs for the input buffers given to capture_graphs. Not the default: ONNX Runtime
# captures in CUDA's global mode, which a CUDA call from any other thread breaks (on the H100, captures made while
# the video pipeline's decoders ran failed with CUDA error 901, and a graph captured before they started failed in
# its replay), so they are for an app calling the engine from one thread. ``tuning="off"``: the session as trtc
# opened it before (only device_id).
TUNED_CUDA_OPTIONS = {"cudnn_conv_algo_search": "HEURISTIC", "prefer_nhwc": "1", "fuse_conv_bias": "1"}
FUSION = "fuse_conv_bias"
TUNINGS = ("auto", "graphs", "off")
MAX_CUDA_GRAPHS = 16  # graphs captured per session in its life (ONNX Runtime keeps each); more run without one
_told: set = set()  # (path, what) said once per process


def _say_once(path, what: str, text: str) -> None:
    import logging

    key = (os.fspath(path), what)
    if key not in _told:
        _told.add(key)
        logging.getLogger("trtc").warning("%s: %s", Path(path).name, text)


def tuned_cuda_options(path) -> dict:
    """The CUDA EP options of a tuned session of this model: TUNED_CUDA_OPTIONS for a float graph; for a quantized
    one (Q/DQ, engines._quick_model.is_float_graph) only the heuristic algorithm choice. NHWC layout and conv-bias
    fusion are graph rewrites made for convolutions whose weights are constants: under the CUDA EP (ORT 1.31) the
    NHWC rewrite of an INT8 Lite0, whose kept-in-FP16 convolutions read their weights through DequantizeLinear and
    Cast, failed at its first run ("Input channels C is not equal to kernel channels * group")."""
    from ._quick_model import is_float_graph

    if is_float_graph(path):
        return dict(TUNED_CUDA_OPTIONS)
    return {"cudnn_conv_algo_search": TUNED_CUDA_OPTIONS["cudnn_conv_algo_search"]}


def _int8_note(path, kind: str, precision: dict) -> None:
    """INT8 Q/DQ models under the CUDA EP compute through Q/DQ pairs, not integer kernels: say it once."""
    if kind == "cuda" and precision.get("mode") == "int8":
        _say_once(path, "int8", "an INT8 model runs no faster than FP16 under ONNX Runtime's CUDA execution "
                                "provider (it computes the Q/DQ pairs); INT8 pays under TensorRT: trtc build "
                                f"{Path(path).name}, or use the FP16 model here")


def _expected_key(inputs, doc: dict):
    """The input shapes the video pipeline will feed (its default batch: a fixed batch dimension, else the
    manifest's opt batch capped at 64, see engines.video.pipeline._default_batch), or None when that is unknown or
    another dimension is not fixed."""
    dims = [spec.shape for spec in inputs]
    first = dims[0][0] if dims and dims[0] else None
    if isinstance(first, int) and first > 0:
        n = first
    else:
        opt = (doc.get("batch") or {}).get("opt")
        if not isinstance(opt, int) or opt < 1:
            return None
        n = min(64, opt)
    if any(not all(isinstance(d, int) and d > 0 for d in shape[1:]) for shape in dims):
        return None
    return tuple((n, *shape[1:]) for shape in dims)


def refused_by_cudnn(exc: Exception) -> bool:
    """Whether ``exc`` is cuDNN refusing a convolution as asked (its frontend's failure, or NOT_SUPPORTED), the one
    failure a session reopened without the fusion can mend; not any error naming cuDNN (an allocation failure, an
    illegal access: those are raised)."""
    import re

    text = str(exc.__cause__ or exc)
    return re.search(r"CUDNN_FE failure|CUDNN_STATUS_NOT_SUPPORTED", text) is not None


def _cudnn_reason(exc: Exception) -> str:
    """cuDNN's own words in an ONNX Runtime failure (e.g. "CUDNN_FE failure 8: HEURISTIC_QUERY_FAILED"), whose
    message runs to kilobytes of JSON; else its first line, cut."""
    import re

    text = str(exc.__cause__ or exc)
    found = re.search(r"CUDNN_FE failure \d+: \w+|CUDNN_STATUS_\w+", text)
    return found.group(0) if found else first_line(exc, 160)


class _Graphed:
    """One captured CUDA graph: its ONNX Runtime id, the IOBinding with the input and output addresses it was
    captured with, the outputs it writes, and its run options."""

    def __init__(self, graph_id: int, binding, run_options, outputs: list):
        self.graph_id, self.binding, self.run_options, self.outputs = graph_id, binding, run_options, outputs


class OnnxRuntimeEngine(EngineBase):
    def __init__(self, path: str | os.PathLike, device: str = "cpu", threads: int | None = None,
                 qdq_fusion: bool | None = None, device_buffers: bool | None = None, tf32: bool = True,
                 tuning: str = "auto", quick_start: bool = True):
        """``device_buffers``: give the session a CUDA stream of its own so device arrays run zero-copy (needs
        CuPy; default: on when the device is CUDA and CuPy is installed). ``tf32``: the CUDA EP computes FP32
        convolutions and matrix products in TF32 on Ampere and later (its default, as PyTorch's cuDNN and
        TensorRT's FP32 builds do); ``tf32=False`` computes them in full FP32 (on an H100, Lite0's softmax against
        the CPU EP: 4.2e-4 with TF32, 3.9e-7 without). ``tuning``: ``"auto"`` (NHWC kernels, heuristic cuDNN
        algorithms and convolutions fused with their bias; see TUNED_CUDA_OPTIONS), ``"graphs"`` (those and, on
        device buffers, CUDA graphs for the input buffers given to :meth:`capture_graphs`: only for a single-threaded
        caller) or ``"off"`` (ONNX Runtime's defaults); the CPU EP is the same in all three. ``quick_start``
        (tuned CUDA sessions on device buffers): the tuned session prepares each new input shape on a thread of its
        own, starting at open with the manifest's batch, while the batches that come meanwhile run on a second
        session with cuDNN's default algorithms and the depthwise convolutions as multiply-adds (engines._ort_quick
        says why and what it costs, engines._quick_model how; the rewrite needs the ``onnx`` package); False: every
        batch runs the tuned session, the first of each shape taking its preparation time."""
        ort = require("onnxruntime", "Running ONNX models")
        if tuning not in TUNINGS:
            raise UsageProblem(f"unknown ONNX Runtime tuning {tuning!r}", f"use one of: {', '.join(TUNINGS)}")
        self.path = Path(path)
        self.device = device
        # the tuned session's one owner: every use of it (a run, the quick start's preparation, a capture, the
        # reopen unfused that replaces it) holds this lock, so no two overlap and none meets a half-replaced one
        self._lock = threading.RLock()
        kind, self.device_id = parse_device(device)
        doc = _manifest_json(self.path) or {}  # read once: the Q/DQ rule, the warnings and the batch below
        precision = doc.get("precision") or {}
        if qdq_fusion is None:
            qdq_fusion = qdq_fusion_ok(precision)
            if not qdq_fusion:
                _warn_runtime(self.path, precision)
        self.qdq_fusion = qdq_fusion  # False: runs op by op, unlike a default session (the manifest says why)
        self.tuning = tuning
        # device buffers: the session gets a CuPy stream of its own (below); quick start needs them
        on_device = kind == "cuda" and bool(device_buffers or (device_buffers is None and is_installed("cupy")))
        quick = quick_start and on_device and tuning in ("auto", "graphs")
        self._quick_model = None  # the quick session's copy of the model, rewritten on a thread (engines._quick_model)
        if quick:
            from ._quick_model import QuickModel

            self._quick_model = QuickModel(self.path)
        opts = session_options(ort, threads, qdq_fusion)
        if kind == "cuda":  # first: without the GPU, a missing CUDA provider is not the problem to fix
            from ._gpu import check_gpu_index

            if device_buffers is not False and is_installed("cupy"):
                require("cupy", "Running ONNX models on device buffers")  # first: the check then asks CUDA
            check_gpu_index(self.device_id)  # else CuPy or the CUDA EP fails on a missing GPU with errors of their own
        providers = providers_for(device)
        self.stream = None
        if on_device:
            cp = require("cupy", "Running ONNX models on device buffers")
            with cp.cuda.Device(self.device_id):
                self.stream = cp.cuda.Stream(non_blocking=True)
            providers[0][1]["user_compute_stream"] = str(self.stream.ptr)
        if kind == "cuda" and not tf32:
            providers[0][1]["use_tf32"] = "0"
        if kind == "cuda" and tuning in ("auto", "graphs"):
            providers[0][1].update(tuned_cuda_options(self.path))
        self.quick = None  # a QuickStart when the first batches of a shape may run on the quick session
        if quick:
            self._quick_setup(ort, opts, providers, doc)  # before the tuned session: its warm-up overlaps that
        graphs = on_device and tuning == "graphs"
        self.session, self._graph_session = self._open(ort, opts, providers, graphs=graphs)
        # fused: the session fuses convolutions with their bias (cuDNN's frontend); a cuDNN failure of a run reopens
        # it without (_unfuse), with what it needs to open again
        self.fused = providers[0][1].get(FUSION) == "1" if kind == "cuda" else False
        self._reopen_with = (ort, opts, providers, graphs)
        # a session made with graphs enabled: every run that replays none says gpu_graph_id -1, else ONNX Runtime
        # would capture one of its own; cuda_graphs: whether capture_graphs may still make graphs
        self.cuda_graphs = self._graph_session
        self.inputs = [_spec(a) for a in self.session.get_inputs()]
        self.outputs = [_spec(a) for a in self.session.get_outputs()]
        self._output_names = [o.name for o in self.outputs]
        _int8_note(self.path, kind, precision)

        self._binding = None
        self._closed = False
        self._preparing = None  # the run options of the preparation running now (close() stops it)
        self._run_options = None
        self._host_run_options = None
        self._graphs: dict = {}  # (input addresses, shapes, dtypes) -> _Graphed, made by capture_graphs
        self._graph_ids = 0  # graph ids given out (ONNX Runtime keeps every graph it captured until the session goes)
        self._last_shapes = None  # input shapes of the session's last run (see _at_shapes)
        self._ran = None  # a CUDA event recorded after the session's last run on device buffers (see _at_shapes)
        if self.quick is not None:  # the tuned session prepares the batch the video pipeline will use
            key = _expected_key(self.inputs, doc)
            if key is not None:
                self.quick.start(key)

    def _quick_setup(self, ort, opts, providers, doc: dict) -> None:
        """The quick session's options (cuDNN's default algorithms, NCHW, no graphs, a stream of its own); its
        creation and one run at the batch the video pipeline will use (the manifest's, as engines.video's default
        batch: a fixed batch, else its opt capped at 64) start now, on a thread (QuickStart.warm)."""
        import cupy as cp

        from ._ort_quick import QuickStart

        with cp.cuda.Device(self.device_id):
            self._quick_stream = cp.cuda.Stream(non_blocking=True)
        skip = (*TUNED_CUDA_OPTIONS, "enable_cuda_graph")
        quick = {k: v for k, v in providers[0][1].items() if k not in skip}
        quick.update(cudnn_conv_algo_search="DEFAULT", user_compute_stream=str(self._quick_stream.ptr))
        quick_providers = [(providers[0][0], quick), *providers[1:]]
        self._quick_run_options = None
        self._quick_lock = threading.Lock()
        model = self._quick_model
        self.quick = QuickStart(self._prepare_shape,
                                lambda: self._session(ort, opts, quick_providers, model.source() if model else None),
                                self.path.name, retire=lambda session: self._quick_stream.synchronize(),
                                interrupt=self._stop_preparing)
        self.quick.warm(lambda session: self._warm_quick(session, doc))

    def _warm_quick(self, session, doc: dict) -> bool:
        """One run of the quick session on zeros at the expected input shapes (on QuickStart.warm's thread); False
        when those shapes are unknown (no run)."""
        inputs, outputs = [_spec(a) for a in session.get_inputs()], [_spec(a) for a in session.get_outputs()]
        key = _expected_key(inputs, doc)
        if key is not None:
            run_options = self._device_run_options(graphs=False)
            def run(io):
                with self._quick_lock:
                    session.run_with_iobinding(io, run_options)

            self._run_on_zeros(session, inputs, outputs, key, self._quick_stream, run)
        return key is not None

    def _prepare_shape(self, key) -> None:
        """Run the tuned session once on zeros of these input shapes (on the quick start's thread), after the
        caller's runs of it already enqueued have finished. Under the engine's lock: a caller's run of the tuned
        session meanwhile waits (QuickStart.route sends the device batches to the quick session instead)."""
        def prepare():
            self._at_shapes(key)
            run_options = self._preparing = self._device_run_options()
            if self._closed:  # close() came before these options were there to stop
                run_options.terminate = True
            self._run_on_zeros(self.session, self.inputs, self.outputs, key, self.stream,
                               lambda io: self._run(io, run_options))

        with self._lock:
            try:
                if not self._closed:
                    self.stream.synchronize()
                    self._unfused_if_refused(prepare)
            finally:
                self._preparing = None
                if self._closed:  # close() found the session in use: it goes now that this run has ended
                    self._let_go()

    def _run_on_zeros(self, session, inputs, outputs, key, stream, run) -> None:
        """``run(io)`` once with ``session``'s inputs bound to zeros of the shapes ``key`` and its outputs to new
        buffers, on ``stream``, and wait for it: a first run that loads or prepares kernels off the caller's path."""
        import cupy as cp

        with cp.cuda.Device(self.device_id), stream:
            xs = [cp.zeros(shape, spec.numpy_dtype) for spec, shape in zip(inputs, key)]
            outs = [cp.empty(self._output_shape(spec, key[0][0]), spec.numpy_dtype) for spec in outputs]
            io = session.io_binding()
            self._bind(io, xs, outs, inputs, outputs)
            run(io)
            stream.synchronize()

    def _at_shapes(self, shapes) -> None:
        """Call before the session runs at these input shapes (not before a graph's replay). When its last run was
        at other shapes: wait for that run's work to finish, and let every captured graph go.

        Why: on an H100 (ONNX Runtime 1.31.1, cuDNN 9.14) the GPU tests at bae537d failed with an illegal
        instruction in Lite0's tuned session (FP32, graphs on) when a graph captured at batch 32 could replay after
        the session ran at 7 and 1 on the preparing thread (tests/gpu/test_ort_tuning_gpu.py); earlier failures
        were runs at a new size beside queued runs at the old one. ONNX Runtime's cuDNN convolutions
        keep one execution plan each, that of the last input shape, and replace it at a new shape without waiting
        for the GPU (``Conv::UpdateState`` in its core/providers/cuda/nn/conv.cc), and cuDNN compiles some of
        Lite0's kernels at run time. That is our best reading, not a proof: a single-threaded probe of the FP16
        model (graph at 32, run at 8, replay) did not fail. The rule removes both conditions, at the cost of one
        wait per change of shape while the session's last run is still on the GPU (none when it ended, as at a
        video pipeline's warm-up, whose zeros fill is queued on the same stream but is not a run of the session).
        The quick session is left alone: cuDNN's fallback engines it runs are not compiled at run time (session
        20's logs), and a wait there would be a host synchronisation on the video pipeline's inference thread at
        its first batch (tests/gpu/test_video_gpu.py counts them)."""
        if self._last_shapes is not None and shapes != self._last_shapes:
            import logging

            ran = self._ran
            if ran is not None and not ran.done:  # the session's last run is still on the GPU (done: a query)
                ran.synchronize()
            if self._graphs:
                logging.getLogger("trtc").debug("%s: a run at %s lets %d CUDA graph(s) of %s go", self.path.name,
                                                shapes, len(self._graphs), self._last_shapes)
                self._graphs = {}
        self._last_shapes = shapes

    @property
    def warms_itself(self) -> bool:
        """Quick start is on: the first batches of a new size run on the quick session (see engines.base)."""
        return self.quick is not None

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the tuned session has prepared every input shape it started on (quick start); False when
        ``timeout`` seconds passed first. Benchmarks call it before timing."""
        return True if self.quick is None else self.quick.wait(timeout)

    def _open(self, ort, opts, providers, graphs: bool):
        """The session; with ``graphs``, CUDA graphs enabled, unless ONNX Runtime refuses them for this model
        (some nodes outside the CUDA EP): then without, said once."""
        if graphs:
            try:
                with_graphs = [(providers[0][0], {**providers[0][1], "enable_cuda_graph": "1"}), *providers[1:]]
                return self._session(ort, opts, with_graphs), True
            except EngineError as exc:
                session = self._session(ort, opts, providers)  # a model that cannot load at all fails here
                _say_once(self.path, "graph", f"runs without CUDA graphs ({exc.reason}); ONNX Runtime captures a "
                                              "graph only when every node runs on the CUDA execution provider")
                return session, False
        return self._session(ort, opts, providers), False

    def _unfused_if_refused(self, run):
        """``run()``; when it fails because cuDNN refused a fused convolution, ``run()`` again on the session
        reopened unfused (:meth:`_unfuse`; ``run`` reads ``self.session`` and its bindings anew). Other failures
        are raised."""
        try:
            return run()
        except Exception as exc:  # EngineError from _run, ORT's own types from a host run
            if not self._unfuse(exc):
                raise
        return run()

    def _unfuse(self, exc: Exception) -> bool:
        """After a run of the tuned session failed with ``exc``: when the session fuses convolutions with their bias
        and cuDNN refused one (:func:`refused_by_cudnn`; e.g. HEURISTIC_QUERY_FAILED for Lite0's first convolution
        under NCHW), reopen it without the fusion, say so once and return True: the caller runs again on the new
        session (its bindings and graphs are gone; graphs a failed capture turned off stay off). Otherwise False:
        the caller raises. Called under the engine's lock, so no other use of the session it replaces is under
        way."""
        if not self.fused or not refused_by_cudnn(exc):
            return False
        ort, opts, providers, graphs = self._reopen_with
        plain = [(providers[0][0], {k: v for k, v in providers[0][1].items() if k != FUSION}), *providers[1:]]
        if self.stream is not None:
            self.stream.synchronize()  # the old session's queued work ends before it goes
        self.session, self._graph_session = self._open(ort, opts, plain, graphs=graphs)
        self.cuda_graphs = self.cuda_graphs and self._graph_session  # a failed capture's "off" stays off
        self.fused = False
        self._reopen_with = (ort, opts, plain, graphs)
        self._binding, self._graphs, self._graph_ids, self._last_shapes = None, {}, 0, None
        if self.quick is not None:  # shapes the fused session prepared are new to this one
            self.quick.forget()
        _say_once(self.path, "fusion", "runs its convolutions unfused: cuDNN refused a convolution fused with its "
                                       f"bias ({_cudnn_reason(exc)})")
        return True

    def _session(self, ort, opts, providers, model=None):
        """A session of ``model`` (a path or the bytes of a model; default: this engine's file)."""
        try:
            return ort.InferenceSession(os.fspath(self.path) if model is None else model, sess_options=opts,
                                        providers=providers)
        except EngineError:
            raise
        except Exception as exc:  # ORT raises its own exception types for bad graphs
            raise EngineError(f"ONNX Runtime cannot load {self.path.name}: {first_line(exc)}",
                              "check the model with `trtc inspect` or re-export it") from exc

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

        def run():
            self._at_shapes(tuple(casted[spec.name].shape for spec in self.inputs))
            return self.session.run(self._output_names, casted, self._graphless_options())

        with self._lock:
            return self._unfused_if_refused(run)

    def _graphless_options(self):
        """Run options for a run that must not use a CUDA graph (host arrays: ONNX Runtime's own copies), or None
        when the session has no graphs."""
        if not self._graph_session:
            return None
        if self._host_run_options is None:
            ort = require("onnxruntime", "Running ONNX models")
            self._host_run_options = ort.RunOptions()
            self._host_run_options.add_run_config_entry("gpu_graph_id", "-1")
        return self._host_run_options

    def _device_run_options(self, graph_id: int | None = None, graphs: bool = True):
        ort = require("onnxruntime", "Running ONNX models")
        ro = ort.RunOptions()
        # with our own compute stream ORT need not synchronise after the run: we order through events
        ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
        # -1: this run neither captures nor replays a graph. Set on every session, also one without graphs (its
        # CUDA EP reads the key only when graphs are enabled): ONNX Runtime's Python run_with_iobinding (1.31)
        # looks the key up on every run, and a missing key costs a C++ exception turned into a Python one (30 us
        # per run on a CI core) while the caller holds the interpreter lock
        use = graph_id if graphs and self._graph_session and graph_id is not None else -1
        ro.add_run_config_entry("gpu_graph_id", str(use))
        return ro

    def _infer_device(self, batch, outputs, stream):
        if self.stream is None:
            raise UsageProblem(f"{self.path.name} is open on {self.device} without device buffers",
                               "open it with device='cuda:N' (CuPy installed) or pass numpy arrays")
        import cupy as cp

        feeds = batch if isinstance(batch, dict) else {self.inputs[0].name: batch}
        xs = [device_input(feeds, spec) for spec in self.inputs]
        n = xs[0].shape[0]
        shapes = [self._output_shape(spec, n) for spec in self.outputs]
        caller = external_stream(stream, self.device_id) if stream is not None else cp.cuda.get_current_stream()
        key = tuple(tuple(x.shape) for x in xs)
        quick = self.quick.route(key) if self.quick is not None else None
        if quick is not None:
            return self._infer_quick(quick, xs, outputs, shapes, caller)
        if caller.ptr != self.stream.ptr:
            self.stream.wait_event(caller.record())
        results = [device_output(outputs, i, spec, shape, self.stream)
                   for i, (spec, shape) in enumerate(zip(self.outputs, shapes))]
        with self._lock:
            self._unfused_if_refused(lambda: self._tuned_run(xs, results, key))
            if self._ran is None:
                self._ran = cp.cuda.Event(disable_timing=True)
            self._ran.record(self.stream)
        if caller.ptr != self.stream.ptr:
            caller.wait_event(self.stream.record())
        return results

    def _tuned_run(self, xs, results, key) -> None:
        """One run of the tuned session on self.stream: the graph held for these inputs replayed, else a run."""
        graphed = self._graphs.get(self._key(xs)) if self.cuda_graphs else None
        if graphed is not None:
            self._run(graphed.binding, graphed.run_options)
            with self.stream:  # the graph writes the same buffers every replay: the caller gets its own copy
                for dst, src in zip(results, graphed.outputs):
                    dst[...] = src
        else:
            self._at_shapes(key)
            if self._binding is None:
                self._binding, self._run_options = self.session.io_binding(), self._device_run_options()
            self._bind(self._binding, xs, results)
            self._run(self._binding, self._run_options)

    def _infer_quick(self, session, xs, outputs, shapes, caller) -> list:
        """One batch on the quick session, on its own stream, ordered with the caller's through events."""
        qs = self._quick_stream
        qs.wait_event(caller.record())
        results = [device_output(outputs, i, spec, shape, qs) for i, (spec, shape) in enumerate(zip(self.outputs,
                                                                                                   shapes))]
        if self._quick_run_options is None:
            self._quick_run_options = self._device_run_options(graphs=False)
        io = session.io_binding()
        self._bind(io, xs, results)
        try:
            with self._quick_lock:  # one run of the quick session at a time (its warm-up may be running)
                session.run_with_iobinding(io, self._quick_run_options)
        except Exception as exc:  # ORT's own exception types
            raise EngineError(f"ONNX Runtime failed on {self.path.name}: {first_line(exc)}") from exc
        caller.wait_event(qs.record())
        if self.quick is None or not self.quick.holds(session):  # let go meanwhile: this reference may be the
            qs.synchronize()  # last, and a session must not go while its kernels run
        return results

    def _output_shape(self, spec, n: int) -> tuple:
        shape = tuple(n if (isinstance(d, str) or d is None or d < 0) and j == 0 else d
                      for j, d in enumerate(spec.shape))
        if any(not isinstance(d, int) for d in shape):
            raise EngineError(f"output {spec.name!r} has dynamic dimensions {spec.shape} besides the batch",
                              "export the model with a fixed output shape")
        return shape

    def _bind(self, io, xs, outs, inputs=None, outputs=None) -> None:
        for spec, x in zip(inputs or self.inputs, xs):
            io.bind_input(spec.name, "cuda", self.device_id, x.dtype, tuple(x.shape), x.data.ptr)
        for spec, out in zip(outputs or self.outputs, outs):
            io.bind_output(spec.name, "cuda", self.device_id, out.dtype, tuple(out.shape), out.data.ptr)

    def _run(self, io, run_options) -> None:
        try:
            self.session.run_with_iobinding(io, run_options)
        except Exception as exc:  # ORT's own exception types
            raise EngineError(f"ONNX Runtime failed on {self.path.name}: {first_line(exc)}") from exc

    def capture_graphs(self, arrays, stream=None) -> int:
        """Capture a CUDA graph for each of these device input batches (one-input models), to be replayed whenever
        ``infer`` gets an array at the same address with the same shape and type (the video pipeline's few fixed
        input buffers); any other input runs without a graph. Returns how many graphs the engine holds.

        ONNX Runtime captures in CUDA's global capture mode: while it captures, a CUDA call from another thread of
        this process (a decoder, an allocation) breaks the capture and fails in that thread too, and on an H100 a
        graph captured before a video pipeline's decoders started failed in its replay while they ran. So graphs
        are for a caller whose process runs no other CUDA work meanwhile (trtc bench's engine rows); the video
        pipeline captures none. A capture that fails turns graphs off for this engine, said once. The graphs held
        are of one input shape: a capture or a run at another shape lets them go (:meth:`_at_shapes` says why), and
        a session gives out at most MAX_CUDA_GRAPHS graph ids in its life."""
        if not self.cuda_graphs or len(self.inputs) != 1:
            return len(self._graphs)
        self.wait_ready()  # a preparation running on its thread would break the capture
        with self._lock:
            return self._capture(arrays, stream)

    def _capture(self, arrays, stream) -> int:
        """capture_graphs under the engine's lock."""
        import cupy as cp

        caller = external_stream(stream, self.device_id) if stream is not None else cp.cuda.get_current_stream()
        self.stream.wait_event(caller.record())
        for x in arrays:
            xs = [device_input({self.inputs[0].name: x}, self.inputs[0])]
            key = self._key(xs)
            if key in self._graphs or self._graph_ids >= MAX_CUDA_GRAPHS:
                continue
            self._at_shapes(tuple(tuple(x.shape) for x in xs))  # graphs of other shapes go (see _at_shapes)
            graphed = self._graphs[key] = self._new_graph(xs)
            try:  # ONNX Runtime runs a new graph id once as usual, then captures and replays it
                for _ in range(2):
                    self._run(graphed.binding, graphed.run_options)
                self.stream.synchronize()
            except EngineError as exc:
                del self._graphs[key]
                if self._unfuse(exc):  # unfused, every graph gone: capture them all again
                    caller.wait_event(self.stream.record())
                    return self._capture(arrays, stream)
                self.cuda_graphs = False
                _say_once(self.path, "capture", f"runs without CUDA graphs: capturing one failed ({exc.reason})")
                break
        caller.wait_event(self.stream.record())
        return len(self._graphs)

    @staticmethod
    def _key(xs) -> tuple:
        return tuple((x.data.ptr, tuple(x.shape), x.dtype.str) for x in xs)

    def _new_graph(self, xs) -> _Graphed:
        """Outputs, binding and run options of a new graph id for these inputs (ids from 1: 0 is ONNX Runtime's
        own)."""
        import cupy as cp

        n = xs[0].shape[0]
        with self.stream:
            outs = [cp.empty(self._output_shape(spec, n), spec.numpy_dtype) for spec in self.outputs]
        io = self.session.io_binding()
        self._bind(io, xs, outs)
        self._graph_ids += 1  # never an id used before: ONNX Runtime would replay the graph it holds for it
        graph_id = self._graph_ids
        return _Graphed(graph_id, io, self._device_run_options(graph_id), outs)

    def close(self) -> None:
        """Let the sessions go without waiting for a preparation: the queued ones are dropped and the one running
        is stopped at its next node (ONNX Runtime's ``RunOptions.terminate``). A session another thread is running
        is let go by that thread when its run ends, never under it."""
        self._closed = True
        if self.quick is not None:
            self.quick.cancel()
        if self._lock.acquire(blocking=False):
            try:
                self._let_go()
            finally:
                self._lock.release()

    def _stop_preparing(self) -> None:
        """Stop the tuned session's preparation running now, if any, at its next node (QuickStart.cancel)."""
        run_options = self._preparing
        if run_options is not None:
            run_options.terminate = True

    def _let_go(self) -> None:
        """Drop the engine's sessions, bindings and graphs (under the lock, no run of the tuned session under way)."""
        self._binding, self._graphs, self.session = None, {}, None
