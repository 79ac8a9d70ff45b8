"""What one prediction costs between a WorkerPool worker and `trtc run`'s output (docs/CLUSTER.md uses these).

A spawned process stands in for a worker: it makes Predictions (5 indices, 5 scores, a long source path) and sends
them through a multiprocessing pipe in chunks of 256, in one of two forms:

  rows   the form trtc used up to issue 31: a tuple per prediction; the parent builds a Prediction with its labels,
         then `trtc run`'s _Lines.write makes its dict and JSON line, and the progress bar advances per line;
  blocks a ResultBlock per chunk, JSON lines formatted in the worker (engines/video/results.py); the parent writes a
         block with one call (_Lines.write_block) and advances the bar once per block.

    python examples/pool_transport_cost.py [--lines 200000]

Prints JSON: per form, microseconds per line in the worker (making and sending) and in the parent (receiving,
writing, bar), and the lines per second one parent core could take.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SOURCE = "/data/archive/2026/11/cam-0042/clip-000123.mp4"


def _preds(n: int):
    from engines.video.pipeline import Prediction

    for i in range(n):
        yield Prediction(SOURCE, i, i * 512, i / 25, [844, 892, 648, 827, 409],
                         [0.441131, 0.101974, 0.012944, 0.011882, 0.00918], None, None, None,
                         received=1795507682.143 + i / 25)


def _worker(conn, n: int, form: str) -> None:
    from engines.video.results import ResultBlock

    out: list = []
    t0 = time.perf_counter()
    for p in _preds(n):
        out.append(p if form == "blocks" else (p.source, p.frame, p.pts, p.time, p.indices, p.scores, p.latency_ms,
                                               p.decode_ms, p.received))
        if len(out) >= 256:
            conn.send(("block", ResultBlock.pack(out, "cuda:0", "plain")) if form == "blocks" else ("preds", out))
            out = []
    if out:
        conn.send(("block", ResultBlock.pack(out, "cuda:0", "plain")) if form == "blocks" else ("preds", out))
    conn.send(("end", time.perf_counter() - t0))


def _parent(conn, form: str, labels) -> tuple[int, float, float]:
    """(lines, seconds the parent worked, seconds the worker worked)."""
    from rich.console import Console
    from rich.progress import Progress

    from engines.video.pipeline import Prediction, label_names
    from toolchain.run import _Lines, _Prior

    lines = _Lines(None, _Prior(), open(os.devnull, "w"), False)  # noqa: SIM115 - closed with the process
    console = Console(file=open(os.devnull, "w"), force_terminal=True)  # noqa: SIM115 - a bar that draws
    busy, got = 0.0, 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("classifying")
        while True:
            msg = conn.recv()
            t = time.perf_counter()
            if msg[0] == "end":
                return got, busy, msg[1]
            if form == "blocks":
                block = msg[1]
                block.device, block.labels = "cuda:0", labels
                n = lines.write_block(block)
                progress.advance(task, n)
                got += n
            else:
                for source, frame, pts, tm, idx, sc, lat, dec, received in msg[1]:
                    p = Prediction(source, frame, pts, tm, idx, sc, label_names(labels, idx), lat, dec,
                                   device="cuda:0", received=received)
                    lines.write(p)
                    progress.advance(task)
                    got += 1
            busy += time.perf_counter() - t


def measure(form: str, n: int) -> dict:
    labels = [f"class {i}" for i in range(1000)]
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_worker, args=(theirs, n, form))
    child.start()
    theirs.close()
    t0 = time.perf_counter()
    got, busy, worker_s = _parent(mine, form, labels)
    wall = time.perf_counter() - t0
    child.join()
    return {"lines": got, "worker_us_per_line": round(worker_s / got * 1e6, 2),
            "parent_us_per_line": round(busy / got * 1e6, 2), "wall_us_per_line": round(wall / got * 1e6, 2),
            "lines_per_s_one_parent_core": round(got / busy)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=200_000)
    args = ap.parse_args()
    print(json.dumps({"cpu_count": os.cpu_count(), "rows": measure("rows", args.lines),
                      "blocks": measure("blocks", args.lines)}, indent=2))


if __name__ == "__main__":
    main()
