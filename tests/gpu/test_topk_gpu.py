"""engines.topk on the device: TopK.device_packed (the one-launch kernel for float32 and float16 outputs, CuPy's
sort past TOPK_MAX) against the numpy rule (topk_host) on the same outputs copied to the host; the softmax decision
of "auto" made on the first row. Real model outputs are compared through the pipelines in test_video_gpu.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="needs CuPy (the gpu extra)")]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("k", [1, 5, 32, 40])  # 40: past TOPK_MAX, CuPy's sort
@pytest.mark.parametrize("scores", ["softmax", "raw"])
def test_device_top_k_gives_the_numpy_rule(dtype, k, scores):
    import cupy as cp

    from engines.topk import TopK, topk_host, unpack

    rng = np.random.default_rng(k)
    host = (np.round(rng.normal(0, 3, (70, 1000)) * 64) / 64).astype(dtype)  # exact ties on a 1/64 grid
    host[5, [7, 8, 9]] = host[5].max() + 1
    stream = cp.cuda.Stream(non_blocking=True)
    top = TopK(k, scores)
    packed = top.device_packed(cp.asarray(host), stream=stream)
    stream.synchronize()
    idx, sc = unpack(cp.asnumpy(packed))
    ref_idx, ref_sc = topk_host(host.astype(np.float32), k, scores == "softmax")
    assert (idx == ref_idx).all(), np.argwhere(idx != ref_idx)[:5]
    assert list(idx[5, :3]) == [7, 8, 9][:k]
    np.testing.assert_allclose(sc, ref_sc, rtol=1e-5, atol=1e-7)
    d_idx, d_sc = top.device(cp.asarray(host), stream=stream)  # the two-array form: views of the same row
    stream.synchronize()
    assert (cp.asnumpy(d_idx) == idx).all() and (cp.asnumpy(d_sc) == sc).all()


def test_auto_keeps_probabilities_and_softmaxes_logits():
    import cupy as cp

    from engines.topk import TopK, unpack

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (8, 100)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    for x, softmaxed in ((probs, False), (logits, True)):
        top = TopK(3, "auto")
        idx, sc = unpack(cp.asnumpy(top.device_packed(cp.asarray(x))))
        assert top.apply_softmax is softmaxed
        np.testing.assert_allclose(sc.sum(1) <= 1.0 + 1e-6, True)
        np.testing.assert_allclose(sc, np.take_along_axis(probs, idx, 1), rtol=1e-5)
