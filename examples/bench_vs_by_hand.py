"""`trtc bench VIDEO`'s trtc row against the same pipeline timed by hand in the same process: the bench for 16
streams (``bench_video(..., repeat=3, first_result=False)``), then ``classify`` of 16 streams at batch 64 four times
with a fresh engine, then four times more after a second engine of the model ran a batch of 32 (as the bench's usual
row's engine does).

    python3 examples/bench_vs_by_hand.py bikes8.mp4 torch-fp16:lite0.pt2     # from the project root, on a GPU

On an H100 (2026-11-26, docs/data/video-torch-vs-ort-h100-2026-11-26.json) with Lite0 FP16: the bench's trtc row 17,434 fps,
by hand afterwards 12,713-17,067, where in a process of its own (examples/pipeline_parts.py) the pipeline ran at
19,202. Later runs did not repeat the gap: the bench itself then reached
0.96-1.12x of its limit. This is the script that ran then, unchanged but for this text.
"""
import sys, time
import engines
from engines.video import classify
from toolchain import bench_video as bv

video, model = sys.argv[1], sys.argv[2]
def pipe(e):
    run = classify([video] * 16, e, batch=64, top_k=5)
    t = time.perf_counter()
    n = sum(1 for _ in run)
    return round(n / (time.perf_counter() - t))
rep = bv.bench_video(video, model, streams=(16,), device="cuda:0", repeat=3, latency_frames=0, first_result=False)
for r in rep.rows:
    print(r.pipeline, r.fps, r.fps_runs)
e = engines.open_engine(model, device="cuda:0")
print("by hand after the bench, a fresh engine:", [pipe(e) for _ in range(4)])
u = engines.open_engine(model, device="cuda:0")
import numpy as np
u.infer(np.zeros((32, 3, 224, 224), np.float16))
print("by hand, a second engine opened and run at batch 32 (as the usual row's):", [pipe(e) for _ in range(4)])
