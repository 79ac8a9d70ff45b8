"""One thread of an engine's own on which calls run, whichever thread makes them: ``OneThread.call(fn, *args)``.

Why (the compiled PyTorch engine, engines.torch_engine): torch keeps cuDNN's execution plans in a cache per thread
(``thread_local`` in ``aten/src/ATen/native/cudnn/Conv_v8.cpp``), so the first run of the model's function on a
new thread builds every convolution's plan again. On an H100 (2026-11-26; torch 2.11.0+cu130, Lite0 FP16, batch
64) that first run took 2.0-2.1 s on each new thread against 3 ms on a thread that had run it, and each video
pipeline has an inference thread of its own: the first pipeline run of `trtc bench VIDEO` at 16 streams captured a
CUDA graph for a new input slot there and ran at 8,700-11,200 fps against 20,000-21,800 for the runs after it.
On one thread the plans are built once per engine.

The caller waits for its call (its exception is raised in the caller); a call made on the thread itself runs at
once. The thread is a ``ThreadPoolExecutor``'s: not a daemon, so an interpreter that exits mid-call lets the call
end first instead of stopping the thread inside torch's C++ code (which aborts the process).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


class OneThread:
    def __init__(self, name: str):
        self.name = name
        self._pool = None
        self._local = threading.local()  # .inside: this thread is the pool's
        self._made = threading.Lock()

    def call(self, fn, *args):
        """``fn(*args)`` on the thread (started at the first call), waiting for its result."""
        if getattr(self._local, "inside", False):
            return fn(*args)
        with self._made:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
            pool = self._pool
        return pool.submit(self._inside, fn, args).result()

    def _inside(self, fn, args):
        self._local.inside = True
        return fn(*args)

    def close(self) -> None:
        """Let the thread end once its calls are done (a later call starts a new one)."""
        with self._made:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


__all__ = ["OneThread"]
