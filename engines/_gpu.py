"""What GPU this machine has, from nvidia-smi (no CUDA library needed): shared by doctor, build and the runtime."""

from __future__ import annotations

import shutil
import subprocess


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def gpus() -> dict:
    """{"devices": [{"name", "compute_capability", "memory_mib"}], "driver", "cuda"} or {"devices": [], "reason"}."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {"devices": [], "reason": "nvidia-smi not found (no NVIDIA driver)"}
    text = _run([smi, "--query-gpu=name,compute_cap,driver_version,memory.total", "--format=csv,noheader,nounits"])
    if not text:
        return {"devices": [], "reason": "nvidia-smi failed (driver not loaded?)"}
    devices, driver = [], None
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            devices.append({"name": parts[0], "compute_capability": parts[1], "memory_mib": parts[3]})
            driver = parts[2]
    cuda = None
    head = _run([smi]) or ""
    for token in head.split("CUDA Version:")[1:2]:
        cuda = token.split()[0]
    return {"devices": devices, "driver": driver, "cuda": cuda}


def memory_used_mib(index: int = 0) -> float | None:
    """GPU memory in use on GPU ``index`` (all processes), from nvidia-smi; None when it cannot say."""
    smi = shutil.which("nvidia-smi")
    text = _run([smi, f"--id={index}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]) if smi else None
    try:
        return float(text.strip().splitlines()[0]) if text else None
    except ValueError:
        return None


def device(index: int = 0) -> dict | None:
    """The GPU at ``index`` with the driver and CUDA version, or None without one."""
    info = gpus()
    if index >= len(info["devices"]):
        return None
    return {**info["devices"][index], "driver": info.get("driver"), "cuda": info.get("cuda"), "index": index}
