"""The integer arithmetic of trtc's INT8 models, in numpy: what an INT8 engine must compute, and what its GPU kernels
are checked against.

    outputs = Int8Reference("lite0.int8.onnx").run({"input": x})      # numpy in, numpy out

trtc's INT8 model (toolchain/precision/int8.py) puts a symmetric QuantizeLinear/DequantizeLinear pair on the input of
each Conv, Gemm and MatMul it quantizes, and reads that layer's weight through a DequantizeLinear of INT8 values with
one scale per output channel; between the pairs the graph runs in FP16 (the default form) or FP32. ONNX Runtime runs
such a graph as written: it dequantizes to floats (rounding ``q * s`` to FP16 in the FP16 form) and convolves in
floating point. An INT8 engine instead multiplies the integers and scales once:

    acc[n, c, ...] = sum over the window and input channels of  q_x * q_w[c]          (exact: int32 range)
    y              = acc * (s_x * s_w[c]) + bias[c]                                     (FP32, then the layer's type)

This class is that arithmetic. A layer counts as quantized when its activation comes from a DequantizeLinear of a
QuantizeLinear's output and its weight from a DequantizeLinear of an INT8 constant (each through Casts); every other
node runs in floating point as ONNX defines it, computed in FP32 and stored in the tensor's own type (FP16 tensors
round once per node, as a GPU kernel storing FP16 does). The integer sums run through float64 matrix products,
which are exact for them (|q_x q_w| <= 2^14, far below 2^53 for any window). ``quantized_layers`` names the layers
run in integers; ``run(..., keep=[...])`` also returns inner tensors by name, for layer-by-layer checks.

The ops of trtc's classifiers are covered (Conv, Gemm, MatMul, Add, Sub, Mul, Div, Relu, Clip, Sigmoid, MaxPool,
AveragePool, GlobalAveragePool, ReduceMean, Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Softmax,
Identity, Cast, QuantizeLinear, DequantizeLinear); another op is refused by name. numpy and onnx only: slow (a
reference for tests, not an engine), and it needs no GPU.
"""

from __future__ import annotations

import os

import numpy as np

from ._deps import require
from .errors import EngineError

_INT8_SAFE = np.float64  # the dtype the integer products run in (exact for int8 x int8 sums)


class Int8Reference:
    def __init__(self, path: str | os.PathLike):
        onnx = require("onnx", "Reading an INT8 model for its integer reference", extra="export")
        from onnx import helper, numpy_helper

        model = onnx.load(os.fspath(path))
        self.graph = model.graph
        self.consts = {t.name: numpy_helper.to_array(t) for t in self.graph.initializer}
        self.attrs = [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in self.graph.node]
        self.inputs = [i.name for i in self.graph.input if i.name not in self.consts]
        self.outputs = [o.name for o in self.graph.output]
        self._producer = {out: node for node in self.graph.node for out in node.output}
        self.quantized_layers = [n.name or n.output[0] for n in self.graph.node if self._quantized(n) is not None]
        missing = sorted({n.op_type for n in self.graph.node} - set(_OPS) - {"Conv", "Gemm", "MatMul"})
        if missing:
            raise EngineError(f"the INT8 reference has no {', '.join(missing)} (ops of {os.fspath(path)})",
                              "run the model with ONNX Runtime instead")

    def run(self, feeds: dict, keep: list[str] | tuple = ()) -> list[np.ndarray]:
        """The graph's outputs for ``feeds`` (name -> numpy array), then the tensors named in ``keep``."""
        env = dict(self.consts)
        env.update({k: np.asarray(v) for k, v in feeds.items()})
        for node, attrs in zip(self.graph.node, self.attrs):
            quantized = self._quantized(node) if node.op_type in ("Conv", "Gemm", "MatMul") else None
            if quantized is not None:
                out = _integer_layer(node, attrs, env, *quantized)
            elif node.op_type in ("Conv", "Gemm", "MatMul"):
                out = _float_layer(node, attrs, env)
            else:
                out = _OPS[node.op_type](node, attrs, env)
            env[node.output[0]] = out
        return [env[name] for name in [*self.outputs, *keep]]

    def _quantized(self, node):
        """(activation's QuantizeLinear output, its DequantizeLinear, the weight's DequantizeLinear) when ``node``
        reads both through DequantizeLinear as trtc's INT8 form places them; else None."""
        if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.input) < 2:
            return None
        x_dq, w_dq = self._through_casts(node.input[0]), self._through_casts(node.input[1])
        if x_dq is None or w_dq is None or x_dq.op_type != "DequantizeLinear" or w_dq.op_type != "DequantizeLinear":
            return None
        q = self._producer.get(x_dq.input[0])
        if q is None or q.op_type != "QuantizeLinear" or w_dq.input[0] not in self.consts:
            return None
        if self.consts[w_dq.input[0]].dtype != np.int8:
            return None
        return x_dq, w_dq

    def _through_casts(self, name: str):
        node = self._producer.get(name)
        while node is not None and node.op_type == "Cast":
            node = self._producer.get(node.input[0])
        return node


# the quantized layers ---------------------------------------------------------------------------------------------
def _qparams(dq, env) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(integer values, scale, zero point) that a DequantizeLinear reads."""
    q = env[dq.input[0]].astype(np.int32)
    scale = env[dq.input[1]].astype(np.float32)
    zp = env[dq.input[2]].astype(np.int32) if len(dq.input) > 2 and dq.input[2] else np.zeros_like(scale, np.int32)
    return q, scale, zp


def _integer_layer(node, attrs, env, x_dq, w_dq):
    """Conv / Gemm / MatMul on integers, then one scale per output channel and the bias, in the output's type."""
    qx, sx, zx = _qparams(x_dq, env)
    qw, sw, zw = _qparams(w_dq, env)
    if np.any(zx) or np.any(zw):
        raise EngineError(f"{node.name}: trtc's INT8 form is symmetric (zero point 0); this one is not",
                          "quantize with trtc quantize --precision int8")
    out_type = _float_type(env, node.input[0])
    x, w = qx.astype(_INT8_SAFE), qw.astype(_INT8_SAFE)
    if node.op_type == "Conv":
        acc = _conv(x, w, attrs)
        scale = (sx * sw).reshape(1, -1, *([1] * (acc.ndim - 2))) if sw.ndim else sx * sw
    else:  # Gemm / MatMul: the scale per output column (the weight's axis is its output)
        if node.op_type == "Gemm" and attrs.get("transB", 0):
            w = w.T
        if node.op_type == "Gemm" and attrs.get("transA", 0):
            x = x.T
        acc = x @ w
        scale = sx * sw
        alpha = attrs.get("alpha", 1.0) if node.op_type == "Gemm" else 1.0
        scale = scale * alpha
    y = (acc.astype(np.float32) * np.float32(1.0)) * np.asarray(scale, np.float32)
    bias = _bias(node, attrs, env, y.ndim)
    if bias is not None:
        y = y + bias
    return y.astype(out_type)


def _bias(node, attrs, env, ndim):
    if len(node.input) < 3 or not node.input[2]:
        return None
    b = env[node.input[2]].astype(np.float32)
    if node.op_type == "Conv":
        return b.reshape(1, -1, *([1] * (ndim - 2)))
    return b * np.float32(attrs.get("beta", 1.0))


def _float_type(env, name):
    return env[name].dtype if env[name].dtype in (np.float16, np.float32, np.float64) else np.float32


def _float_layer(node, attrs, env):
    x = env[node.input[0]].astype(np.float32)
    w = env[node.input[1]].astype(np.float32)
    out_type = env[node.input[0]].dtype
    if node.op_type == "Conv":
        y = _conv(x.astype(np.float64), w.astype(np.float64), attrs).astype(np.float32)
    else:
        if node.op_type == "Gemm" and attrs.get("transA", 0):
            x = x.T
        if node.op_type == "Gemm" and attrs.get("transB", 0):
            w = w.T
        y = (x @ w) * np.float32(attrs.get("alpha", 1.0) if node.op_type == "Gemm" else 1.0)
    bias = _bias(node, attrs, env, y.ndim)
    return (y if bias is None else y + bias).astype(out_type)


def _pads(attrs, spatial, kernel, strides, dilations) -> list[tuple[int, int]]:
    """(before, after) per spatial axis, from pads or auto_pad (SAME_UPPER/SAME_LOWER/VALID)."""
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return out
    pads = attrs.get("pads", [0] * (2 * len(spatial)))
    n = len(spatial)
    return [(pads[i], pads[i + n]) for i in range(n)]


def _conv(x, w, attrs):
    """N-D convolution (2-D here) as windows times weights, grouped; x and w already in the type to sum in."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    strides = attrs.get("strides", [1, 1])
    dil = attrs.get("dilations", [1, 1])
    group = attrs.get("group", 1)
    (pt, pb), (pl, pr) = _pads(attrs, (h, wd), (kh, kw), strides, dil)
    x = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (x.shape[2] - (kh - 1) * dil[0] - 1) // strides[0] + 1
    ow = (x.shape[3] - (kw - 1) * dil[1] - 1) // strides[1] + 1
    sn, sc, sh, sw = x.strides
    windows = np.lib.stride_tricks.as_strided(
        x, (n, c, oh, ow, kh, kw), (sn, sc, sh * strides[0], sw * strides[1], sh * dil[0], sw * dil[1]),
        writeable=False)
    if group == c == m and cg == 1:  # depthwise: one multiply-add per channel, in one call
        return np.einsum("nchwij,cij->nchw", windows, w[:, 0], optimize=True)
    out = np.empty((n, m, oh, ow), x.dtype)
    per = m // group
    for g in range(group):
        cols = windows[:, g * cg:(g + 1) * cg]  # n, cg, oh, ow, kh, kw
        out[:, g * per:(g + 1) * per] = np.einsum("nchwij,mcij->nmhw", cols, w[g * per:(g + 1) * per],
                                                  optimize=True)
    return out


# the other ops, in floating point (computed in FP32, stored in the tensor's type) ---------------------------------
def _in(env, node, i=0):
    return env[node.input[i]]


def _same(fn):
    def op(node, attrs, env):
        a = _in(env, node)
        return np.asarray(fn(node, attrs, env, a.astype(np.float32))).astype(a.dtype)
    return op


def _binary(fn):
    def op(node, attrs, env):
        a, b = _in(env, node), _in(env, node, 1)
        return fn(a.astype(np.float32), b.astype(np.float32)).astype(np.result_type(a.dtype, b.dtype))
    return op


def _clip(node, attrs, env, x):
    lo = attrs.get("min", None) if len(node.input) < 2 or not node.input[1] else float(env[node.input[1]])
    hi = attrs.get("max", None) if len(node.input) < 3 or not node.input[2] else float(env[node.input[2]])
    return np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi)


def _axes(node, attrs, env):
    if "axes" in attrs:
        return tuple(attrs["axes"])
    return tuple(int(a) for a in env[node.input[1]]) if len(node.input) > 1 and node.input[1] else None


def _pool(kind):
    def op(node, attrs, env):
        x = _in(env, node)
        kernel, strides = attrs["kernel_shape"], attrs.get("strides", [1] * len(attrs["kernel_shape"]))
        (pt, pb), (pl, pr) = _pads(attrs, x.shape[2:], kernel, strides, [1, 1])
        fill = -np.inf if kind == "max" else 0.0
        xp = np.pad(x.astype(np.float32), ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
        oh = (xp.shape[2] - kernel[0]) // strides[0] + 1
        ow = (xp.shape[3] - kernel[1]) // strides[1] + 1
        sn, sc, sh, sw = xp.strides
        win = np.lib.stride_tricks.as_strided(xp, (x.shape[0], x.shape[1], oh, ow, *kernel),
                                              (sn, sc, sh * strides[0], sw * strides[1], sh, sw))
        out = win.max(axis=(4, 5)) if kind == "max" else win.mean(axis=(4, 5))
        return out.astype(x.dtype)
    return op


def _quantize(node, attrs, env):
    x, scale = _in(env, node).astype(np.float32), env[node.input[1]].astype(np.float32)
    zp = env[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
    info = np.iinfo(zp.dtype)
    shape = _per_axis(scale, x.ndim, attrs.get("axis", 1))
    q = np.rint(x / scale.reshape(shape)) + zp.astype(np.int32).reshape(shape)  # rint: half to even, as ONNX
    return np.clip(q, info.min, info.max).astype(zp.dtype)


def _dequantize(node, attrs, env):
    q, scale = _in(env, node), env[node.input[1]].astype(np.float32)
    zp = env[node.input[2]].astype(np.int32) if len(node.input) > 2 and node.input[2] else np.zeros((), np.int32)
    shape = _per_axis(scale, q.ndim, attrs.get("axis", 1))
    return ((q.astype(np.int32) - zp.reshape(shape)) * scale.reshape(shape)).astype(np.float32)


def _per_axis(scale, ndim, axis):
    if scale.ndim == 0 or scale.size == 1:
        return ()
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return shape


_CAST = {1: np.float32, 10: np.float16, 11: np.float64, 3: np.int8, 2: np.uint8, 6: np.int32, 7: np.int64, 9: np.bool_}


def _reshape(node, attrs, env):
    x, shape = _in(env, node), [int(d) for d in env[node.input[1]]]
    shape = [x.shape[i] if d == 0 and not attrs.get("allowzero", 0) else d for i, d in enumerate(shape)]
    return x.reshape(shape)


def _softmax(node, attrs, env, x):
    axis = attrs.get("axis", -1)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


_OPS = {
    "Identity": lambda node, attrs, env: _in(env, node),
    "Cast": lambda node, attrs, env: _in(env, node).astype(_CAST[attrs["to"]]),
    "QuantizeLinear": _quantize,
    "DequantizeLinear": _dequantize,
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Div": _binary(np.divide),
    "Relu": _same(lambda n, a, e, x: np.maximum(x, 0)),
    "Sigmoid": _same(lambda n, a, e, x: 1 / (1 + np.exp(-x))),
    "Clip": _same(_clip),
    "Softmax": _same(_softmax),
    "MaxPool": _pool("max"), "AveragePool": _pool("mean"),
    "GlobalAveragePool": _same(lambda n, a, e, x: x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)),
    "ReduceMean": _same(lambda n, a, e, x: x.mean(axis=_axes(n, a, e), keepdims=bool(a.get("keepdims", 1)))),
    "Reshape": _reshape,
    "Flatten": lambda node, attrs, env: _in(env, node).reshape(
        int(np.prod(_in(env, node).shape[:attrs.get("axis", 1)])), -1),
    "Squeeze": lambda node, attrs, env: np.squeeze(_in(env, node), _axes(node, attrs, env)),
    "Unsqueeze": lambda node, attrs, env: np.expand_dims(_in(env, node), _axes(node, attrs, env)),
    "Transpose": lambda node, attrs, env: np.transpose(_in(env, node), attrs.get("perm")),
    "Concat": lambda node, attrs, env: np.concatenate([env[i] for i in node.input], axis=attrs["axis"]),
}
