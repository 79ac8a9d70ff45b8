"""Kernel launches through the CUDA driver API, for the launch the video pipeline makes most often.

The GPU pipeline launches its preprocessing kernel once per batch of decoded frames, from 16 or more decoder threads
that share the interpreter lock. CuPy's ``RawKernel.__call__`` converts every argument on each call while holding
that lock: with the kernel's 35 arguments the launch was 21-24% of the lock's held samples (roughly 50 us a launch)
at 16 streams of 640x272 video on an H100, and 7% through this module with half as many launches (16 frames each;
docs/BENCHMARKS.md).

:class:`DriverLaunch` packs the arguments once per launch plan (each parameter's bytes in an 8-byte slot of a
per-thread buffer), and each launch then writes only the frames' surface pointers and the output pointer before it
calls ``cuLaunchKernel`` through ctypes, which releases the interpreter lock for the call. The driver copies the
parameter values at the call, so the buffer can be rewritten by the thread's next launch at once.

The CUfunction is CuPy's own (``RawKernel.kernel.ptr``, the module CuPy loaded on the plan's device), and the launch
goes to the CUDA context that was current when the plan was made. A thread whose current context is another one
(or none) gets ``False`` back, and the caller launches through CuPy, which sets the device itself.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from .errors import EngineError

_DRIVER = None  # libcuda through ctypes once loaded; False when it cannot be loaded
_DRIVER_LOCK = threading.Lock()


class _Driver:
    """The three driver entry points this module calls, with their C signatures."""

    def __init__(self, lib):
        self.launch = lib.cuLaunchKernel
        # CUfunction f, gridDimX..Z, blockDimX..Z, sharedMemBytes, CUstream, void** kernelParams, void** extra
        self.launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self.launch.restype = ctypes.c_int
        self.current = lib.cuCtxGetCurrent
        self.current.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.current.restype = ctypes.c_int
        self.error_name = lib.cuGetErrorName
        self.error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.error_name.restype = ctypes.c_int

    def context(self) -> int | None:
        ctx = ctypes.c_void_p()
        if self.current(ctypes.byref(ctx)) != 0:
            return None
        return ctx.value

    def name_of(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self.error_name(code, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode()
        return f"CUDA driver error {code}"


def driver(load=None):
    """The CUDA driver through ctypes, or None where it cannot be loaded (no driver: the CPU-only install) or where
    ``TRTC_KERNEL_LAUNCH=cupy`` asks for CuPy's launches (how the two are compared). ``load``: a stand-in for
    ``ctypes.CDLL`` (tests)."""
    global _DRIVER
    if os.environ.get("TRTC_KERNEL_LAUNCH", "").strip().lower() == "cupy":
        return None
    if _DRIVER is None or load is not None:
        with _DRIVER_LOCK:
            if _DRIVER is None or load is not None:
                try:
                    _DRIVER = _Driver((load or ctypes.CDLL)("libcuda.so.1"))
                except (OSError, AttributeError):
                    _DRIVER = False
    return _DRIVER or None


def param_bytes(value) -> bytes:
    """A kernel parameter's value as the kernel reads it: a numpy scalar's own bytes, a device array's address as a
    64-bit pointer. Anything else raises TypeError (the caller keeps CuPy's launch)."""
    if isinstance(value, np.generic):
        return value.tobytes()
    data = getattr(value, "data", None)
    ptr = getattr(data, "ptr", None)
    if isinstance(ptr, int):
        return np.uint64(ptr).tobytes()
    raise TypeError(f"no kernel parameter form for {type(value).__name__}")


class DriverLaunch:
    """One kernel's launches with ``pointers`` leading 64-bit pointer parameters that change per launch (the frames'
    surfaces; those past the launch's count are written as 0), a fixed middle, one more pointer that changes (the
    output) and a fixed tail. Grid (``grid_x``, frames), block (``block``, 1, 1)."""

    def __init__(self, drv: _Driver, function: int, context: int, grid_x: int, block: int, pointers: int, middle,
                 tail):
        self.drv, self.function, self.context = drv, function, context
        self.grid_x, self.block, self.pointers = grid_x, block, pointers
        fixed = [param_bytes(v) for v in middle]
        self.out_at = pointers + len(fixed)
        self.template = [bytes(8)] * pointers + fixed + [bytes(8)] + [param_bytes(v) for v in tail]
        if any(len(b) > 8 for b in self.template):
            raise TypeError("a kernel parameter wider than 8 bytes")
        self._mine = threading.local()

    def _buffers(self):
        """This thread's parameter slots, their addresses (the kernelParams array) and a uint64 view of them."""
        mine = self._mine
        if not hasattr(mine, "view"):
            n = len(self.template)
            slots = (ctypes.c_uint64 * n)()
            base = ctypes.addressof(slots)
            for i, b in enumerate(self.template):
                ctypes.memmove(base + 8 * i, b, len(b))
            mine.slots = slots  # kept alive with the addresses that point into it
            mine.params = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
            mine.view = np.frombuffer(slots, np.uint64)
        return mine

    def __call__(self, surface_ptrs, out_ptr: int, stream_ptr: int) -> bool:
        """Enqueue the launch for these frames on the stream; False (nothing enqueued) when this thread's current
        context is not the plan's. A launch the driver refuses raises EngineError."""
        drv = self.drv
        if drv.context() != self.context:
            return False
        mine = self._buffers()
        m = len(surface_ptrs)
        view = mine.view
        view[:m] = surface_ptrs
        view[m:self.pointers] = 0
        view[self.out_at] = out_ptr
        rc = drv.launch(self.function, self.grid_x, m, 1, self.block, 1, 1, 0, stream_ptr, mine.params, None)
        if rc != 0:
            raise EngineError(f"the preprocessing kernel did not launch: {drv.name_of(rc)}",
                              "set TRTC_KERNEL_LAUNCH=cupy to launch it through CuPy and see CuPy's error")
        return True


def driver_launch(kernel, grid_x: int, block: int, pointers: int, middle, tail) -> DriverLaunch | None:
    """A :class:`DriverLaunch` for CuPy ``kernel`` on the current device, or None where the driver path is not
    available (no libcuda, ``TRTC_KERNEL_LAUNCH=cupy``, a stand-in kernel, no current context)."""
    drv = driver()
    if drv is None:
        return None
    try:
        function = int(kernel.kernel.ptr)  # CuPy loads the module on the current device here if it has not yet
        context = drv.context()
        if not context:
            return None
        return DriverLaunch(drv, function, context, grid_x, block, pointers, middle, tail)
    except (AttributeError, TypeError):
        return None
