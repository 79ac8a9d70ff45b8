"""trtc on Ray with one engine actor per GPU: agreement with the single-process run, and throughput.

    python examples/ray_two_gpus.py --model lite0.fp16.onnx --video bikes.mp4 --streams 16 --gpus 2 \
        [--batch 64] [--json ray-2gpu.json] [--no-baseline]

1. reference: the clip once through `engines.video.classify` on cuda:0 (one process, no Ray);
2. baseline (unless --no-baseline): all STREAMS copies in one process on cuda:0, timed;
3. Ray: a local instance with GPUS GPUs, GPUS actors (num_gpus=1 each), STREAMS copies shared out
   (STREAMS/GPUS sources per actor at once), one warm-up source per actor, then the timed run.
Every copy must give the reference's frames in order, with the same top-1 (agreement printed, exit 1 below
0.99); scores are compared too (max absolute difference printed). Prints JSON (and writes it with --json):
frames, seconds, fps of each run, frames per GPU, the speed-up over one GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--video", required=True)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="dry run of this script on a CPU machine: CPU actors")
    args = ap.parse_args()

    import numpy as np
    import ray

    import engines
    from engines.video import RayPool, classify

    report: dict = {"model": args.model, "video": args.video, "streams": args.streams, "gpus": args.gpus,
                    "ray": ray.__version__}
    device = "cpu" if args.cpu else "cuda:0"
    report["device"] = device
    with engines.open_engine(args.model, device=device) as eng:
        ref = {p.frame: (p.indices, p.scores) for p in classify([args.video], eng, batch=args.batch)}
        tmp = Path(tempfile.mkdtemp(prefix="trtc-ray-"))
        copies = []
        for i in range(args.streams):  # distinct names: results are keyed by source
            link = tmp / f"copy{i:03d}{Path(args.video).suffix}"
            link.symlink_to(Path(args.video).resolve())
            copies.append(str(link))
        if not args.no_baseline:
            run = classify(copies, eng, batch=args.batch)
            t0 = time.perf_counter()
            n = sum(1 for _ in run)
            dt = time.perf_counter() - t0
            report["one_gpu_one_process"] = {"frames": n, "seconds": round(dt, 3), "fps": round(n / dt, 1)}

    ray.init(num_gpus=0 if args.cpu else args.gpus, num_cpus=max(os.cpu_count(), args.gpus),
             include_dashboard=False, log_to_driver=False)
    try:
        with RayPool(args.model, device="cpu" if args.cpu else "cuda", actors=args.gpus,
                     streams=max(1, args.streams // args.gpus)) as pool:
            report["actors"] = [a.name for a in pool.actors]
            warm = [str(tmp / f"warm{i}{Path(args.video).suffix}") for i in range(args.gpus)]
            for w in warm:
                os.symlink(Path(args.video).resolve(), w)
            list(pool.classify(warm, batch=args.batch))
            run = pool.classify(copies, batch=args.batch)
            t0 = time.perf_counter()
            got: dict = {c: [] for c in copies}
            for p in run:
                got[p.source].append((p.frame, p.indices, p.scores))
            dt = time.perf_counter() - t0
    finally:
        ray.shutdown()
    frames = sum(len(v) for v in got.values())
    per_actor: dict = {}
    for c in copies:
        per_actor[run.placement.get(c, "?")] = per_actor.get(run.placement.get(c, "?"), 0) + len(got[c])
    same = total = 0
    max_diff = 0.0
    order_ok = True
    for c in copies:
        order_ok &= [f for f, _, _ in got[c]] == sorted(ref)
        for f, idx, sc in got[c]:
            if f in ref:
                total += 1
                same += int(idx[0] == ref[f][0][0])
                max_diff = max(max_diff, float(np.max(np.abs(np.asarray(sc) - np.asarray(ref[f][1])))))
    agreement = same / max(total, 1)
    report["ray"] = {"ray": ray.__version__, "frames": frames, "seconds": round(dt, 3), "fps": round(frames / dt, 1),
                     "frames_per_actor": per_actor, "problems": [str(p) for p in run.problems],
                     "failures": run.failures}
    report["agreement"] = {"top1": round(agreement, 5), "frames_compared": total, "expected": len(ref) * len(copies),
                           "every_frame_in_order": order_ok, "max_abs_score_diff": round(max_diff, 6)}
    if "one_gpu_one_process" in report:
        report["speedup_over_one_gpu"] = round(report["ray"]["fps"] / report["one_gpu_one_process"]["fps"], 2)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    ok = run.ok and order_ok and total == len(ref) * len(copies) and agreement >= 0.99
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
