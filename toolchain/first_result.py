"""Time to first result of `trtc run`, in a fresh Python process: `trtc bench VIDEO` reports it.

    first_result("lite0.fp16.onnx", "bikes.mp4", "cuda:0", 64)
    # {"first": {"import_s": .., "open_s": .., "first_result_s": ..}, "warm": {...}, ...}

Each run is a new interpreter (nothing warm in the process; what is cached on disk stays: the OS page cache,
CUDA's kernel cache, ONNX Runtime's or Inductor's caches), which imports ``engines`` (timed on its own), then times
from just before ``engines.open_engine(model, device)`` (the engine's default options, as `trtc run` opens it)
to the first Prediction of ``engines.video.classify([video], engine, batch=batch)``. It runs twice: the second
run is the one whose caches are warm.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from engines.errors import TrtcError

from ._env import checkout_env

MARK = "TRTC_FIRST_RESULT "  # the child's answer line (PyNvVideoCodec can print on stdout too)
# the child: time the import of engines before anything else is imported, then run child()
CHILD = ("import time; t = time.perf_counter(); import engines, engines.video; i = time.perf_counter() - t; "
         "from toolchain.first_result import child; child(i)")


def child(import_s: float) -> None:
    """In the fresh process: ``sys.argv[1:]`` is model, video, device, batch; prints one :data:`MARK` line."""
    import engines
    from engines.video import classify

    model, video, device, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    t0 = time.perf_counter()
    engine = engines.open_engine(model, device=device)
    t1 = time.perf_counter()
    frames = iter(classify([video], engine, batch=batch, top_k=5))
    pred = next(frames, None)
    t2 = time.perf_counter()
    frames.close()
    engine.close()
    if pred is None:
        raise SystemExit(f"{video} gave no prediction")
    print(MARK + json.dumps({"import_s": round(import_s, 4), "open_s": round(t1 - t0, 4),
                             "first_result_s": round(t2 - t0, 4)}), flush=True)


def _one(model: str, video: str, device: str, batch: int, timeout: float) -> dict:
    env = checkout_env()  # this trtc, whatever is installed
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, model, video, device, str(batch)], capture_output=True,
                           text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise TrtcError(f"time to first result: the fresh process took over {timeout:.0f} s",
                        "run trtc run VIDEO --model M to see where it waits, or give --no-first-result") from None
    lines = [line for line in p.stdout.splitlines() if line.startswith(MARK)]
    if p.returncode != 0 or not lines:
        why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        raise TrtcError(f"time to first result: the fresh process failed: {why}",
                        f"run trtc run {video} --model {model} --device {device} to see the error, or give "
                        "--no-first-result")
    return json.loads(lines[-1][len(MARK):])


def first_result(model: str, video: str, device: str, batch: int, runs: int = 2, timeout: float = 600.0) -> dict:
    """``runs`` fresh processes in a row (see the module): the first, the last ("warm": caches on disk warm), and
    every run."""
    got = [_one(str(model), str(video), device, batch, timeout) for _ in range(runs)]
    return {"first": got[0], "warm": got[-1], "runs": got, "batch": batch, "device": device,
            "measures": "fresh process: import engines; then engines.open_engine -> first Prediction of "
                        "engines.video.classify"}


__all__ = ["first_result", "child"]
