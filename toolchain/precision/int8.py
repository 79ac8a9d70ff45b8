"""Explicit INT8 quantization: QuantizeLinear/DequantizeLinear pairs where TensorRT fuses them.

What TensorRT 10/11 and TensorRT-RTX accept and fuse (their explicit-quantization guide): symmetric INT8 with zero
point 0; weights per output channel, stored as INT8 initializers followed by a DequantizeLinear (TensorRT folds
it into the kernel); activations per tensor, a Q/DQ pair on the *input* of each Conv, ConvTranspose, Gemm and
MatMul. The layer before a quantized input then writes INT8 directly (TensorRT moves the Quantize into its
epilogue), so nothing else needs Q/DQ, and nothing else gets it: Q/DQ on every tensor forces extra reformatting
and is a known reason INT8 engines end up slower than FP16 ones.

Weights: |w| <= 127 * scale per channel (scale = max|w| / 127). Activations: x clipped to the calibrated range,
scale = range / 127, zero point 0 (Q saturates to [-128, 127]).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .fp16 import _topological
from .graph import all_names, graph_inputs, node_label, onnx_module, unique

QUANTIZABLE = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass
class Layer:
    """One quantizable node: the activations to quantize and, where constant, its weight."""

    name: str
    op: str
    index: int  # node index in the prepared model
    activations: list[str]
    weight: str | None = None
    axis: int | None = None  # per-channel axis of the weight (None: per tensor)
    first: bool = False  # reads a graph input
    last: bool = False  # writes a graph output (the classifier head)

    def to_dict(self) -> dict:
        return asdict(self)


def find_layers(model) -> list[Layer]:
    onnx = onnx_module()
    g = model.graph
    consts = {i.name for i in g.initializer}
    shapes = {i.name: list(i.dims) for i in g.initializer}
    feeds = {i.name for i in graph_inputs(model)}
    outputs = {o.name for o in g.output}
    # what each tensor eventually feeds, through shape-only/elementwise tail ops, to find the head layer
    readers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    tail_ops = {"Add", "Reshape", "Flatten", "Identity", "Squeeze", "Softmax", "LogSoftmax", "Mul", "Cast"}

    def reaches_output(t: str, depth: int = 0) -> bool:
        if t in outputs:
            return True
        if depth > 4:
            return False
        return any(r.op_type in tail_ops and any(reaches_output(o, depth + 1) for o in r.output)
                   for r in readers.get(t, []))

    layers = []
    for idx, n in enumerate(g.node):
        if n.op_type not in QUANTIZABLE or len(n.input) < 2:
            continue
        attr = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        a_in, b_in = n.input[0], n.input[1]
        acts = [a_in] if a_in not in consts else []
        weight, axis = None, None
        if b_in in consts:
            weight = b_in
            rank = len(shapes[b_in])
            if n.op_type == "Conv":
                axis = 0
            elif n.op_type == "ConvTranspose":
                axis = 1 if attr.get("group", 1) == 1 else None
            elif n.op_type == "Gemm":
                axis = 0 if attr.get("transB", 0) else 1
            elif n.op_type == "MatMul":
                axis = rank - 1 if rank >= 2 else None
        else:
            acts.append(b_in)
        if not acts and weight is None:
            continue
        layers.append(Layer(name=node_label(n, idx), op=n.op_type, index=idx, activations=acts, weight=weight,
                            axis=axis, first=any(a in feeds for a in acts),
                            last=any(reaches_output(o) for o in n.output)))
    return layers


def activation_tensors(layers: list[Layer]) -> list[str]:
    seen, out = set(), []
    for layer in layers:
        for t in layer.activations:
            if t not in seen:
                seen.add(t)
                out.append(t)
    return out


FP16_MIN_NORMAL = 2.0 ** -14


def fp16_scale(scale):
    """The smallest normal FP16 value >= ``scale`` (as float32), so a scale stored in FP16 is exact, positive and
    not subnormal: TensorRT rejects zero scales ("Scale coefficients must all be positive"), and subnormal FP16 may
    be flushed to zero by GPU kernels. Rounding *up* means no weight needs clipping."""
    s = np.maximum(np.asarray(scale, np.float32), np.float32(FP16_MIN_NORMAL))
    h = s.astype(np.float16)
    lower = h.astype(np.float32) < s
    h = np.where(lower, np.nextafter(h, np.float16(np.inf)), h)
    return h.astype(np.float32)


def quantize_weight(w: np.ndarray, axis: int | None, fp16_scales: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric INT8: (int8 weights, float32 scales per channel or a scalar). With ``fp16_scales`` the scales are
    values FP16 holds exactly (see :func:`fp16_scale`) and the weights are rounded on that grid."""
    w = np.asarray(w, np.float32)
    if axis is None:
        amax = np.float32(np.max(np.abs(w))) if w.size else np.float32(0)
        scale = np.float32(amax / 127.0) if amax > 0 else np.float32(1.0)
        if fp16_scales:
            scale = fp16_scale(scale)
        q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        return q, np.asarray(scale, np.float32)
    other = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w), axis=other) if w.size else np.zeros(w.shape[axis], np.float32)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    if fp16_scales:
        scale = fp16_scale(scale)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


def activation_scale(amax: float, fp16_scales: bool = False) -> float:
    scale = float(amax) / 127.0 if amax > 0 else 1.0
    return float(fp16_scale(scale)) if fp16_scales else scale


@dataclass
class QdqResult:
    quantized: list[str] = field(default_factory=list)  # layer names with Q/DQ
    excluded: list[str] = field(default_factory=list)  # layer names left in higher precision
    weights: int = 0
    activations: int = 0
    bias_corrected: int = 0


def bias_shift(node, op: str, dw: np.ndarray, mean: np.ndarray, onnx) -> np.ndarray | None:
    """Expected change of each output channel caused by the weight error ``dw`` for inputs of per-channel
    ``mean``: what bias correction subtracts (Nagel et al., "Data-Free Quantization", 2019). None where the
    layout is not handled (the layer is then left uncorrected)."""
    attr = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    mean = np.asarray(mean, np.float64)
    if op == "Conv" and dw.ndim >= 3:
        groups = attr.get("group", 1)
        per_in = dw.reshape(dw.shape[0], dw.shape[1], -1).sum(axis=2)  # (O, I/g)
        if per_in.shape[1] * groups != mean.shape[0]:
            return None
        g_of = np.arange(dw.shape[0]) // (dw.shape[0] // groups)
        return np.einsum("oi,oi->o", per_in, mean.reshape(groups, -1)[g_of])
    if op == "Gemm" and not attr.get("transA", 0) and dw.ndim == 2:
        w = dw if attr.get("transB", 0) else dw.T  # (N, K)
        return w @ mean if w.shape[1] == mean.shape[0] else None
    return None


def insert_qdq(model, layers: list[Layer], ranges: dict[str, float], exclude: set[str],
               fp16_scales: bool = False, means: dict | None = None) -> QdqResult:
    """Add Q/DQ to ``model`` (in place) for every layer not in ``exclude``. ``fp16_scales``: the scales will be
    stored in FP16 (the rest of the graph goes FP16), so choose them on FP16's grid. ``means`` (per-channel means
    of the layer inputs from calibration) turns on bias correction of Conv and Gemm layers."""
    from .graph import prune_initializers

    g = model.graph
    qdq = _QdqWriter(model, ranges, fp16_scales)
    by_index = {layer.index: layer for layer in layers}
    for idx, n in enumerate(list(g.node)):
        layer = by_index.get(idx)
        if layer is not None:
            if layer.name in exclude:
                qdq.result.excluded.append(layer.name)
            else:
                qdq.quantize_node(n, layer, means)
        qdq.new_nodes.append(n)
    g.initializer.extend(qdq.new_inits)
    del g.node[:]
    g.node.extend(_topological(qdq.new_nodes))
    prune_initializers(model)
    return qdq.result


class _QdqWriter:
    """The Q/DQ nodes and initializers :func:`insert_qdq` adds, each activation and weight quantized once however
    many layers read it; ``new_nodes`` keeps them in the order they are made, each before the node that reads it."""

    def __init__(self, model, ranges: dict[str, float], fp16_scales: bool):
        self.onnx = onnx_module()  # the missing-package message before onnx's own import error
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.ranges, self.fp16_scales = ranges, fp16_scales
        self.taken = all_names(model)
        self.inits = {i.name: i for i in model.graph.initializer}
        self.result = QdqResult()
        self.new_nodes: list = []
        self.new_inits: list = []
        self.weight_error: dict[tuple[str, int | None], np.ndarray] = {}
        self.act_dq: dict[str, str] = {}
        self.w_dq: dict[tuple[str, int | None], str] = {}

    def quantize_node(self, n, layer: Layer, means: dict | None) -> None:
        """Point ``n``'s activation and weight inputs at their DequantizeLinear outputs; correct its bias."""
        for slot, t in enumerate(n.input):
            if t in layer.activations:
                n.input[slot] = self.q_pair(t)
            elif t == layer.weight and slot == 1:
                n.input[slot] = self.w_pair(t, layer.axis)
        if means is not None and layer.weight and layer.activations and layer.activations[0] in means:
            if _correct_bias(n, layer, self.weight_error[(layer.weight, layer.axis)], means[layer.activations[0]],
                             self.inits, self.new_inits, self.taken, self.onnx, self.numpy_helper):
                self.result.bias_corrected += 1
        self.result.quantized.append(layer.name)

    def q_pair(self, t: str) -> str:
        if t not in self.act_dq:
            helper, numpy_helper, taken = self.helper, self.numpy_helper, self.taken
            scale = unique(f"{t}_scale", taken)
            zp = unique(f"{t}_zp", taken)
            self.new_inits.append(numpy_helper.from_array(
                np.asarray(activation_scale(self.ranges[t], self.fp16_scales), np.float32), scale))
            self.new_inits.append(numpy_helper.from_array(np.asarray(0, np.int8), zp))
            q_out, dq_out = unique(f"{t}_q", taken), unique(f"{t}_dq", taken)
            self.new_nodes.append(helper.make_node("QuantizeLinear", [t, scale, zp], [q_out],
                                                   name=unique(f"QuantizeLinear_{t}", taken)))
            self.new_nodes.append(helper.make_node("DequantizeLinear", [q_out, scale, zp], [dq_out],
                                                   name=unique(f"DequantizeLinear_{t}", taken)))
            self.act_dq[t] = dq_out
            self.result.activations += 1
        return self.act_dq[t]

    def w_pair(self, w: str, axis: int | None) -> str:
        key = (w, axis)
        if key not in self.w_dq:
            helper, numpy_helper, taken = self.helper, self.numpy_helper, self.taken
            w_float = numpy_helper.to_array(self.inits[w])
            q, scale = quantize_weight(w_float, axis, self.fp16_scales)
            shape = [1] * q.ndim
            if axis is not None and scale.ndim == 1:
                shape[axis] = -1
            self.weight_error[key] = q.astype(np.float32) * scale.reshape(shape) - w_float
            qn, sn, zn = unique(f"{w}_int8", taken), unique(f"{w}_wscale", taken), unique(f"{w}_wzp", taken)
            self.new_inits.append(numpy_helper.from_array(q, qn))
            self.new_inits.append(numpy_helper.from_array(scale, sn))
            self.new_inits.append(numpy_helper.from_array(np.zeros(scale.shape, np.int8), zn))
            out = unique(f"{w}_dq", taken)
            kwargs = {"axis": axis} if axis is not None and scale.ndim == 1 else {}
            self.new_nodes.append(helper.make_node("DequantizeLinear", [qn, sn, zn], [out],
                                                   name=unique(f"DequantizeLinear_{w}", taken), **kwargs))
            self.w_dq[key] = out
            self.result.weights += 1
        return self.w_dq[key]


def _correct_bias(node, layer: Layer, dw, mean, inits, new_inits, taken, onnx, numpy_helper) -> bool:
    shift = bias_shift(node, layer.op, dw, mean, onnx)
    if shift is None:
        return False
    out_channels = shift.shape[0]
    if len(node.input) > 2 and node.input[2]:
        bias_name = node.input[2]
        if bias_name not in inits:
            return False
        bias = numpy_helper.to_array(inits[bias_name]).astype(np.float64)
        if bias.shape != (out_channels,):
            return False
    else:
        bias = np.zeros(out_channels, np.float64)
    name = unique(f"{layer.name}_bias_corrected", taken)
    new_inits.append(numpy_helper.from_array((bias - shift).astype(np.float32), name))
    while len(node.input) < 3:
        node.input.append("")
    node.input[2] = name
    return True
