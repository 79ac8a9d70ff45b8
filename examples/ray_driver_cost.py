"""What one result line costs the driver of `trtc run --ray` (docs/CLUSTER.md uses these numbers).

Two parts, measured apart on this machine:
  1. transport: an actor yields results in chunks of 256 (the tuple trtc's actors send: source, frame, pts, time,
     5 indices, 5 scores, 2 latencies) through a Ray streaming generator; the driver gets every chunk.
  2. writing: per result, the driver's own work in trtc run: a Prediction with its labels, to_dict, json.dumps,
     one write to a file.

    python examples/ray_driver_cost.py [--lines 400000]

Prints JSON: microseconds per line for each part and the lines per second one driver core could take.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def transport(lines: int, chunk: int = 256) -> float:
    import ray

    @ray.remote(num_cpus=1)
    class Source:
        def chunks(self, n):
            row = ("/data/archive/2026/11/cam-0042/clip-000123.mp4", 0, 0, 0.0, [844, 892, 648, 827, 409],
                   [0.441131, 0.101974, 0.012944, 0.011882, 0.00918], None, None)
            block = [row] * chunk
            for _ in range(n):
                yield ("preds", block)

    actor = Source.remote()
    ray.get(actor.__ray_ready__.remote())
    n = lines // chunk
    t0 = time.perf_counter()
    got = 0
    for ref in actor.chunks.options(num_returns="streaming").remote(n):
        got += len(ray.get(ref)[1])
    dt = time.perf_counter() - t0
    ray.kill(actor)
    return dt / got


def writing(lines: int) -> float:
    from engines.video.pipeline import Prediction, label_names

    labels = [f"class {i}" for i in range(1000)]
    row = ("/data/archive/2026/11/cam-0042/clip-000123.mp4", 0, 0, 0.0, [844, 892, 648, 827, 409],
           [0.441131, 0.101974, 0.012944, 0.011882, 0.00918], None, None)
    with tempfile.TemporaryDirectory() as d, open(os.path.join(d, "out.jsonl"), "wb") as sink:
        t0 = time.perf_counter()
        for i in range(lines):
            source, _frame, pts, t, idx, sc, lat, dec = row
            p = Prediction(source, i, pts, t, idx, sc, label_names(labels, idx), lat, dec)
            sink.write((json.dumps(p.to_dict()) + "\n").encode())
        sink.flush()
        return (time.perf_counter() - t0) / lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=400_000)
    args = ap.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        tr = transport(args.lines)
    finally:
        ray.shutdown()
    wr = writing(args.lines // 4)
    total = tr + wr
    print(json.dumps({"lines": args.lines, "cpu_count": os.cpu_count(), "transport_us_per_line": round(tr * 1e6, 2),
                      "writing_us_per_line": round(wr * 1e6, 2), "total_us_per_line": round(total * 1e6, 2),
                      "lines_per_s_one_driver_core": round(1 / total)}, indent=2))


if __name__ == "__main__":
    main()
