"""Check an edge install (``pip install "trtc[edge]"`` in a clean venv) on its GPU: NVDEC decodes frames of VIDEO,
trtc's preprocessing kernel (compiled at run time by NVRTC, through CuPy) writes them into a device buffer, and
each frame is checked against the numpy reference of the same maths. Then it lists where every CUDA library the
process loaded comes from: on a box with only the driver, NVRTC and the CUDA runtime must come from the venv's own
wheels (``cuda-toolkit[nvrtc,cudart]``), never from a system CUDA toolkit.

    python examples/edge_check.py clip.mp4 [--frames 16] [--json]

Exit 0 when the kernel matches (max |difference| < 1e-5 in FP32) and NVRTC and the CUDA runtime were loaded from
inside this Python environment; 1 otherwise, saying what failed. The engine itself is not run: it needs a plan,
which only full TensorRT builds (``trtc build --version-compatible``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def cuda_libraries() -> dict:
    """{library file name: path} of the CUDA libraries mapped into this process (from /proc/self/maps)."""
    found = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if "/" in line else ""
            name = os.path.basename(path)
            if name.startswith(("libnvrtc", "libcudart", "libcuda.", "libnvcuvid", "libnvidia-encode", "libcublas",
                                "libnvinfer")):
                found.setdefault(name, os.path.realpath(path))
    return found


def check(video: str, frames: int) -> dict:
    import cupy as cp
    import numpy as np

    from engines.preprocess import GpuPreprocessor, PreprocessSpec, planes_from_surface, preprocess_yuv
    from engines.video.sources import NvdecSource, surface_format

    spec = PreprocessSpec()  # ImageNet-style: RGB, short side 256, crop 224
    pre = GpuPreprocessor(spec)
    src = NvdecSource(video)
    stream = cp.cuda.Stream(non_blocking=True)
    out = cp.empty((1, 3, *spec.size), cp.float32)
    worst, n = 0.0, 0

    def one(_i, _pts, _t, frame, _fed):
        nonlocal worst, n
        fmt = surface_format(frame)
        surface = cp.from_dlpack(frame)
        info = src.info
        plan = pre.plan(fmt, surface.shape, surface.dtype, info.height, info.width, info.colorspace, np.float32)
        pre.launch(plan, [surface.data.ptr], out.data.ptr, stream)
        host = cp.asnumpy(surface, stream=stream)  # the check's own copy, for the numpy reference
        got = cp.asnumpy(out, stream=stream)[0]
        want = preprocess_yuv(planes_from_surface(host, fmt, info.height, info.width), spec, info.colorspace,
                              np.float32)
        worst = max(worst, float(np.abs(got - want).max()))
        n += 1
        return n < frames

    with stream:
        src.run(stream.ptr, one)
    stream.synchronize()
    cs = src.info.colorspace if src.info is not None else None
    return {"frames": n, "max_abs_diff": worst, "format": src._what, "nvrtc": cp.cuda.nvrtc.getVersion(),
            "colorspace": f"{cs.matrix}:{cs.range}" if cs is not None else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("video")
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    result = check(a.video, a.frames)
    libs = cuda_libraries()
    prefix = os.path.realpath(sys.prefix)
    own = {k: v.startswith(prefix + os.sep) for k, v in libs.items()}
    need = [k for k in libs if k.startswith(("libnvrtc", "libcudart"))]
    problems = []
    if result["frames"] == 0:
        problems.append("no frame was decoded")
    if result["max_abs_diff"] >= 1e-5:
        problems.append(f"the kernel differs from the numpy reference by {result['max_abs_diff']:.2e}")
    if not any(k.startswith("libnvrtc") for k in need):
        problems.append("NVRTC was not loaded (the kernel was not compiled here?)")
    problems += [f"{k} came from {libs[k]}, outside this environment ({prefix})" for k in need if not own[k]]
    report = dict(result, python=sys.executable, prefix=prefix, libraries=libs, problems=problems)
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{result['frames']} frames of {result['format']} ({result['colorspace']}): kernel vs numpy max |diff| "
              f"{result['max_abs_diff']:.2e}; NVRTC {result['nvrtc']}")
        for k, v in sorted(libs.items()):
            print(f"  {k:28s} {v}{'' if own[k] else '   (outside the environment)'}")
        print("ok" if not problems else "FAILED: " + "; ".join(problems))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
