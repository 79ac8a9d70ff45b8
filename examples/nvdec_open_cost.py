"""What opening NVDEC decoders costs, and what reusing them saves: the measurement behind engines/video/decoders.py.

    python examples/nvdec_open_cost.py clip1080.mp4 --streams 1,16,32 [--gpu 0] [--json out.json]

For each stream count, S threads each decode the whole clip with a SimpleDecoder on a CUDA stream of their own,
three times (frames dropped):

- ``new``: a new decoder per thread (the CUDA context is already made, so this is the decoders alone);
- ``reused``: the same decoders, pointed at the clip again with ``reconfigure_decoder`` (what trtc does);
- ``replaced``: each thread frees its decoder and makes a new one (what a pipeline without reuse does for
  every new source).

and prints, per pass, the aggregate fps, when the constructors returned and when the first frames came (median and
last thread, from the pass's start). ``--start-at`` (a Unix time) lets two processes, e.g. one per GPU, start
their passes together, to see whether opening decoders on one GPU slows the other. Needs a GPU, CuPy and
PyNvVideoCodec.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

PASSES = ("new", "reused", "replaced")


def measure(nvc, cp, video: str, streams: int, gpu: int) -> list[dict]:
    bar = threading.Barrier(streams + 1)
    starts: dict = {}
    rec: dict = {}

    def drain(dec) -> tuple[float, int]:
        total, n, first = len(dec), 0, None
        while n < total:  # never past the end: the SimpleDecoder prints "INVALID INDEX" for such frames
            frames = dec.get_batch_frames(min(8, total - n))
            if not frames:
                break
            if first is None:
                first = time.perf_counter()
            n += len(frames)
            del frames
        return first, n

    def work(i):
        with cp.cuda.Device(gpu):
            stream = cp.cuda.Stream(non_blocking=True)
            dec = None
            for p in PASSES:
                bar.wait()
                t0 = starts[p]
                if p == "reused":
                    dec.reconfigure_decoder(video)
                else:
                    dec = None  # "replaced": the old decoder is freed here, in the timed pass
                    dec = nvc.SimpleDecoder(video, gpu_id=gpu, cuda_context=0, cuda_stream=stream.ptr,
                                            use_device_memory=True)
                opened = time.perf_counter()
                first, n = drain(dec)
                stream.synchronize()
                rec[(p, i)] = (opened - t0, first - t0, time.perf_counter() - t0, n)
                bar.wait()
            del dec
            stream.synchronize()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    rows = []
    for p in PASSES:
        starts[p] = time.perf_counter()
        bar.wait()  # the threads start the pass
        bar.wait()  # and end it
        r = [rec[(p, i)] for i in range(streams)]
        opened = sorted(x[0] for x in r)
        first = sorted(x[1] for x in r)
        end = max(x[2] for x in r)
        frames = sum(x[3] for x in r)
        rows.append({"streams": streams, "pass": p, "frames": frames, "seconds": round(end, 3),
                     "fps": round(frames / end, 1), "opened_ms_median": round(opened[streams // 2] * 1e3, 1),
                     "opened_ms_last": round(opened[-1] * 1e3, 1),
                     "first_frame_ms_median": round(first[streams // 2] * 1e3, 1),
                     "first_frame_ms_last": round(first[-1] * 1e3, 1)})
    for t in threads:
        t.join()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("video")
    ap.add_argument("--streams", default="1,16,32", help="comma-separated stream counts (default 1,16,32)")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--start-at", type=float, default=0.0, help="Unix time to start at (to start processes together)")
    ap.add_argument("--tag", default="", help="a label for this process's rows")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    import cupy as cp
    import PyNvVideoCodec as nvc

    with cp.cuda.Device(args.gpu):  # make the CUDA context before any clock
        cp.zeros(1).sum()
        cp.cuda.Device(args.gpu).synchronize()
    while time.time() < args.start_at:
        time.sleep(0.001)
    rows = []
    print(f"{'tag':8s} {'streams':>7s} {'pass':8s} {'fps':>8s} {'opened ms (med/last)':>21s} "
          f"{'first frame ms (med/last)':>26s}")
    for s in [int(x) for x in args.streams.split(",")]:
        for row in measure(nvc, cp, args.video, s, args.gpu):
            row["tag"] = args.tag
            rows.append(row)
            print(f"{args.tag:8s} {s:7d} {row['pass']:8s} {row['fps']:8.0f} "
                  f"{row['opened_ms_median']:10.0f} / {row['opened_ms_last']:<8.0f} "
                  f"{row['first_frame_ms_median']:12.0f} / {row['first_frame_ms_last']:<8.0f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"video": args.video, "gpu": args.gpu, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
