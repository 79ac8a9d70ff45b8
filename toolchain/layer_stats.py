"""What the per-layer comparisons (toolchain.layers between two ONNX models, toolchain.module_parity against a
PyTorch model) share: the running sums kept per tensor, the report, the ranking of the worst layers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from engines._deps import require

FP16_MAX = 65504.0
# relative L2 error beyond which a layer is "over the threshold", by the candidate's precision
DEFAULT_LAYER_THRESHOLD = {"fp32": 0.001, "fp16": 0.01, "int8": 0.1}
FLOATS = ("float32", "float16", "float64")
ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64"}


@dataclass
class LayerReport:
    reference: str
    candidate: str
    precision: str
    samples: int
    matched_by: str
    matched: int
    unmatched: list[str]
    candidate_only: dict[str, int]
    not_compared: list[str]  # matched tensors that are not floating point (shapes, indices)
    threshold: float
    first_over: dict | None  # the first layer (graph order) whose relative L2 error is over the threshold
    worst: list[int]  # row indices, most error added first
    rows: list[dict]  # every layer, in graph order
    seconds: float
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _feeds(model) -> set[str]:
    inits = {i.name for i in model.graph.initializer}
    return {i.name for i in model.graph.input if i.name not in inits}


class _Sums:
    """Running sums for one reference tensor against its candidate tensor, batch by batch."""

    def __init__(self):
        self.d2 = self.r2 = self.cos = 0.0
        self.samples = self.elements = self.nonfinite = self.fp16_saturated = self.clipped = 0
        self.ref_beyond = 0  # reference values beyond FP16's range in an FP16 candidate tensor
        self.max_abs = 0.0

    def add(self, r: np.ndarray, c: np.ndarray, n: int, batch: int, scale: float | None = None) -> None:
        """``r``, ``c``: the first ``n`` of ``batch`` samples count (a fixed-batch model's last batch is padded).
        Elementwise work in float32, each sample's sums by BLAS dot products, added up in float64."""
        if r.ndim == 0 or r.shape[0] != batch or c.shape != r.shape:  # no batch dimension: one sample per batch
            n, r, c = 1, r.reshape(1, -1), c.reshape(1, -1)
        r = np.ascontiguousarray(r[:n], np.float32).reshape(n, -1)
        half = c.dtype == np.float16
        if half:
            beyond = int(np.count_nonzero(np.abs(r) > FP16_MAX))
            self.ref_beyond += beyond
            self.fp16_saturated += int(np.count_nonzero(np.abs(c[:n]) >= FP16_MAX)) + beyond
        c = np.ascontiguousarray(c[:n], np.float32).reshape(n, -1)
        if not np.isfinite(c).all():
            bad = ~np.isfinite(c)
            self.nonfinite += int(bad.sum())
            self.fp16_saturated -= int(np.count_nonzero(bad & (np.abs(c) >= FP16_MAX))) if half else 0
            c = np.where(bad, np.float32(0), c)
        if scale is not None:  # QuantizeLinear saturates where x / scale rounds beyond [-128, 127]
            self.clipped += int(np.count_nonzero(r > np.float64(127.5 * scale)) +
                                np.count_nonzero(r < np.float64(-128.5 * scale)))
        d = c - r
        for i in range(n):
            rr, cc = float(np.dot(r[i], r[i])), float(np.dot(c[i], c[i]))
            self.d2 += float(np.dot(d[i], d[i]))
            self.r2 += rr
            self.cos += float(np.dot(r[i], c[i])) / np.sqrt(rr * cc) if rr > 0 and cc > 0 else float(rr == cc)
        self.max_abs = max(self.max_abs, float(max(d.max(), -d.min()))) if d.size else self.max_abs
        self.samples += n
        self.elements += r.size

    def rel_l2(self) -> float:
        if self.nonfinite:
            return float("inf")
        return float(np.sqrt(self.d2 / self.r2)) if self.r2 > 0 else float(np.sqrt(self.d2) > 0)

    def cosine(self) -> float:
        return self.cos / self.samples if self.samples else 1.0


def _ort_session(model, device: str, qdq_fusion: bool = True):
    ort = require("onnxruntime", "Running ONNX models", extra="cpu")
    from engines.ort_session import providers_for, session_options

    return ort.InferenceSession(model.SerializeToString(), sess_options=session_options(ort, qdq_fusion=qdq_fusion),
                                providers=providers_for(device))


def _num(v: float) -> float | None:
    """A figure for the JSON report: None for an infinite error (the candidate overflowed: see ``overflow``)."""
    return None if not np.isfinite(v) else round(float(v), 7)


def rank_key(row: dict) -> tuple[int, float]:
    """Sort key, most error added first: a layer that overflows on the reference's inputs before any other (one whose
    inputs fit its type before one fed values already beyond it), then the error it makes on the reference's inputs
    (``alone``; the rise of error over its inputs' where that is unknown)."""
    if row["alone_overflow"]:
        return (1 if row.get("overflow_inherited") else 2), float(row["alone_overflow"])
    v = row["alone"] if row["alone"] is not None else row["added"]
    return 0, float("inf") if v is None else v


def _over(row: dict, threshold: float) -> bool:
    return row["rel_l2"] is None or row["rel_l2"] > threshold
