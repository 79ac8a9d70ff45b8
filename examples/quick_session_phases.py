"""Where the start of ONNX Runtime's quick session goes, in fresh processes, one per variant and repeat:

    python examples/quick_session_phases.py lite0.fp16.onnx --repeat 3 --json phases.json     # [GPU]

Each child stamps, from its own start: ``import onnxruntime``, ``preload_dlls``, CuPy's import and the CUDA context, the
model's preparation, the session's creation and four runs at batch 64 on zeros (device buffers, a stream of its own,
cuDNN's default algorithms: the quick session's options). Variants:

- ``file``: the model itself;
- ``rewrite``: the copy with its depthwise convolutions as multiply-adds, made in the process (onnx, the rewrite);
- ``kept``: the copy as ONNX Runtime optimized it, saved by a first process and loaded unoptimized (what
  engines._quick_model.quick_session does from the second start on).

A table of the medians (seconds from the child's start) is printed; ``--json`` writes every child's stamps."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r'''
import json, sys, time
t0 = float(sys.argv[1]); variant, model, kept = sys.argv[2:5]
stamps = {}
def stamp(name): stamps[name] = round(time.time() - t0, 4)
import onnxruntime as ort; stamp("import_ort")
ort.preload_dlls(); stamp("preload")
import cupy as cp
cp.cuda.Device(0).use(); stream = cp.cuda.Stream(non_blocking=True); stamp("cupy_ctx")
from engines.ort_session import session_options
options = session_options(ort, None, True, spin=True)
if variant in ("rewrite", "save"):
    from engines._quick_model import depthwise_as_taps
    source = depthwise_as_taps(model)
    if variant == "save":
        options.optimized_model_filepath = kept
elif variant == "kept":
    source = kept
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
else:
    source = model
stamp("model")
cuda = {"device_id": 0, "cudnn_conv_algo_search": "DEFAULT", "user_compute_stream": str(stream.ptr)}
session = ort.InferenceSession(source, sess_options=options, providers=[("CUDAExecutionProvider", cuda)])
stamp("create")
inp, out = session.get_inputs()[0], session.get_outputs()[0]
dtype = "float16" if "16" in inp.type else "float32"
with stream:
    x, y = cp.zeros((64, 3, 224, 224), dtype), cp.empty((64, 1000), dtype)
run_options = ort.RunOptions()
run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
for i in range(4):
    io = session.io_binding()
    io.bind_input(inp.name, "cuda", 0, x.dtype, x.shape, x.data.ptr)
    io.bind_output(out.name, "cuda", 0, y.dtype, y.shape, y.data.ptr)
    session.run_with_iobinding(io, run_options)
    stream.synchronize()
    stamp(f"run{i + 1}")
print(json.dumps(stamps))
'''
VARIANTS = ("file", "rewrite", "kept")
COLUMNS = ("import_ort", "preload", "cupy_ctx", "model", "create", "run1", "run2", "run4")


def child(variant: str, model: str, kept: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", CHILD, str(time.time()), variant, model, kept], capture_output=True,
                          text=True, timeout=300, env=env)
    if done.returncode:
        sys.exit(f"{variant}: the child failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kept = os.path.join(tmp, "kept.onnx")
        child("save", a.model, kept)
        rows = {v: [] for v in VARIANTS}
        for _ in range(a.repeat):  # the variants alternate, so that a slow spell falls on each
            for v in VARIANTS:
                rows[v].append(child(v, a.model, kept))
    print(f"{'variant':<8} " + " ".join(f"{c:>10}" for c in COLUMNS) + "   (medians, s from the process start)")
    for v, each in rows.items():
        print(f"{v:<8} " + " ".join(f"{statistics.median(e[c] for e in each):>10.3f}" for c in COLUMNS))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": os.path.basename(a.model), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
