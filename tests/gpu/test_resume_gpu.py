"""`--resume` on the GPU pipeline: frames up to the last one already written are decoded but not classified, and
the rest come out as in a whole run (the CPU side of this is tests/cpu/test_run_interrupt.py)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("cupy", "PyNvVideoCodec", "av")),
                                 reason="needs the gpu and video-cpu extras")]


def test_gpu_pipeline_skips_frames_already_done(lite0_onnx, bikes):
    import engines
    from engines.video import classify

    with engines.open_engine(lite0_onnx[0], device="cuda:0") as engine:
        whole = {p.frame: p.indices[0] for p in classify([bikes], engine, batch=16, top_k=1)}
        run = classify([bikes], engine, batch=16, top_k=1, done={str(bikes): 99})
        rest = {p.frame: p.indices[0] for p in run}
    assert run.ok, run.problems
    assert sorted(rest) == list(range(100, 250))
    assert sum(rest[f] == whole[f] for f in rest) >= 0.99 * len(rest)
