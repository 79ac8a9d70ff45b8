"""Device arrays and streams, through CuPy (imported only when a caller already works on the GPU)."""

from __future__ import annotations

from .errors import UsageProblem


def is_device_array(x) -> bool:
    """Anything that lives in GPU memory and says so (DLPack device type CUDA, or __cuda_array_interface__)."""
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return int(dev()[0]) in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
    except Exception:  # noqa: BLE001 - not a DLPack producer we understand
        return False


def as_cupy(x):
    """A CuPy view of a device array, without a copy: DLPack first (it orders the producer's stream before the
    current one), then __cuda_array_interface__."""
    import cupy as cp

    if isinstance(x, cp.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return cp.from_dlpack(x)
    if hasattr(x, "__cuda_array_interface__"):
        return cp.asarray(x)
    raise UsageProblem(f"expected a device array (DLPack or __cuda_array_interface__), got {type(x).__name__}")


def stream_ptr(stream) -> int:
    """The raw cudaStream_t of a CuPy/torch stream, or an int passed through."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("ptr", "cuda_stream", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise UsageProblem(f"cannot use {type(stream).__name__} as a CUDA stream", "pass a cupy or torch stream")


def external_stream(stream, device_id: int = 0):
    """A CuPy stream object for ``stream`` (CuPy stream returned as is; torch stream or int wrapped)."""
    import cupy as cp

    if stream is None or isinstance(stream, cp.cuda.Stream):
        return stream
    return cp.cuda.ExternalStream(stream_ptr(stream), device_id)


def device_input(feeds: dict, spec):
    """The CuPy view of ``feeds[spec.name]``, which must be a C-contiguous device array of the input's type."""
    if spec.name not in feeds:
        raise UsageProblem(f"no data for model input {spec.name!r}")
    x = as_cupy(feeds[spec.name])
    if x.dtype != spec.numpy_dtype or not x.flags.c_contiguous:
        raise UsageProblem(f"input {spec.name!r} must be a C-contiguous {spec.dtype} device array, got {x.dtype} "
                           f"{'contiguous' if x.flags.c_contiguous else 'strided'}",
                           f"write the batch as {spec.dtype} (the video pipeline does)")
    return x


def device_output(outputs, i: int, spec, shape: tuple, stream):
    """``outputs[i]`` checked against (shape, the output's type), or a new array allocated on ``stream``."""
    import cupy as cp

    out = as_cupy(outputs[i]) if outputs is not None else None
    if out is None:
        with stream:
            return cp.empty(shape, spec.numpy_dtype)
    if tuple(out.shape) != tuple(shape) or out.dtype != spec.numpy_dtype or not out.flags.c_contiguous:
        raise UsageProblem(f"output buffer for {spec.name!r} must be contiguous {spec.dtype} {tuple(shape)}, got "
                           f"{out.dtype} {tuple(out.shape)}")
    return out
