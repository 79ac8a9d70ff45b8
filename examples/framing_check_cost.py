"""The GPU path's framing check (engines/video/bitstream.py), what it costs at 16 and 32 streams: one engine
classifies N distinct copies of WORKDIR/long1080.mp4 (hard links, so each is read by its own check) with the check
on and off (gpu_pipeline.Auditor replaced by None), ABBA order at 16 streams (the first run also prepares the
engine), AB at 32; prints each run and the on/off ratios, writes OUTDIR/audit.json. Needs a GPU and PyNvVideoCodec.

    python3 examples/framing_check_cost.py OUTDIR WORKDIR lite0.fp16.onnx
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
out, w, model = sys.argv[1], sys.argv[2], sys.argv[3]
import engines  # noqa: E402
from engines.video import classify  # noqa: E402
from engines.video import gpu_pipeline  # noqa: E402

real = gpu_pipeline.Auditor
engine = engines.open_engine(model, device="cuda:0", batch=64)
rows = []
for n, order in ((16, "ABBA"), (32, "AB")):
    rep = 0
    for mode in order:
        rep += 1
        d = os.path.join(w, f"copies-{n}-{rep}")  # new paths each run: no audit cached from an earlier one
        os.makedirs(d, exist_ok=True)
        paths = []
        for k in range(n):
            p = os.path.join(d, f"c{k}.mp4")
            if not os.path.exists(p):
                os.link(os.path.join(w, "long1080.mp4"), p)
            paths.append(p)
        gpu_pipeline.Auditor = real if mode == "A" else (lambda path, stop=None: None)
        t0 = time.perf_counter()
        run = classify(paths, engine, batch=64)
        frames = sum(1 for _ in run)
        wall = time.perf_counter() - t0
        s = run.stats
        row = {"streams": n, "check": mode == "A", "frames": frames, "wall_s": round(wall, 3),
               "fps": round(frames / wall, 1), "problems": len(getattr(s, "problems", []) or [])}
        rows.append(row)
        print(row, flush=True)
gpu_pipeline.Auditor = real
for n in (16, 32):
    on = [r["fps"] for r in rows if r["streams"] == n and r["check"]]
    off = [r["fps"] for r in rows if r["streams"] == n and not r["check"]]
    print(f"{n} streams: check on {on} off {off}: on/off {sum(on) / len(on) / (sum(off) / len(off)):.3f}")
json.dump(rows, open(os.path.join(out, "audit.json"), "w"), indent=1)
