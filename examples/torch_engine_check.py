"""The compiled PyTorch engine on a GPU, measured: start-up (cold, then with the cache beside the model), where a
start goes, and img/s at batch 64 FP16 with device-resident input against a plain torch.compile of the same program.

    python3 examples/torch_engine_check.py --workdir /tmp/tec            # ResNet-50 (random weights) and Lite0

Exports each model once (trtc export --program, batch 1:64:64), then per model: a fresh process with empty caches
(first start), a fresh process whose Inductor cache is empty but whose model folder holds trtc's cache (second
start), then throughput in this process. Prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODELS = {"resnet50": ["torchvision:resnet50", "--random-weights"], "lite0": ["pretrained:efficientnet-lite0"]}
START = """
import json, sys, time
t0 = time.perf_counter()
import cupy as cp
import engines
# no quick start: the first batch is the compiled function's, as before it
e = engines.open_engine(sys.argv[1], device="cuda:0", precision="fp16", quick_start=False)
t1 = time.perf_counter()
x = cp.zeros((int(sys.argv[2]), 3, 224, 224), cp.float16)
cp.asnumpy(e.infer(x)[0])
st = list(e.compile_stats.values())[0]
print(json.dumps({"total_s": time.perf_counter() - t0, "open_s": t1 - t0, "first_batch_s": time.perf_counter() - t1,
                  "cache_file": st["cache_file"], "inductor_hit": st["inductor_cache_hit"], **e.timings}))
"""


def export(name: str, workdir: Path) -> Path:
    onnx = workdir / f"{name}.onnx"
    if not (workdir / f"{name}.pt2").exists():
        subprocess.run([sys.executable, "-m", "toolchain", "-q", "export", *MODELS[name], "-o", str(onnx), "--batch",
                        "1:64:64", "--program", "--force"], check=True, cwd=ROOT)
    return workdir / f"{name}.pt2"


def start(pt2: Path, batch: int, inductor_dir: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor_dir, "TRITON_CACHE_DIR": f"{inductor_dir}/triton",
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", START, str(pt2), str(batch)], capture_output=True, text=True, env=env,
                         check=False)
    if out.returncode:
        sys.exit(out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def throughput(fn, x, seconds: float = 3.0) -> float:
    """Images per second of ``fn(x)`` on the current stream, after a warm-up, by wall time with a final sync."""
    import torch

    for _ in range(10):
        fn(x)
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            fn(x)
        n += 20
        torch.cuda.synchronize()
    return n * x.shape[0] / (time.perf_counter() - t0)


def speeds(pt2: Path, batch: int) -> dict:
    """trtc's engine (NCHW and NHWC device input, on its own stream) and torch.compile(mode="reduce-overhead") of
    the same program, FP16 channels_last, its input resident and channels_last."""
    import cupy as cp
    import torch

    import engines

    eng = engines.open_engine(pt2, device="cuda:0", precision="fp16")
    x = cp.random.standard_normal((batch, 3, 224, 224)).astype(cp.float16)
    nhwc = cp.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    s = eng.stream
    out = {"trtc NCHW": throughput(lambda a: eng.infer(a, stream=s), x),
           "trtc NHWC": throughput(lambda a: eng.infer(a, stream=s), nhwc)}
    eng.close()
    module = torch.export.load(str(pt2)).module()
    module._forward_pre_hooks.clear()  # the program's input checks (as the engine does)
    module = module.cuda().half().to(memory_format=torch.channels_last)
    compiled = torch.compile(module, mode="reduce-overhead")
    xt = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    with torch.no_grad():
        out["torch.compile"] = throughput(compiled, xt)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--models", default="resnet50,lite0")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="trtc-torch-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        pt2 = export(name, workdir)
        for old in workdir.glob(f"{name}.pt2.inductor/*"):
            old.unlink()  # a cold first start
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            first, second = start(pt2, args.batch, a), start(pt2, args.batch, b)
            warm = start(pt2, args.batch, b)  # Inductor's own cache warm too
        rows.append((name, first, second, warm, speeds(pt2, args.batch)))
    print(f"batch {args.batch}, FP16, device-resident input; starts are open + first batch in a fresh process")
    print(f"{'model':9} {'first s':>8} {'second s':>9} {'ratio':>6} {'warm s':>7} {'trtc NCHW':>10} {'trtc NHWC':>10} "
          f"{'torch.compile':>14} {'best/compile':>13}")
    for name, first, second, warm, sp in rows:
        best = max(sp["trtc NCHW"], sp["trtc NHWC"])
        print(f"{name:9} {first['total_s']:8.1f} {second['total_s']:9.1f} {second['total_s'] / first['total_s']:6.0%} "
              f"{warm['total_s']:7.2f} {sp['trtc NCHW']:10.0f} {sp['trtc NHWC']:10.0f} {sp['torch.compile']:14.0f} "
              f"{best / sp['torch.compile']:12.2f}x")
        print(f"  second start: cache file {second['cache_file']}, Inductor hit {second['inductor_hit']}; "
              + ", ".join(f"{k} {v:.2f}" for k, v in second.items() if k.endswith("_s")))
        print("  warm start: " + ", ".join(f"{k} {v:.2f}" for k, v in warm.items() if k.endswith("_s")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
