"""The yardstick of `trtc bench`: the model as a plain PyTorch user runs it, sharing no code with trtc's engines.

    y = Yardstick("torch-compile", "cuda:0")
    name = y.prepare("r50.fp16.onnx", ref)         # the PyTorch model of the engine's source, loaded once
    call, clock, where = y.timer(name, 64, (3, 224, 224))

What the user does, and nothing more: the PyTorch model of the engine's source (its manifest's ``model.source``:
``pretrained:...``, ``timm:...``, ``torchvision:...``, ``file.py:factory``, a TorchScript or ``.pt2`` file; else a
``.pt2`` program beside the model, as ``lite0.pt2`` beside ``lite0.onnx``), ``.eval()``, ``.half()`` when the engine
is not FP32 (FP16 and INT8 graphs compute their other layers in FP16), ``channels_last``, then
``torch.compile(model, mode="reduce-overhead", dynamic=False)`` (one static shape per batch size, as a user timing
one batch gets; "torch-eager" skips the compile), warmed up, and called under ``torch.inference_mode()`` on a
random batch made once on the device in ``channels_last``. On a GPU each call is timed by CUDA events on torch's
current stream (the same span loop as the engine rows, :func:`toolchain.bench.time_spans`).

Architectures given by name (torchvision:, timm:) are built with random weights: the speed does not depend on
them, and the manifest does not say where the trained weights are.
"""

from __future__ import annotations

from pathlib import Path

from engines._deps import require
from engines.errors import TrtcError

from .bench_clocks import HostClock

LABELS = {"torch-compile": "torch.compile (reduce-overhead)", "torch-eager": "torch eager"}
WARM_CALLS = 3  # reduce-overhead records its CUDA graph on the third call of a shape


class ReferenceUnavailable(TrtcError):
    """No PyTorch model can be made for this engine (no torch, no source in its manifest, a foreign ONNX)."""


class TorchClock:
    """CUDA events recorded on torch's current stream after each call."""

    def __init__(self, torch):
        self.torch = torch

    def mark(self):
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def wait(self, mark) -> None:
        mark.synchronize()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1000.0


def reference_source(spec: str, ref) -> tuple[str, int | None]:
    """(the PyTorch source of the model ``spec``, the class count to build it with or None): a PyTorch source
    itself, its manifest's source, or a ``.pt2`` beside it; :class:`ReferenceUnavailable` saying why not."""
    from engines import split_engine

    from .model_source import parse_source

    if ref.kind == "pytorch":
        return spec, None
    path = Path(split_engine(spec)[1])
    program = path.with_suffix(".pt2")
    model = (ref.manifest.model or {}) if ref.manifest is not None else {}
    source = model.get("source")
    why = "its manifest names no PyTorch source" if ref.manifest is not None else "it has no trtc manifest"
    if source:
        try:
            kind = parse_source(str(source), use="bench").kind
            classes = model.get("num_classes")
            return str(source), (classes if kind in ("torchvision", "timm") and classes not in (None, 1000) else None)
        except TrtcError as exc:
            why = f"its manifest's source {source} is not a PyTorch model here ({exc.reason})"
    if program.is_file():
        return str(program), None
    raise ReferenceUnavailable(why, f"export it from a PyTorch source, or put its torch.export program at {program}")


class Yardstick:
    """Reference models by name ("SOURCE (fp16)"), each loaded once, and the (name, batch) pairs already timed."""

    def __init__(self, mode: str, device: str):
        self.mode, self.label = mode, LABELS[mode]
        self.device = device
        self.models: dict[str, tuple] = {}  # name -> (module, half)
        self.timed: set = set()

    def prepare(self, spec: str, ref) -> str:
        """The reference's name for model ``spec`` (its PyTorch model loaded the first time)."""
        source, classes = reference_source(spec, ref)
        half = ref.precision != "fp32"
        name = f"{source} ({'fp16' if half else 'fp32'})"
        if name not in self.models:
            self.models[name] = (self._load(source, classes, half), half)
        return name

    def precision(self, name: str) -> str:
        return "fp16" if self.models[name][1] else "fp32"

    def _torch_device(self, torch):
        if not self.device.startswith("cuda"):
            return torch.device("cpu")
        index = int(self.device.partition(":")[2] or 0)
        torch.cuda.set_device(index)
        return torch.device("cuda", index)

    def _load(self, source: str, classes: int | None, half: bool):
        torch = require("torch", f"The {self.label} reference row", extra="export")
        from .model_source import load_model

        loaded = load_model(source, num_classes=classes, use="bench")
        module = loaded.module.module() if loaded.kind == "exported" else loaded.module
        try:
            module.eval()
        except (NotImplementedError, RuntimeError):  # an ExportedProgram's module() is in eval form already
            pass
        module = module.to(self._torch_device(torch))
        if half:
            module = module.half()
        return module.to(memory_format=torch.channels_last)

    def timer(self, name: str, batch: int, shape: tuple):
        """(call, clock, "device" or "host") timing the reference ``name`` at ``batch``: compiled (torch-compile)
        and warmed up here; the input made once on the device."""
        torch = require("torch", f"The {self.label} reference row", extra="export")
        module, half = self.models[name]
        dev = self._torch_device(torch)
        x = torch.randn((batch, *shape), device=dev, dtype=torch.float16 if half else torch.float32)
        x = x.contiguous(memory_format=torch.channels_last)
        fn = torch.compile(module, mode="reduce-overhead", dynamic=False) if self.mode == "torch-compile" else module

        def call():
            with torch.inference_mode():
                fn(x)

        for _ in range(WARM_CALLS):  # the compile itself (seconds to a minute), then the CUDA graph's recording
            call()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            return call, TorchClock(torch), "device"
        return call, HostClock(), "host"


__all__ = ["Yardstick", "ReferenceUnavailable", "reference_source", "LABELS"]
