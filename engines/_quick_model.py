"""The quick session's copy of a model: depthwise convolutions written as shifted multiply-adds.

With cuDNN's default algorithms (the quick session, engines._ort_quick) ONNX Runtime runs depthwise convolutions on
cuDNN's generic fallback kernels, slowly (docs/BENCHMARKS.md). A depthwise convolution is one multiply-add per tap:

    y = bias + sum over taps (i, j) of  w[:, 0, i, j] * x_padded[:, :, i*dh :: sh, j*dw :: sw]   (cropped to y)

computed in FP32 whatever the model's type (as cuDNN computes FP16 convolutions), cast back at the end, with ONNX
Runtime's element-wise kernels, which need no cuDNN set-up. Only the quick session runs the copy.
``depthwise_as_taps(path)`` gives the copy's bytes, or None when there is nothing to rewrite or the model is out of
reach (no ``onnx`` package, external data, opset below 11, a quantized graph). Convolutions it cannot rewrite exactly
(weights that are not constants, ``auto_pad``, anything but 2-D) are left as they are.
"""

from __future__ import annotations

import logging
import os

from ._deps import is_installed

log = logging.getLogger("trtc")

INT64_MAX = 2**63 - 1
MIN_OPSET = 11  # Pad with its pads as an input


def _varint(buf, pos: int) -> tuple:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf, pos: int, end: int):
    """(field number, wire type, value or start, end) of each protobuf field in ``buf[pos:end]``; length-delimited
    fields are given as their span, not read (an initializer's bytes are skipped, not copied)."""
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield field, wire, value, None
        elif wire == 2:
            n, pos = _varint(buf, pos)
            yield field, wire, pos, pos + n
            pos += n
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire}")


QUANT_OPS = (b"QuantizeLinear", b"DequantizeLinear", b"QLinearConv", b"QLinearMatMul", b"ConvInteger",
             b"MatMulInteger", b"DynamicQuantizeLinear")


def node_kinds(path: str | os.PathLike) -> tuple | None:
    """(whether a Conv has ``group`` above 1, whether any node quantizes: Q/DQ or integer kernels) of the ONNX
    file, read from the protobuf's wire format without ``onnx`` and without reading the weights (ModelProto.graph
    = 7; GraphProto.node = 1; NodeProto.op_type = 4, .attribute = 5; AttributeProto.name = 1, .i = 3); None when
    the file cannot be read this way."""
    import mmap

    grouped = quant = False
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            for field, wire, start, end in _fields(m, 0, len(m)):
                if field == 7 and wire == 2:
                    for f2, w2, s2, e2 in _fields(m, start, end):
                        if f2 == 1 and w2 == 2:
                            op, group = _node_op(m, s2, e2)
                            grouped |= op == b"Conv" and group > 1
                            quant |= op in QUANT_OPS
    except (OSError, ValueError, IndexError):
        return None
    return grouped, quant


def has_grouped_conv(path: str | os.PathLike) -> bool:
    """Whether the ONNX file has a Conv whose ``group`` is above 1 (:func:`node_kinds`); True when the file cannot
    be read that way (the caller then parses it properly)."""
    kinds = node_kinds(path)
    return True if kinds is None else kinds[0]


def is_float_graph(path: str | os.PathLike) -> bool:
    """Whether the model computes in floating point only (no Q/DQ pair, no integer kernel), as the graph rewrites
    that speed a float model up assume (this module's copy; ONNX Runtime's NHWC layout and conv-bias fusion, see
    engines.onnxruntime_engine.tuned_cuda_options). False when the file cannot be scanned: no rewrite on a guess."""
    kinds = node_kinds(path)
    return kinds is not None and not kinds[1]


def _node_op(m, start: int, end: int) -> tuple:
    """(op_type bytes, group attribute) of one NodeProto."""
    op, group = None, 1
    for field, wire, s, e in _fields(m, start, end):
        if field == 4 and wire == 2:
            op = m[s:e]
        elif field == 5 and wire == 2:
            name, i = None, None
            for f2, w2, s2, e2 in _fields(m, s, e):
                if f2 == 1 and w2 == 2:
                    name = m[s2:e2]
                elif f2 == 3 and w2 == 0:
                    i = s2
            if name == b"group" and i is not None:
                group = i
    return op, group


def depthwise_as_taps(path: str | os.PathLike) -> bytes | None:
    """The rewritten model's bytes (see the module), or None: no depthwise convolution to rewrite, or the model
    cannot be rewritten here (said at debug level). A model without grouped convolutions costs a scan of its
    nodes (no ``onnx`` import, no weights read: it runs beside CUDA's start and must not slow it). A quantized
    model (Q/DQ) is never rewritten: the copy is made for float graphs, and a Q/DQ model's convolutions are the
    quantizer's to place."""
    kinds = node_kinds(path)
    if kinds is not None and (not kinds[0] or kinds[1]):
        return None
    if not is_installed("onnx"):
        log.debug("%s: onnx is not installed; the quick session runs the model as it is", path)
        return None
    import onnx

    model = onnx.load(os.fspath(path), load_external_data=False)
    if any(n.op_type.encode() in QUANT_OPS for n in model.graph.node):
        return None
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        log.debug("%s: weights in external data; the quick session runs the model as it is", path)
        return None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        log.debug("%s: opset %d below %d; the quick session runs the model as it is", path, opset, MIN_OPSET)
        return None
    if rewrite_depthwise(model) == 0:
        return None
    return model.SerializeToString()


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _depthwise(node, inits: dict):
    """(weights array, bias array or None, attributes) when ``node`` is a 2-D depthwise Conv with constant weights
    (and bias) that this rewrite reproduces exactly, else None. Only such a node's own weights are decoded."""
    from onnx import numpy_helper

    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    a = _attrs(node)
    w, group = inits.get(node.input[1]), a.get("group", 1)
    if w is None or len(w.dims) != 4 or w.dims[1] != 1 or group != w.dims[0] or group == 1:
        return None
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if (bias is not None and bias not in inits) or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"", ""):
        return None
    w = numpy_helper.to_array(w)
    if w.dtype.name not in ("float16", "float32"):
        return None
    return w, (numpy_helper.to_array(inits[bias]) if bias is not None else None), a


def rewrite_depthwise(model) -> int:
    """Rewrite ``model`` (an onnx ModelProto, in place) as the module says; returns how many convolutions."""
    from onnx import AttributeProto

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    used: dict = {}
    for n in graph.node:
        for name in n.input:
            used[name] = used.get(name, 0) + 1
    new_nodes, new_inits, rewritten = [], [], 0
    for node in graph.node:
        found = _depthwise(node, inits)
        if found is None:
            new_nodes.append(node)
            continue
        for name in node.input[1:]:
            used[name] -= 1
        _as_taps(node, *found, f"trtc_taps{rewritten}_", new_nodes, new_inits)
        rewritten += 1
    if not rewritten:
        return 0
    # weights no node uses any more go, unless the graph names them (an input or output) or a subgraph may use them
    named = {v.name for v in [*graph.input, *graph.output]}
    subgraphs = any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for n in graph.node for a in n.attribute)
    keep = [t for t in graph.initializer if subgraphs or used.get(t.name, 0) > 0 or t.name in named]
    del graph.node[:]
    graph.node.extend(new_nodes)
    del graph.initializer[:]
    graph.initializer.extend([*keep, *new_inits])
    return rewritten


def _as_taps(node, w, b, a: dict, p: str, nodes: list, inits: list) -> None:
    """Append the nodes and initializers (names prefixed ``p``) computing depthwise ``node`` tap by tap."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def const(values, name, dtype=np.int64):
        inits.append(numpy_helper.from_array(np.asarray(values, dtype), name))
        return name

    kh, kw = w.shape[2], w.shape[3]
    sh, sw = a.get("strides", [1, 1])
    dh, dw = a.get("dilations", [1, 1])
    pt, pl, pb, pr = a.get("pads", [0, 0, 0, 0])
    half, x = w.dtype == np.float16, node.input[0]
    if any((pt, pl, pb, pr)):
        nodes.append(helper.make_node("Pad", [x, const([0, 0, pt, pl, 0, 0, pb, pr], p + "pads")], [p + "padded"],
                                      name=p + "pad"))
        x = p + "padded"
    if half:
        nodes.append(helper.make_node("Cast", [x], [p + "f32"], name=p + "cast_in", to=TensorProto.FLOAT))
        x = p + "f32"
    axes, steps, acc = const([2, 3], p + "axes"), const([sh, sw], p + "steps"), None
    for i in range(kh):
        for j in range(kw):  # a running sum, not one Sum of every tap (k*k products in memory at once)
            t = f"{p}{i}_{j}"
            # from tap (i, j) to where the last tap's window ends: exactly the output's size, whatever the input's
            ends = [-(dh * (kh - 1 - i)) or INT64_MAX, -(dw * (kw - 1 - j)) or INT64_MAX]
            nodes.append(helper.make_node("Slice", [x, const([i * dh, j * dw], t + "_starts"), const(ends, t + "_ends"),
                                                    axes, steps], [t + "_x"], name=t + "_slice"))
            tap = const(w[:, 0, i, j].reshape(1, -1, 1, 1), t + "_w", np.float32)
            nodes.append(helper.make_node("Mul", [t + "_x", tap], [t + "_m"], name=t + "_mul"))
            if acc is not None:
                nodes.append(helper.make_node("Add", [acc, t + "_m"], [t + "_acc"], name=t + "_add"))
            acc = nodes[-1].output[0]
    if b is not None:
        bias = const(b.reshape(1, -1, 1, 1), p + "bias", np.float32)
        nodes.append(helper.make_node("Add", [acc, bias], [p + "biased"], name=p + "bias_add"))
        acc = p + "biased"
    if half:
        nodes.append(helper.make_node("Cast", [acc], [node.output[0]], name=p + "cast_out", to=TensorProto.FLOAT16))
    else:  # the last node (which made acc) writes the convolution's output
        nodes[-1].output[0] = node.output[0]


class QuickModel:
    """``depthwise_as_taps(path)`` on a thread started at construction (it overlaps CUDA's start); ``source()``
    waits for it and gives the bytes, or ``path`` when there was nothing to rewrite or the rewrite failed."""

    def __init__(self, path: str | os.PathLike):
        import threading

        self.path, self.rewritten = path, None
        self._thread = threading.Thread(target=self._go, name="trtc-quick-model", daemon=True)
        self._thread.start()

    def _go(self) -> None:
        try:
            self.rewritten = depthwise_as_taps(self.path)
        except Exception as exc:  # noqa: BLE001 - the quick session then runs the model as it is
            log.debug("%s: rewriting the quick session's model failed: %s", self.path, exc)

    def source(self):
        self._thread.join()
        return os.fspath(self.path) if self.rewritten is None else self.rewritten


__all__ = ["QuickModel", "depthwise_as_taps", "is_float_graph", "node_kinds", "rewrite_depthwise"]
