"""FP32 -> FP16 graph conversion with FP32 inputs and outputs kept.

Every float tensor computed by a converted node becomes FP16; graph inputs and outputs stay FP32 (a Cast after
each input and before each output), so the runtime's contract does not change. Nodes on the keep-list compute in
FP32: Casts are put around them. An initializer is stored in FP16 unless only FP32 nodes read it. Values beyond
FP16's range are not silently clipped: the nodes that read them are kept in FP32 and reported.

Default keep-list and why (:data:`DEFAULT_KEEP_FP32`): exponentials, logarithms, powers and reciprocals
overflow or lose most of their precision in FP16; sums of many elements and squared sums exceed 65504; the
normalisations compute variances; Softmax/LogSoftmax turn the logits into probabilities and cost nothing to
keep; index-valued ops (TopK, Range, CumSum, NMS, RoiAlign) must stay exact. Convolutions, matrix products,
activations, pooling and additions - where the time goes - are converted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import QuantizeError, UsageProblem
from .graph import all_names, node_label, onnx_module, opset_of, prune_initializers, tensor_types, unique

DEFAULT_KEEP_FP32 = ("Softmax", "LogSoftmax", "Exp", "Log", "Pow", "Reciprocal", "ReduceSum", "ReduceSumSquare",
                     "ReduceL2", "ReduceLogSumExp", "ReduceProd", "LayerNormalization", "InstanceNormalization",
                     "GroupNormalization", "CumSum", "Range", "TopK", "NonMaxSuppression", "RoiAlign")
# inputs that must stay FP32 even in an FP16 node (by the operator's type constraints)
FP32_ONLY_INPUTS = {"Resize": {1, 2}, "Upsample": {1}}
FP16_MAX = 65504.0


@dataclass
class Fp16Result:
    converted_nodes: int
    kept: list[dict] = field(default_factory=list)  # {"node", "op", "reason"}
    casts_added: int = 0
    underflow_values: int = 0  # nonzero weights that round to 0 in FP16


def resolve_keep(model, keep: list[str] | tuple[str, ...] | None, default: bool = True) -> tuple[set, set]:
    """Split --keep-fp32 items into op types and node names; an item that matches nothing is an error."""
    ops = {n.op_type for n in model.graph.node}
    names = {n.name for n in model.graph.node if n.name}
    keep_ops, keep_names = set(DEFAULT_KEEP_FP32) if default else set(), set()
    for item in keep or ():
        if item in ops:
            keep_ops.add(item)
        elif item in names:
            keep_names.add(item)
        else:
            close = sorted(n for n in names | ops if item.lower() in n.lower())[:5]
            hint = f"did you mean {', '.join(close)}?" if close else \
                f"op types in this model: {', '.join(sorted(ops))}"
            raise UsageProblem(f"--keep-fp32 {item!r} is neither an op type nor a node name in this model", hint)
    return keep_ops, keep_names


def convert_fp16(model, keep_ops: set[str], keep_names: set[str]) -> Fp16Result:
    """Convert ``model`` in place; nodes whose op type is in ``keep_ops`` or whose name is in ``keep_names``
    compute in FP32.

    The steps: check that the graph can be converted, choose the nodes kept in FP32, convert the initializers,
    retype the nodes (Casts where FP16 and FP32 meet, and before the graph's outputs), then sort the graph."""
    onnx_module()
    from onnx import TensorProto, helper, numpy_helper

    F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
    g = model.graph
    types = tensor_types(model)
    inits = {i.name: i for i in g.initializer}
    nodes = list(g.node)
    _check_convertible(model, nodes, types, keep_ops)

    def is_float(name: str) -> bool:
        return bool(name) and types.get(name) == F32

    result = Fp16Result(converted_nodes=0)
    keep = _kept_nodes(nodes, inits, keep_ops, keep_names, result, numpy_helper, F32)
    taken = all_names(model)

    def wants_low(idx: int, slot: int) -> bool:
        n = nodes[idx]
        return idx not in keep and slot not in FP32_ONLY_INPUTS.get(n.op_type, ())

    low, fp16_copy = _convert_initializers(g, inits, nodes, is_float, wants_low, taken, result, numpy_helper, F32)
    out_nodes = _retyped_nodes(g, nodes, keep, low, fp16_copy, is_float, wants_low, taken, result, helper,
                               numpy_helper, F32, F16)
    del g.node[:]
    g.node.extend(_topological(out_nodes))
    del g.value_info[:]
    prune_initializers(model)
    return result


def _check_convertible(model, nodes: list, types: dict, keep_ops: set[str]) -> None:
    """FP16 Q/DQ needs opset 19, and every node's output needs a known type."""
    qdq = {"QuantizeLinear", "DequantizeLinear"}
    if any(n.op_type in qdq for n in nodes) and not qdq <= set(keep_ops) and opset_of(model) < 19:
        raise QuantizeError("FP16 Q/DQ needs opset 19 (FP16 scales)",
                            "internal: upgrade the opset first, or keep Q/DQ in FP32")
    for n in nodes:
        for o in n.output:
            if o and o not in types:
                raise QuantizeError(f"the type of tensor {o!r} (output of {node_label(n, 0)}) is unknown",
                                    "run onnx shape inference on the model, or re-export it")


def _kept_nodes(nodes: list, inits: dict, keep_ops: set[str], keep_names: set[str], result: Fp16Result,
                numpy_helper, F32) -> set[int]:
    """The indices of the nodes that compute in FP32: those on the keep-list, and those reading a weight FP16 cannot
    hold (kept rather than clipped); each is reported in ``result.kept`` with its reason."""
    keep: set[int] = set()
    for idx, n in enumerate(nodes):
        if n.op_type in keep_ops or (n.name and n.name in keep_names):
            keep.add(idx)
            result.kept.append({"node": node_label(n, idx), "op": n.op_type,
                                "reason": "keep-list" if n.op_type in keep_ops else "--keep-fp32 node"})
    # weights FP16 cannot hold: keep their readers in FP32 rather than clip
    for idx, n in enumerate(nodes):
        if idx in keep:
            continue
        for i in n.input:
            if i in inits and inits[i].data_type == F32:
                a = numpy_helper.to_array(inits[i])
                if a.size and np.max(np.abs(a)) > FP16_MAX:
                    keep.add(idx)
                    result.kept.append({"node": node_label(n, idx), "op": n.op_type,
                                        "reason": f"weight {i} exceeds FP16 range"})
                    break
    return keep


def _convert_initializers(g, inits: dict, nodes: list, is_float, wants_low, taken: set, result: Fp16Result,
                          numpy_helper, F32) -> tuple[dict[str, bool], dict[str, str]]:
    """The float initializers stored in FP16 when only FP16 inputs read them, kept FP32 with an FP16 copy when both
    kinds do. Returns ``low`` (whether each float tensor known so far is FP16 after the pass: the graph's inputs
    stay FP32) and the FP16 copies' names by original name."""
    # precision each float tensor has after the pass: graph inputs stay FP32, outputs of converted nodes go FP16
    low: dict[str, bool] = {}
    for vi in g.input:
        if is_float(vi.name) and vi.name not in inits:
            low[vi.name] = False
    readers: dict[str, list[tuple[int, int]]] = {}
    for idx, n in enumerate(nodes):
        for slot, i in enumerate(n.input):
            if is_float(i):
                readers.setdefault(i, []).append((idx, slot))

    new_inits, fp16_copy = [], {}
    for name, init in inits.items():
        if init.data_type != F32 or name not in readers:
            continue
        rs = readers[name]
        if all(wants_low(i, s) for i, s in rs):
            low[name] = True
            init.CopyFrom(_to_fp16_tensor(init, numpy_helper, result))
        elif any(wants_low(i, s) for i, s in rs):
            low[name] = False  # FP32 readers keep the original; FP16 readers get a converted copy
            copy = _to_fp16_tensor(init, numpy_helper, result)
            copy.name = unique(name + "_fp16", taken)
            fp16_copy[name] = copy.name
            new_inits.append(copy)
        else:
            low[name] = False
    g.initializer.extend(new_inits)
    return low, fp16_copy


def _retyped_nodes(g, nodes: list, keep: set[int], low: dict[str, bool], fp16_copy: dict[str, str], is_float,
                   wants_low, taken: set, result: Fp16Result, helper, numpy_helper, F32, F16) -> list:
    """The nodes in order, converted ones retyped, with a Cast wherever an input's precision is not the one its
    reader computes in, and a Cast back to FP32 before each float graph output a converted node makes."""
    cast_cache: dict[tuple[str, bool], str] = {}
    out_nodes = []
    graph_outputs = {o.name for o in g.output if is_float(o.name)}
    renamed_outputs: dict[str, str] = {}

    def cast(name: str, to_low: bool) -> str:
        key = (name, to_low)
        if key not in cast_cache:
            new = unique(f"{name}_{'fp16' if to_low else 'fp32'}", taken)
            out_nodes.append(helper.make_node("Cast", [name], [new], to=F16 if to_low else F32,
                                              name=unique(f"Cast_{new}", taken)))
            result.casts_added += 1
            cast_cache[key] = new
        return cast_cache[key]

    for idx, n in enumerate(nodes):
        for slot, i in enumerate(n.input):
            if not is_float(i):
                continue
            need_low = wants_low(idx, slot)
            i_now = renamed_outputs.get(i, i)
            if i in fp16_copy and need_low:
                n.input[slot] = fp16_copy[i]
            elif low.get(i) is None:
                raise QuantizeError(f"tensor {i!r} is read before it is produced", "the graph is not sorted")
            elif low[i] != need_low:
                n.input[slot] = cast(i_now, need_low)
            else:
                n.input[slot] = i_now
        converted = idx not in keep
        if converted:
            result.converted_nodes += 1
            _retype_attributes(n, helper, numpy_helper, F32, F16)
        for o_slot, o in enumerate(n.output):
            if not is_float(o):
                continue
            low[o] = converted
            if converted and o in graph_outputs:
                inner = unique(o + "_fp16", taken)
                n.output[o_slot] = inner
                renamed_outputs[o] = inner
        out_nodes.append(n)
        for o in list(graph_outputs):
            if o in renamed_outputs and (o, False) not in cast_cache:
                out_nodes.append(helper.make_node("Cast", [renamed_outputs[o]], [o], to=F32,
                                                  name=unique(f"Cast_{o}_out", taken)))
                cast_cache[(o, False)] = o
                result.casts_added += 1
                low[o] = True
    # the consumers of a renamed output read the FP16 inner tensor (fixed up in the loop above via renamed_outputs)
    return out_nodes


def _to_fp16_tensor(init, numpy_helper, result: Fp16Result):
    a = numpy_helper.to_array(init)
    h = np.clip(a, -FP16_MAX, FP16_MAX).astype(np.float16)
    result.underflow_values += int(np.count_nonzero((h == 0) & (a != 0)))
    return numpy_helper.from_array(h, init.name)


def _retype_attributes(node, helper, numpy_helper, F32, F16) -> None:
    for a in node.attribute:
        if node.op_type == "Cast" and a.name == "to" and a.i == F32:
            a.i = F16
        elif a.name == "dtype" and a.i == F32:
            a.i = F16
        elif node.op_type in ("ConstantOfShape", "Constant") and a.name == "value" and a.t.data_type == F32:
            v = numpy_helper.to_array(a.t).astype(np.float16)
            a.t.CopyFrom(numpy_helper.from_array(v, a.t.name))


def _topological(nodes: list) -> list:
    """Order nodes so each comes after the producers of its inputs (Casts were appended next to their use)."""
    produced_by = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            produced_by[o] = i
    order, state = [], {}

    def visit(i):
        stack = [(i, False)]
        while stack:
            j, done = stack.pop()
            if done:
                state[j] = 2
                order.append(nodes[j])
                continue
            if state.get(j):
                continue
            state[j] = 1
            stack.append((j, True))
            for inp in nodes[j].input:
                p = produced_by.get(inp)
                if p is not None and not state.get(p):
                    stack.append((p, False))

    for i in range(len(nodes)):
        if not state.get(i):
            visit(i)
    return order
