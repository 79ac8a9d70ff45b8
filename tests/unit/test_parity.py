import numpy as np
import pytest

from toolchain.parity import TIE_MARGIN, accuracy, compare, softmax, topk_indices


def test_identical_logits_agree_fully():
    x = np.random.default_rng(0).standard_normal((20, 10)).astype(np.float32)
    p = compare(x, x)
    assert p.top1_agreement == 1.0 and p.top5_overlap == 1.0 and p.flips == []
    assert p.max_abs_diff == 0.0 and p.cosine == pytest.approx(1.0) and p.kl == pytest.approx(0.0, abs=1e-12)


def test_flip_is_counted_and_located():
    ref = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 5.0]])
    cand = ref.copy()
    cand[1] = [0.0, 1.0, 2.0]  # sample 1 now picks class 2
    p = compare(ref, cand)
    assert p.flips == [1]
    assert p.top1_agreement == pytest.approx(2 / 3)
    assert p.max_abs_diff == pytest.approx(1.0)
    assert p.kl > 0


def test_near_tie_flips_do_not_count_as_decisive():
    ref = np.array([[2.0, 2.0 + TIE_MARGIN / 2, 0.0], [5.0, 0.0, 0.0]])
    cand = np.array([[2.0 + TIE_MARGIN, 2.0, 0.0], [5.0, 0.0, 0.0]])
    p = compare(ref, cand)
    assert p.top1_agreement == 0.5 and p.near_ties == 1 and p.decisive_agreement == 1.0


def test_top5_overlap_and_topk_order():
    ref = np.arange(10, dtype=np.float64)[None]
    cand = ref.copy()
    cand[0, 9], cand[0, 0] = -1.0, 100.0  # swaps one member of the top 5
    assert compare(ref, cand).top5_overlap == pytest.approx(0.8)
    assert topk_indices(ref, 3).tolist() == [[9, 8, 7]]


def test_softmax_accuracy_and_shape_errors():
    s = softmax(np.array([[1000.0, 1000.0]]))
    assert np.allclose(s, 0.5)
    assert accuracy(np.eye(3), np.array([0, 1, 0])) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        compare(np.zeros((2, 3)), np.zeros((3, 3)))


def test_kl_is_reference_to_candidate_with_known_values():
    """KL(reference || candidate), the direction the docs give (the divergence of the candidate from the reference),
    on numbers worked by hand: p = (0.9, 0.1), q = (0.5, 0.5) as probabilities gives
    0.9 ln(0.9/0.5) + 0.1 ln(0.1/0.5) = 0.368064; the other direction would give 0.510826 (issue 32: a reversed KL
    passed every test)."""
    import math

    p = np.array([[0.9, 0.1]])
    q = np.array([[0.5, 0.5]])
    want = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert compare(p, q, probabilities=True).kl == pytest.approx(want, abs=1e-9)
    # logits: the softmax of each side first
    lp, lq = np.log(p), np.log(q)
    assert compare(lp, lq, probabilities=False).kl == pytest.approx(want, abs=1e-9)


def test_a_sample_with_nan_or_inf_outputs_has_cosine_zero():
    """An FP16 overflow turns a sample's logits into NaN: its cosine is 0 (it used to be 1.0, so that a model giving
    NaN for every input passed the cosine threshold)."""
    ref = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 5.0], [1.0, 2.0, 3.0]])
    cand = ref.copy()
    cand[1] = np.nan
    cand[2, 0] = np.inf
    p = compare(ref, cand)
    assert p.cosine == pytest.approx(0.5)  # two of four samples agree exactly, two count 0
    assert compare(ref, np.full_like(ref, np.nan)).cosine == 0.0
    assert compare(cand, cand.copy()).cosine == 1.0  # two runs of one overflowing model agree
