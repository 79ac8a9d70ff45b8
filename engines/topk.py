"""Top-k of classifier outputs: on the GPU for device arrays (only (batch, k) indices and scores come back), in
numpy for host arrays. One rule for both:

- ``scores="softmax"`` turns logits into probabilities first; ``"raw"`` keeps the model's numbers; ``"auto"``
  (the default) keeps them when every row already looks like a probability distribution (non-negative, sums to
  1 within 1e-3, as after a Softmax layer) and applies softmax otherwise. The decision is made on the first
  batch an engine sees and then kept, so one run never mixes the two.
- Ties keep the lower class index first (stable sort of the negated scores).
"""

from __future__ import annotations

import numpy as np

from .errors import UsageProblem

SCORES = ("auto", "softmax", "raw")


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
        """Enqueue top-k of a CuPy (B, C) array on ``stream``; returns device (indices int32, scores float32).

        The softmax decision of "auto" needs one row on the host, once per TopK (first batch only)."""
        import cupy as cp  # the caller already holds device arrays, so CuPy is there

        with stream if stream is not None else _null():
            x = outputs.reshape(outputs.shape[0], -1).astype(cp.float32, copy=False)
            if self.apply_softmax is None:
                self._decide(cp.asnumpy(x[:1]))
            if self.apply_softmax:
                x = x - x.max(axis=1, keepdims=True)
                cp.exp(x, out=x)
                x /= x.sum(axis=1, keepdims=True)
            k = min(self.k, x.shape[1])
            idx = cp.argsort(-x, axis=1)[:, :k].astype(cp.int32)
            return idx, cp.take_along_axis(x, idx, axis=1)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
