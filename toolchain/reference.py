"""The PyTorch model behind the same small interface as the engines: numpy batch in, logits out."""

from __future__ import annotations

import numpy as np

from engines._deps import require
from engines._gpu import parse_device

from .model_source import load_model


class TorchReference:
    def __init__(self, source: str, device: str = "cpu", weights: str | None = None, num_classes: int | None = None):
        torch = require("torch", "Running the PyTorch reference", extra="export")
        self.loaded = load_model(source, weights=weights, num_classes=num_classes)
        module = self.loaded.module
        fn = module.module() if self.loaded.kind == "exported" else module
        kind, index = parse_device(device)
        self.device = torch.device(f"cuda:{index}" if kind == "cuda" else "cpu")
        self.fn = fn.to(self.device).eval() if hasattr(fn, "to") else fn
        self._torch = torch

    def infer(self, batch: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            out = self.fn(torch.from_numpy(np.ascontiguousarray(batch, np.float32)).to(self.device))
        return out.float().cpu().numpy()
