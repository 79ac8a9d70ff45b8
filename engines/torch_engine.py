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

Compilation takes seconds to tens of seconds (ResNet-50 on an H100: about 20 s). The first start keeps beside the
model (``m.pt2.inductor/``; a user cache folder where the model's folder is read-only) a plain copy of the program
(:func:`plain_program`: no ``torch.export.load`` next time), Inductor's compiled artifacts and the precompiled
function (Dynamo's AOT precompile: no trace, no compile next time), keyed by GPU, torch version, batch size,
precision and layout (:func:`cache_key`, :func:`program_key`). On a GPU a second start loads that function on a
thread of its own, from open, while the calling thread runs the module once eagerly: cuDNN's plans are per thread
(:class:`_PrecompiledLoader`). A corrupt or mismatched cache file is ignored with a log line and compiled again.
cuDNN's benchmark mode is off by default, as PyTorch leaves it: on an H100 it made ResNet-50 FP16 slower (0.935x
against 0.964x of torch.compile, NCHW input) and each start 1-4 s longer; ``cudnn_benchmark=True`` turns it on while
a shape warms up and its graphs are captured (:func:`cudnn_benchmark_on`).

On the CPU the program runs eagerly (``compile=True`` compiles it with Inductor's C++ backend; slow to compile).
INT8 is refused: it needs TensorRT or ONNX Runtime (``trtc quantize m.onnx --precision int8``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import platform
import re
import threading
import time
from pathlib import Path

import numpy as np

from ._deps import require
from ._one_thread import OneThread
from .base import EngineBase, TensorSpec
from .errors import EngineError, UsageProblem, first_line

log = logging.getLogger("trtc")
PREFIXES = ("torch", "torch-fp16")
PRECISIONS = ("fp32", "fp16")
# trtc quantize's FP16 keep-list (ONNX op types, toolchain/precision/fp16.py) -> the aten operators of a torch.export
# program that compute the same thing; these compute in FP32 in an FP16 program (their inputs cast up, their float
# outputs cast back down). Convolutions, matrix products, activations, pooling, additions and batch norm run in FP16.
KEEP_FP32_ATEN = {
    "Softmax": ("softmax", "_softmax", "_safe_softmax"), "LogSoftmax": ("log_softmax", "_log_softmax"),
    "Exp": ("exp", "exp2", "expm1"), "Log": ("log", "log2", "log10", "log1p"), "Pow": ("pow",),
    "Reciprocal": ("reciprocal", "rsqrt"), "ReduceSum": ("sum",), "ReduceSumSquare": ("sum",),
    "ReduceL2": ("norm", "linalg_vector_norm"), "ReduceLogSumExp": ("logsumexp",), "ReduceProd": ("prod",),
    "LayerNormalization": ("layer_norm", "native_layer_norm"),
    "InstanceNormalization": ("instance_norm",), "GroupNormalization": ("group_norm", "native_group_norm"),
    "CumSum": ("cumsum",), "Range": ("arange",), "TopK": ("topk",), "NonMaxSuppression": ("nms",),
    "RoiAlign": ("roi_align",),
}
CACHE_MAGIC = b"TRTC-INDUCTOR-CACHE 1\n"
MAX_SLOT_GRAPHS = 8  # input slots (device addresses) per batch size that get a graph of their own


def require_torch(purpose: str = "The compiled PyTorch engine"):
    return require("torch", purpose, extra="torch")


def check_precision(precision: str | None) -> str:
    """fp32 or fp16; int8 is refused with the fix (it needs TensorRT or ONNX Runtime)."""
    p = (precision or "fp32").lower()
    if p == "int8":
        raise UsageProblem("INT8 needs TensorRT or ONNX Runtime: the compiled PyTorch engine runs FP32 and FP16",
                           "quantize the ONNX exported beside the program: trtc quantize MODEL.onnx --precision int8, "
                           "then run MODEL.int8.onnx (ONNX Runtime) or build a plan (TensorRT)")
    if p not in PRECISIONS:
        raise UsageProblem(f"unknown precision {precision!r} for the compiled PyTorch engine", "use fp32 or fp16")
    return p


def keep_fp32_ops(onnx_ops=None) -> set[str]:
    """The aten operator names kept in FP32 for these ONNX op types (default: trtc quantize's keep-list)."""
    if onnx_ops is None:
        onnx_ops = KEEP_FP32_ATEN
    return {name for op in onnx_ops for name in KEEP_FP32_ATEN.get(op, ())}


def _op_name(node) -> str | None:
    packet = getattr(node.target, "_overloadpacket", None)
    if packet is not None:
        return packet.__name__.split(".")[-1]
    return getattr(node.target, "__name__", None) if node.op == "call_function" else None


def _is_float(val) -> bool:
    dtype = getattr(val, "dtype", None)
    return dtype is not None and dtype.is_floating_point


def fp16_graph(gm, keep: set[str] | None = None) -> list[str]:
    """Make the GraphModule ``gm`` (``ExportedProgram.module()``) compute in FP16, in place: float parameters and
    buffers to FP16, and the nodes whose operator is in ``keep`` (:func:`keep_fp32_ops`) computed in FP32 (casts
    around them). The caller feeds it FP16 input. Returns the names of the nodes kept in FP32."""
    torch = require_torch()
    keep = keep_fp32_ops() if keep is None else keep
    graph, kept = gm.graph, []
    to_copy = torch.ops.aten._to_copy.default
    for node in list(graph.nodes):
        if node.op != "call_function" or _op_name(node) not in keep:
            continue
        kept.append(node.name)
        for arg in [a for a in node.all_input_nodes if _is_float(a.meta.get("val"))]:
            with graph.inserting_before(node):
                up = graph.call_function(to_copy, (arg,), {"dtype": torch.float32})
            node.replace_input_with(arg, up)
        outs = [node] if _is_float(node.meta.get("val")) else \
            [u for u in node.users if _is_float(u.meta.get("val"))]  # a tuple's float items (getitem nodes)
        for out in outs:
            users = list(out.users)
            with graph.inserting_after(out):
                down = graph.call_function(to_copy, (out,), {"dtype": torch.float16})
            for user in users:
                user.replace_input_with(out, down)
    graph.lint()
    gm.recompile()
    gm.half()
    return kept


def _model_class(torch):
    """The wrapper giving a program trtc's input and output contract: takes the input as given (FP32 or FP16, any
    layout), computes in the engine's precision, returns FP32 logits. One class per process, a module attribute, so
    that a saved compiled function (:func:`_aot_compile`) finds it again by name."""
    cls = globals().get("_TrtcModel")
    if cls is None:
        class _TrtcModel(torch.nn.Module):
            def __init__(self, gm, dtype):
                super().__init__()
                self.gm, self.dtype = gm, dtype

            def forward(self, x):
                out = self.gm(x.to(self.dtype))
                return (out[0] if isinstance(out, (tuple, list)) else out).float()

        _TrtcModel.__qualname__ = "_TrtcModel"
        cls = globals()["_TrtcModel"] = _TrtcModel
    return cls


def _call(model, x):
    """What is compiled: the model is an argument, so a saved compiled function holds no weights."""
    return model(x)


def load_program(path: Path, precision: str):
    """``torch.export.load`` -> its module, without the input check hooks (the engine checks shapes itself), frozen
    (no gradients), cast to FP16 where asked; returns (module, the nodes kept in FP32)."""
    torch = require_torch()
    try:
        program = torch.export.load(str(path))
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for a file that is not a program
        raise EngineError(f"torch cannot load {path.name} as a torch.export program: {first_line(exc)}",
                          "re-export it: trtc export SOURCE -o MODEL.onnx --program") from exc
    gm = program.module()
    gm._forward_pre_hooks.clear()  # the program's shape checks: the engine checks the batch range itself
    gm.requires_grad_(False)
    kept = fp16_graph(gm) if precision == "fp16" else []
    dtype = torch.float16 if precision == "fp16" else torch.float32
    return _model_class(torch)(gm, dtype), kept


# ------------------------------------------------------------------------------------------- the plain program
def _code_globals(torch) -> dict:
    """The names the generated code of an exported program refers to (torch.fx's own globals for aten code)."""
    import math

    return {"torch": torch, "inf": math.inf, "nan": math.nan, "NoneType": type(None), "device": torch.device}


def plain_program(gm, kept: list[str]) -> dict | None:
    """The loaded program in a form that loads in milliseconds (no ``torch.export.load``): its forward's Python code
    and the tensors it reads, by attribute path; ``gm`` (``ExportedProgram.module()``, after :func:`fp16_graph`) is
    changed in place (the shape-check module dropped, plain code generation). None for a program this cannot hold
    (a submodule call other than the shape check, an unknown global): such a program is loaded the slow way."""
    torch = require_torch()
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            graph.erase_node(node)  # the program's input checks (shapes): the engine checks the batch itself
    graph.set_codegen(torch.fx.graph.CodeGen())
    code = gm.recompile()
    if not set(code.globals) <= set(_code_globals(torch)) | {"fx_pytree", "pytree"} or \
            any(n.op == "call_module" for n in graph.nodes):
        return None
    params = {name for name, _ in gm.named_parameters()}
    tensors, kinds = {}, {}
    for node in graph.nodes:
        if node.op == "get_attr":
            obj = gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            if not isinstance(obj, torch.Tensor):
                return None
            tensors[node.target] = obj.detach()
            kinds[node.target] = "param" if node.target in params else "buffer"
    return {"code": code.src, "tensors": tensors, "kinds": kinds, "kept": list(kept)}


def module_from_plain(plain: dict):
    """The module of a :func:`plain_program`: a module tree holding its tensors, whose class (named after a hash of
    the code, a module attribute, so a saved compiled function finds it by name) runs its code."""
    import hashlib

    torch = require_torch()
    name = "_TrtcProgram_" + hashlib.sha256(plain["code"].encode()).hexdigest()[:16]
    cls = globals().get(name)
    if cls is None:
        namespace = _code_globals(torch)
        exec(compile(plain["code"], f"<trtc program {name}>", "exec"), namespace)  # noqa: S102 - trtc's own file
        cls = globals()[name] = type(name, (torch.nn.Module,), {"forward": namespace["forward"],
                                                                "__module__": __name__})
    root = cls()
    for path, tensor in plain["tensors"].items():
        *parents, leaf = path.split(".")
        mod = root
        for part in parents:
            if part not in mod._modules:
                mod.add_module(part, torch.nn.Module())
            mod = mod._modules[part]
        if plain["kinds"][path] == "param":
            mod.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=False))
        else:
            mod.register_buffer(leaf, tensor)
    return root


# ----------------------------------------------------------------------------------------------------- the cache
def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def device_label(device_id: int | None) -> str:
    """``H100-sm90`` style: the GPU's name (without NVIDIA and the memory) and compute capability; ``cpu-x86_64``."""
    if device_id is None:
        return f"cpu-{platform.machine()}"
    torch = require_torch()
    name = torch.cuda.get_device_name(device_id)
    major, minor = torch.cuda.get_device_capability(device_id)
    short = re.sub(r"^NVIDIA\s+", "", name).split()
    return f"{_clean('-'.join(short[:2]))}-sm{major}{minor}"


def cache_key(device: str, torch_version: str, batch: int, precision: str, layout: str, dtype: str,
              model_sha: str) -> str:
    """One compiled artifact's key: GPU (name and compute capability), torch and Python versions, batch size,
    precision, input layout and dtype, and the model's hash (a replaced model never loads another's code)."""
    py = f"py{platform.python_version_tuple()[0]}{platform.python_version_tuple()[1]}"
    return (f"{_clean(device)}-torch{_clean(torch_version)}-{py}-b{batch}-{precision}-{layout}-{dtype}-"
            f"{model_sha[:12]}")


def program_key(torch_version: str, precision: str, model_sha: str) -> str:
    """The key of a program's plain copy (:func:`plain_program`): torch and Python versions (the aten code it holds),
    precision (FP16 casts and weights) and the model's hash; not the GPU or batch size (it holds no compiled code)."""
    py = f"py{platform.python_version_tuple()[0]}{platform.python_version_tuple()[1]}"
    return f"program-torch{_clean(torch_version)}-{py}-{precision}-{model_sha[:12]}"


def plain_bytes(plain: dict) -> bytes:
    buf = io.BytesIO()
    require_torch().save(plain, buf)
    return buf.getvalue()


def read_plain(path: Path, key: str) -> dict | None:
    """The plain program kept in ``path`` for ``key``; None (with a log line) for a missing, damaged or foreign one."""
    payload = read_cache(path, key)
    if payload is None:
        return None
    try:
        plain = require_torch().load(io.BytesIO(payload), weights_only=True)
        if not isinstance(plain, dict) or {"code", "tensors", "kinds", "kept"} - set(plain):
            raise ValueError("not a plain program")
    except Exception as exc:  # noqa: BLE001 - torch.load raises many kinds for damaged bytes
        log.warning("ignored the plain program %s (%s); loading the program itself", path.name, first_line(exc))
        return None
    return plain


_CUDNN_LOCK = threading.Lock()
_CUDNN_STATE = {"depth": 0, "saved": None}


@contextlib.contextmanager
def cudnn_benchmark_on(torch, enabled: bool = True):
    """cuDNN's benchmark mode on inside the block (cuDNN times its convolution algorithms for each new shape and keeps
    the fastest), the caller's setting back after it. The setting is process-wide: other threads' convolutions meanwhile
    are timed too. Nested and concurrent blocks (engines warming up in several threads) share one count: the setting
    the first one found comes back when the last one ends."""
    if not enabled:
        yield
        return
    cudnn = torch.backends.cudnn
    with _CUDNN_LOCK:
        if _CUDNN_STATE["depth"] == 0:
            _CUDNN_STATE["saved"] = bool(cudnn.benchmark)
        _CUDNN_STATE["depth"] += 1
        cudnn.benchmark = True
    try:
        yield
    finally:
        with _CUDNN_LOCK:
            _CUDNN_STATE["depth"] -= 1
            if _CUDNN_STATE["depth"] == 0:
                cudnn.benchmark = _CUDNN_STATE["saved"]


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trtc" / "inductor"


def cache_dirs(model: Path, model_sha: str) -> list[Path]:
    """Where a model's compiled artifacts are looked for and written: beside the model, then the user's cache."""
    return [model.with_name(model.name + ".inductor"), user_cache_dir() / model_sha[:16]]


def read_cache(path: Path, key: str) -> bytes | None:
    """The payload of a cache file written for ``key``; None (with a log line) for a missing, corrupt or
    mismatched one."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.info("ignored the compile cache %s: %s", path, exc)
        return None
    try:
        if not raw.startswith(CACHE_MAGIC):
            raise ValueError("not a trtc compile cache")
        head, _, payload = raw[len(CACHE_MAGIC):].partition(b"\n")
        meta = json.loads(head)
        if meta.get("key") != key or meta.get("bytes") != len(payload):
            raise ValueError(f"written for {meta.get('key')} ({meta.get('bytes')} bytes), not {key} "
                             f"({len(payload)} bytes)")
    except (ValueError, UnicodeDecodeError) as exc:
        log.warning("ignored the compile cache %s: %s; compiling again", path.name, exc)
        return None
    return payload


def cached_payloads(dirs: list[Path], key: str, suffix: str):
    """(path, payload) of each cache file ``key + suffix`` in ``dirs``, in order, that is whole and written for
    ``key`` (:func:`read_cache`); the caller stops at the first it can use."""
    for folder in dirs:
        path = folder / f"{key}{suffix}"
        payload = read_cache(path, key)
        if payload is not None:
            yield path, payload


def write_cache(dirs: list[Path], key: str, payload: bytes, suffix: str = ".bin") -> Path | None:
    """Write the cache file ``key + suffix`` atomically in the first folder that takes it; None (a log line) where none
    does."""
    from ._io import atomic_write_bytes
    from .errors import TrtcError

    data = CACHE_MAGIC + json.dumps({"key": key, "bytes": len(payload)}).encode() + b"\n" + payload
    for folder in dirs:
        target = folder / f"{key}{suffix}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, data)
            return target
        except (OSError, TrtcError) as exc:
            log.info("cannot keep the compile cache in %s (%s)", folder, getattr(exc, "reason", exc))
    log.warning("could not keep Inductor's compiled code (tried %s): the next start compiles again",
                ", ".join(str(d) for d in dirs))
    return None


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


class _Loading:
    """What :meth:`TorchEngine._compiled` returns for a shape whose precompiled function is still loading, where the
    engine starts quickly (``quick_start``): the module serves its batches eagerly meanwhile."""

    def __init__(self, loader):
        self.loader = loader


# quick start: how long a load begun at open waits for the first eager batch before it goes ahead anyway (a source
# that is slow to give its first frames, e.g. a camera still connecting); see _PrecompiledLoader's ``go``
LOAD_HOLD_S = 5.0

# one load of a precompiled function, or one compile, at a time in a process: Dynamo and Inductor do not say that two
# at once are safe, and a load begun at open for another shape may still run while the first batch loads or compiles
_TORCH_LOCK = threading.RLock()


class _PrecompiledLoader(threading.Thread):
    """Loads a precompiled function (``torch.compiler.load_compiled_function``, which also imports Dynamo and
    Inductor: 3-4 s of Python in a second start of Lite0 on an H100) from the first of ``payloads`` that loads, on a
    thread of its own (``start()``) or on the caller's (``run()``).

    Why the load goes to another thread and the eager warm-up stays on the caller's, and not the other way round
    (tried on an H100: it did not shorten the first run): torch keeps cuDNN's execution plans
    in a cache per thread (``thread_local`` in ``aten/src/ATen/native/cudnn/Conv_v8.cpp``; cuDNN's plans are not
    guaranteed thread-safe), so plans that another thread built are built again by the thread that runs the
    compiled function. Its first run spent about 2 s there on an H100 (Lite0 FP16, batch 64). The warm-up must run
    on the thread that will run the compiled function.

    ``go`` (an event; the engine's quick start): the load waits for it, or for LOAD_HOLD_S seconds, before it begins.
    The engine sets it once its first eager batch has run. The load is seconds of Python (imports, unpickling) that
    holds the interpreter lock; begun at open, it ran beside everything up to that first result (the program's load,
    the caller's first batch, the eager warm-up and batch, each operator of which waits for the lock again after its
    kernel launch) and delayed it. Eager batches serve meanwhile, so the load is not needed before then."""

    def __init__(self, torch, key: str, payloads: list, device_id: int | None, go: threading.Event | None = None):
        # not a daemon: the interpreter waits for a load in progress before it finalises. A daemon thread still in
        # torch's C++ code then is ended by pthread_exit through noexcept frames, which aborts the process
        # ("terminate called without an active exception": once in CI, a start whose load begun at open was for
        # another batch size and still ran when the script ended)
        super().__init__(name="trtc-torch-load", daemon=False)
        self.torch, self.key, self.payloads, self.device_id = torch, key, payloads, device_id
        self.loaded: list = []  # per payload, in order: the loaded function, or the exception loading it raised
        self.supported = True  # False: this torch has no precompiled functions (nothing is loaded)
        self.seconds = 0.0
        self.thread_name = None
        self.at_open = False  # started at open (the model's most recently used function), not at a first batch
        self.served_eager = False  # the calling thread ran batches of this shape eagerly while it loaded
        self.go, self.held_s = go, 0.0  # held_s: how long the load waited for ``go``

    def run(self) -> None:
        if self.go is not None:
            t0 = time.perf_counter()
            self.go.wait(LOAD_HOLD_S)
            self.held_s = time.perf_counter() - t0
        torch, t0 = self.torch, time.perf_counter()
        self.thread_name = threading.current_thread().name
        try:
            with _TORCH_LOCK:
                self._load_all(torch)
        finally:
            self.seconds = time.perf_counter() - t0

    def _load_all(self, torch) -> None:
        try:
            on_gpu = torch.cuda.device(self.device_id) if self.device_id is not None else contextlib.nullcontext()
            with on_gpu:
                self.supported = precompile_supported(torch)
                if not self.supported:
                    return
                _raise_recompile_limit(torch)
                for _path, payload in self.payloads:
                    try:
                        self.loaded.append(self.load_one(payload))
                        break  # the rest are loaded only where this one does not run
                    except Exception as exc:  # noqa: BLE001 - reported, and tried again, by the engine
                        self.loaded.append(exc)
        except Exception as exc:  # noqa: BLE001 - e.g. Dynamo's import failing on this thread: the engine retries
            self.loaded.append(exc)

    def load_one(self, payload: bytes):
        torch = self.torch
        with _TORCH_LOCK, torch._dynamo.config.patch(enable_aot_compile=True):
            return torch.compiler.load_compiled_function(io.BytesIO(payload))


def _layout(shape: tuple, strides: tuple) -> str:
    """nchw (C-contiguous) or nhwc (channels_last) for an (N, C, H, W) array's strides in elements; anything else is
    refused. Dimensions of size 1 may have any stride."""
    n, c, h, w = (int(d) for d in shape)
    for name, want in (("nchw", (c * h * w, h * w, w, 1)), ("nhwc", (h * w * c, 1, w * c, c))):
        if all(int(s) == t or d == 1 for s, t, d in zip(strides, want, (n, c, h, w))):
            return name
    raise UsageProblem(f"input strides {tuple(strides)} are neither NCHW nor channels_last (NHWC) for shape "
                       f"{tuple(shape)}", "pass a C-contiguous NCHW array, or an (N, C, H, W) view of NHWC memory")


def _sha(path: Path) -> str:
    from ._io import sha256_verified

    return sha256_verified(path)


def _program_specs(gm) -> tuple[list[TensorSpec], list[TensorSpec], tuple | None]:
    """Inputs, outputs and fixed batch of a program without a manifest, from its graph's example values."""
    def spec(name, val):
        shape = tuple(int(d) if isinstance(d, int) or str(d).isdigit() else "batch" for d in val.shape)
        return TensorSpec(name, str(val.dtype).replace("torch.", ""), shape)

    holders = [n for n in gm.graph.nodes if n.op == "placeholder" and hasattr(n.meta.get("val"), "shape")]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    first = out_node.args[0]
    first = first[0] if isinstance(first, (tuple, list)) else first
    if len(holders) != 1 or not hasattr(getattr(first, "meta", {}).get("val"), "shape"):
        raise EngineError("the program is not a classifier with one image input and a logits output",
                          "export it with trtc export SOURCE -o MODEL.onnx --program")
    ins, outs = [spec("input", holders[0].meta["val"])], [spec("logits", first.meta["val"])]
    b = ins[0].shape[0]
    return ins, outs, ((b, b) if isinstance(b, int) else None)


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
        graphs (:func:`cudnn_benchmark_on`); off by default (PyTorch's heuristics ran ResNet-50 FP16 faster on an
        H100, docs/TORCH.md, and the timing costs seconds at each start). ``precompile``: save (and load) the
        compiled function itself with the cache (Dynamo's AOT precompile, where torch has it), so a second start does
        not trace the program again. ``warm_beside_load`` (default: on a GPU): a start from a precompiled function
        loads it on a thread of its own while the calling thread runs the module once eagerly, so that cuDNN's
        execution plans are ready for the compiled function's first run (:class:`_PrecompiledLoader` says why it
        must be this way round); False loads it on the calling thread, as before. ``quick_start`` (default: on a
        GPU, with ``warm_beside_load``): a batch that comes while its precompiled function still loads is not kept
        waiting: the module computes it eagerly (the same program and precision, without Inductor's fusions and
        without graphs), and so do the batches after it until the load has ended; then the compiled function and
        its graphs take over (``compile_stats[...]["eager_batches"]`` says how many ran eagerly). Off, the first
        batch waits for the load. ``trtc validate`` and ``trtc bench`` open the engine without it, so that every
        batch they time or compare is the compiled function's. An FP32
        engine turns torch's TF32 convolutions and matrix products off (process-wide): on an H100 Lite0 in TF32
        disagreed with the FP32 reference on 1 of 276 top-1s (max logit difference 0.05)."""
        t0 = time.perf_counter()
        self.precision = check_precision(precision)
        torch = require_torch()
        from .manifest import read_manifest_if_any
        from .onnxruntime_engine import parse_device

        self.timings = {"import_torch_s": time.perf_counter() - t0}
        self.path, self.device = Path(path), device
        kind, index = parse_device(device)
        self.device_id = index if kind == "cuda" else None
        self.manifest = read_manifest_if_any(self.path)
        if self.manifest is not None and self.manifest.kind not in ("program",):
            raise UsageProblem(f"{self.path.name} is a {self.manifest.kind}, not a torch.export program",
                               "give the .pt2 that trtc export --program writes")
        self.compile = kind == "cuda" if compile is None else bool(compile)
        self.cuda_graph = bool(cuda_graph) and kind == "cuda"
        self.cache, self.progress, self.precompile = cache, progress, precompile
        self.cudnn_benchmark = bool(cudnn_benchmark) and kind == "cuda"
        self.warm_beside_load = kind == "cuda" if warm_beside_load is None else bool(warm_beside_load)
        self.quick_start = kind == "cuda" if quick_start is None else bool(quick_start)
        self._loaders: dict = {}  # key -> a _PrecompiledLoader started at open and not used yet
        # quick start: set when the first eager batch has run; until then a load on its thread waits (LOAD_HOLD_S at
        # most), so that it does not hold the interpreter lock while that first result is made
        self._go = threading.Event() if self.quick_start and self.warm_beside_load else None
        self.compile_stats: dict = {}
        self.program_from = "export"  # or "cache": the plain copy of the program kept beside the model
        self._runs: dict = {}
        self._lock = threading.Lock()
        self.stream = None
        if kind == "cuda":
            self._open_cuda(torch)
        self._sha = self.manifest.artifact.get("sha256", "") if self.manifest else _sha(self.path)
        self._start_preload(torch)
        t1 = time.perf_counter()
        self.module, self.kept_fp32 = self._load_module(torch)
        self.timings["load_program_s"] = time.perf_counter() - t1
        self._set_specs()
        if kind == "cuda":
            self.module.to(self._torch_device).to(memory_format=torch.channels_last)
        self.timings["open_s"] = time.perf_counter() - t0
        self.preferred_layout = "NHWC" if kind == "cuda" else "NCHW"  # what the first convolution reads best

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

    def _load_module(self, torch):
        """The program's module and the nodes kept in FP32: from the plain copy in the cache where there is one
        (no ``torch.export.load``: milliseconds instead of seconds), else loaded from the program, then kept as a plain
        copy for the next start (when compiling). Both compile the same module, so Inductor's caches hit."""
        dtype = torch.float16 if self.precision == "fp16" else torch.float32
        key = program_key(torch.__version__, self.precision, self._sha)
        dirs = cache_dirs(self.path, self._sha) if self.cache and self.manifest is not None else []
        for folder in dirs:
            plain = read_plain(folder / f"{key}.program", key)
            if plain is not None:
                self.program_from = "cache"
                log.info("loaded %s (%s) from its plain copy %s", self.path.name, self.precision, folder)
                return _model_class(torch)(module_from_plain(plain), dtype), plain["kept"]
        module, kept = load_program(self.path, self.precision)
        plain = plain_program(module.gm, kept) if dirs else None
        if plain is None:
            return module, kept
        if self.compile:
            written = write_cache(dirs, key, plain_bytes(plain), suffix=".program")
            if written is not None:
                log.info("kept a plain copy of %s (%s) in %s", self.path.name, self.precision, written)
        return _model_class(torch)(module_from_plain(plain), dtype), kept

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

    # ------------------------------------------------------------------------------------------------ running
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
            self._let_loads_go()
        return out

    def _run_for(self, xt, layout: str) -> _Run:
        """The compiled callable (and, on CUDA, the copying graph) of this input's batch size, dtype and layout:
        made on first use."""
        key = (int(xt.shape[0]), str(xt.dtype), layout)
        run = self._runs.get(key)
        if run is not None and run.loading is not None and not run.loading.is_alive():
            earlier = self._runs.pop(key)  # its precompiled function has loaded: made again, with it
            run = self._run_for(xt, layout)
            self._served_eagerly(xt, layout, earlier)
            return run
        if run is not None:
            if run.loading is not None:
                run.eager_batches += 1
            return run
        torch, since = require_torch(), time.perf_counter()
        if self.stream is None:
            fn = self._compiled(xt, layout)
        else:
            static_in = torch.empty_strided(tuple(xt.shape), tuple(xt.stride()), dtype=xt.dtype, device=xt.device)
            static_in.copy_(xt)
            fn = self._compiled(static_in, layout)
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

    def _served_eagerly(self, xt, layout: str, earlier: _Run) -> None:
        """After the switch from eager batches to the loaded function: the count in ``compile_stats`` and its seconds
        from the first batch of the shape (the wait the quick start kept off the batches), said once."""
        stats = self.compile_stats.get((int(xt.shape[0]), str(xt.dtype).replace("torch.", ""), layout))
        if stats is None:
            return
        stats["eager_batches"] = earlier.eager_batches
        stats["seconds"] = time.perf_counter() - earlier.since
        log.info("%s: %d batch(es) of %d ran eagerly while the precompiled function loaded (%.1f s)", self.path.name,
                 earlier.eager_batches, int(xt.shape[0]), stats["seconds"])

    def _capture(self, fn, xt) -> tuple:
        """A CUDA graph of ``fn(xt)`` reading ``xt`` where it lies, captured on the engine's stream after one
        warm-up run there (with ``cudnn_benchmark``, cuDNN's benchmark mode on for both: the graph keeps the algorithms
        it timed fastest); other threads' CUDA calls (decoders, kernels) go on meanwhile (thread-local capture).

        Not through ``torch.cuda.graph``: its entry synchronises the whole device, runs ``gc.collect()`` and empties
        torch's allocator cache, which, mid-stream, stalled every decoder: the first timed pipeline run of Lite0 at 16
        streams on an H100 ran at 8,610 fps, the next at 15,312. Only this engine's stream is waited for; the graph's
        memory comes from the engine's private pool, as before."""
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
        self._add_time("capture_s", time.perf_counter() - t0)
        return graph, out

    @property
    def binds_inputs(self) -> bool:
        """Whether the engine keeps a CUDA graph per input address (up to MAX_SLOT_GRAPHS per batch size): a
        pipeline then runs each of its input buffers once before its clock starts, so that no graph is captured
        mid-stream."""
        return self.cuda_graph and self.stream is not None

    # ----------------------------------------------------------------------------------------------- compiling
    def _compiled(self, xt, layout: str):
        """The callable for ``xt``'s shape: the module itself (eager), a precompiled function from the cache (no trace,
        no compile), or ``torch.compile(dynamic=False)`` run once here (Inductor compiles at the first call), Inductor's
        artifacts and the precompiled function loaded from and saved to the cache; or, with ``quick_start`` while the
        precompiled function still loads, a :class:`_Loading` (the caller runs the module meanwhile)."""
        if not self.compile:
            return self.module
        torch = require_torch()
        b, dtype = int(xt.shape[0]), str(xt.dtype).replace("torch.", "")
        key = cache_key(self._device_label(), torch.__version__, b, self.precision, layout, dtype, self._sha)
        dirs = cache_dirs(self.path, self._sha) if self.cache else []
        what = f"{self.path.name} ({self.precision}) for batch {b} on {self._device_name()}"
        t0 = time.perf_counter()
        # the precompiled function holds Inductor's compiled code for its graph (a bundled entry): Inductor's own
        # artifacts are loaded only to compile (on an H100 a second start of Lite0 ran as well without them). Dynamo
        # is imported by the loader (on its thread where it warms beside the load), not before it.
        self._loaded_on, self._preloaded = None, False
        fn, aot, loaded = self._load_precompiled(torch, dirs, key, xt), None, None
        if isinstance(fn, _Loading):
            self._say(f"running {what} eagerly while its precompiled function loads", loud=False)
            self._add_time("compile_s", time.perf_counter() - t0)
            return fn
        _raise_recompile_limit(torch)
        start, hits = ("precompiled", 0) if fn is not None else (None, _counter(torch, "fxgraph_cache_hit"))
        if fn is not None:
            self._say(f"started {what} from its compile cache (precompiled: no trace, no compile)", loud=False)
        else:
            with _TORCH_LOCK:  # Inductor's artifacts, the trace and the compile: no load beside them
                loaded = self._load_cache(dirs, key)
                where = "from its cache" if loaded else "about 20 s the first time for ResNet-50 on an H100; " + \
                    ("cached beside the model" if self.cache else "not cached")
                self._say(f"compiling {what} ({where})", loud=not loaded)
                fn, aot = self._compile_now(torch, xt, b)
        seconds = time.perf_counter() - t0
        hit = start is None and _counter(torch, "fxgraph_cache_hit") > hits
        start = start or ("inductor cache" if hit else "cold")
        precompiled = start == "precompiled"
        self.compile_stats[(b, dtype, layout)] = {"seconds": seconds, "start": start,
                                                  "cache_file": bool(loaded) or precompiled,
                                                  "inductor_cache_hit": hit, "precompiled": precompiled,
                                                  "loaded_on": self._loaded_on,
                                                  "preloaded": self._preloaded and precompiled, "key": key,
                                                  "eager_batches": 0}
        self._add_time("compile_s", seconds)
        log.info("started %s in %.1f s (%s)", what, seconds, {"precompiled": "precompiled function from the cache",
                 "inductor cache": "traced, Inductor cache hit", "cold": "traced and compiled"}[start])
        if dirs and start != "precompiled":
            with _TORCH_LOCK:
                self._save_cache(torch, dirs, key, aot)
        return fn

    def _compile_now(self, torch, xt, b: int):
        """``torch.compile`` run once on ``xt``: precompiled (a function that can be saved, Dynamo's AOT precompile)
        where torch has it and the cache is on, else (or where that fails) plainly. Returns (callable, the precompiled
        function or None)."""
        aot = None
        if self.cache and self.precompile and precompile_supported(torch):
            try:
                with torch._dynamo.config.patch(enable_aot_compile=True):
                    aot = torch.compile(_call, fullgraph=True, dynamic=False).aot_compile(((self.module, xt), {}))
            except Exception as exc:  # noqa: BLE001 - an experimental API: compile as before
                log.info("Dynamo's AOT precompile failed on %s (%s); compiling without it", self.path.name,
                         first_line(exc))
        fn = functools.partial(aot, self.module) if aot is not None else torch.compile(self.module, dynamic=False)
        try:
            self._first_run(torch, fn, xt)
        except Exception as exc:  # noqa: BLE001 - Inductor and Dynamo raise many kinds
            raise EngineError(f"torch.compile failed on {self.path.name} at batch {b}: {first_line(exc)}",
                              "run it eagerly (open_engine(..., compile=False)) and report the model") from exc
        return fn, aot

    def _first_run(self, torch, fn, xt) -> None:
        """Run ``fn`` once (Inductor compiles or loads its kernels, cuDNN times its algorithms) and wait for it."""
        with cudnn_benchmark_on(torch, self.cudnn_benchmark):
            fn(xt)
            if self.stream is not None:
                self._tstream.synchronize()

    def _start_preload(self, torch):
        """At open, where the engine warms beside the load: a loader of this model's most recently used precompiled
        function (the newest whole ``.aot`` for this GPU, torch and precision, whatever its batch size), started now
        so that it loads while the program loads and the caller prepares its first batch. It waits in
        ``self._loaders`` for the batch size, layout and dtype of its key (a first batch of another shape loads its
        own function, and this one serves a later batch of its shape, or is waited for at close)."""
        if not (self.warm_beside_load and self.compile and self.cache and self.precompile
                and hasattr(torch.compiler, "load_compiled_function")):
            return
        suffix = self._aot_suffix()
        pattern = cache_key(self._device_label(), torch.__version__, "*", self.precision, "*", "*", self._sha) + suffix
        dirs, found = cache_dirs(self.path, self._sha), []
        for folder in dirs:
            for path in folder.glob(pattern):
                with contextlib.suppress(OSError):
                    found.append((path.stat().st_mtime, path))
        for _mtime, path in sorted(found, reverse=True):  # the newest whole one
            key = path.name[:-len(suffix)]
            payloads = list(cached_payloads(dirs, key, suffix))
            if payloads:
                loader = self._loaders[key] = _PrecompiledLoader(torch, key, payloads, self.device_id, self._go)
                loader.at_open = True
                loader.start()
                return

    def _load_precompiled(self, torch, dirs: list[Path], key: str, xt):
        """The precompiled function of ``key`` from the cache, run once on ``xt``; None where there is none, or it does
        not load or run here (a log line; compiled again). With ``warm_beside_load`` it loads on a thread of its own
        (started at open where the key was guessed right) while this thread runs the module once eagerly; with
        ``quick_start``, a :class:`_Loading` instead of waiting while the load goes on (the loader waits in
        ``self._loaders`` for the next batch of this shape, which skips the eager warm-up: the eager batches built
        the plans)."""
        if not (self.precompile and dirs and hasattr(torch.compiler, "load_compiled_function")):
            return None
        loader = self._loaders.pop(key, None)
        if loader is None:
            payloads = list(cached_payloads(dirs, key, self._aot_suffix()))
            if not payloads:
                return None
            loader = _PrecompiledLoader(torch, key, payloads, self.device_id, self._go)
            if self.warm_beside_load:
                loader.start()
        self._preloaded = loader.at_open
        if self.warm_beside_load:
            if not loader.served_eager:  # eager batches on this thread have built cuDNN's plans already
                self._warm_eager(torch, xt)
            if self.quick_start and loader.is_alive():
                loader.served_eager = True
                self._loaders[key] = loader  # looked at again by the next batch of this shape
                return _Loading(loader)
            t0 = time.perf_counter()
            loader.join()
            self._add_time("precompiled_wait_s", time.perf_counter() - t0)
        else:
            loader.run()  # here, on the calling thread
        if not loader.supported:
            return None
        self._add_time("precompiled_load_s", loader.seconds)
        self._add_time("precompiled_held_s", loader.held_s)
        for i, (path, payload) in enumerate(loader.payloads):
            got = loader.loaded[i] if i < len(loader.loaded) else None
            where = loader.thread_name
            if not callable(got):
                if got is not None:
                    log.info("loading %s on %s failed (%s); loading it on this thread", path.name, where,
                             first_line(got))
                try:
                    t0 = time.perf_counter()
                    got, where = loader.load_one(payload), threading.current_thread().name
                    self._add_time("precompiled_load_s", time.perf_counter() - t0)
                except Exception as exc:  # noqa: BLE001 - a function torch cannot load: compile
                    log.warning("ignored the precompiled function %s (%s); compiling again", path.name,
                                first_line(exc))
                    continue
            fn = functools.partial(got, self.module)
            try:
                t1 = time.perf_counter()
                self._first_run(torch, fn, xt)
                self._add_time("first_run_s", time.perf_counter() - t1)
            except Exception as exc:  # noqa: BLE001 - guards that fail here, or a function that does not run: compile
                log.warning("ignored the precompiled function %s (%s); compiling again", path.name, first_line(exc))
                continue
            log.info("loaded the precompiled function %s on %s", path, where)
            self._loaded_on = where
            with contextlib.suppress(OSError):
                os.utime(path)  # the most recently used: the one a later start loads at open
            return fn
        return None

    def _warm_eager(self, torch, xt) -> None:
        """Run the module once eagerly on ``xt`` (this thread, the engine's stream) while the loader loads the
        precompiled function: cuDNN's execution plans for these convolutions are then built, on this thread, when
        the compiled function first runs here. (A shorter switch interval meanwhile, so that this thread got the
        interpreter back sooner between operators, made the loader, the longer of the two, slower: probe SI on an
        H100, median second start 6.33 s with it against 6.02 s without.)"""
        t0 = time.perf_counter()
        try:
            self._first_run(torch, self.module, xt)
        except Exception as exc:  # noqa: BLE001 - the compiled function's own first run says what is wrong
            log.info("the eager warm-up of %s failed: %s", self.path.name, first_line(exc))
        self._add_time("warm_eager_s", time.perf_counter() - t0)

    def _add_time(self, name: str, seconds: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + seconds

    def _load_cache(self, dirs: list[Path], key: str) -> Path | None:
        """Load the first cache file of ``key`` that is whole and meant for it; None where there is none."""
        torch = require_torch()
        for path, payload in cached_payloads(dirs, key, ".bin"):
            try:
                t0 = time.perf_counter()
                torch.compiler.load_cache_artifacts(payload)
                self._add_time("cache_load_s", time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001 - a payload torch cannot read: compile afresh
                log.warning("ignored the compile cache %s: torch cannot load it (%s); compiling again", path.name,
                            first_line(exc))
                continue
            log.info("loaded Inductor's compiled code from %s", path)
            return path
        return None

    def _save_cache(self, torch, dirs: list[Path], key: str, aot=None) -> None:
        """Keep Inductor's artifacts (``.bin``) and the precompiled function (``.aot``, where there is one)."""
        try:
            saved = torch.compiler.save_cache_artifacts()
        except Exception as exc:  # noqa: BLE001 - never fail a run for a cache
            log.info("torch could not serialise its compiled code: %s", exc)
            saved = None
        if saved is not None and saved[0]:
            written = write_cache(dirs, key, bytes(saved[0]))
            if written is not None:
                log.info("kept Inductor's compiled code in %s (%d bytes)", written, len(saved[0]))
        data = precompiled_bytes(aot) if aot is not None else None
        if data:
            written = write_cache(dirs, key, data, suffix=self._aot_suffix())
            if written is not None:
                log.info("kept the precompiled function in %s (%d bytes)", written, len(data))

    def _aot_suffix(self) -> str:
        """The precompiled function's guards hold the GPU's index: one file per index (Inductor's are portable)."""
        return ".aot" if self.device_id is None else f".cuda{self.device_id}.aot"

    def _device_label(self) -> str:
        return device_label(self.device_id)

    def _device_name(self) -> str:
        if self.device_id is None:
            return "the CPU"
        return require_torch().cuda.get_device_name(self.device_id)

    def _say(self, text: str, loud: bool = True) -> None:
        """A compilation announced: to ``progress``, else the log (a warning, so the CLI shows it, when it is the
        slow one)."""
        if self.progress is not None:
            self.progress(text)
        else:
            log.log(logging.WARNING if loud else logging.INFO, "%s", text)

    def _let_loads_go(self) -> None:
        """The first eager batch has run (quick start): loads waiting for it begin now, and later ones at once."""
        if self._go is not None and not self._go.is_set():
            self._go.set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the precompiled functions loading on their thread (begun at open, or by a quick start) have
        loaded; False when ``timeout`` seconds passed first. The next batch of their shape runs the compiled
        function. (As :meth:`OnnxRuntimeEngine.wait_ready` for its quick start.)"""
        deadline = None if timeout is None else time.perf_counter() + timeout
        self._let_loads_go()  # a caller who waits for them wants them now
        for loader in list(self._loaders.values()):
            loader.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
            if loader.is_alive():
                return False
        return True

    def close(self) -> None:
        self._let_loads_go()
        for loader in self._loaders.values():  # loads begun at open and not used: let them end first
            loader.join()
        self._loaders.clear()
        if self.stream is not None:
            self.stream.synchronize()
            self._one.close()
        self._runs.clear()
        self.module = None


def precompile_supported(torch) -> bool:
    """Whether this torch has Dynamo's AOT precompile (``torch.compile(...).aot_compile``, 2.10 and later; behind
    ``torch._dynamo.config.enable_aot_compile``, off by default in 2.11) and its loader."""
    return hasattr(torch.compiler, "load_compiled_function") and hasattr(torch._dynamo.config, "enable_aot_compile")


def precompiled_bytes(aot) -> bytes | None:
    """The saved form of a precompiled function (``AOTCompiledFunction.serialize``); None (a log line) where torch
    cannot save it."""
    try:
        data = type(aot).serialize(aot)
        data = getattr(data, "serialized_data", data)
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"serialize gave {type(data).__name__}")
        return bytes(data)
    except Exception as exc:  # noqa: BLE001 - never fail a run for a cache
        log.info("torch could not save the precompiled function: %s", first_line(exc))
        return None


def _counter(torch, name: str) -> int:
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"][name])
    except Exception:  # noqa: BLE001 - a torch without the counter: no hit known
        return 0


def _raise_recompile_limit(torch, at_least: int = 64) -> None:
    """One compiled entry per batch size and layout: Dynamo's default of 8 recompiles would run the ninth eagerly."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), at_least * (4 if "accumulated" in name else 1)))
