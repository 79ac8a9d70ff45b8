"""The push targets of issue 27 on a GPU: frames already on the device (1080p NV12) pushed into
engines.video.FramePusher from 1 and 16 threads, against the engine alone at the same batch in the same run;
``--many 8`` also pushes 8 frames per push_many call; optionally GPU memory over a long push (--soak SECONDS).
Prints a table, writes JSON.

    python3 examples/bench_push.py --model resnet50.fp16.onnx --model lite0.fp16.onnx --video bikes1080.mp4 \\
        --batch 32 --threads 1,16 --many 1,8 --seconds 8 --repeat 3 --soak 600 --json push.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path


def device_frames(video: str, n: int):
    """The first ``n`` frames of ``video`` decoded by PyAV, as NV12 on the GPU (decoded once, before timing)."""
    import av
    import cupy as cp

    out = []
    with av.open(video) as c:
        for f in c.decode(video=0):
            out.append(cp.asarray(f.to_ndarray(format="nv12")))
            if len(out) == n:
                break
    cp.cuda.Device().synchronize()
    return out


def engine_only(engine, batch: int, seconds: float) -> float:
    """Frames per second of engine.infer on a device batch, the engine's own stream, nothing else."""
    import cupy as cp

    import numpy as np

    dtype = engine.inputs[0].numpy_dtype
    # normal noise, as trtc bench VIDEO's engine-only row: on the H100 ResNet-50 ran 1-2% faster on zeros than on
    # real frames or noise (less power drawn), which would flatter the reference
    x = cp.asarray(np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32).astype(dtype))
    stream = getattr(engine, "stream", None) or cp.cuda.Stream(non_blocking=True)
    # a new batch size: ONNX Runtime's quick start runs it on its default-algorithm session until the tuned one
    # has prepared it (started by this first call); time the tuned session only
    engine.infer(x, stream=stream)
    if not getattr(engine, "wait_ready", lambda _t: True)(600):
        raise SystemExit("the tuned session did not prepare the batch in 600 s")
    for _ in range(5):
        engine.infer(x, stream=stream)
    stream.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            engine.infer(x, stream=stream)
        n += 10
    stream.synchronize()
    return n * batch / (time.perf_counter() - t0)


def push_rate(engine, frames, batch: int, threads: int, seconds: float, soak: bool = False, many: int = 1,
              buffers: int = 0) -> dict:
    """Frames classified per second while ``threads`` threads push device frames (on_lag=block: every frame is
    classified), one per push() call, or ``many`` per push_many() call; with ``soak``, GPU memory sampled every
    10 s. ``buffers``: the pusher's input buffers (0: enough for two frames per thread, at least 4)."""
    import cupy as cp

    from engines._gpu import memory_used_mib
    from engines.video import FramePusher

    stop = threading.Event()
    samples = []
    with FramePusher(engine, batch=batch, top_k=1, on_lag="block", callback=lambda _p: None, format="NV12",
                     buffers=buffers or max(4, threads * 2 // batch + 2)) as p:
        def produce(k):
            i = 0
            while not stop.is_set():
                if many == 1:
                    p.push(f"cam{k}", frames[i % len(frames)], frame_id=i)
                else:
                    p.push_many(f"cam{k}", [frames[(i + j) % len(frames)] for j in range(many)],
                                frame_ids=list(range(i, i + many)))
                i += many
        workers = [threading.Thread(target=produce, args=(k,)) for k in range(threads)]
        for w in workers:
            w.start()
        time.sleep(2)  # steady state before the clock
        f0, t0 = p.stats.frames, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            time.sleep(min(10.0, seconds))
            if soak:
                samples.append((round(time.perf_counter() - t0), memory_used_mib(0),
                                round(cp.get_default_memory_pool().used_bytes() / 2**20, 1)))
        fps = (p.stats.frames - f0) / (time.perf_counter() - t0)
        stop.set()
        for w in workers:
            w.join()
    return {"threads": threads, "many": many, "fps": round(fps, 1), "dropped": sum(p.stats.dropped.values()),
            "memory_mib": samples, "infer_stage_s": {k: round(v, 2) for k, v in p.stats.infer_stage.items()}}


def bench(model: str, args) -> list[dict]:
    """Each row (threads, frames per call, buffers) ``--repeat`` times, engine-only timed right before each push
    (the GPU's clocks and temperature drift over a run: a reference timed once at the start flatters or
    penalises later rows); the row shows the median ratio and keeps every pair."""
    import statistics

    import engines

    rows = []
    frames = device_frames(args.video, 64)
    with engines.open_engine(model, device=args.device) as engine:
        for batch in args.batch:
            for threads, many, bufs in ((t, m, b) for b in args.buffers for m in args.many for t in args.threads):
                runs = []
                for _ in range(args.repeat):
                    ref = engine_only(engine, batch, args.seconds)
                    r = push_rate(engine, frames, batch, threads, args.seconds, many=many, buffers=bufs)
                    runs.append({"engine_only_fps": round(ref, 1), **r, "ratio": round(r["fps"] / ref, 3)})
                mid = sorted(runs, key=lambda x: x["ratio"])[len(runs) // 2]
                rows.append({"model": Path(model).name, "batch": batch, **mid, "buffers": bufs or None,
                             "ratios": [x["ratio"] for x in runs], "runs": runs,
                             "median_ratio": round(statistics.median(x["ratio"] for x in runs), 3)})
                call = ("push" if many == 1 else f"push_many({many})") + (f" buffers {bufs}" if bufs else "")
                st = mid["infer_stage_s"]
                print(f"{rows[-1]['model']:<28} batch {batch:>3}  threads {threads:>2}  engine-only "
                      f"{mid['engine_only_fps']:8.1f} fps  {call} {mid['fps']:8.1f} fps  {mid['ratio']:5.3f}x "
                      f"(median of {[x['ratio'] for x in runs]})  inference thread, s: engine "
                      f"{st.get('engine_call_s')}, waiting for batches {st.get('waiting_for_batches_s')}, for the "
                      f"collector {st.get('waiting_for_collect_s')}", flush=True)
            if args.soak:
                s = push_rate(engine, frames, batch, max(args.threads), args.soak, soak=True)
                mem = s["memory_mib"]
                print(f"{Path(model).name}: soak {args.soak:.0f} s at {s['fps']:.1f} fps; GPU memory (s, nvidia-smi "
                      f"MiB, CuPy pool MiB) first {mem[0] if mem else None}, last {mem[-1] if mem else None}")
                rows.append({"model": Path(model).name, "batch": batch, "soak": s})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--video", required=True, help="a 1080p clip (tests/clips.py makes one)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[32])
    ap.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    ap.add_argument("--many", type=lambda s: [int(x) for x in s.split(",")], default=[1],
                    help="frames per call: 1 is push(), more is push_many() (e.g. 1,8)")
    ap.add_argument("--buffers", type=lambda s: [int(x) for x in s.split(",")], default=[0],
                    help="the pusher's input buffers, e.g. 4,8 (0, the default: two frames per thread, at least 4)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=1,
                    help="engine-only then push, this many times per row; the median ratio is shown")
    ap.add_argument("--soak", type=float, default=0.0, help="also push this long and sample GPU memory")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--switch-interval-ms", type=float, default=0.0,
                    help="sys.setswitchinterval for the run (default: Python's 5 ms): how long a thread that wants the "
                         "interpreter lock (the inference thread, back from the engine) may wait for a running one")
    args = ap.parse_args()
    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    import engines

    queues = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    print(f"CUDA_DEVICE_MAX_CONNECTIONS={queues} (trtc {engines.__version__})", flush=True)
    rows = [{**r, "cuda_device_max_connections": queues} for m in args.model for r in bench(m, args)]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
