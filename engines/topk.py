"""Top-k of classifier outputs: on the GPU for device arrays (only (batch, k) indices and scores come back), in
numpy for host arrays. One rule for both:

- ``scores="softmax"`` turns logits into probabilities first; ``"raw"`` keeps the model's numbers; ``"auto"``
  (the default) keeps them when every row already looks like a probability distribution (non-negative, sums to
  1 within 1e-3, as after a Softmax layer) and applies softmax otherwise. The decision is made on the first
  batch an engine sees and then kept, so one run never mixes the two.
- Ties keep the lower class index first (stable sort of the negated scores).
"""

from __future__ import annotations

import logging

import numpy as np

from .errors import UsageProblem, first_line

log = logging.getLogger("trtc")

SCORES = ("auto", "softmax", "raw")


DEFAULT_K = 5


def resolve_k(k: int | None, classes: int | None, model: str = "the model") -> int:
    """The top-k to give: ``k`` None is the default, min(5, classes); an explicit ``k`` over the class count (where
    it is known) is refused, as it would silently give fewer. The CLI and the library follow this one rule."""
    if k is None:
        return min(DEFAULT_K, classes) if classes else DEFAULT_K
    if k < 1:
        raise UsageProblem(f"--top-k must be at least 1, got {k}")
    if classes and k > classes:
        raise UsageProblem(f"--top-k {k} asks for more classes than {model} has ({classes})",
                           f"give --top-k {classes} or less, or leave it out (the default is min(5, classes))")
    return k


def check_scores(scores: str) -> str:
    if scores not in SCORES:
        raise UsageProblem(f"unknown scores mode {scores!r}", "use auto, softmax or raw")
    return scores


def looks_like_probabilities(rows: np.ndarray) -> bool:
    rows = np.asarray(rows, np.float64)
    return bool(rows.size) and rows.min() >= 0.0 and bool(np.all(np.abs(rows.sum(axis=-1) - 1.0) < 1e-3))


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def topk_indices(logits: np.ndarray, k: int) -> np.ndarray:
    """(N, k) class indices, best first (ties broken by the lower index)."""
    k = min(k, logits.shape[1])
    return np.argsort(-np.asarray(logits, np.float64), axis=1, kind="stable")[:, :k]


def topk_host(outputs: np.ndarray, k: int, apply_softmax: bool) -> tuple[np.ndarray, np.ndarray]:
    """(indices int64 (B, k), scores float32 (B, k)), best first."""
    x = np.asarray(outputs).reshape(len(outputs), -1)
    p = softmax(x) if apply_softmax else x.astype(np.float64)
    idx = topk_indices(p, k)
    return idx.astype(np.int64), np.take_along_axis(p, idx, axis=1).astype(np.float32)


class TopK:
    """Top-k that remembers its softmax decision across batches (see the module docstring)."""

    def __init__(self, k: int = 5, scores: str = "auto"):
        if k < 1:
            raise UsageProblem(f"--top-k must be at least 1, got {k}")
        self.k = k
        self.scores = check_scores(scores)
        self.apply_softmax: bool | None = {"softmax": True, "raw": False}.get(scores)

    def _decide(self, first_rows) -> bool:
        if self.apply_softmax is None:
            self.apply_softmax = not looks_like_probabilities(first_rows)
        return self.apply_softmax

    def host(self, outputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(outputs).reshape(len(outputs), -1)
        return topk_host(x, self.k, self._decide(x[:1]))

    def device(self, outputs, stream=None):
        """Enqueue top-k of a CuPy (B, C) array on ``stream``; returns device (indices int32, scores float32)."""
        packed = self.device_packed(outputs, stream)
        k = packed.shape[1] // 2
        return packed[:, :k], packed[:, k:].view("float32")

    def device_packed(self, outputs, stream=None):
        """Enqueue top-k of a CuPy (B, C) array on ``stream``; returns one device int32 array (B, 2k): the k
        indices, then the k scores' float32 bits (one copy brings both to the host: :func:`unpack`).

        One kernel launch (:func:`topk_kernel_source`: a warp per row) for float32 and float16 outputs and
        k <= TOPK_MAX; CuPy's sort otherwise. The softmax decision of "auto" needs one row on the host, once per
        TopK (first batch only)."""
        import cupy as cp  # the caller already holds device arrays, so CuPy is there

        with stream if stream is not None else _null():
            x = outputs.reshape(outputs.shape[0], -1)
            if self.apply_softmax is None:
                self._decide(cp.asnumpy(x[:1]).astype(np.float32))
            rows, cols = x.shape
            k = min(self.k, cols)
            half = x.dtype == np.float16
            fits = k <= TOPK_MAX and (half or x.dtype == np.float32) and x.flags.c_contiguous
            kernel = _topk_kernel(cp, half) if fits else None
            if kernel is not None:
                out = cp.empty((rows, 2 * k), cp.int32)
                if rows:
                    per = TOPK_ROWS_PER_BLOCK
                    kernel(((rows + per - 1) // per,), (32 * per,), (x, np.int32(rows), np.int32(cols), np.int32(k),
                                                                    np.int32(self.apply_softmax), out))
                return out
            x = x.astype(cp.float32)
            if self.apply_softmax:
                x = x - x.max(axis=1, keepdims=True)
                cp.exp(x, out=x)
                x /= x.sum(axis=1, keepdims=True)
            idx = cp.argsort(-x, axis=1)[:, :k].astype(cp.int32)
            scores = cp.ascontiguousarray(cp.take_along_axis(x, idx, axis=1))
            return cp.concatenate([idx, scores.view(cp.int32)], axis=1)


def unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`TopK.device_packed`'s (B, 2k) int32 array, on the host -> (indices int32 (B, k), scores float32)."""
    k = packed.shape[1] // 2
    return packed[:, :k], np.ascontiguousarray(packed[:, k:]).view(np.float32)


TOPK_MAX = 32  # one pass over the row per rank: past this CuPy's sort is the better tool
TOPK_ROWS_PER_BLOCK = 4  # a warp per row


def topk_kernel_source(half: bool) -> str:
    """CUDA source of the top-k kernel: one warp (32 threads) per row of a (rows, cols) array, each thread reading
    every 32nd class, so the warp's loads are coalesced and no thread holds a list. With ``softmax`` the row's
    maximum, then the sum of exp(x - max) (both reduced across the warp by shuffles), then each score
    exp(x - max) / sum (float32, as the numpy rule). Then k rounds: each finds the best class ranked after the
    previous round's winner (every thread its best of its classes, then a shuffle reduction), so no sort and no
    local array. The ranking is the numpy rule's: higher scores first, equal scores the lower class first, NaN
    after every number. Writes k indices, then k scores as float32 bits, per row. Launch with blocks of
    32 * TOPK_ROWS_PER_BLOCK threads (a whole warp per row: the shuffles need every lane)."""
    t, load = ("__half", "__half2float(row[c])") if half else ("float", "row[c]")
    include = "#include <cuda_fp16.h>\n" if half else ""
    name = "f16" if half else "f32"
    return include + f"""
__device__ __forceinline__ bool trtc_topk_before(float a, int ia, float b, int ib) {{
    // does score a of class ia rank before score b of class ib
    bool na = a != a, nb = b != b;
    if (na != nb) return nb;
    if (!na && a != b) return a > b;
    return ia < ib;
}}

extern "C" __global__ void trtc_topk_{name}(const {t}* __restrict__ x, int rows, int cols, int k, int softmax,
                                        int* __restrict__ out) {{
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // the whole warp: every lane of a row's warp has the same r
    const {t}* row = x + (long long)r * cols;
    const unsigned all = 0xffffffffu;
    float m = __int_as_float((int)0xff800000), s = 1.0f;  // minus infinity (no header needed under NVRTC)
    if (softmax) {{
        for (int c = lane; c < cols; c += 32) m = fmaxf(m, {load});
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(all, m, o));
        s = 0.0f;
        for (int c = lane; c < cols; c += 32) s += expf({load} - m);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(all, s, o);
    }}
    int* o = out + (long long)r * 2 * k;
    float pv = 0.0f;
    int pi = -1;  // the previous round's winner (none yet)
    for (int j = 0; j < k; j++) {{
        float bv = 0.0f;
        int bi = -1;
        for (int c = lane; c < cols; c += 32) {{
            float v = {load};
            if (softmax) v = expf(v - m) / s;
            if (pi >= 0 && !trtc_topk_before(pv, pi, v, c)) continue;  // taken in an earlier round
            if (bi < 0 || trtc_topk_before(v, c, bv, bi)) {{ bv = v; bi = c; }}
        }}
        for (int d = 16; d > 0; d >>= 1) {{  // butterfly: every lane ends with the warp's best
            float ov = __shfl_xor_sync(all, bv, d);
            int oi = __shfl_xor_sync(all, bi, d);
            if (oi >= 0 && (bi < 0 || trtc_topk_before(ov, oi, bv, bi))) {{ bv = ov; bi = oi; }}
        }}
        if (lane == 0) {{ o[j] = bi; o[k + j] = __float_as_int(bv); }}
        pv = bv;
        pi = bi;
    }}
}}
"""


_KERNELS: dict = {}


def _topk_kernel(cp, half: bool):
    """The compiled kernel (once per process and variant), or None where it cannot compile (said once; CuPy's
    sort does the work then, as before the kernel)."""
    key = (cp.RawKernel, half)  # per CuPy module: the tests' stand-ins bring their own
    if key not in _KERNELS:
        name = "f16" if half else "f32"
        try:
            kernel = cp.RawKernel(topk_kernel_source(half), f"trtc_topk_{name}")
            kernel.compile()
        except Exception as exc:  # noqa: BLE001 - NVRTC's and CuPy's own errors; the sort path still works
            log.warning("the top-k kernel (%s) did not compile, so top-k uses CuPy's sort: %s", name,
                        first_line(exc))
            kernel = None
        _KERNELS[key] = kernel
    return _KERNELS[key]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
