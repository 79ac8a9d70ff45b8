"""Small ONNX graph helpers shared by the FP16 and INT8 passes (onnx + numpy only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engines._deps import require

from ..errors import QuantizeError, UsageProblem, first_line

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
           "DynamicQuantizeLinear", "QLinearAdd", "QLinearMul", "QGemm"}
CONTROL_FLOW = {"If", "Loop", "Scan"}
# ops whose output is a pure rearrangement/cast of constant inputs: folded into initializers before the passes
_FOLDABLE = {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Cast"}


def onnx_module():
    return require("onnx", "Quantizing ONNX models", extra="export")


def load(path: str | Path):
    onnx = onnx_module()
    p = Path(path)
    if not p.is_file():
        raise UsageProblem(f"model not found: {p}", "give the path of an .onnx file (make one with trtc export)")
    try:
        model = onnx.load(str(p))
    except Exception as exc:  # protobuf DecodeError and friends
        raise QuantizeError(f"{p} is not a readable ONNX model: {first_line(exc)}",
                            "re-export it with trtc export") from exc
    if not model.graph.node:
        raise QuantizeError(f"{p} has an empty graph", "re-export the model")
    if model.ir_version < 4:
        # IR < 4 lists every initializer among the graph inputs (overridable at run time); weights are constants
        # here, and later IR versions let initializers stand alone
        inits = {i.name for i in model.graph.initializer}
        inputs = [i for i in model.graph.input if i.name not in inits]
        del model.graph.input[:]
        model.graph.input.extend(inputs)
        model.ir_version = 4
    return model


def opset_of(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def refuse_reduced(model, name: str) -> None:
    """An FP16 or Q/DQ model is not a parent for another precision step: its FP32 values are gone."""
    onnx = onnx_module()
    ops = {n.op_type for n in model.graph.node}
    q = sorted(ops & QDQ_OPS)
    if q:
        raise QuantizeError(f"{name} is already quantized (it contains {', '.join(q)})",
                            "quantize the FP32 model it was made from")
    half = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    typed = list(model.graph.input) + list(model.graph.output)
    if any(t.type.tensor_type.elem_type in half for t in typed) or \
            any(t.data_type in half for t in model.graph.initializer):
        raise QuantizeError(f"{name} already computes in FP16/BF16",
                            "quantize the FP32 model it was made from")
    bad = sorted(ops & CONTROL_FLOW)
    if bad:
        raise QuantizeError(f"{name} has control flow ({', '.join(bad)}), which trtc quantize does not handle",
                            "export the classifier without data-dependent control flow")
    if any(n.domain not in ("", "ai.onnx") for n in model.graph.node):
        doms = sorted({n.domain for n in model.graph.node if n.domain not in ("", "ai.onnx")})
        raise QuantizeError(f"{name} uses operators from other domains ({', '.join(doms)})",
                            "export with standard ONNX operators only")


def graph_inputs(model) -> list:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def input_dims(value_info) -> list:
    """[int or str] per dimension; unnamed dynamic dimensions are '?'."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in value_info.type.tensor_type.shape.dim]


def tensor_spec(value_info):
    """An ONNX graph input/output as the runtime's TensorSpec (numpy dtype name, dims with names for dynamic)."""
    from engines.base import TensorSpec

    onnx = onnx_module()
    dtype = onnx.helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type).name
    return TensorSpec(value_info.name, dtype, tuple(input_dims(value_info)))


def upgrade_opset(model, minimum: int):
    """Return ``model`` at opset >= ``minimum`` (per-channel Q/DQ needs 13, FP16 scales need 19)."""
    onnx = onnx_module()
    current = opset_of(model)
    if current >= minimum:
        return model
    from onnx import version_converter

    try:
        out = version_converter.convert_version(model, minimum)
    except Exception as exc:
        raise QuantizeError(f"cannot convert the model from opset {current} to {minimum}: "
                            f"{first_line(exc)}", "re-export it with --opset 19 or newer") from exc
    if out.ir_version < 7:
        out.ir_version = 7
    onnx.checker.check_model(out)
    return out


def fold_constants(model) -> int:
    """Turn Constant nodes into initializers and fold Identity/Reshape/Transpose/... of constants, so that
    weights reached through such ops (e.g. the MNIST model reshapes its MatMul weight) are seen as weights."""
    onnx = onnx_module()
    from onnx import numpy_helper

    g = model.graph
    const = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    folded, keep = 0, []
    for node in g.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            attr = {a.name: a for a in node.attribute}
            value = None
            if "value" in attr:
                value = numpy_helper.to_array(attr["value"].t)
            elif "value_float" in attr:
                value = np.array(attr["value_float"].f, np.float32)
            elif "value_floats" in attr:
                value = np.array(list(attr["value_floats"].floats), np.float32)
            elif "value_int" in attr:
                value = np.array(attr["value_int"].i, np.int64)
            elif "value_ints" in attr:
                value = np.array(list(attr["value_ints"].ints), np.int64)
            if value is not None:
                const[node.output[0]] = value
                g.initializer.append(numpy_helper.from_array(value, node.output[0]))
                folded += 1
                continue
        if node.op_type in _FOLDABLE and node.input and all(i in const for i in node.input if i):
            value = _fold(node, [const[i] for i in node.input if i], onnx)
            if value is not None:
                const[node.output[0]] = value
                g.initializer.append(numpy_helper.from_array(value, node.output[0]))
                folded += 1
                continue
        keep.append(node)
    if folded:
        del g.node[:]
        g.node.extend(keep)
        prune_initializers(model)
    return folded


def _fold(node, args, onnx):
    attr = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    x = args[0]
    op = node.op_type
    if op == "Identity":
        return x
    if op == "Reshape":
        shape = [int(s) for s in args[1]]
        if attr.get("allowzero", 0) == 0:
            shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
        return x.reshape(shape)
    if op == "Transpose":
        return np.transpose(x, attr.get("perm"))
    if op == "Flatten":
        axis = attr.get("axis", 1)
        return x.reshape(int(np.prod(x.shape[:axis])), -1)
    if op in ("Squeeze", "Unsqueeze"):
        axes = attr.get("axes") if len(args) < 2 else [int(a) for a in args[1]]
        if op == "Squeeze":
            return np.squeeze(x, axis=tuple(axes) if axes is not None else None)
        out = x
        for a in sorted(a % (x.ndim + len(axes)) for a in axes):
            out = np.expand_dims(out, a)
        return out
    if op == "Cast":
        np_type = onnx.helper.tensor_dtype_to_np_dtype(attr["to"])
        return x.astype(np_type)
    return None


def prune_initializers(model) -> None:
    """Drop initializers nothing reads any more (and their entries in graph.input, which IR < 4 models list)."""
    g = model.graph
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    gone = {i.name for i in g.initializer if i.name not in used}
    if not gone:
        return
    keep = [i for i in g.initializer if i.name not in gone]
    del g.initializer[:]
    g.initializer.extend(keep)
    inputs = [i for i in g.input if i.name not in gone]
    del g.input[:]
    g.input.extend(inputs)


def tensor_types(model) -> dict[str, int]:
    """elem_type of every tensor in the graph (inputs, initializers, node outputs), via shape inference."""
    onnx = onnx_module()
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:
        raise QuantizeError(f"ONNX shape inference failed: {first_line(exc)}",
                            "check the model with onnx.checker; re-export it") from exc
    g = inferred.graph
    types = {i.name: i.data_type for i in g.initializer}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type.elem_type
        if t:
            types[vi.name] = t
    return types


def unique(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def all_names(model) -> set[str]:
    g = model.graph
    names = {i.name for i in g.initializer} | {i.name for i in g.input} | {o.name for o in g.output}
    for n in g.node:
        names.update(n.input)
        names.update(n.output)
        if n.name:
            names.add(n.name)
    return names


def node_label(node, index: int) -> str:
    """A stable human name for a node: its name, else op type and first output."""
    return node.name or f"{node.op_type}:{node.output[0] if node.output else index}"


def save_model(model, path: Path) -> None:
    onnx = onnx_module()
    onnx.save_model(model, str(path))


def check_model(model, name: str) -> None:
    onnx = onnx_module()
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        raise QuantizeError(f"the {name} model fails onnx.checker: {first_line(exc)}",
                            "report this model with --debug output") from exc
