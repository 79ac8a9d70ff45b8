"""How much memory this machine can give, so that a batch too large for it is refused before it is allocated (a
MemoryError halfway through read as a bug in trtc)."""

from __future__ import annotations

import math
import os

from .errors import UsageProblem

# a batch's input may take at most this share of the available memory: a classifier's live activations are many
# times its input (a ResNet's first convolution alone makes 5x; two or three such tensors live at once), and an
# export runs PyTorch and ONNX Runtime on it
INPUT_SHARE = 1 / 16


def _cgroup_room() -> int | None:
    """What the cgroup (v2, else v1) of this process may still allocate, or None without a limit."""
    for limit_file, used_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                   "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(used_file) as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return None
        return max(0, int(limit) - used)
    return None


def available_memory() -> int | None:
    """Bytes of memory available to this process now (MemAvailable, within its cgroup's limit), or None where it
    cannot be read."""
    found = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            return None
    room = _cgroup_room()
    return found if room is None else min(found, room)


def _gib(n: float) -> str:
    if n >= 2**40:
        return f"{n / 2**40:.1f} TiB"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.0f} MiB"


def check_input_fits(batch: int, sample_shape, itemsize: int, what: str, fix: str, given: str | None = None) -> None:
    """Refuse ``batch`` samples of ``sample_shape`` when their input alone would take more than INPUT_SHARE of the
    memory available (nothing is checked where that is unknown). ``what``: the work, e.g. "timing lite0.onnx";
    ``fix`` may use ``{most}``, the largest batch whose input stays within that share; ``given``: the option as the
    user wrote it (default ``--batch N``)."""
    per_sample = math.prod(int(d) for d in sample_shape) * itemsize
    avail = available_memory()
    if avail is None or per_sample <= 0:
        return
    need = batch * per_sample
    if need <= INPUT_SHARE * avail:
        return
    most = max(1, int(INPUT_SHARE * avail // per_sample))
    given = given or f"--batch {batch}"
    raise UsageProblem(f"{given} is too large for this machine: {what} at batch {batch} needs {_gib(need)} "
                       f"for its input alone, and its activations several times that; {_gib(avail)} of memory is "
                       "available", fix.format(most=most))
