"""A stand-in for CuPy, backed by NumPy, that runs FramePusher's GPU path (engines.video.push._GpuPusher and
GpuBatches: slots, launches, events, inference, top-k) on a machine without a GPU. Nothing about CUDA is proven
here: it checks the control code (order, counts, closing, the release point) and times its Python.

"Device" arrays are NumPy arrays whose ``.data.ptr`` is their host address. The preprocessing "kernel" runs when
it is launched: slot i of its output is filled with (first byte of frame i) / 255, read through the frame's
pointer, so a frame overwritten before its launch comes out with the wrong class. :class:`ValueEngine` then
classifies a slot filled with v / 255 as class v. ``kernel_reads=False`` makes the kernel read nothing (for
timing Python alone); ``launches`` records (frames per launch) for the tests.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import itertools
import sys
import threading
import time
import types
import weakref

import numpy as np

from engines.preprocess import MAX_FRAMES_PER_LAUNCH
from engines import topk
from engines.topk import topk_host

_ptrs = itertools.count(0x10000, 0x10)
_ONE = types.SimpleNamespace(id=0)
# µs of interpreter time (the lock held, spinning) each modelled CUDA call costs: set by install(cuda_us=...);
# a kernel launch costs LAUNCH_FACTOR times as much (CuPy marshals its ~33 arguments)
COST = {"call": 0.0}
LAUNCH_FACTOR = 5
# when a list: what the stand-in's streams did, in order, for tests of the ordering between streams:
# ("record", event ptr, stream ptr, n), ("wait", stream ptr, (stream ptr, n) of the event's last record or None),
# ("launch", stream ptr, frame pointers), ("infer", stream ptr) (ValueEngine); n numbers the records. Tests
# append their own entries (e.g. pushes)
TRACE: dict = {"log": None}
_EVENTS = weakref.WeakValueDictionary()  # event ptr -> Event, for runtime.eventRecord on raw pointers
_records = itertools.count()
_TLS = threading.local()  # the thread's current stream ("with stream:"), else the null stream


def _log(*entry) -> None:
    if TRACE["log"] is not None:
        TRACE["log"].append(entry)


def _spin(us: float) -> None:
    if us:
        end = time.perf_counter() + us * 1e-6
        while time.perf_counter() < end:
            pass


class ndarray(np.ndarray):  # noqa: N801 - CuPy's name
    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0], device_id=0)

    @property
    def device(self):
        return _ONE


def _dev(a):
    return np.asarray(a).view(ndarray)


class Stream:
    """As CuPy's: a new stream gets the current device's id; the singletons (the null stream, handle 0, and the
    per-thread default stream, handle 2) get -1."""

    def __init__(self, non_blocking=False, ptr=None, device_id=0):
        self.ptr = ptr if ptr is not None else next(_ptrs)
        self.device_id = device_id

    def __enter__(self):  # the thread's current stream, as CuPy's
        self._outer = getattr(_TLS, "stream", None)
        _TLS.stream = self
        return self

    def __exit__(self, *exc):
        _TLS.stream = self._outer
        return False

    def synchronize(self):
        pass

    def wait_event(self, event):
        _log("wait", self.ptr, event.last)
        _spin(COST["call"])

    def record(self, event=None):
        ev = event or Event()
        ev.record(self)
        return ev


class Event:
    def __init__(self, block=False, disable_timing=False):
        self.ptr = next(_ptrs)
        self.recorded = 0
        self.last = None  # (stream ptr, record number) of the last record
        _EVENTS[self.ptr] = self
        _spin(COST["call"])

    def record(self, stream=None):
        self.recorded += 1
        self.last = (stream.ptr if stream is not None else 0, next(_records))
        _log("record", self.ptr, *self.last)
        _spin(COST["call"])

    def synchronize(self):
        pass

    @property
    def done(self):
        return True


class Device:
    def __init__(self, index=0):
        self.id = index

    def __enter__(self):
        _spin(COST["call"])
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


class RawKernel:
    launches: list = []
    layouts: list = []
    reads = True
    read_delay = 0.0  # seconds slept (the interpreter lock released) before the frames are read

    def __init__(self, code, name):
        self.half = name.endswith("f16")
        self.topk = name.startswith("trtc_topk")

    def compile(self):
        pass

    def __call__(self, grid, block, args, stream=None):
        if self.topk:  # engines.topk's kernel, done at once in numpy (the engine stand-ins run at once too)
            _spin(COST["call"] * LAUNCH_FACTOR)
            x, _rows, _cols, k, softmax, out = args
            idx, scores = topk_host(np.asarray(x), int(k), bool(softmax))
            k = int(k)
            out[:, :k], out[:, k:] = idx, scores.view(np.int32)
            return
        m = grid[1]
        RawKernel.launches.append(m)
        RawKernel.layouts.append("NHWC" if int(args[-3]) else "NCHW")  # the kernel's nhwc argument (then grey, transpose)
        _log("launch", stream.ptr if stream is not None else 0, tuple(int(p) for p in args[:m]))
        _spin(COST["call"] * LAUNCH_FACTOR)
        if not RawKernel.reads:
            return
        if RawKernel.read_delay:
            time.sleep(RawKernel.read_delay)
        srcs, out, (h, w) = args[:m], int(args[MAX_FRAMES_PER_LAUNCH + 14]), args[MAX_FRAMES_PER_LAUNCH + 15:][:2]
        n = 3 * int(h) * int(w)
        ctype, size = (ctypes.c_uint16, 2) if self.half else (ctypes.c_float, 4)
        for i, p in enumerate(srcs):
            v = ctypes.c_uint8.from_address(int(p)).value
            slot = np.ctypeslib.as_array((ctype * n).from_address(out + i * n * size))
            slot[:] = np.float16(v / 255).view(np.uint16) if self.half else np.float32(v / 255)


class ValueEngine:
    """A GPU engine stand-in: a (B, 3, 8, 8) input whose slot holds v / 255 is classified as class v (of 256).
    ``delay``: seconds per batch, slept with the interpreter lock released (the GPU's time)."""

    device = "cuda:0"

    def __init__(self, delay: float = 0.0, dtype=np.float32):
        self.inputs = [types.SimpleNamespace(shape=[None, 3, 8, 8], numpy_dtype=dtype)]
        self.delay, self.batches = delay, []

    def infer(self, x, stream=None):
        self.batches.append(len(x))
        _log("infer", stream.ptr if stream is not None else 0)
        if self.delay:
            time.sleep(self.delay)
        with np.errstate(all="ignore"):  # rows past a partial batch hold whatever the buffer held
            v = np.clip(np.nan_to_num(np.rint(np.asarray(x[:, 0, 0, 0], np.float32) * 255)), 0, 255).astype(int)
        logits = np.zeros((len(x), 256), np.float32)
        logits[np.arange(len(x)), v] = 10.0
        return [_dev(logits)]


def _event_record(ev_ptr: int, stream_ptr: int) -> None:
    _EVENTS[ev_ptr].record(types.SimpleNamespace(ptr=stream_ptr))


def install(monkeypatch=None, kernel_reads: bool = True, cuda_us: float = 0.0):
    """Put the stand-in in sys.modules as ``cupy`` (through ``monkeypatch`` when given, else for good), with a
    fresh kernel cache (engines.preprocess keeps compiled kernels per process). ``cuda_us``: see COST."""
    import engines.preprocess as pre

    m = types.ModuleType("cupy")
    m.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    m.ndarray = ndarray
    m.empty = lambda shape, dtype=np.float32: np.empty(shape, dtype).view(ndarray)
    m.zeros = lambda shape, dtype=np.float32: np.zeros(shape, dtype).view(ndarray)
    m.asarray = lambda a, dtype=None: a if isinstance(a, ndarray) and dtype is None else _dev(np.asarray(a, dtype))
    m.from_dlpack = lambda a: _dev(np.from_dlpack(a))
    m.asnumpy = lambda a, stream=None: np.array(a)
    for name in ("argsort", "take_along_axis", "exp", "float32", "float16", "int32", "uint8", "concatenate",
                 "ascontiguousarray"):
        setattr(m, name, getattr(np, name))
    m.RawKernel = RawKernel
    RawKernel.launches, RawKernel.layouts, RawKernel.reads, RawKernel.read_delay = [], [], kernel_reads, 0.0
    current = Stream.null = Stream(ptr=0, device_id=-1)
    Stream.ptds = Stream(ptr=2, device_id=-1)
    m.cuda = types.SimpleNamespace(Stream=Stream, Device=Device, Event=Event,
                                   get_current_stream=lambda device_id=-1: getattr(_TLS, "stream", None) or current,
                                   runtime=types.SimpleNamespace(eventRecord=_event_record, getDeviceCount=lambda: 1))
    TRACE["log"] = None
    m.FAKE = True
    COST["call"] = cuda_us
    if monkeypatch is not None:
        monkeypatch.setitem(sys.modules, "cupy", m)
        monkeypatch.setattr(pre, "_KERNELS", {})
        monkeypatch.setattr(topk, "_KERNELS", {})
    else:
        sys.modules["cupy"] = m
        pre._KERNELS.clear()
        topk._KERNELS.clear()  # a real CuPy's top-k kernel must not be launched with the stand-in's arrays
    return m
