"""The clocks `trtc bench` times calls with: a call's seconds between two marks, on the host or on a CUDA stream.

Their own module so that the reference rows (:mod:`toolchain.bench_reference`) time a plain PyTorch model with the
same clocks without importing :mod:`toolchain.bench`, which imports them.
"""

from __future__ import annotations

import time


class HostClock:
    """Wall-clock marks: each call has returned (host input, or a synchronous engine) when the next mark is taken."""

    def mark(self):
        return time.perf_counter()

    def wait(self, mark) -> None:
        pass

    def seconds(self, a, b) -> float:
        return b - a


class CupyClock:
    """CUDA events recorded on ``stream`` after each call: a call's time is the GPU's, whatever the host did."""

    def __init__(self, cp, stream, device):
        self.cp, self.stream, self.device = cp, stream, device

    def mark(self):
        with self.device:
            e = self.cp.cuda.Event()
            e.record(self.stream)
        return e

    def wait(self, mark) -> None:
        mark.synchronize()

    def seconds(self, a, b) -> float:
        return self.cp.cuda.get_elapsed_time(a, b) / 1000.0
