"""A minimal stand-in for CuPy on a machine without a GPU: host memory that claims to be device memory.

Only for driving trtc's GPU-side control code (TensorRTEngine's calls) on CPU CI: nothing here runs on a GPU and
nothing about CUDA is proven by it."""

from __future__ import annotations

import itertools
import sys
import types

import numpy as np

_ptrs = itertools.count(0x10000, 0x1000)


class ndarray:  # noqa: N801 - CuPy's name
    def __init__(self, host: np.ndarray):
        self.host = host
        self.data = types.SimpleNamespace(ptr=host.__array_interface__["data"][0])
        self.shape, self.dtype, self.flags = host.shape, host.dtype, host.flags
        self.strides, self.ndim = host.strides, host.ndim

    def transpose(self, *axes):  # a view of the same memory, as CuPy's
        return ndarray(self.host.transpose(*axes))

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.data.ptr, False), "version": 3}

    def __getitem__(self, item):
        return ndarray(self.host[item])

    def __setitem__(self, item, value):  # a device-to-device copy
        self.host[item] = value.host if isinstance(value, ndarray) else value


class Stream:
    def __init__(self, non_blocking=False, ptr=None):
        self.ptr = ptr if ptr is not None else next(_ptrs)
        self.captures = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass

    def record(self, event=None):
        return Event()

    def wait_event(self, event):
        pass

    def begin_capture(self):
        self.captures += 1

    def end_capture(self):
        return Graph(self)


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.done = True  # cudaEventQuery: work here is done when enqueued; a test may say False

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class Graph:
    launches: list = []

    def __init__(self, stream):
        self.stream = stream

    def launch(self, stream):
        Graph.launches.append(stream.ptr)


class Device:
    compute_capability = "90"  # a string, as CuPy's

    def __init__(self, index=0):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def install(monkeypatch):
    m = types.ModuleType("cupy")
    m.ndarray = ndarray
    m.empty = lambda shape, dtype=np.float32: ndarray(np.zeros(shape, dtype))
    m.zeros = lambda shape, dtype=np.float32: ndarray(np.zeros(shape, dtype))
    m.asarray = lambda a, dtype=None: a if isinstance(a, ndarray) else ndarray(np.ascontiguousarray(a, dtype))
    m.asnumpy = lambda a, stream=None: a.host.copy()
    m.ascontiguousarray = lambda a: ndarray(np.ascontiguousarray(a.host))
    current = Stream(ptr=0)
    m.cuda = types.SimpleNamespace(Stream=Stream, Device=Device, Event=Event, get_current_stream=lambda: current,
                                   ExternalStream=lambda ptr, device_id=0: Stream(ptr=ptr))
    m.FAKE = True
    monkeypatch.setitem(sys.modules, "cupy", m)
    Graph.launches = []
    return m
