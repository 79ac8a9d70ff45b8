"""`trtc run`: classify video sources and write one JSON line per classified frame.

    summary = run_video(["cam1.mp4", "cam2.mp4"], "model.onnx", device="cuda:0", output="preds.jsonl")

A thin layer over :func:`engines.video.classify`: picks the device, opens the engine, streams predictions to the
output (stdout or a file written atomically: a temporary file renamed at the end, also when a source failed, so
every result computed is kept), and returns a summary with per-source counts and problems.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engines.video import default_device

from ._ui import Reporter
from .errors import UsageProblem


@dataclass
class RunSummary:
    model: str
    device: str
    decoder: str
    sources: list[str]
    frames: int
    batches: int
    seconds: float
    fps: float
    mean_batch: float
    per_source: dict
    problems: list[dict]
    output: str | None
    latency_ms: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def pick_device(device: str) -> str:
    """"auto": cuda:0 when there is an NVIDIA GPU and the GPU video stack (CuPy, PyNvVideoCodec) is installed."""
    if device != "auto":
        return device
    return default_device()


def run_video(sources, model, *, device: str = "auto", batch: int | None = None, top_k: int = 5, stride: int = 1,
              output: str | None = None, decoder: str = "auto", colorspace: str | None = None, scores: str = "auto",
              max_wait_ms: float = 100.0, loop: int = 1, realtime: bool = False, latency: str = "native",
              with_latency: bool = False, force: bool = False, reporter: Reporter | None = None,
              stream=None) -> RunSummary:
    """Classify ``sources`` with ``model``; predictions go to ``output`` (a .jsonl path) or ``stream``."""
    import numpy as np

    import engines
    from engines.video import classify

    reporter = reporter or Reporter()
    sources = [os.fspath(s) for s in sources]
    if not sources:
        raise UsageProblem("no video sources given", "trtc run clip.mp4 --model model.onnx")
    out_path = Path(output) if output and output != "-" else None
    if out_path is not None and out_path.exists() and not force:
        raise UsageProblem(f"{out_path} exists", "add --force to overwrite it, or give another -o")
    device = pick_device(device)
    engine = engines.open_engine(model, device=device)
    try:
        run = classify(sources, engine, batch=batch, top_k=top_k, stride=stride, decoder=decoder,
                       colorspace=colorspace, scores=scores, max_wait_ms=max_wait_ms, loop=loop,
                       realtime=realtime, latency=latency)
        tmp = None
        if out_path is not None:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
            sink = tmp.open("w")
        else:
            sink = stream or sys.stdout
        latencies = []
        t0 = time.perf_counter()
        try:
            with reporter.phase(f"classifying {len(sources)} source(s) on {device}") as bar:
                last = 0.0
                for i, pred in enumerate(run, 1):
                    sink.write(json.dumps(pred.to_dict(latency=with_latency)) + "\n")
                    if pred.latency_ms is not None:
                        latencies.append(pred.latency_ms)
                    bar.advance()
                    now = time.perf_counter()
                    if now - last > 0.5:
                        bar.describe(f"{i} frames, {i / max(now - t0, 1e-9):.0f} fps")
                        last = now
        finally:
            if tmp is not None:
                sink.close()
                os.replace(tmp, out_path)  # keep every result written, also after a failure
            else:
                sink.flush()
        stats = run.stats.to_dict()
        lat = {}
        if latencies:
            a = np.asarray(latencies)
            lat = {"p50": round(float(np.percentile(a, 50)), 2), "p99": round(float(np.percentile(a, 99)), 2),
                   "max": round(float(a.max()), 2)}
        return RunSummary(model=str(model), device=device, decoder=stats["path"].split(" ")[0], sources=sources,
                          frames=stats["frames"], batches=stats["batches"], seconds=stats["seconds"],
                          fps=stats["fps"], mean_batch=stats["mean_batch"], per_source=stats["per_source"],
                          problems=[{"source": p.source, "reason": p.reason, "frames": p.frames}
                                    for p in run.problems],
                          output=str(out_path) if out_path else None, latency_ms=lat)
    finally:
        engine.close()
