"""The job row of the benchmark: how long a short clip takes from process start to its first and its last result.

    python -m toolchain.bench_job bikes.mp4 --model lite0.fp16.onnx --device cuda:0 --runs 4 --json job.json

Each run is a fresh Python process (nothing warm: imports, CUDA's start, the engine's open and preparation all
count), started by this one, which stamps every prediction line as it arrives on the child's stdout (the child
writes unbuffered). Two ways to run the same clip: ``trtc run VIDEO --model M --device D`` (the CLI) and
``classify([VIDEO], open_engine(M, device=D))`` (the library, printing one line per prediction). A row gives the
medians over the runs of: first result, last result and process exit, in seconds from the child's start, and the
number of predictions (every run must give the same number, else the row says which runs differed). Speed is only
ever measured here and in the other benchmarks, never in tests.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ._env import checkout_env
from .errors import TrtcError, UsageProblem

WAYS = ("run", "classify")
_CLASSIFY = ("import sys\nfrom engines import open_engine\nfrom engines.video import classify\n"
             "engine = open_engine(sys.argv[2], device=sys.argv[3])\n"
             "for p in classify([sys.argv[1]], engine):\n    print(p.frame, flush=True)\n")


@dataclass
class JobRow:
    way: str  # "run" (the CLI) or "classify" (the library)
    model: str
    device: str
    runs: int
    first_s: float  # medians, seconds from the child's start
    last_s: float
    exit_s: float
    predictions: int
    each: list = field(default_factory=list)  # per run: {"first_s", "last_s", "exit_s", "predictions"}


def _command(way: str, video: str, model: str, device: str) -> list:
    if way == "run":
        return [sys.executable, "-m", "toolchain", "run", video, "--model", model, "--device", device]
    return [sys.executable, "-c", _CLASSIFY, video, model, device]


def one_job(way: str, video: str, model: str, device: str, timeout: float = 600.0) -> dict:
    """One fresh process: {"first_s", "last_s", "exit_s", "predictions"}; raises TrtcError when it fails."""
    env = checkout_env(PYTHONUNBUFFERED="1")  # the child imports this checkout, as this process does
    t0 = time.perf_counter()
    child = subprocess.Popen(_command(way, video, model, device), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env)
    first = last = None
    n = 0
    for line in child.stdout:  # stamped on arrival
        now = time.perf_counter() - t0
        if line.strip():
            n += 1
            first = now if first is None else first
            last = now
    try:
        err = child.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise TrtcError(f"{way}: {Path(video).name} with {Path(model).name} ran past {timeout:.0f} s") from None
    exit_s = time.perf_counter() - t0
    if child.returncode != 0 or not n:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise TrtcError(f"{way}: {Path(video).name} with {Path(model).name} failed (exit {child.returncode}): "
                        f"{tail[0]}", "run the same command by hand to see the whole error")
    return {"first_s": round(first, 3), "last_s": round(last, 3), "exit_s": round(exit_s, 3), "predictions": n}


def job_rows(video: str, models: list, device: str, runs: int = 4, ways=WAYS) -> list:
    """A :class:`JobRow` per model and way, each from ``runs`` fresh processes (the ways alternate within a
    model, so that a slow spell of the machine falls on both)."""
    if runs < 1:
        raise UsageProblem(f"--runs must be at least 1, got {runs}")
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        raise UsageProblem(f"unknown way {unknown[0]!r}", f"use one of: {', '.join(WAYS)}")
    rows = []
    for model in models:
        each = {w: [] for w in ways}
        for _ in range(runs):
            for w in ways:
                each[w].append(one_job(w, video, model, device))
        for w in ways:
            med = {k: round(statistics.median(r[k] for r in each[w]), 3) for k in ("first_s", "last_s", "exit_s")}
            counts = {r["predictions"] for r in each[w]}
            if len(counts) != 1:
                raise TrtcError(f"{w}: the runs gave different numbers of predictions ({sorted(counts)})")
            rows.append(JobRow(w, model, device, runs, predictions=counts.pop(), each=each[w], **med))
    return rows


def render(rows: list) -> str:
    head = f"{'way':<9} {'model':<28} {'device':<8} {'runs':>4} {'first s':>8} {'last s':>8} {'exit s':>8} {'preds':>6}"
    lines = [head]
    for r in rows:
        lines.append(f"{r.way:<9} {Path(r.model).name[:28]:<28} {r.device:<8} {r.runs:>4} {r.first_s:>8.2f} "
                     f"{r.last_s:>8.2f} {r.exit_s:>8.2f} {r.predictions:>6}")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m toolchain.bench_job", description=__doc__.split("\n\n")[0])
    p.add_argument("video")
    p.add_argument("--model", action="append", required=True, help="a model (repeat for several)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--runs", type=int, default=4, help="fresh processes per model and way [4]")
    p.add_argument("--way", action="append", choices=WAYS, help="run, classify or both (the default)")
    p.add_argument("--json", help="write the rows (medians and each run) to this file")
    a = p.parse_args(argv)
    try:
        rows = job_rows(a.video, a.model, a.device, a.runs, tuple(a.way or WAYS))
    except TrtcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(render(rows))
    if a.json:
        from engines._io import atomic_write_text

        atomic_write_text(a.json, json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
