"""The compiled PyTorch engine: a ``torch.export`` program (``trtc export ... --program`` writes ``m.pt2`` beside the
ONNX) run through Inductor, for GPUs without TensorRT.

    engine = engines.open_engine("lite0.pt2", device="cuda:0")            # FP32
    engine = engines.open_engine("torch-fp16:lite0.pt2", device="cuda:0") # FP16, trtc quantize's keep-list in FP32

On CUDA the program is loaded, cast to FP16 where asked (:func:`fp16_graph`), put in channels_last, compiled with
``torch.compile(dynamic=False)`` once per batch size and input layout, and replayed as CUDA graphs that trtc
captures itself on the engine's own stream: one graph per input slot (the graph reads the caller's device array
where it lies, no copy), and one per batch size that copies other inputs into a static buffer. ``infer`` follows
the device-array contract of :class:`~engines.onnxruntime_engine.OnnxRuntimeEngine`: numpy in -> numpy out; a device
array (CuPy, DLPack) in -> CuPy out, enqueued on the engine's stream, ordered with the caller's ``stream`` through
CUDA events, without a host synchronisation.

The engine is three parts: the program (:mod:`engines.torch_program`: loaded, cast to FP16, its plain copy), the
compiled program and its cache (:mod:`engines.torch_compiled`: a callable per batch size, dtype and layout, compiled
once and kept beside the model, keyed by GPU, torch version, TF32 settings, batch size, precision and layout, so that
a second start neither traces nor compiles), and running it (this module: the engine's stream and thread, the CUDA
graphs, the device-array contract). On a GPU a second start loads the precompiled function on a thread of its own,
from open, while the engine's thread runs the module once eagerly: cuDNN's plans are per thread
(:class:`_PrecompiledLoader`). A corrupt or mismatched cache file is ignored with a log line and compiled again.
cuDNN's benchmark mode is off by default, as PyTorch leaves it; ``cudnn_benchmark=True`` turns it on while a shape
warms up and its graphs are captured (:func:`cudnn_benchmark_on`); docs/TORCH.md says why.

On the CPU the program runs eagerly (``compile=True`` compiles it with Inductor's C++ backend; slow to compile).
INT8 is refused: it needs TensorRT or ONNX Runtime (``trtc quantize m.onnx --precision int8``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import numpy as np

from ._deps import require
from ._one_thread import OneThread
from .base import EngineBase, TensorSpec
from .errors import UsageProblem
from .torch_compiled import (CACHE_MAGIC, LOAD_HOLD_S, CompiledProgram, _Loading, _PrecompiledLoader, cache_dirs,
                             cache_key, cached_payloads, cudnn_benchmark_on, device_label, math_label,
                             plain_bytes, precompile_supported, precompiled_bytes, program_key, read_cache, read_plain,
                             user_cache_dir, write_cache)
from .torch_program import (KEEP_FP32_ATEN, PRECISIONS, _model_class, _op_name, _program_specs, check_precision,
                            fp16_graph, keep_fp32_ops, load_program, module_from_plain, plain_program, require_torch)

# the names above are this module's public face as before the program and its cache had modules of their own
__all__ = ["CACHE_MAGIC", "KEEP_FP32_ATEN", "LOAD_HOLD_S", "MAX_SLOT_GRAPHS", "PRECISIONS", "PREFIXES",
           "CompiledProgram", "OneThread", "TorchEngine", "_PrecompiledLoader", "_Run", "_layout", "_model_class",
           "_op_name", "cache_dirs", "cache_key", "cached_payloads", "check_precision", "cudnn_benchmark_on",
           "device_label", "fp16_graph", "keep_fp32_ops", "load_program", "math_label", "module_from_plain",
           "plain_bytes", "plain_program", "precompile_supported", "precompiled_bytes", "program_key", "read_cache",
           "read_plain", "require_torch", "user_cache_dir", "write_cache"]

log = logging.getLogger("trtc")
PREFIXES = ("torch", "torch-fp16")
MAX_SLOT_GRAPHS = 8  # input slots (device addresses) per batch size that get a graph of their own


# ---------------------------------------------------------------------------------------------------- the engine
class _Run:
    """What one (batch size, input dtype, layout) needs: the compiled callable, the static input with the graph
    that copies into it, and the graphs bound to input slots (device address -> (graph, output))."""

    def __init__(self, fn, static_in=None, graph=None, out=None, loading=None):
        self.fn, self.static_in, self.graph, self.out = fn, static_in, graph, out
        self.slots: dict[int, tuple] = {}
        # quick start: the loader whose precompiled function this shape waits for; until it has loaded, ``fn`` is the
        # module, run eagerly without graphs. ``eager_batches``: the batches it served so; ``since``: when the first
        # of them came
        self.loading, self.eager_batches, self.since = loading, 0, time.perf_counter()


def _layout(shape: tuple, strides: tuple) -> str:
    """nchw (C-contiguous) or nhwc (channels_last) for an (N, C, H, W) array's strides in elements; anything else is
    refused. Dimensions of size 1 may have any stride."""
    n, c, h, w = (int(d) for d in shape)
    for name, want in (("nchw", (c * h * w, h * w, w, 1)), ("nhwc", (h * w * c, 1, w * c, c))):
        if all(int(s) == t or d == 1 for s, t, d in zip(strides, want, (n, c, h, w))):
            return name
    raise UsageProblem(f"input strides {tuple(strides)} are neither NCHW nor channels_last (NHWC) for shape "
                       f"{tuple(shape)}", "pass a C-contiguous NCHW array, or an (N, C, H, W) view of NHWC memory")


class TorchEngine(EngineBase):
    def __init__(self, path: str | os.PathLike, device: str = "cpu", precision: str | None = None,
                 compile: bool | None = None, cuda_graph: bool = True, cache: bool = True, progress=None,
                 cudnn_benchmark: bool = False, precompile: bool = True, warm_beside_load: bool | None = None,
                 quick_start: bool | None = None):
        """``precision``: fp32 (default) or fp16 (trtc quantize's keep-list computes in FP32); int8 is refused.
        ``compile``: Inductor (default on CUDA; on the CPU the program runs eagerly unless True). ``cuda_graph``:
        replay CUDA graphs (CUDA only). ``cache``: keep and reuse Inductor's compiled artifacts beside the model.
        ``progress``: called with a line of text before a compilation (default: the ``trtc`` log).
        ``cudnn_benchmark``: let cuDNN time its convolution algorithms while the engine warms up and captures its
        graphs (:func:`cudnn_benchmark_on`); off by default, as PyTorch leaves it (docs/TORCH.md has the measurements
        that chose this). ``precompile``: save (and load) the compiled function itself with the cache (Dynamo's AOT
        precompile, where torch has it), so a second start does not trace the program again. ``warm_beside_load``
        (default: on a GPU): a start from a precompiled function loads it on a thread of its own while the engine's
        thread runs the module once eagerly, so that cuDNN's execution plans are ready for the compiled function's
        first run (:class:`_PrecompiledLoader` says why it must be this way round); False loads it on the engine's
        thread. ``quick_start`` (default: on a GPU, with ``warm_beside_load``): a batch that comes while its
        precompiled function still loads is not kept waiting: the module computes it eagerly (the same program and
        precision, without Inductor's fusions and without graphs), and so do the batches after it until the load has
        ended; then the compiled function and its graphs take over (``compile_stats[...]["eager_batches"]`` says how
        many ran eagerly). Off, the first batch waits for the load. ``trtc validate`` and ``trtc bench`` open the
        engine without it, so that every batch they time or compare is the compiled function's. An FP32 engine turns
        torch's TF32 convolutions and matrix products off (process-wide), so that FP32 computes in FP32."""
        t0 = time.perf_counter()
        self.precision = check_precision(precision)
        torch = require_torch()
        from .manifest import read_manifest_if_any
        from ._gpu import parse_device

        self.timings = {"import_torch_s": time.perf_counter() - t0}
        self.path, self.device = Path(path), device
        kind, index = parse_device(device)
        self.device_id = index if kind == "cuda" else None
        self.manifest = read_manifest_if_any(self.path)
        if self.manifest is not None and self.manifest.kind not in ("program",):
            raise UsageProblem(f"{self.path.name} is a {self.manifest.kind}, not a torch.export program",
                               "give the .pt2 that trtc export --program writes")
        self.cuda_graph = bool(cuda_graph) and kind == "cuda"
        self.cudnn_benchmark = bool(cudnn_benchmark) and kind == "cuda"
        self._runs: dict = {}
        self._lock = threading.Lock()
        self.stream = self._tstream = None
        if kind == "cuda":
            self._open_cuda(torch)
        on_gpu = kind == "cuda"
        self.program = CompiledProgram(
            torch, self.path, self.manifest, self.precision, self.device_id, self._tstream, self.timings,
            compile=on_gpu if compile is None else bool(compile), cache=cache, progress=progress,
            precompile=precompile, cudnn_benchmark=self.cudnn_benchmark,
            warm_beside_load=on_gpu if warm_beside_load is None else bool(warm_beside_load),
            quick_start=on_gpu if quick_start is None else bool(quick_start))
        self.compile_stats = self.program.compile_stats  # the same dict, never replaced
        self._set_specs()
        if kind == "cuda":
            self.module.to(self._torch_device).to(memory_format=torch.channels_last)
        self.timings["open_s"] = time.perf_counter() - t0
        self.preferred_layout = "NHWC" if kind == "cuda" else "NCHW"  # what the first convolution reads best

    # the program's state, read where the engine was read before it had a program of its own
    compile = property(lambda self: self.program.compile)
    quick_start = property(lambda self: self.program.quick_start)
    warm_beside_load = property(lambda self: self.program.warm_beside_load)
    program_from = property(lambda self: self.program.program_from)
    module = property(lambda self: self.program.module)
    kept_fp32 = property(lambda self: self.program.kept_fp32)

    def _open_cuda(self, torch) -> None:
        from ._gpu import check_gpu_index

        check_gpu_index(self.device_id)
        if not torch.cuda.is_available():
            raise UsageProblem(f"{self.device}: this torch ({torch.__version__}) has no CUDA",
                               "install a CUDA build of torch (pip install torch), or use --device cpu")
        cp = require("cupy", "Running the compiled PyTorch engine on device buffers")
        with cp.cuda.Device(self.device_id):
            self.stream = cp.cuda.Stream(non_blocking=True)
        self._torch_device = torch.device("cuda", self.device_id)
        self._tstream = torch.cuda.ExternalStream(self.stream.ptr, device=self._torch_device)
        self._pool = torch.cuda.graph_pool_handle()
        self._one = OneThread("trtc-torch-run")  # runs the model's function (see _forward)
        if self.precision == "fp32":  # FP32 means FP32: torch's default runs FP32 convolutions in TF32 (process-wide)
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False

    def _set_specs(self) -> None:
        dtype = "float16" if self.precision == "fp16" else "float32"
        if self.manifest is not None:
            m = self.manifest
            self.inputs = [TensorSpec(t.name, dtype, t.shape) for t in m.inputs]
            self.outputs = [TensorSpec(t.name, "float32", t.shape) for t in m.outputs]
            self.batch_range = (m.batch.min, m.batch.max)
            return
        ins, outs, self.batch_range = _program_specs(self.module.gm)
        self.inputs = [TensorSpec(ins[0].name, dtype, ins[0].shape)]
        self.outputs = [TensorSpec(outs[0].name, "float32", outs[0].shape)]

    def infer(self, batch, outputs=None, stream=None) -> list:
        """Run one batch. Host arrays in, host arrays out; device arrays in, CuPy arrays out (enqueued on the
        engine's stream, ordered after the caller's ``stream`` and before whatever the caller enqueues next).

        A device input is read where it lies: keep it alive and unchanged until ``stream`` reaches this point."""
        from ._cuda import is_device_array

        first = next(iter(batch.values())) if isinstance(batch, dict) else batch
        if is_device_array(first):
            return self._infer_device(first, outputs, stream)
        return self._infer_host(np.asarray(first))

    def _check_shape(self, shape: tuple) -> int:
        want = self.inputs[0].shape
        if len(shape) != 4 or tuple(shape[1:]) != tuple(want[1:]):
            raise UsageProblem(f"input shape {tuple(shape)} does not fit the model's {list(want)}",
                               f"give (batch, {', '.join(str(d) for d in want[1:])}) arrays")
        b = int(shape[0])
        lo, hi = self.batch_range or (1, None)
        if b < lo or (hi is not None and b > hi):
            raise UsageProblem(f"batch {b} is outside {self.path.name}'s batch range {lo}..{hi}",
                               f"give batches of {lo} to {hi}, or export again with --batch 1:{b}:{max(b, hi or b)}")
        return b

    def _infer_host(self, x: np.ndarray) -> list:
        torch = require_torch()
        self._check_shape(x.shape)
        x = np.ascontiguousarray(x, dtype=self.inputs[0].numpy_dtype)
        if self.stream is None:
            with self._lock, torch.no_grad():
                xt = torch.from_numpy(x)
                return [self._run_function(self._run_for(xt, "nchw"), xt).numpy()]
        with self._lock, torch.cuda.device(self.device_id), torch.cuda.stream(self._tstream), torch.no_grad():
            xt = torch.from_numpy(x).to(self._torch_device)
            return [self._forward(xt, bind=False).cpu().numpy()]  # .cpu() waits for the engine's stream

    def _infer_device(self, x, outputs, stream) -> list:
        if self.stream is None:
            raise UsageProblem(f"{self.path.name} is open on {self.device}, not on a GPU",
                               "open it with device='cuda:N' or pass numpy arrays")
        import cupy as cp

        from ._cuda import as_cupy, device_output, external_stream

        torch = require_torch()
        x = as_cupy(x)
        self._check_shape(x.shape)
        if x.dtype not in (np.float32, np.float16):
            raise UsageProblem(f"input must be a float32 or float16 device array, got {x.dtype}")
        caller = external_stream(stream, self.device_id) if stream is not None else cp.cuda.get_current_stream()
        if caller.ptr != self.stream.ptr:
            self.stream.wait_event(caller.record())
        with self._lock, cp.cuda.Device(self.device_id), self.stream, torch.cuda.device(self.device_id), \
                torch.cuda.stream(self._tstream), torch.no_grad():
            logits = self._forward(torch.from_dlpack(x))
            out = device_output(outputs, 0, self.outputs[0], tuple(logits.shape), self.stream)
            torch.from_dlpack(out).copy_(logits)  # a graph's output is overwritten by its next replay
        if caller.ptr != self.stream.ptr:
            caller.wait_event(self.stream.record())
        return [out]

    def _forward(self, xt, bind: bool = True):
        """Logits of a CUDA tensor, on the engine's stream (the current one): the graph bound to the input's slot,
        a new such graph (up to MAX_SLOT_GRAPHS per batch size), or the graph that copies the input in (also for
        ``bind=False``: a temporary input of the host path). A replay runs on the caller's thread; whatever runs the
        model's function (a compile or load, an eager batch, a capture) runs on the engine's own thread
        (engines._one_thread says why: cuDNN's plans are cached per thread)."""
        layout = _layout(tuple(xt.shape), tuple(xt.stride()))
        run = self._runs.get((int(xt.shape[0]), str(xt.dtype), layout))
        if self.cuda_graph and run is not None and run.loading is None:
            out = self._replayed(run, xt, bind)
            if out is not None:
                return out
        return self._one.call(self._in_context, self._forward_on_own_thread, xt, layout, bind)

    @staticmethod
    def _replayed(run: _Run, xt, bind: bool):
        """Logits from ``run``'s graphs, without running the model's function: the graph bound to the input's slot,
        or the graph that copies the input in where the slot gets none (``bind=False``, or MAX_SLOT_GRAPHS taken);
        None when the slot is still to get a graph of its own."""
        bound = run.slots.get(xt.data_ptr()) if bind else None
        if bound is not None:
            bound[0].replay()
            return bound[1]
        if bind and len(run.slots) < MAX_SLOT_GRAPHS:
            return None
        run.static_in.copy_(xt)
        run.graph.replay()
        return run.out

    def _in_context(self, fn, *args):
        """``fn(*args)`` with the engine's GPU, stream and no autograd (torch keeps them per thread)."""
        torch = require_torch()
        with torch.cuda.device(self.device_id), torch.cuda.stream(self._tstream), torch.no_grad():
            return fn(*args)

    def _forward_on_own_thread(self, xt, layout: str, bind: bool):
        run = self._run_for(xt, layout)
        if not self.cuda_graph or run.loading is not None:
            return self._run_function(run, xt)
        if bind and xt.data_ptr() not in run.slots and len(run.slots) < MAX_SLOT_GRAPHS:
            run.slots[xt.data_ptr()] = self._capture(run.fn, xt)
        return self._replayed(run, xt, bind)

    def _run_function(self, run: _Run, xt):
        """``run``'s function on ``xt`` without graphs (the module eagerly, or the compiled function); an eager batch
        served while the precompiled function waits to load lets that load go (quick start)."""
        out = run.fn(xt)
        if run.loading is not None:
            self.program.let_loads_go()
        return out

    def _run_for(self, xt, layout: str) -> _Run:
        """The compiled callable (and, on CUDA, the copying graph) of this input's batch size, dtype and layout:
        made on first use."""
        key = (int(xt.shape[0]), str(xt.dtype), layout)
        run = self._runs.get(key)
        if run is not None and run.loading is not None and not run.loading.is_alive():
            earlier = self._runs.pop(key)  # its precompiled function has loaded: made again, with it
            run = self._run_for(xt, layout)
            self.program.served_eagerly(xt, layout, earlier)
            return run
        if run is not None:
            if run.loading is not None:
                run.eager_batches += 1
            return run
        torch, since = require_torch(), time.perf_counter()
        if self.stream is None:
            fn = self.program.compiled(xt, layout)
        else:
            static_in = torch.empty_strided(tuple(xt.shape), tuple(xt.stride()), dtype=xt.dtype, device=xt.device)
            static_in.copy_(xt)
            fn = self.program.compiled(static_in, layout)
        if isinstance(fn, _Loading):  # the module serves this batch and the next until the function has loaded
            run = self._runs[key] = _Run(self.module, loading=fn.loader)
            run.eager_batches, run.since = 1, since
            return run
        if self.stream is None:
            run = self._runs[key] = _Run(fn)
            return run
        graph, out = self._capture(fn, static_in) if self.cuda_graph else (None, None)
        run = self._runs[key] = _Run(fn, static_in, graph, out)
        return run

    def _capture(self, fn, xt) -> tuple:
        """A CUDA graph of ``fn(xt)`` reading ``xt`` where it lies, captured on the engine's stream after one
        warm-up run there (with ``cudnn_benchmark``, cuDNN's benchmark mode on for both: the graph keeps the algorithms
        it timed fastest); other threads' CUDA calls (decoders, kernels) go on meanwhile (thread-local capture).

        Not through ``torch.cuda.graph``: its entry synchronises the whole device, runs ``gc.collect()`` and empties
        torch's allocator cache, which, mid-stream, stalls every decoder of the pipeline. Only this engine's stream is
        waited for; the graph's memory comes from the engine's private pool."""
        torch = require_torch()
        t0 = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with cudnn_benchmark_on(torch, self.cudnn_benchmark):
            fn(xt)
            self._tstream.synchronize()
            with torch.cuda.stream(self._tstream):
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    out = fn(xt)
                finally:
                    graph.capture_end()
        self.program.add_time("capture_s", time.perf_counter() - t0)
        return graph, out

    @property
    def binds_inputs(self) -> bool:
        """Whether the engine keeps a CUDA graph per input address (up to MAX_SLOT_GRAPHS per batch size): a
        pipeline then runs each of its input buffers once before its clock starts, so that no graph is captured
        mid-stream."""
        return self.cuda_graph and self.stream is not None

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the precompiled functions loading on their thread (begun at open, or by a quick start) have
        loaded; False when ``timeout`` seconds passed first. The next batch of their shape runs the compiled
        function. (As :meth:`OnnxRuntimeEngine.wait_ready` for its quick start.)"""
        return self.program.wait_ready(timeout)

    def close(self) -> None:
        self.program.end_loads()
        if self.stream is not None:
            self.stream.synchronize()
            self._one.close()
        self._runs.clear()
        self.program.module = None
