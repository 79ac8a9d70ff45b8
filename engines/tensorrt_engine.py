"""TensorRT plans: the manifest check that comes before deserialization, and loading.

A plan only runs on the TensorRT flavour and version that built it (unless built version-compatible, and then
only on the same or a newer runtime) and on the GPU it was built for (unless built hardware-compatible). Asking
TensorRT to deserialize anything else ends in a log line and a None, or worse; so the runtime reads the plan's
manifest first and says which side differs and how to rebuild. TensorRT-RTX builds for a list of compute
capabilities and version 1.7 has none for 9.0 (H100/H200).

:class:`TensorRTEngine` runs a plan on device arrays: one execution context per CUDA stream (contexts are not
shared across streams or threads), ``set_input_shape`` + ``set_tensor_address`` with the caller's device pointers,
``execute_async_v3(stream)``, no host synchronisation. A context is used by one thread at a time (a lock per
context is held from ``set_input_shape`` to the enqueue), so threads sharing a stream take turns. With
``cuda_graph=True`` each (stream, shapes, addresses) combination is run once normally, then captured into a CUDA
graph on that stream and replayed afterwards (full TensorRT); at most ``MAX_GRAPHS`` graphs are kept (least
recently used dropped), and a context's graphs are dropped when its input shapes change, so returning to an
earlier shape runs and captures again instead of replaying a graph of a context state that no longer holds.
TensorRT-RTX captures its own graphs (``IRuntimeConfig.cuda_graph_strategy``).

What has been executed: this module's manifest check and deserialisation path ran against TensorRT-RTX 1.7 on an
H200 (which RTX refuses to run on: no SM90 kernels), and the execution calls run against a recording fake on CPU.
No TensorRT plan has been *executed* by this code on a real GPU yet: no machine here has a runnable TensorRT.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ._gpu import device as gpu_device
from ._trt import (NAMES, RUNTIME_FLAVORS, Backend, installed, load_backend, load_runtime_backend, make_logger,
                   rtx_targets, runtime_pip_line, sm_name, version_tuple)
from ._cuda import device_input, device_output, external_stream, is_device_array
from ._deps import require
from .base import EngineBase, TensorSpec
from .errors import EngineError, ManifestError, UsageProblem
from .manifest import Manifest, read_manifest

log = logging.getLogger("trtc")


class Problem(str):
    """One reason why a plan cannot run here, as shown; ``kind`` picks the fix :func:`rebuild_command` gives:
    ``missing`` (no runtime), ``not-vc`` (a runtime-only TensorRT and a plan built without --version-compatible),
    ``lean-excluded`` (the dispatch runtime and a plan without its lean runtime), ``runtime-older`` (the lean or
    dispatch runtime older than the plan's TensorRT), ``rtx-on-edge`` (a TensorRT-RTX plan and only the edge
    runtimes), ``flavor``, ``version``, ``no-gpu``, ``gpu`` (another GPU), ``rtx-gpu`` (RTX cannot run on it)."""

    kind = "other"

    def __new__(cls, text: str, kind: str = "other"):
        self = super().__new__(cls, text)
        self.kind = kind
        return self


def _kinds(problems) -> set[str]:
    return {getattr(p, "kind", "other") for p in problems or []}


def rebuild_command(manifest: Manifest, plan: str | Path, problems: list[str] | None = None,
                    backend: Backend | None = None) -> str:
    """How to get a plan that runs here (or where to run this one). ``backend`` is the runtime found here: with the
    lean or dispatch runtime (an edge box: no builder) the fix never says to build on this machine."""
    kinds = _kinds(problems)
    b = manifest.builder or {}
    if "rtx-gpu" in kinds:
        targets = ", ".join(b.get("compute_capabilities", [])) or "a supported GPU"
        return (f"run it on a GPU it was built for ({targets}), or build for this GPU with TensorRT: "
                f"trtc build {(manifest.parent or {}).get('file', 'model.onnx')} --backend tensorrt")
    parent = (manifest.parent or {}).get("file", "model.onnx")
    elsewhere = "on a machine with TensorRT (and the target's GPU): {}, then copy the plan and its .json here"
    if "rtx-on-edge" in kinds:
        return ('the edge extra runs only TensorRT version-compatible plans: pip install "trtc[rtx]" to run '
                "TensorRT-RTX plans, or " + elsewhere.format(f"trtc build {parent} -o {Path(plan).name} --force "
                                                             "--backend tensorrt --version-compatible"))
    if "not-vc" in kinds:
        return elsewhere.format(f"trtc build {parent} -o {Path(plan).name} --force --version-compatible")
    mode = (manifest.precision or {}).get("mode", "fp32")
    cmd = f"trtc build {parent} -o {Path(plan).name} --force --backend {b.get('flavor', 'auto')}"
    if mode != "fp32" and not str(parent).endswith(f".{mode}.onnx"):
        cmd += f" --precision {mode}"
    edge = backend is not None and backend.runtime_only
    if edge:
        fix = _edge_fix(kinds, b, cmd, backend, elsewhere)
        if "no-gpu" in kinds:
            there = f"run it on a machine with {_target_gpu(b)}"
            return f"{there}: the plan needs no rebuild" if kinds == {"no-gpu"} else f"{fix}; {there}"
        return fix
    cmd += _build_flags(b)
    if "no-gpu" in kinds:  # rebuilt here, it would still have no GPU to run on
        where = ", ".join(t for t in b.get("compute_capabilities", []) if t.upper() != "CURRENT")
        return (f"run it on a machine with an NVIDIA GPU{f' it was built for ({where})' if where else ''}; "
                f"to build it again: {cmd}")
    return cmd + " (on this machine)"


def _edge_fix(kinds: set[str], b: dict, cmd: str, backend: Backend, elsewhere: str) -> str:
    """The fix on a box with only the lean or dispatch runtime: a runtime to install, or a plan to build elsewhere."""
    if "runtime-older" in kinds:
        built, here = str(b.get("version", "?")), backend.version
        newer_minor = version_tuple(built)[:2] > version_tuple(here)[:2]
        cap = ".".join(here.split(".")[:2]) if newer_minor else here
        what = "lean" if backend.flavor == "tensorrt-lean" else "dispatch"
        return (f"upgrade the {what} runtime ({runtime_pip_line(backend.flavor, built)}) or build with TensorRT "
                f"<= {cap} --version-compatible ({cmd}{_build_flags(b)})")
    if "lean-excluded" in kinds:
        flags = dict(b.get("flags") or {}, exclude_lean_runtime=False)
        return ('install the lean runtime (pip install "trtc[edge]"), or '
                + elsewhere.format(cmd + _build_flags(dict(b, flags=flags))))
    return elsewhere.format(cmd + _build_flags(b))


def _target_gpu(b: dict) -> str:
    """The GPUs a plan runs on, from its manifest's builder: 'an NVIDIA GPU of compute capability 9.0 (...)'."""
    if b.get("flavor") == "tensorrt-rtx":
        targets = [t for t in b.get("compute_capabilities", []) if str(t).upper() != "CURRENT"]
        if not targets:
            targets = [sm_name((b.get("gpu") or {}).get("compute_capability", "0.0"))]
        return f"an NVIDIA GPU it was built for ({', '.join(targets)})"
    level = (b.get("flags") or {}).get("hardware_compatibility", "none")
    gpu = b.get("gpu") or {}
    cc = gpu.get("compute_capability")
    if level == "ampere+":
        return "an Ampere-or-newer NVIDIA GPU (compute capability 8.0 or higher)"
    if not cc:
        return "an NVIDIA GPU"
    return f"an NVIDIA GPU of compute capability {cc}" + ("" if level == "same-cc" else
                                                          f" (it was built on {gpu.get('name', '?')})")


NO_GPU = Problem("no NVIDIA GPU found here", "no-gpu")


def _build_flags(builder: dict) -> str:
    """The options of `trtc build` that the manifest records and a rebuild needs again: TensorRT-RTX's compute
    capabilities (without them a GPU-less machine cannot build at all), the compatibility flags."""
    flags = builder.get("flags") or {}
    out = ""
    if builder.get("flavor") == "tensorrt-rtx":
        for cc in builder.get("compute_capabilities") or []:
            if str(cc).upper() != "CURRENT":
                out += f" --compute-capability {cc}"
    if flags.get("version_compatible"):
        out += " --version-compatible"
        if flags.get("exclude_lean_runtime"):
            out += " --exclude-lean-runtime"
    if flags.get("hardware_compatibility") not in (None, "none"):
        out += f" --hardware-compatibility {flags['hardware_compatibility']}"
    return out


def plan_problems(manifest: Manifest, backend: Backend | None, gpu: dict | None) -> list[str]:
    """Why this machine cannot run the plan (empty when it can, as far as the manifest tells): its runtime's
    problems, then its GPU's."""
    return _runtime_problems(manifest, backend) + _gpu_problems(manifest, backend, gpu)


def _runtime_problems(manifest: Manifest, backend: Backend | None) -> list[str]:
    """Why the installed TensorRT runtime (``backend``; None: none) cannot load the plan."""
    b = manifest.builder or {}
    problems = []
    flavor = b.get("flavor")
    built = str(b.get("version", "?"))
    flags = b.get("flags", {})
    compatible = bool(flags.get("version_compatible"))
    if backend is None:
        problems.append(Problem(f"{'TensorRT-RTX' if flavor == 'tensorrt-rtx' else 'TensorRT'} is not installed here "
                                f"(the plan needs {flavor} {built}"
                                + (", or TensorRT's lean runtime of that version or newer)" if compatible else ")"),
                                "missing"))
    elif backend.runtime_only and flavor == "tensorrt":
        if not compatible:
            problems.append(Problem(f"the plan was built with {flavor} {built} without --version-compatible; "
                                    f"{backend.describe()} only runs version-compatible plans", "not-vc"))
        elif backend.flavor == "tensorrt-dispatch" and flags.get("exclude_lean_runtime"):
            problems.append(Problem(f"the plan was built with --exclude-lean-runtime; {backend.describe()} needs "
                                    "the lean runtime inside the plan", "lean-excluded"))
        elif version_tuple(backend.version) < version_tuple(built):
            problems.append(Problem(f"the plan was built with {flavor} {built}; {backend.describe()} is older, and "
                                    "only the same or a newer runtime loads a version-compatible plan",
                                    "runtime-older"))
    elif backend.runtime_only:  # a TensorRT-RTX plan where only the edge extra's runtimes are installed
        problems.append(Problem(f"the plan was built with {NAMES.get(flavor, flavor)} {built}; {backend.describe()} "
                                "runs only TensorRT version-compatible plans", "rtx-on-edge"))
    elif backend.flavor != flavor:
        problems.append(Problem(f"the plan was built with {flavor} {built}; this machine has {backend.describe()}",
                                "flavor"))
    elif backend.version != built:
        newer = version_tuple(backend.version) > version_tuple(built)
        if not (compatible and newer and not backend.rtx):
            problems.append(Problem(f"the plan was built with {flavor} {built}; this machine has {flavor} "
                                    f"{backend.version}" + (" (only a newer runtime can load a version-compatible "
                                                            "plan)" if compatible else ""), "version"))
    return problems


def _gpu_problems(manifest: Manifest, backend: Backend | None, gpu: dict | None) -> list[str]:
    """Why this GPU (``gpu``; None: none) cannot run the plan, by the compute capabilities it was built for."""
    b = manifest.builder or {}
    flavor = b.get("flavor")
    problems = []
    if gpu is None:
        problems.append(NO_GPU)
    else:
        cc = str(gpu.get("compute_capability"))
        if flavor == "tensorrt-rtx":
            targets = [t.upper() for t in b.get("compute_capabilities", [])]
            if "CURRENT" in targets:
                targets = [sm_name((b.get("gpu") or {}).get("compute_capability", "0.0"))]
            if targets and sm_name(cc) not in targets:
                problems.append(Problem(f"the plan was built for {', '.join(targets)}; this GPU ({gpu.get('name')}) "
                                        f"is {sm_name(cc)}", "gpu"))
            if backend is not None and backend.rtx and sm_name(cc) not in rtx_targets(backend.module):
                problems.append(Problem(f"TensorRT-RTX {backend.version} cannot run on compute capability {cc} "
                                        f"({gpu.get('name')}); it supports {', '.join(rtx_targets(backend.module))}",
                                        "rtx-gpu"))
        else:
            level = b.get("flags", {}).get("hardware_compatibility", "none")
            built_gpu = b.get("gpu") or {}
            built_cc = str(built_gpu.get("compute_capability", "?"))
            if level == "none" and built_cc != cc:
                problems.append(Problem(f"the plan was built on a GPU of compute capability {built_cc} "
                                        f"({built_gpu.get('name', '?')}); this one is {cc} ({gpu.get('name')})", "gpu"))
            if level == "ampere+" and version_tuple(cc) < (8, 0):
                problems.append(Problem(f"an Ampere-or-newer plan cannot run on compute capability {cc}", "gpu"))
            if level == "same-cc" and version_tuple(built_cc) != version_tuple(cc):
                problems.append(Problem(f"a same-compute-capability plan built on {built_cc} "
                                        f"({built_gpu.get('name', '?')}) cannot run on compute capability {cc} "
                                        f"({gpu.get('name')})", "gpu"))
    return problems


def runtime_for(manifest: Manifest) -> Backend | None:
    """The runtime that would load this plan here: its flavour, or for a TensorRT plan the lean, then the dispatch
    runtime. Where none is installed but the edge extra's runtime is (a TensorRT-RTX plan on an edge box), that
    runtime, so that :func:`plan_problems` can say the edge extra runs only TensorRT plans. None: nothing here."""
    flavor = (manifest.builder or {}).get("flavor", "tensorrt")
    try:
        return load_runtime_backend(flavor, purpose="Running TensorRT plans")
    except Exception as exc:  # MissingDependency: reported with the plan's other problems
        log.debug("no %s: %s", flavor, exc)
    for edge in RUNTIME_FLAVORS:
        if flavor != "tensorrt" and installed(edge) is not None:
            try:
                return load_backend(edge, purpose="Running TensorRT plans")
            except Exception as exc:  # a broken install: as if absent
                log.debug("no %s: %s", edge, exc)
    return None


def load_plan(path: str | Path, device: int = 0, backend: Backend | None = None):
    """Check the manifest against this machine, then deserialize. Returns (backend, runtime, engine, manifest)."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.kind != "plan":
        raise ManifestError(f"{path.name} is a {manifest.kind} artifact, not a TensorRT plan",
                            "give the .plan made by trtc build")
    if backend is None:
        backend = runtime_for(manifest)
    problems = plan_problems(manifest, backend, gpu_device(device))
    if problems:
        raise ManifestError(f"{path.name} cannot run here: " + "; ".join(problems),
                            rebuild_command(manifest, path, problems, backend))
    trt = backend.module
    logger = make_logger(trt, error_level=logging.DEBUG)  # the reason is in the error raised below
    runtime = trt.Runtime(logger)
    if (manifest.builder or {}).get("flags", {}).get("version_compatible") and not backend.rtx:
        # a version-compatible plan carries host code (its lean runtime); TensorRT refuses it unless allowed.
        # trtc only loads plans whose manifest hash it verified (read_manifest), i.e. plans it was given to trust.
        runtime.engine_host_code_allowed = True
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise EngineError(f"{backend.describe()} could not deserialize {path.name}: "
                          + ("; ".join(logger.errors[-2:]) or "no reason given"),
                          rebuild_command(manifest, path, backend=backend))
    return backend, runtime, engine, manifest


_TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "INT8": "int8", "INT32": "int32", "INT64": "int64",
               "BOOL": "bool", "UINT8": "uint8"}


def _dtype_name(dt) -> str:
    name = str(getattr(dt, "name", dt)).rsplit(".", 1)[-1].upper()
    if name not in _TRT_DTYPES:
        raise EngineError(f"tensor type {name} is not supported by trtc's runtime", "export FP32/FP16 I/O")
    return _TRT_DTYPES[name]


class TensorRTEngine(EngineBase):
    """A TensorRT or TensorRT-RTX plan behind the Engine interface (device arrays in and out)."""

    MAX_GRAPHS = 16  # CUDA graphs kept (each holds the context's frozen launch sequence and some device memory)

    def __init__(self, path: str | Path, device: str = "cuda:0", cuda_graph: bool = False):
        from ._gpu import parse_device

        kind, self.device_id = parse_device(device)
        if kind != "cuda":
            raise UsageProblem(f"a TensorRT plan runs on a GPU, not on {device}", "use --device cuda:0, or run the "
                               ".onnx the plan was built from on the CPU")
        from ._gpu import check_gpu_index

        check_gpu_index(self.device_id)
        self.path = Path(path)
        self.device = device
        self.backend, self._runtime, self.engine, self.manifest = load_plan(self.path, self.device_id)
        trt = self.backend.module
        self.cp = require("cupy", "Running TensorRT plans on device buffers")
        self.cuda_graph = cuda_graph
        self._runtime_config = None
        if self.backend.rtx and cuda_graph and hasattr(self.engine, "create_runtime_config"):
            self._runtime_config = self.engine.create_runtime_config()
            self._runtime_config.cuda_graph_strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs, self.outputs = [], []
        for n in names:
            spec = TensorSpec(n, _dtype_name(self.engine.get_tensor_dtype(n)),
                              tuple(d if d >= 0 else ("batch" if i == 0 else "?")
                                    for i, d in enumerate(self.engine.get_tensor_shape(n))))
            is_input = self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT
            (self.inputs if is_input else self.outputs).append(spec)
        self._contexts: dict[int, object] = {}
        self._context_locks: dict[int, threading.Lock] = {}
        self._last_shapes: dict[int, tuple] = {}  # per stream: the input shapes the context was last run with
        self._graphs: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        with self.cp.cuda.Device(self.device_id):
            self.stream = self.cp.cuda.Stream(non_blocking=True)

    def context(self, stream_ptr: int):
        """The execution context for this stream (made on first use). TensorRT contexts hold their own activation
        memory and must not be used by two streams at once."""
        with self._lock:
            ctx = self._contexts.get(stream_ptr)
            if ctx is None:
                if self._runtime_config is not None:
                    ctx = self.engine.create_execution_context(self._runtime_config)
                else:
                    ctx = self.engine.create_execution_context()
                if ctx is None:
                    raise EngineError(f"TensorRT could not create an execution context for {self.path.name}",
                                      "free GPU memory or use fewer streams")
                self._contexts[stream_ptr] = ctx
                self._context_locks[stream_ptr] = threading.Lock()
            return ctx

    def infer(self, batch, outputs=None, stream=None) -> list:
        """Device arrays in, device (CuPy) arrays out, enqueued on ``stream`` (default: the engine's own stream).
        Host (numpy) arrays are accepted for convenience: uploaded, run, and copied back (not zero-copy)."""
        first = next(iter(batch.values())) if isinstance(batch, dict) else batch
        if not is_device_array(first):
            cp = self.cp
            feeds = batch if isinstance(batch, dict) else {self.inputs[0].name: batch}
            with self.stream:
                dev = {k: cp.asarray(np.ascontiguousarray(v, dtype=self._spec(k).numpy_dtype))
                       for k, v in feeds.items()}
                outs = self._run(dev, None, self.stream)
                host = [cp.asnumpy(o, stream=self.stream) for o in outs]
            self.stream.synchronize()
            return host
        s = external_stream(stream, self.device_id) if stream is not None else self.stream
        return self._run(batch if isinstance(batch, dict) else {self.inputs[0].name: batch}, outputs, s)

    def _spec(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise UsageProblem(f"{self.path.name} has no input {name!r}",
                           f"inputs are {', '.join(i.name for i in self.inputs)}")

    def _run(self, feeds: dict, outputs, stream) -> list:
        ctx = self.context(stream.ptr)
        with self._context_locks[stream.ptr]:  # one thread at a time from set_input_shape to the enqueue
            return self._run_locked(ctx, feeds, outputs, stream)

    def _run_locked(self, ctx, feeds: dict, outputs, stream) -> list:
        addresses = []
        for spec in self.inputs:
            x = device_input(feeds, spec)
            if not ctx.set_input_shape(spec.name, tuple(x.shape)):
                raise EngineError(f"shape {tuple(x.shape)} is outside {self.path.name}'s profile for {spec.name!r}",
                                  "use a batch inside the plan's --batch range (see `trtc inspect`)")
            ctx.set_tensor_address(spec.name, x.data.ptr)
            addresses.append((spec.name, tuple(x.shape), x.data.ptr))
        results = []
        for i, spec in enumerate(self.outputs):
            shape = tuple(ctx.get_tensor_shape(spec.name))
            out = device_output(outputs, i, spec, shape, stream)
            ctx.set_tensor_address(spec.name, out.data.ptr)
            addresses.append((spec.name, shape, out.data.ptr))
            results.append(out)
        if self.cuda_graph and self._runtime_config is None:
            self._launch_graph(ctx, stream, tuple(addresses))
        elif not ctx.execute_async_v3(stream.ptr):
            raise EngineError(f"TensorRT failed to enqueue {self.path.name}", "run with -vv to see TensorRT's log")
        return results

    def _launch_graph(self, ctx, stream, key: tuple) -> None:
        """Full TensorRT: a graph freezes shapes and addresses, so one graph per (stream, shapes, addresses)."""
        shapes = tuple((name, shape) for name, shape, _ in key)
        key = (stream.ptr, key)
        with self._lock:  # the graph cache is shared by every stream's thread
            if self._last_shapes.get(stream.ptr) != shapes:
                # new shapes on this context: TensorRT re-plans it (and may move its internal memory), so its graphs
                # of earlier shapes describe a state that no longer exists; drop them rather than replay them later
                for k in [k for k in self._graphs if k[0] == stream.ptr]:
                    del self._graphs[k]
                self._last_shapes[stream.ptr] = shapes
            graph = self._graphs.get(key)
            if graph is not None:
                self._graphs.move_to_end(key)
        if graph is None:
            # the first run after a shape change flushes TensorRT's deferred updates; it must not be captured
            if not ctx.execute_async_v3(stream.ptr):
                raise EngineError(f"TensorRT failed to enqueue {self.path.name}")
            stream.synchronize()
            stream.begin_capture()
            try:
                ok = ctx.execute_async_v3(stream.ptr)
            finally:
                graph = stream.end_capture()
            if not ok:
                raise EngineError(f"TensorRT failed to enqueue {self.path.name} while capturing a CUDA graph",
                                  "open the plan without cuda_graph")
            with self._lock:
                self._graphs[key] = graph
                while len(self._graphs) > self.MAX_GRAPHS:
                    self._graphs.popitem(last=False)
        graph.launch(stream)

    def close(self) -> None:
        self._graphs.clear()
        self._contexts.clear()
        self.engine = None
