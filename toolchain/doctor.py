"""`trtc doctor`: what this machine can do, and the install line for what it cannot.

Versions come from package metadata (no import); a package is imported only where the question needs it
(ONNX Runtime's providers, TensorRT's version, NVDEC's capabilities), and a broken import is reported, not
raised.
"""

from __future__ import annotations

import platform
import sys

from engines import _deps
from engines._deps import dist_version, install_tested, is_installed, is_tested, tested_range, untested_message

PACKAGES = [
    # (shown name, module, distributions that provide it)
    ("torch", "torch", ["torch"]),
    ("torchvision", "torchvision", ["torchvision"]),
    ("onnx", "onnx", ["onnx"]),
    ("onnxscript", "onnxscript", ["onnxscript"]),
    ("onnxruntime", "onnxruntime", ["onnxruntime", "onnxruntime-gpu"]),
    ("tensorrt", "tensorrt", ["tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu13-bindings",
                              "tensorrt-cu12-bindings"]),
    ("tensorrt_rtx", "tensorrt_rtx", ["tensorrt-rtx", "tensorrt-rtx-cu13-bindings", "tensorrt-rtx-cu12-bindings"]),
    ("tensorrt_lean", "tensorrt_lean", ["tensorrt-lean", "tensorrt-lean-cu13-bindings", "tensorrt-lean-cu12-bindings"]),
    ("tensorrt_dispatch", "tensorrt_dispatch", ["tensorrt-dispatch", "tensorrt-dispatch-cu13-bindings",
                                                "tensorrt-dispatch-cu12-bindings"]),
    ("cupy", "cupy", ["cupy-cuda13x", "cupy-cuda12x", "cupy"]),
    ("PyNvVideoCodec", "PyNvVideoCodec", ["pynvvideocodec", "PyNvVideoCodec"]),
    ("av (PyAV)", "av", ["av"]),
    ("opencv (cv2)", "cv2", ["opencv-python", "opencv-python-headless", "opencv-contrib-python",
                             "opencv-contrib-python-headless"]),
    ("timm", "timm", ["timm"]),
    ("ray", "ray", ["ray"]),
    ("pyyaml", "yaml", ["PyYAML", "pyyaml"]),
    ("paho-mqtt", "paho.mqtt.client", ["paho-mqtt"]),
    ("prometheus-client", "prometheus_client", ["prometheus-client", "prometheus_client"]),
]
# the TensorRT flavours: module shown -> engines._trt flavour (imported to read the version: loads the libraries,
# makes no CUDA call, so it answers on a machine without a GPU too)
TRT_MODULES = {"tensorrt": "tensorrt", "tensorrt_rtx": "tensorrt-rtx", "tensorrt_lean": "tensorrt-lean",
               "tensorrt_dispatch": "tensorrt-dispatch"}
CODECS = [("H264", "420", 8), ("HEVC", "420", 8), ("HEVC", "420", 10), ("AV1", "420", 8), ("VP9", "420", 8)]


def packages() -> dict:
    out = {}
    for shown, module, dists in PACKAGES:
        version = dist_version(*dists)
        info = {"version": version, "module": module}
        if module == "onnxruntime":
            cpu, gpu = dist_version("onnxruntime"), dist_version("onnxruntime-gpu")
            info["distributions"] = {"onnxruntime": cpu, "onnxruntime-gpu": gpu}
            if cpu and gpu:
                info["note"] = ("onnxruntime AND onnxruntime-gpu are both installed: they share one module; "
                                "uninstall both, then install only one")
            if version:
                try:
                    import onnxruntime

                    info["providers"] = onnxruntime.get_available_providers()
                    info.setdefault("note", "providers: " + ", ".join(p.replace("ExecutionProvider", "")
                                                                      for p in info["providers"]))
                except Exception as exc:
                    info["import_error"] = f"{type(exc).__name__}: {exc}"
                    info["note"] = f"import failed: {exc}"
        elif module == "cv2" and version:
            try:
                from engines.opencv_engine import cuda_status, dnn_engines

                status = cuda_status()
                info["version"] = status["version"]  # the imported module's, whichever wheel provides it
                info["dnn_cuda"] = status["dnn_cuda"]
                info["cuda_devices"] = status["devices"]
                info["dnn_cuda_reason"] = status["reason"]
                info["note"] = (f"dnn CUDA: {'yes' if status['dnn_cuda'] else 'no'} "
                                f"({max(status['devices'], 0)} devices)"
                                + ("" if status["dnn_cuda"] else f"; {status['reason']}"))
                info["dnn_engines"] = list(dnn_engines())
            except Exception as exc:  # noqa: BLE001 - a broken cv2 is reported, not raised
                info["import_error"] = f"{type(exc).__name__}: {exc}"
                info["note"] = f"import failed: {str(exc)[:80]}"
        elif module == "cupy" and version:
            info.update(cupy_nvrtc())
        elif module == "torch" and version:
            info.update(bytecode_status("torch"))
            if info.get("bytecode"):
                info["note"] = f"bytecode {info['bytecode']}"
        elif module in TRT_MODULES:
            from engines._trt import installed

            mod = installed(TRT_MODULES[module])
            if mod:
                info["import_as"] = mod
                try:
                    m = __import__(mod)
                    info["version"] = getattr(m, "__version__", version)
                    info["note"] = f"import {mod}"
                except Exception as exc:
                    info["import_error"] = f"{type(exc).__name__}: {exc}"
                    info["note"] = f"import {mod} failed: {str(exc)[:80]}"
        _tested(module, info)
        out[shown] = info
    return out


def _tested(module: str, info: dict) -> None:
    """``tested`` (whether the installed release is one trtc is tested with) and ``tested_range`` for the packages
    of engines._deps.TESTED; an untested release leads the note, with the line that installs a tested one."""
    if module not in _deps.TESTED or not info.get("version"):
        return
    info["tested_range"] = tested_range(module)
    info["tested"] = is_tested(module, info["version"])
    if not info["tested"]:
        info["note"] = "; ".join(filter(None, [f"{untested_message(module, info['version'])}: "
                                               f"{install_tested(module)}", info.get("note")]))


# modules whose cached bytecode stands for a package's: its own __init__ and, where they exist, the parts a start of
# the compiled PyTorch engine imports (Dynamo, Inductor)
BYTECODE_SAMPLES = ("__init__.py", "_dynamo/__init__.py", "_inductor/__init__.py", "nn/modules/conv.py")


def bytecode_status(module: str) -> dict:
    """Whether ``module``'s package has cached bytecode, without importing it: ``bytecode`` is "cached" (every
    sample has its .pyc where this Python looks: __pycache__, or PYTHONPYCACHEPREFIX), "written at first import"
    (missing, but this Python writes it), or "missing" (missing, and PYTHONDONTWRITEBYTECODE or a read-only folder
    keeps it so: every start compiles the source again); ``package_dir`` says where."""
    import importlib.util
    import os

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return {}
    folder = os.path.dirname(spec.origin)
    sources = [p for p in (os.path.join(folder, s) for s in BYTECODE_SAMPLES) if os.path.exists(p)]
    caches = [importlib.util.cache_from_source(p) for p in sources]
    if all(os.path.exists(c) for c in caches):
        return {"bytecode": "cached", "package_dir": folder}

    def writable(cache: str) -> bool:
        d = os.path.dirname(cache)
        while not os.path.exists(d):  # the folder Python would make
            d = os.path.dirname(d)
        return os.access(d, os.W_OK)

    missing = [c for c in caches if not os.path.exists(c)]
    written = not sys.dont_write_bytecode and all(writable(c) for c in missing)
    return {"bytecode": "written at first import" if written else "missing", "package_dir": folder}


def cupy_nvrtc() -> dict:
    """Whether CuPy's kernel compiler (NVRTC) loads: trtc's GPU preprocessing compiles its kernel at run time, and
    cupy-cuda13x does not bring CUDA's NVRTC library (a driver-only box lacks it). The call needs no GPU. Returns
    {"nvrtc": version, "note"} or {"nvrtc_error", "note"}, or {"import_error", "note"} when CuPy does not import."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken install is reported, not raised
        return {"import_error": f"{type(exc).__name__}: {exc}", "note": f"import failed: {str(exc)[:80]}"}
    try:
        from cupy.cuda import nvrtc

        version = nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001 - DynamicLibNotFoundError (libnvrtc.so.13 not found) and the like
        first = (str(exc).splitlines() or [""])[0][:160]
        return {"nvrtc_error": f"{type(exc).__name__}: {first}" if first else type(exc).__name__,
                "note": "kernel compiler (NVRTC) does not load"}
    shown = ".".join(str(v) for v in version) if isinstance(version, (tuple, list)) else str(version)
    return {"nvrtc": shown, "note": f"kernel compiler: NVRTC {shown}"}


def gpus() -> dict:
    from engines._gpu import gpus as _gpus

    return _gpus()


def nvdec_caps() -> dict:
    """NVDEC limits per codec from PyNvVideoCodec, where it and a GPU are present."""
    if not is_installed("PyNvVideoCodec"):
        return {}
    try:
        import PyNvVideoCodec as nvc
    except Exception as exc:
        return {"error": f"import failed: {exc}"}
    # the pybind11 enum names its members "420", "422", "444" (not attribute names): look them up by name
    members = getattr(nvc.cudaVideoChromaFormat, "__members__", {})
    out = {}
    for codec, fmt, depth in CODECS:
        key = f"{codec} {fmt} {depth}-bit"
        try:
            chroma = members.get(fmt) or members[f"YUV{fmt}"]
            caps = nvc.GetDecoderCaps(gpuid=0, codec=getattr(nvc.cudaVideoCodec, codec), chromaformat=chroma,
                                      bitdepth=depth)
            out[key] = (f"up to {caps.get('width_max')}x{caps.get('height_max')}, "
                        f"{caps.get('num_decoder_engines')} engine(s)") if caps.get("supported") else "not supported"
        except Exception as exc:
            out[key] = f"query failed: {str(exc)[:60]}"
    return out


def features(pk: dict, gpu: dict) -> list[dict]:
    """What this machine can run, a row per feature: ok, or the reason and the fix."""
    has = {name: bool(info.get("version")) and not info.get("import_error") for name, info in pk.items()}
    rows = []

    def row(feature, ok, reason, fix):
        rows.append({"feature": feature, "ok": bool(ok), "reason": "" if ok else reason, "fix": "" if ok else fix})

    for group in (_decode_and_onnx_rows, _runtime_rows, _tensorrt_rows):
        group(row, has, pk, gpu)
    return rows


def _decode_and_onnx_rows(row, has: dict, pk: dict, gpu: dict) -> None:
    providers = pk.get("onnxruntime", {}).get("providers", [])
    have_gpu = bool(gpu.get("devices"))
    both_ort = bool(pk.get("onnxruntime", {}).get("distributions", {}).get("onnxruntime")) and bool(
        pk.get("onnxruntime", {}).get("distributions", {}).get("onnxruntime-gpu"))
    export_missing = [n for n in ("torch", "torchvision", "onnx", "onnxscript") if not has[n]]
    row("trtc export (PyTorch -> ONNX)", not export_missing, "missing " + ", ".join(export_missing),
        'pip install "trtc[export]"')
    row("ONNX Runtime on CPU (export check; FP32/FP16/INT8 ONNX)", has["onnxruntime"], "onnxruntime not installed",
        'pip install "trtc[cpu]"')
    cuda_ep = "CUDAExecutionProvider" in providers
    fix = ("pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu" if both_ort else
           'pip uninstall -y onnxruntime && pip install "trtc[gpu]"' if have_gpu else "needs an NVIDIA GPU")
    row("ONNX Runtime on GPU (CUDA EP)", cuda_ep and have_gpu,
        "NVIDIA GPU missing" if not have_gpu else "onnxruntime has no CUDAExecutionProvider", fix)
    nvrtc_error = pk.get("cupy", {}).get("nvrtc_error") if has["cupy"] else None
    if nvrtc_error:  # CuPy imports, but its kernel compiler does not load (no GPU needed to know)
        row("GPU preprocessing (CuPy)", False, f"CuPy's kernel compiler (NVRTC) does not load: {nvrtc_error}",
            'pip install "cuda-toolkit[nvrtc,cudart]==13.0.*" (CUDA 13\'s NVRTC and runtime from PyPI, which the edge '
            "extra installs)" if dist_version("cupy-cuda13x") else
            "install the NVRTC library of CuPy's CUDA version (a CUDA toolkit, or NVIDIA's nvrtc wheel for it)")
    else:
        row("GPU preprocessing (CuPy)", has["cupy"] and have_gpu,
            "NVIDIA GPU missing" if not have_gpu else "cupy not installed",
            'pip install "trtc[gpu]"' if have_gpu else "needs an NVIDIA GPU")
    row("NVDEC video decode (PyNvVideoCodec)", has["PyNvVideoCodec"] and have_gpu,
        "NVIDIA GPU missing" if not have_gpu else "PyNvVideoCodec not installed",
        'pip install "trtc[gpu]"' if have_gpu else "needs an NVIDIA GPU")
    row("CPU video decode (PyAV)", has["av (PyAV)"], "av not installed", 'pip install "trtc[video-cpu]"')
    n_gpus = len(gpu.get("devices", []))
    stack = has["cupy"] and has["PyNvVideoCodec"]
    row("Several GPUs of this host (run --device cuda:all, bench --devices)", n_gpus >= 2 and stack,
        "no NVIDIA GPU" if not n_gpus else "this host has 1 GPU" if n_gpus == 1 else "cupy or PyNvVideoCodec not "
        "installed", 'pip install "trtc[gpu]"' if n_gpus >= 2 else "needs a host with two or more NVIDIA GPUs; "
        "trtc run --ray spreads sources over the GPUs of several hosts")


def _runtime_rows(row, has: dict, pk: dict, gpu: dict) -> None:
    torch_info = pk.get("torch", {})
    row("Compiled PyTorch engine: quick restarts (torch's bytecode cached)",
        has["torch"] and torch_info.get("bytecode") != "missing",
        "torch not installed" if not has["torch"] else
        "torch has no cached bytecode and this Python will not write it (PYTHONDONTWRITEBYTECODE, or a read-only "
        "install): every start compiles its source again (11 s of a 29 s start of the engine, profiled on an H100 "
        "machine)",
        'pip install "trtc[torch]"' if not has["torch"] else
        f"python -m compileall -q -j 0 {torch_info.get('package_dir', '<torch folder>')} (where that folder is "
        "read-only: unset PYTHONDONTWRITEBYTECODE and set PYTHONPYCACHEPREFIX to a writable folder)")
    row("Ray: trtc run --ray (a local instance or a cluster)", has["ray"], "ray not installed",
        'pip install "trtc[ray]" (the same Ray version on every node)')
    cv = pk.get("opencv (cv2)", {})
    cv_known = bool(cv.get("dnn_engines"))  # dnn engines trtc can drive (unknown ones: a release it does not support)
    row("OpenCV dnn engine on CPU (opencv:model.onnx)", has["opencv (cv2)"] and cv_known,
        "cv2 not installed" if not has["opencv (cv2)"] else
        f"OpenCV {cv.get('version')} is not supported by this trtc (its dnn engines are not ones trtc knows); "
        f"supported: {tested_range('cv2')}",
        'pip install "trtc[opencv]"' if not has["opencv (cv2)"] else install_tested("cv2"))
    row("OpenCV dnn engine on GPU (CUDA backend)", has["opencv (cv2)"] and cv.get("dnn_cuda"),
        "cv2 not installed" if not has["opencv (cv2)"] else cv.get("dnn_cuda_reason") or "no CUDA backend",
        'pip install "trtc[opencv]"' if not has["opencv (cv2)"] else
        "build OpenCV with CUDA and cuDNN (-D WITH_CUDA=ON -D WITH_CUDNN=ON -D OPENCV_DNN_CUDA=ON); trtc's own "
        "GPU engines do not need it")
    serve_missing = [n for n in ("pyyaml", "paho-mqtt", "prometheus-client") if not has.get(n)]
    row("trtc serve (cameras file, MQTT, metrics)", not serve_missing, "missing " + ", ".join(serve_missing),
        'pip install "trtc[serve]"')


def _tensorrt_rows(row, has: dict, pk: dict, gpu: dict) -> None:
    have_gpu = bool(gpu.get("devices"))
    ccs = [d["compute_capability"] for d in gpu.get("devices", [])]
    row("TensorRT 10/11 engines (build + run)", has["tensorrt"] and have_gpu,
        "NVIDIA GPU missing" if not have_gpu else "tensorrt not installed",
        'pip install "trtc[trt]" (NVIDIA\'s wheels fetch the libraries from NVIDIA\'s index)' if have_gpu
        else "needs an NVIDIA GPU")
    # the runtimes engines.tensorrt_engine.load_plan accepts for a version-compatible plan: full TensorRT, the lean
    # runtime, or the dispatch runtime (for plans that carry their lean runtime)
    runtime = next((m for m in ("tensorrt", "tensorrt_lean", "tensorrt_dispatch") if has[m]), None)
    row("TensorRT plans: run version-compatible plans (edge)", runtime and have_gpu,
        "no GPU" if not have_gpu else "none of tensorrt, tensorrt_lean, tensorrt_dispatch installed",
        'pip install "trtc[edge]" (the lean runtime; plans built with trtc build --version-compatible)' if have_gpu
        else "needs an NVIDIA GPU")
    rtx_runs = any(c and (c.startswith(("7.5", "8.", "12.")) or c >= "12") for c in ccs)
    row("TensorRT-RTX engines: build", has["tensorrt_rtx"], "tensorrt_rtx not installed", 'pip install "trtc[rtx]"')
    row("TensorRT-RTX engines: run", has["tensorrt_rtx"] and rtx_runs,
        "tensorrt_rtx not installed" if not has["tensorrt_rtx"] else
        f"RTX runs on compute capability 7.5/8.x/12.x, this GPU is {', '.join(ccs) or 'absent'}",
        'pip install "trtc[rtx]"' if not has["tensorrt_rtx"] else "build with --backend tensorrt on this GPU")


def diagnose() -> dict:
    pk = packages()
    gpu = gpus()
    if gpu.get("devices"):
        gpu["nvdec"] = nvdec_caps()
    from engines import __version__

    system = {"trtc": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
              "machine": platform.machine()}
    return {"system": system, "packages": pk, "gpu": gpu, "features": features(pk, gpu)}
