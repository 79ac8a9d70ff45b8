"""The quick session's copy of a model: each depthwise convolution as shifted multiply-adds. With cuDNN's default
algorithms ONNX Runtime runs depthwise convolutions on cuDNN's slow fallback kernels; the copy computes each as one
multiply-add per tap on element-wise kernels, in FP32 whatever the model's type (as cuDNN computes FP16 convolutions),
cast back at the end:
    y = bias + sum over taps (i, j) of  w[:, 0, i, j] * x_padded[:, :, i*dh :: sh, j*dw :: sw]   (cropped to y)
The copy is kept as ONNX Runtime optimized it (quick_session): a later start neither rewrites nor optimizes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading

from ._io import sha256_verified, user_cache_dir
from .manifest import QUANT_MARKS

log = logging.getLogger("trtc")
INT64_MAX = 2**63 - 1
MIN_OPSET = 11  # Pad with its pads as an input


# the rewrite's version, part of every cache key: a changed rewrite never meets a copy the old one made
REWRITE_VERSION = 2
# the cache folder's bounds: entries past these go, least recently used first (a model's copy is about its size)
CACHE_ENTRIES, CACHE_BYTES = 64, 2 << 30
STALE_TMP_S = 24 * 3600  # a temporary copy this old is a dead process's, whatever its process number says


def cache_key(path, tag: str) -> str:
    """The cache entry's name for model ``path`` and ``tag``: the file's SHA-256, the tag and the rewrite's version."""
    return f"{sha256_verified(path)[:32]}-{hashlib.sha256(f'{tag}|rewrite {REWRITE_VERSION}'.encode()).hexdigest()[:16]}"


def quick_session(path, ort, new_options, open_session, tag: str):
    """The quick session of ``path`` (``open_session(options, model)``, ``new_options()``), through the cache folder
    "quick": the copy as ONNX Runtime optimized it (saved by the session that made it, loaded unoptimized), or a mark
    that the file runs as it is. Keyed by :func:`cache_key`: a changed model, runtime or rewrite never meets an old
    entry. An entry that cannot be loaded is made again; where none can be kept (no folder, a read-only or full
    disk) the session opens all the same, without keeping one. The folder stays within CACHE_ENTRIES and
    CACHE_BYTES, and dead processes' temporary copies are swept."""
    folder = user_cache_dir("quick")
    key = cache_key(path, tag)
    saved, as_is, options = folder / f"{key}.onnx", folder / f"{key}.as-is", new_options()
    if as_is.exists():
        _used(as_is)
        return open_session(options, os.fspath(path))
    if saved.exists():
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            session = open_session(options, os.fspath(saved))
            _used(saved)
            return session
        except Exception as exc:  # noqa: BLE001 - a damaged entry: made again below
            log.debug("%s: the quick session's kept copy did not load (%s); making it again", path, exc)
        options = new_options()
    copy, tmp = depthwise_as_taps(path), folder / f"{key}.{os.getpid()}-{threading.get_ident()}.tmp.onnx"
    keep = copy is not None and _writable(folder, tmp)
    if keep:
        options.optimized_model_filepath = os.fspath(tmp)
    elif copy is None and "onnx" in sys.modules:  # the file was read and has nothing to rewrite (not: onnx is missing)
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            as_is.touch()
    model = os.fspath(path) if copy is None else copy
    try:
        try:
            session = open_session(options, model)
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's save failed (a full disk): open without keeping
            if not keep:
                raise
            log.debug("%s: the quick session's copy could not be kept (%s); opening it without", path, exc)
            keep, session = False, open_session(new_options(), model)
        if keep:
            with contextlib.suppress(OSError):
                os.replace(tmp, saved)
                _prune(folder)
        return session
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _writable(folder, tmp) -> bool:
    """Whether ``tmp`` can be made in ``folder`` (made here, empty, for ONNX Runtime to write): False for a missing
    folder that cannot be made, a read-only one, or a name taken."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb"):
            return True
    except OSError as exc:
        log.debug("%s: no copy of the quick session can be kept there (%s)", folder, exc)
        return False


def _used(entry) -> None:
    with contextlib.suppress(OSError):  # a read-only folder: the entry still serves, its age is not kept
        os.utime(entry)


def _prune(folder, now: float | None = None) -> None:
    """Keep the folder within CACHE_ENTRIES and CACHE_BYTES (the least recently used entries go first), and remove
    the temporary copies of processes that are gone (or older than STALE_TMP_S)."""
    import time

    now = time.time() if now is None else now
    entries = []
    for item in folder.iterdir():
        try:
            st = item.stat()
        except OSError:
            continue
        if item.name.endswith(".tmp.onnx"):
            if now - st.st_mtime > STALE_TMP_S or not _alive(item.name):
                with contextlib.suppress(OSError):
                    item.unlink()
        elif item.suffix in (".onnx", ".as-is"):
            entries.append((st.st_mtime, st.st_size, item))
    entries.sort(reverse=True)
    total = 0
    for count, (_, size, item) in enumerate(entries):
        total += size
        if count >= CACHE_ENTRIES or total > CACHE_BYTES:
            with contextlib.suppress(OSError):
                item.unlink()


def _alive(tmp_name: str) -> bool:
    """Whether the process that writes temporary copy ``tmp_name`` (``KEY.PID-THREAD.tmp.onnx``) still runs."""
    try:
        pid = int(tmp_name.split(".")[1].split("-")[0])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


def depthwise_as_taps(path: str | os.PathLike) -> bytes | None:
    """The copy's bytes, or None (the quick session then runs the file): no depthwise convolution, a quantized
    graph (its convolutions are the quantizer's to place), or out of reach here (no ``onnx``, external data, an
    opset below MIN_OPSET), said at debug level."""
    try:
        import onnx
        model = onnx.load(os.fspath(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - no onnx, or a file it cannot read: the quick session runs the file
        log.debug("%s: the quick session runs the model as it is (%s)", path, exc)
        return None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if any(mark in n.op_type for n in model.graph.node for mark in QUANT_MARKS):
        return None
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer) or opset < MIN_OPSET:
        log.debug("%s: external data or opset %d; the quick session runs the model as it is", path, opset)
        return None
    return model.SerializeToString() if rewrite_depthwise(model) else None


def _depthwise(node, inits: dict):
    """(weights, bias or None, attributes) when ``node`` is a 2-D depthwise Conv with constant FP16/FP32 weights
    (and bias) and explicit pads, which the copy reproduces exactly; else None."""
    from onnx import helper, numpy_helper
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    w, group = inits.get(node.input[1]), a.get("group", 1)
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if w is None or len(w.dims) != 4 or w.dims[1] != 1 or group != w.dims[0] or group == 1 or \
            (bias is not None and bias not in inits) or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", b""):
        return None
    w = numpy_helper.to_array(w)
    if w.dtype.name not in ("float16", "float32"):
        return None
    return w, (numpy_helper.to_array(inits[bias]) if bias is not None else None), a


def rewrite_depthwise(model) -> int:
    """Rewrite ``model`` (an onnx ModelProto, in place) as the module says; how many convolutions. The depthwise
    weights stay as unused initializers (ONNX Runtime drops those at load)."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes, new_inits, rewritten = [], [], 0
    for node in model.graph.node:
        found = _depthwise(node, inits)
        if found is None:
            nodes.append(node)
        else:
            _as_taps(node, *found, f"trtc_taps{rewritten}_", nodes, new_inits)
            rewritten += 1
    if rewritten:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        model.graph.initializer.extend(new_inits)
    return rewritten


def _as_taps(node, w, b, a: dict, p: str, nodes: list, inits: list) -> None:
    """Append the nodes and initializers (names prefixed ``p``) computing depthwise ``node`` tap by tap."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    def const(values, name, dtype=np.int64):
        inits.append(numpy_helper.from_array(np.asarray(values, dtype), name))
        return name

    def add(op, inputs, out, **attrs):
        nodes.append(helper.make_node(op, inputs, [out], name=f"{p}{len(nodes)}", **attrs))
        return out

    kh, kw = w.shape[2], w.shape[3]
    (sh, sw), (dh, dw) = a.get("strides", [1, 1]), a.get("dilations", [1, 1])
    pads, x, acc = a.get("pads", [0, 0, 0, 0]), node.input[0], None
    if any(pads):
        x = add("Pad", [x, const([0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]], p + "pads")], p + "padded")
    if w.dtype == np.float16:
        x = add("Cast", [x], p + "f32", to=TensorProto.FLOAT)
    axes, steps = const([2, 3], p + "axes"), const([sh, sw], p + "steps")
    for i in range(kh):
        for j in range(kw):  # a running sum, not one Sum of every tap (k*k products in memory at once)
            t = f"{p}{i}_{j}"
            # from tap (i, j) to where the last tap's window ends: exactly the output's size, whatever the input's
            ends = [-(dh * (kh - 1 - i)) or INT64_MAX, -(dw * (kw - 1 - j)) or INT64_MAX]
            tap = add("Slice", [x, const([i * dh, j * dw], t + "_starts"), const(ends, t + "_ends"), axes, steps],
                      t + "_x")
            tap = add("Mul", [tap, const(w[:, 0, i, j].reshape(1, -1, 1, 1), t + "_w", np.float32)], t + "_m")
            acc = tap if acc is None else add("Add", [acc, tap], t + "_acc")
    if b is not None:
        acc = add("Add", [acc, const(b.reshape(1, -1, 1, 1), p + "bias", np.float32)], p + "biased")
    if w.dtype == np.float16:
        add("Cast", [acc], node.output[0], to=TensorProto.FLOAT16)
    else:  # the last node (which made acc) writes the convolution's output
        nodes[-1].output[0] = node.output[0]
