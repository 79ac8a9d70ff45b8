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
