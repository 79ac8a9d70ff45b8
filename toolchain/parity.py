"""Classifier-level agreement between a reference and a candidate (numpy only).

Raw-tensor tolerances make FP16 and INT8 models "fail" for noise. What a classifier team needs to know is
whether the labels change: top-1 agreement, top-5 overlap, and, to see how close a flip was, logit and
probability distances. Every function takes logits of shape (N, classes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

# one softmax and one top-k ordering for the runtime and the checks
from engines.topk import looks_like_probabilities, softmax, topk_indices  # noqa: F401


@dataclass
class Parity:
    samples: int
    top1_agreement: float  # fraction of samples whose top-1 class matches the reference
    top5_overlap: float  # mean |top5(ref) & top5(cand)| / 5
    max_abs_diff: float  # over all logits
    mean_abs_diff: float
    cosine: float  # mean per-sample cosine similarity of the logit vectors
    kl: float  # mean KL(softmax(ref) || softmax(cand)) in nats
    decisive_agreement: float  # top-1 agreement on samples the reference does not call a near-tie
    near_ties: int  # samples whose reference top-1 and top-2 logits are within TIE_MARGIN
    flips: list[int] = field(default_factory=list)  # sample indices whose top-1 changed

    def to_dict(self) -> dict:
        return asdict(self)


TIE_MARGIN = 0.01  # logits: top-1 within 1% probability (exp(0.01)) of top-2 in the reference = a near-tie


def scores(outputs: np.ndarray, probabilities: bool) -> np.ndarray:
    """Probabilities of classifier outputs: the outputs themselves when they are probabilities already (a Softmax
    in the graph), else their softmax."""
    return np.asarray(outputs, np.float64) if probabilities else softmax(outputs)


def compare(reference: np.ndarray, candidate: np.ndarray, probabilities: bool | None = None) -> Parity:
    """``probabilities``: the outputs are probabilities already (None: decided on the reference's outputs by the
    rule of ``trtc run --scores auto``, :func:`engines.topk.looks_like_probabilities`), so KL uses them as they
    are instead of a second softmax."""
    ref = np.asarray(reference, np.float64)
    cand = np.asarray(candidate, np.float64)
    if ref.shape != cand.shape or ref.ndim != 2:
        raise ValueError(f"logits must have the same (N, classes) shape, got {ref.shape} and {cand.shape}")
    n = len(ref)
    if n == 0:
        raise ValueError("no samples to compare")
    r1, c1 = ref.argmax(1), cand.argmax(1)
    k = min(5, ref.shape[1])
    r5, c5 = topk_indices(ref, k), topk_indices(cand, k)
    overlap = np.mean([len(set(a) & set(b)) / k for a, b in zip(r5, c5)])
    diff = np.abs(ref - cand)
    num = np.sum(ref * cand, axis=1)
    den = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    cos = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
    # a sample whose outputs are not all finite (an FP16 overflow) agrees in no direction: 0, never the 1.0 that the
    # comparisons above give for NaN (nor a NaN mean, which no threshold fails); unless the reference's are the same
    # (two runs of one overflowing model)
    finite = np.isfinite(ref).all(1) & np.isfinite(cand).all(1)
    if not finite.all():
        same = np.array([np.array_equal(a, b, equal_nan=True) for a, b in zip(ref, cand)])
        cos = np.where(finite, cos, np.where(same, 1.0, 0.0))
    if probabilities is None:
        probabilities = looks_like_probabilities(ref)
    p, q = scores(ref, probabilities), scores(cand, probabilities)
    kl = np.sum(p * (np.log(np.clip(p, 1e-300, None)) - np.log(np.clip(q, 1e-300, None))), axis=1)
    top2 = np.sort(ref, axis=1)[:, -2:] if ref.shape[1] > 1 else np.concatenate([ref, ref - np.inf], 1)
    tie = (top2[:, 1] - top2[:, 0]) < TIE_MARGIN
    decisive = ~tie
    dec_agree = float(np.mean(r1[decisive] == c1[decisive])) if decisive.any() else 1.0
    return Parity(samples=n, top1_agreement=float(np.mean(r1 == c1)), top5_overlap=float(overlap),
                  max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()), cosine=float(cos.mean()),
                  kl=float(np.mean(kl)), decisive_agreement=dec_agree, near_ties=int(tie.sum()),
                  flips=[int(i) for i in np.nonzero(r1 != c1)[0]])


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.asarray(logits).argmax(1) == np.asarray(labels)))
