"""What the GPU pipeline loses to what: decode-only (trtc bench VIDEO's SimpleDecoder row), the pipeline with a null
engine (decoding, the preprocessing kernel, input slots, top-k and results; an ``infer`` that computes nothing) and
the pipeline with the real engine, 16 streams of a clip at batch 64, in one process, four rounds interleaved; prints
each run and the medians as fractions of decode-only.

    python3 examples/pipeline_parts.py bikes8.mp4 torch-fp16:lite0.pt2     # from the project root, on a GPU
    python3 examples/pipeline_parts.py bikes8.mp4 lite0.fp16.onnx

On an H100 (2026-11-26, docs/data/video-torch-vs-ort-h100-2026-11-26.json) with Lite0 FP16 and bikes8.mp4: null engine 1.02x
of decode-only, the compiled engine 0.917x, tuned ONNX Runtime 0.56x (the engine's own limit). The same pipeline
timed inside `trtc bench VIDEO`'s process ran at 0.80x once (examples/bench_vs_by_hand.py), and three later fresh
processes of this script gave 1.04x, 0.93x and 0.96x: the rate varied between phases of a machine's life, for reasons
not found. This is the script that ran then, unchanged but for this text.
"""
import json, statistics, sys, time
import cupy as cp
import engines
from engines.video import classify
from toolchain.bench_video import _decode_only_batched

video, model = sys.argv[1], sys.argv[2]
real = engines.open_engine(model, device="cuda:0")


class Null:
    """The real engine's attributes, an infer that returns a fixed (B, 1000) output and computes nothing."""
    def __init__(self, e):
        self._e, self._out = e, {}
    def __getattr__(self, k):
        if k == "binds_inputs":
            return False
        return getattr(self._e, k)
    def infer(self, x, outputs=None, stream=None):
        b = x.shape[0]
        if b not in self._out:
            self._out[b] = cp.zeros((b, 1000), cp.float16)
        return [self._out[b]]


null = Null(real)
def pipe(e):
    t = time.perf_counter()
    n = sum(1 for _ in classify([video] * 16, e, batch=64, top_k=5))
    return n / (time.perf_counter() - t)
def dec():
    n, s = _decode_only_batched(video, 16, 0)
    return n / s
rows = {"decode-only (SimpleDecoder)": [], "pipeline, null engine": [], "pipeline, compiled engine": []}
pipe(real); pipe(null); dec()
for _ in range(4):
    rows["decode-only (SimpleDecoder)"].append(dec())
    rows["pipeline, null engine"].append(pipe(null))
    rows["pipeline, compiled engine"].append(pipe(real))
d = statistics.median(rows["decode-only (SimpleDecoder)"])
for k, v in rows.items():
    print(f"{k:30} median {statistics.median(v):9.0f} fps  ({statistics.median(v) / d:.3f} of decode-only)  runs {[round(x) for x in v]}")
print(json.dumps(rows))
