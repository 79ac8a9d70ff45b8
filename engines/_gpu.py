"""What GPU this machine has, from nvidia-smi (no CUDA library needed): shared by doctor, build and the runtime."""

from __future__ import annotations

import os
import shutil
import subprocess

from .errors import UsageProblem


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _listed() -> tuple[list[dict], str | None, str | None]:
    """(devices, driver, why not) from one nvidia-smi query, in nvidia-smi's (PCI bus) order."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return [], None, "nvidia-smi not found (no NVIDIA driver)"
    text = _run([smi, "--query-gpu=name,compute_cap,driver_version,memory.total,uuid",
                 "--format=csv,noheader,nounits"])
    if not text:
        return [], None, "nvidia-smi failed (driver not loaded?)"
    devices, driver = [], None
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            devices.append({"name": parts[0], "compute_capability": parts[1], "memory_mib": parts[3],
                            **({"uuid": parts[4]} if len(parts) > 4 else {})})
            driver = parts[2]
    return devices, driver, None


def gpus() -> dict:
    """{"devices": [{"name", "compute_capability", "memory_mib", "uuid"}], "driver", "cuda"} or {"devices": [],
    "reason"}."""
    devices, driver, why = _listed()
    if why:
        return {"devices": [], "reason": why}
    cuda = None
    smi = shutil.which("nvidia-smi")
    head = (_run([smi]) if smi else None) or ""
    for token in head.split("CUDA Version:")[1:2]:
        cuda = token.split()[0]
    return {"devices": devices, "driver": driver, "cuda": cuda}


def visible_gpus(found: list[dict] | None = None) -> list[dict] | None:
    """The GPUs this process opens as cuda:0, cuda:1, ...: nvidia-smi's list (``found``, else asked for), narrowed
    and reordered by CUDA_VISIBLE_DEVICES (indices or GPU-UUID prefixes; like CUDA, the list ends at an index that
    does not exist, and "" or "-1" hide every GPU). None when nothing can be said: nvidia-smi lists no GPU, or an
    entry is one this cannot map (a MIG instance, a UUID prefix that matches no GPU or several)."""
    if found is None:
        found = _listed()[0]
    if not found:
        return None
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(found)
    out = []
    for entry in (e.strip() for e in env.split(",")):
        if entry.isdigit() and int(entry) < len(found):
            out.append(found[int(entry)])
            continue
        if entry == "" or entry.isdigit() or entry.lstrip("-").isdigit():
            break  # CUDA stops at an index that is not there
        match = [d for d in found if entry.startswith("GPU-") and d.get("uuid", "").startswith(entry)]
        if len(match) != 1:
            return None
        out.append(match[0])
    return out


def cuda_gpus(listed: list[dict]) -> list[dict]:
    """``listed`` (nvidia-smi's GPUs) as this process numbers them cuda:0, cuda:1, ...: :func:`visible_gpus`, or
    ``listed`` itself where CUDA_VISIBLE_DEVICES cannot be mapped (a MIG instance: nvidia-smi's order is the best
    guess there is)."""
    found = visible_gpus(listed)
    return listed if found is None else found


def _cuda_count() -> int | None:
    """How many GPUs CUDA shows this process, asked through CuPy or torch when this process has already imported
    one of them; None when neither is imported or CUDA cannot say. The first call starts CUDA's driver (0.10-0.22 s
    on an H100), which the engine's first stream pays otherwise; nvidia-smi is a process of its own at every open
    (0.02 s on that H100 with persistence mode on; not measured without it)."""
    import sys

    try:
        if "cupy" in sys.modules:
            return int(sys.modules["cupy"].cuda.runtime.getDeviceCount())
        if "torch" in sys.modules:
            return int(sys.modules["torch"].cuda.device_count()) or None  # 0 also when torch has no CUDA build
    except Exception:  # noqa: BLE001 - no driver, no GPU: nvidia-smi below names what is missing
        return None
    return None


def check_gpu_index(index: int) -> None:
    """Refuse cuda:``index`` when this process has no such GPU, naming those it has (before CUDA, ONNX Runtime or
    TensorRT fail on it with an error of their own). An index CUDA shows this process passes without asking
    nvidia-smi (see :func:`_cuda_count`); otherwise nvidia-smi decides and names the GPUs; silent when it cannot
    say."""
    count = _cuda_count()
    if count is not None and 0 <= index < count:
        return
    found = visible_gpus()
    if found is None or index < len(found):
        return
    raise no_such_gpu(f"cuda:{index}", found)


def no_such_gpu(name: str, found: list, other: str = "") -> UsageProblem:
    """The error for GPU ``name`` (e.g. "cuda:2") when this process sees the GPUs ``found``: those it has, or, with
    none, --device cpu (and CUDA_VISIBLE_DEVICES when it is what hides them). ``other``: more to the fix."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" with CUDA_VISIBLE_DEVICES={env!r}" if env is not None else ""
    if not found:
        return UsageProblem(f"{name}: no NVIDIA GPU found here{where}",
                            "unset CUDA_VISIBLE_DEVICES, or use --device cpu" if env is not None else "use --device cpu")
    have = ", ".join(f"cuda:{i} ({d['name']})" for i, d in enumerate(found))
    return UsageProblem(f"no GPU {name} here{where} (GPUs: {have})", "give one of the GPUs listed" + other)


def _smi_id(index: int) -> str:
    """nvidia-smi's --id for this process's cuda:``index`` (its UUID when CUDA_VISIBLE_DEVICES renumbers GPUs)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        return str(index)
    found = visible_gpus()
    return found[index].get("uuid", str(index)) if found and index < len(found) else str(index)


def memory_used_mib(index: int = 0) -> float | None:
    """GPU memory in use on this process's cuda:``index`` (all processes), from nvidia-smi; None when it cannot
    say."""
    smi = shutil.which("nvidia-smi")
    text = _run([smi, f"--id={_smi_id(index)}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]) \
        if smi else None
    try:
        return float(text.strip().splitlines()[0]) if text else None
    except ValueError:
        return None


def device(index: int = 0) -> dict | None:
    """This process's cuda:``index`` (CUDA_VISIBLE_DEVICES applied) with the driver and CUDA version, or None
    without one. ``index`` is the CUDA index; nvidia-smi's own number for the GPU is not kept."""
    info = gpus()
    found = cuda_gpus(info["devices"])
    if index >= len(found):
        return None
    return {**found[index], "driver": info.get("driver"), "cuda": info.get("cuda"), "index": index}


def parse_device(device: str) -> tuple[str, int]:
    """("cpu" or "cuda", the GPU's index) from cpu, cuda or cuda:N."""
    d = (device or "cpu").strip().lower()
    if d in ("cpu", "cuda"):
        return d, 0
    if d.startswith("cuda:") and d[5:].isdigit():
        return "cuda", int(d[5:])
    raise UsageProblem(f"unknown device {device!r}", "use cpu, cuda or cuda:N")
