"""The preprocessing kernel's launch through the CUDA driver (engines/_launch.py), checked on the CPU with a
recording stand-in for libcuda: every parameter the driver would read, in the order and width the kernel's own
source declares them (the reference here is the CUDA source text, not the packing code), the pointers of frames a
launch does not have written as 0, the fallback to CuPy's launch, and the refusal of a failed launch. tests/gpu
checks that the driver path writes the same pixels as CuPy's launch."""

from __future__ import annotations

import ctypes
import re
import threading
import types

import numpy as np
import pytest

from engines import _launch
from engines.errors import EngineError
from engines.preprocess import MAX_FRAMES_PER_LAUNCH, ColorSpace, GpuPreprocessor, PreprocessSpec, kernel_source

C_SIZES = {"unsigned long long": 8, "long long": 8, "int": 4}


def _declared_params(source: str) -> list[int]:
    """The byte width of each parameter of the kernel, read from its CUDA source."""
    head = source[source.index("trtc_preprocess_"):]
    params = head[head.index("(") + 1:head.index(")")]
    widths = []
    for p in params.split(","):
        p = " ".join(p.replace("__restrict__", "").replace("const", "").split())
        if "*" in p:
            widths.append(8)
        else:
            ctype = re.sub(r"\s+\w+$", "", p)
            widths.append(C_SIZES[ctype])
    return widths


class FakeDriver:
    """Records launches: the function, grid, block, stream, and each parameter's bytes as the driver would read
    them (it copies them at the call)."""

    def __init__(self, widths, context=0x5000, rc=0):
        self.widths, self.ctx, self.rc = widths, context, rc
        self.calls = []

    def context(self):
        return self.ctx

    def name_of(self, code):
        return f"CUDA_ERROR_{code}"

    def launch(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        values = [ctypes.string_at(params[i], w) for i, w in enumerate(self.widths)]
        self.calls.append({"fn": fn, "grid": (gx, gy, gz), "block": (bx, by, bz), "shared": shared,
                           "stream": stream, "values": values, "params_at": ctypes.addressof(params)})
        return self.rc


def _device_array(ptr):
    return types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr))


def _fake_cupy(monkeypatch, function_ptr=0xF00):
    """tests/fake_cupy.py (host memory that claims to be device memory: its uploads have addresses) with a RawKernel
    that has a CUfunction and records CuPy's own launches."""
    from tests import fake_cupy

    class Kernel:
        def __init__(self, code, name):
            self.code = code
            self.kernel = types.SimpleNamespace(ptr=function_ptr)
            self.cupy_launches = []

        def compile(self):
            pass

        def __call__(self, grid, block, args, stream=None):
            self.cupy_launches.append((grid, args))

    monkeypatch.setattr("engines.preprocess._KERNELS", {})  # compiled kernels are kept per process
    m = fake_cupy.install(monkeypatch)
    m.RawKernel = Kernel
    return m


def _plan(monkeypatch, drv, layout="NCHW", out_dtype=np.float32):
    _fake_cupy(monkeypatch)
    monkeypatch.setattr(_launch, "driver", lambda load=None: drv)
    pre = GpuPreprocessor(PreprocessSpec(size=(8, 8), resize=10), layout=layout)
    plan = pre.plan("NV12", (30, 20), np.uint8, 20, 20, ColorSpace("bt601", "limited"), out_dtype)
    return pre, plan


def _expected(plan, ptrs, out_ptr, widths):
    """What each parameter must hold, built from the plan's own values (not from the packed buffer)."""
    values = [int(p) for p in ptrs] + [0] * (MAX_FRAMES_PER_LAUNCH - len(ptrs))
    want = [np.uint64(v).tobytes() for v in values]
    for v in plan.mid:
        want.append(v.tobytes() if isinstance(v, np.generic) else np.uint64(v.data.ptr).tobytes())
    want.append(np.uint64(out_ptr).tobytes())
    want += [v.tobytes() for v in plan.tail]
    return [w[:n] for w, n in zip(want, widths, strict=True)]


@pytest.mark.parametrize("half", [False, True])
def test_every_parameter_is_packed_in_the_kernels_declared_order_and_width(monkeypatch, half):
    widths = _declared_params(kernel_source("u8_f16" if half else "u8_f32", False, half))
    assert len(widths) == 37
    drv = FakeDriver(widths)
    pre, plan = _plan(monkeypatch, drv, out_dtype=np.float16 if half else np.float32)
    assert plan.driver is not None
    # the packed template has exactly one value per declared parameter, each no wider than its slot
    assert len(plan.driver.template) == len(widths)
    assert [len(b) for b in plan.driver.template] == widths
    ptrs = [0x7F0000001000 + 0x100000 * i for i in range(5)]
    pre.launch(plan, ptrs, 0x7F00DEAD0000, types.SimpleNamespace(ptr=0x77))
    (call,) = drv.calls
    assert call["fn"] == 0xF00 and call["stream"] == 0x77 and call["shared"] == 0
    assert call["grid"] == (plan.grid_x, 5, 1) and call["block"] == (256, 1, 1)
    assert call["values"] == _expected(plan, ptrs, 0x7F00DEAD0000, widths)


def test_a_smaller_launch_writes_zero_for_the_frames_it_does_not_have(monkeypatch):
    widths = _declared_params(kernel_source("u8_f32", False, False))
    drv = FakeDriver(widths)
    pre, plan = _plan(monkeypatch, drv, layout="NHWC")
    stream = types.SimpleNamespace(ptr=1)
    pre.launch(plan, list(range(0x1000, 0x1000 + 16 * 8, 8)), 0x9000, stream)  # all 16 pointers set
    pre.launch(plan, [0x5000, 0x6000], 0xA000, stream)
    second = drv.calls[1]
    assert second["grid"][1] == 2
    assert second["values"] == _expected(plan, [0x5000, 0x6000], 0xA000, widths)
    assert second["values"][-3] == np.int32(1).tobytes()  # the NHWC flag, before the grey and transpose flags
    assert drv.calls[0]["params_at"] == second["params_at"]  # one buffer per thread, rewritten


def test_each_thread_packs_into_its_own_buffer(monkeypatch):
    widths = _declared_params(kernel_source("u8_f32", False, False))
    drv = FakeDriver(widths)
    pre, plan = _plan(monkeypatch, drv)
    stream = types.SimpleNamespace(ptr=1)
    launched, done = threading.Event(), threading.Event()

    def other():  # launches, then stays alive (its buffer with it) until this thread has launched too
        pre.launch(plan, [0x1000], 0x2000, stream)
        launched.set()
        done.wait(5)

    t = threading.Thread(target=other)
    t.start()
    launched.wait(5)
    pre.launch(plan, [0x3000], 0x4000, stream)
    done.set()
    t.join()
    assert drv.calls[0]["params_at"] != drv.calls[1]["params_at"]
    assert drv.calls[1]["values"][0] == np.uint64(0x3000).tobytes()


def test_another_current_context_falls_back_to_cupys_launch(monkeypatch):
    widths = _declared_params(kernel_source("u8_f32", False, False))
    drv = FakeDriver(widths)
    pre, plan = _plan(monkeypatch, drv)
    drv.ctx = 0x6000  # e.g. a thread on another GPU
    pre.launch(plan, [0x1000, 0x2000], 0x9000, types.SimpleNamespace(ptr=1))
    assert drv.calls == []
    ((grid, args),) = plan.kernel.cupy_launches
    assert grid == (plan.grid_x, 2)
    assert [int(a) for a in args[:3]] == [0x1000, 0x2000, 0]


def test_a_refused_launch_is_an_engine_error_with_the_drivers_name(monkeypatch):
    widths = _declared_params(kernel_source("u8_f32", False, False))
    pre, plan = _plan(monkeypatch, FakeDriver(widths, rc=700))
    with pytest.raises(EngineError, match="CUDA_ERROR_700"):
        pre.launch(plan, [0x1000], 0x9000, types.SimpleNamespace(ptr=1))


def test_no_driver_means_cupys_launch(monkeypatch):
    pre, plan = _plan(monkeypatch, None)
    assert plan.driver is None
    pre.launch(plan, [0x1000], 0x9000, types.SimpleNamespace(ptr=1))
    assert len(plan.kernel.cupy_launches) == 1


def test_no_libcuda_or_trtc_kernel_launch_cupy_means_no_driver_path(monkeypatch):
    monkeypatch.setattr(_launch, "_DRIVER", None)

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    assert _launch.driver(load=missing) is None
    monkeypatch.setattr(_launch, "_DRIVER", None)

    class Lib:
        def __init__(self):
            for name in ("cuLaunchKernel", "cuCtxGetCurrent", "cuGetErrorName"):
                setattr(self, name, types.SimpleNamespace())

    assert isinstance(_launch.driver(load=lambda name: Lib()), _launch._Driver)
    monkeypatch.setenv("TRTC_KERNEL_LAUNCH", "cupy")
    assert _launch.driver() is None


def test_what_cannot_be_launched_by_the_driver_stays_with_cupy(monkeypatch):
    class Kernel:
        kernel = types.SimpleNamespace(ptr=1)

    drv = FakeDriver([8])
    monkeypatch.setattr(_launch, "driver", lambda load=None: drv)
    assert _launch.driver_launch(Kernel(), 1, 256, 16, (np.int32(1),), ()) is not None
    assert _launch.driver_launch(Kernel(), 1, 256, 16, ("text",), ()) is None  # no fixed-width form
    assert _launch.driver_launch(object(), 1, 256, 16, (np.int32(1),), ()) is None  # not a CuPy RawKernel
    drv.ctx = None  # no current context in this thread
    assert _launch.driver_launch(Kernel(), 1, 256, 16, (np.int32(1),), ()) is None
    with pytest.raises(TypeError):
        _launch.param_bytes(3)  # a Python int has no fixed width: the plan's values are numpy scalars
    assert _launch.param_bytes(np.int32(-2)) == b"\xfe\xff\xff\xff"
    assert _launch.param_bytes(_device_array(0x1234)) == np.uint64(0x1234).tobytes()
