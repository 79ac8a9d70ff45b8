"""The program of the compiled PyTorch engine (:mod:`engines.torch_engine`): a ``torch.export`` program loaded as a
module that takes trtc's input and gives FP32 logits, cast to FP16 where asked (trtc quantize's keep-list computes
in FP32), and its plain copy (:func:`plain_program`), which loads in milliseconds instead of ``torch.export.load``.

Classes that a saved compiled function refers to by name (the model wrapper, a plain program's module class) are
attributes of this module, so that the function finds them again in another process.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ._deps import require
from .base import TensorSpec
from .errors import EngineError, UsageProblem, first_line

log = logging.getLogger("trtc")
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


def file_sha(path: Path) -> str:
    """The program file's SHA-256, hashed once per process while the file stays the same (:func:`sha256_verified`)."""
    from ._io import sha256_verified

    return sha256_verified(path)
