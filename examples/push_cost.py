"""What a GPU push costs in Python, measured on the CPU: engines.video.FramePusher's GPU path (the pusher, the slot
assembler, launches, events, inference and top-k control code) driven by a NumPy stand-in for CuPy
(tests/push_fake_gpu.py; the "kernel" reads nothing, the engine returns at once), 1080p NV12 frames.

    python3 examples/push_cost.py [--frames 20000] [--threads 1,16] [--gpu-ms 2.11]

Prints, per thread count: µs of the caller's thread per push() call, and µs per frame end to end (all frames
pushed, classified and delivered). With ``--gpu-ms`` (the engine's time per batch on the GPU, slept with the
interpreter lock released: 2.11 ms = ResNet-50 FP16 batch 32 on the H100, 15,132 fps) also the push throughput
against that engine alone, a CPU proxy of examples/bench_push.py's ratio.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _pusher(engine, batch: int, **kw):
    from engines.preprocess import PreprocessSpec
    from engines.video import FramePusher

    spec = PreprocessSpec(size=(8, 8), resize=None, mean=(0, 0, 0), std=(1, 1, 1))
    return FramePusher(engine, batch=batch, preprocess=spec, top_k=1, on_lag="block", callback=lambda _p: None,
                       format="NV12", **kw)


def cost(cp, frames: int, threads: int, batch: int) -> tuple[float, float]:
    """(µs in push() per call, µs per frame end to end) for ``frames`` pushes from ``threads`` threads."""
    from tests.push_fake_gpu import ValueEngine

    frame = cp.zeros((1620, 1920), np.uint8)
    in_push = [0.0] * threads
    p = _pusher(ValueEngine(), batch, buffers=4)

    def produce(k):
        t = 0.0
        for i in range(frames // threads):
            t0 = time.perf_counter()
            p.push(f"cam{k}", frame, frame_id=i)
            t += time.perf_counter() - t0
        in_push[k] = t

    workers = [threading.Thread(target=produce, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stats = p.close()
    wall = time.perf_counter() - t0
    assert stats.frames == frames // threads * threads, (stats.frames, stats.dropped)
    return sum(in_push) / frames * 1e6 / threads, wall / stats.frames * 1e6


def throughput(cp, threads: int, batch: int, gpu_ms: float, seconds: float) -> tuple[float, float]:
    """(engine-only fps, push fps) with an engine that takes ``gpu_ms`` per batch (the interpreter lock released)."""
    from tests.push_fake_gpu import ValueEngine

    engine = ValueEngine(delay=gpu_ms / 1000)
    x = cp.zeros((batch, 3, 8, 8), np.float32)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        engine.infer(x)
        n += batch
    ref = n / (time.perf_counter() - t0)
    frame = cp.zeros((1620, 1920), np.uint8)
    stop = threading.Event()
    p = _pusher(engine, batch, buffers=max(4, threads * 2 // batch + 2))

    def produce(k):
        i = 0
        while not stop.is_set():
            p.push(f"cam{k}", frame, frame_id=i)
            i += 1

    workers = [threading.Thread(target=produce, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    time.sleep(0.5)
    f0, t0 = p.stats.frames, time.perf_counter()
    time.sleep(seconds)
    fps = (p.stats.frames - f0) / (time.perf_counter() - t0)
    stop.set()
    for w in workers:
        w.join()
    p.close()
    return ref, fps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--gpu-ms", type=float, default=0.0, help="also the throughput against an engine this slow")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--cuda-us", type=float, default=0.0,
                    help="model each CUDA call (event, record, stream wait, device switch) as this many µs of "
                         "interpreter time, a kernel launch 5x (tests/push_fake_gpu.py); 0: Python alone")
    ap.add_argument("--switch-interval-ms", type=float, default=0.0, help="sys.setswitchinterval (default 5 ms)")
    args = ap.parse_args()
    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    from tests.push_fake_gpu import install

    cp = install(kernel_reads=False, cuda_us=args.cuda_us)
    for threads in args.threads:
        call, frame = cost(cp, args.frames, threads, args.batch)
        print(f"threads {threads:>2}: {call:7.1f} µs in push() per call, {frame:7.1f} µs per frame end to end "
              f"({1e6 / frame:8.0f} frames/s of Python)", flush=True)
    if args.gpu_ms:
        for threads in args.threads:
            ref, fps = throughput(cp, threads, args.batch, args.gpu_ms, args.seconds)
            print(f"threads {threads:>2}: engine alone {ref:8.0f} fps, push {fps:8.0f} fps, {fps / ref:5.2f}x "
                  f"(engine {args.gpu_ms} ms per batch of {args.batch}, slept)", flush=True)


if __name__ == "__main__":
    main()
