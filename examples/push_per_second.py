"""Push rate second by second, over several pushers in one process: does a pusher run at one speed for its whole
life, and do pushers of one process differ? Each repeat times the engine alone for a few seconds (one figure a
second), then pushes device NV12 1080p frames from N threads into a new FramePusher (one figure a second, with the
GPU's SM clock, power and utilisation from nvidia-smi). Prints two lines a repeat, writes JSON.

A first run showed with it that a pusher's speed is fixed for its whole life (one pusher in five at 0.90x of
engine-only for all of its 60 s) and CUDA's hardware work queues were taken for the cause: with
CUDA_DEVICE_MAX_CONNECTIONS=32 five of five pushers ran at 0.998x. Ten pushers each way in one
call then showed: with 32 queues 4 of 10 ran below 0.95x, with CUDA's default 8 none did (docs/PUSH.md), so the queues are not
the cause and trtc sets nothing. Compare the two with

    CUDA_DEVICE_MAX_CONNECTIONS=32 python3 examples/push_per_second.py --model r50.fp16.onnx --video bikes1080.mp4
    python3 examples/push_per_second.py --model r50.fp16.onnx --video bikes1080.mp4 --seconds 8 --repeat 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def gpu_state() -> str:
    """SM clock (MHz), power (W), utilisation (%) of the first GPU, as nvidia-smi prints them."""
    q = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,utilization.gpu", "--format=csv,noheader,nounits"]
    return subprocess.run(q, capture_output=True, text=True).stdout.strip().splitlines()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--video", required=True, help="a 1080p clip (tests/clips.py makes one)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=int, default=60, help="of each push, one figure a second")
    ap.add_argument("--engine-seconds", type=int, default=3, help="of engine-only before each push")
    ap.add_argument("--repeat", type=int, default=2, help="pushers, one after the other, in this process")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()

    import engines

    import cupy as cp
    import numpy as np
    from bench_push import device_frames

    from engines.video import FramePusher

    frames = device_frames(args.video, 64)
    e = engines.open_engine(args.model, device="cuda:0")
    dtype = e.inputs[0].numpy_dtype
    x = cp.asarray(np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224), dtype=np.float32).astype(dtype))
    e.infer(x, stream=e.stream)
    if not getattr(e, "wait_ready", lambda _t: True)(600):
        raise SystemExit("the tuned session did not prepare the batch in 600 s")
    queues = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    print(f"CUDA_DEVICE_MAX_CONNECTIONS={queues}", flush=True)
    out = {"engine_only": [], "push": [], "model": Path(args.model).name, "threads": args.threads,
           "batch": args.batch, "cuda_device_max_connections": queues}
    for rep in range(args.repeat):
        for _ in range(args.engine_seconds):
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 1.0:
                for _ in range(10):
                    e.infer(x, stream=e.stream)
                n += 10
            e.stream.synchronize()
            out["engine_only"].append((rep, round(n * args.batch / (time.perf_counter() - t0)), gpu_state()))
        stop = threading.Event()
        with FramePusher(e, batch=args.batch, top_k=1, on_lag="block", callback=lambda _p: None,
                         format="NV12") as p:
            def produce(k):
                i = 0
                while not stop.is_set():
                    p.push(f"cam{k}", frames[i % len(frames)], frame_id=i)
                    i += 1
            workers = [threading.Thread(target=produce, args=(k,)) for k in range(args.threads)]
            for w in workers:
                w.start()
            for s in range(args.seconds):
                f0, t0 = p.stats.frames, time.perf_counter()
                time.sleep(1.0)
                out["push"].append((rep, s, round((p.stats.frames - f0) / (time.perf_counter() - t0)), gpu_state()))
            stop.set()
            for w in workers:
                w.join()
        print("repeat", rep, "engine-only", [r[1] for r in out["engine_only"] if r[0] == rep], flush=True)
        print("repeat", rep, "push", [r[2] for r in out["push"] if r[0] == rep], flush=True)
    e.close()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
