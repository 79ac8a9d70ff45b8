"""The Engine interface every backend implements, and the tensor description they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

# ONNX TensorProto element types we meet in classifiers, by name
DTYPES = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "uint8": np.uint8, "int64": np.int64,
          "int32": np.int32, "bool": np.bool_, "float64": np.float64}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple  # ints, or strings for symbolic dimensions ("batch")

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict) -> "TensorSpec":
        return cls(d["name"], d["dtype"], tuple(d["shape"]))

    @property
    def numpy_dtype(self):
        return np.dtype(DTYPES.get(self.dtype, self.dtype))


@runtime_checkable
class Engine(Protocol):
    """A loaded model. ``infer`` takes the input batch and returns the outputs, in ``outputs`` order."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    device: str

    def infer(self, batch: Any) -> list[Any]: ...

    def close(self) -> None: ...

    def __enter__(self): ...

    def __exit__(self, *exc) -> None: ...


class EngineBase:
    """Context-manager plumbing shared by the backends."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    device: str = "cpu"
    # True when the engine readies a new batch size by itself (ONNX Runtime's quick start: a session warmed at open
    # runs the first batches while the tuned one prepares): the video pipeline then runs no warm-up batch of zeros
    warms_itself: bool = False

    def expect(self, batch=None, form: str | None = None) -> None:
        """The caller says what it will run: ``batch`` (a batch size, or a list of them) and ``form``, "device"
        (device arrays) or "host" (numpy). An engine that prepares shapes ahead prepares those, and no other
        (ONNX Runtime's quick start); the others need not know."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def input_layout(engine) -> str:
    """The memory order ``engine`` reads its (N, C, H, W) input best in: "NHWC" (channels_last) where its
    ``preferred_layout`` says so (the compiled PyTorch engine), else "NCHW". The GPU pipeline and the push write their
    slots in it; ``trtc bench`` times device input in it."""
    return "NHWC" if getattr(engine, "preferred_layout", "NCHW") == "NHWC" else "NCHW"
