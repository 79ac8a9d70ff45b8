"""What `trtc validate --layers` costs on EfficientNet-Lite0 (docs/VALIDATE.md uses these numbers): wall time and
peak memory of the whole command, with and without --layers, for the FP16 and the plain INT8 model, 16 inputs.

    python examples/layers_cost.py [--samples 16] [--folder DIR] [--json layers_cost.json]

Makes lite0.onnx (trtc export), lite0.fp16.onnx and lite0.int8.onnx (trtc quantize, calibrated on bikes.mp4) in
DIR (a temporary folder by default; kept and reused when given), then runs each `trtc validate` in a process of its
own and reads its peak resident memory from the kernel (wait4). Prints a table and writes JSON.
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


def _models(folder: Path) -> dict[str, Path]:
    from toolchain.datasets import copy_sample_data
    from toolchain.export import export_onnx
    from toolchain.quantize import quantize_onnx

    data = copy_sample_data(folder)
    ref = folder / "lite0.onnx"
    if not ref.exists():
        export_onnx("pretrained:efficientnet-lite0", ref, check_data=[str(p) for p in data["files"][1:]])
    out = {"reference": ref, "video": data["video"]}
    for precision, extra in (("fp16", {"check": [str(data["video"])]}),
                             ("int8", {"calib": [str(data["video"])], "calib_count": 64})):
        path = folder / f"lite0.{precision}.onnx"
        if not path.exists():
            quantize_onnx(ref, path, precision=precision, **extra)
        out[precision] = path
    return out


def _run(args: list[str], cwd: Path) -> dict:
    """One trtc command in its own process: wall seconds, peak resident MB and exit code."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "toolchain", *args], cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return {"seconds": round(wall, 2), "peak_mb": round(usage.ru_maxrss / 1024, 1), "exit": p.returncode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--folder")
    ap.add_argument("--json", default="layers_cost.json")
    a = ap.parse_args()
    folder = Path(a.folder) if a.folder else Path(tempfile.mkdtemp(prefix="trtc-layers-"))
    folder.mkdir(parents=True, exist_ok=True)
    m = _models(folder)
    rows = []
    for precision in ("fp16", "int8"):
        base = ["validate", "--reference", m["reference"].name, "--candidate", m[precision].name, "--data",
                m["video"].name, "--count", str(a.samples)]
        plain = _run(base, folder)
        layers = _run(base + ["--layers", "--layer-samples", str(a.samples), "--json", "layers.json", "--force"],
                      folder)
        report = json.loads((folder / "layers.json").read_text())["candidates"][0]["layers"]
        rows.append({"candidate": m[precision].name, "samples": a.samples, "layers": report["matched"],
                     "validate": plain, "validate_layers": layers,
                     "layers_seconds": report["seconds"]})
    result = {"cpu_count": os.cpu_count(), "threads": os.environ.get("TRTC_CPU_THREADS"), "rows": rows,
              "load_average": os.getloadavg()}
    print(f"{'candidate':<18} {'layers':>6} {'validate s':>10} {'+ --layers s':>12} {'per-layer part s':>16} "
          f"{'peak MB':>8} {'peak MB --layers':>16}")
    for r in rows:
        print(f"{r['candidate']:<18} {r['layers']:>6} {r['validate']['seconds']:>10} "
              f"{r['validate_layers']['seconds']:>12} {r['layers_seconds']:>16} {r['validate']['peak_mb']:>8} "
              f"{r['validate_layers']['peak_mb']:>16}")
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
