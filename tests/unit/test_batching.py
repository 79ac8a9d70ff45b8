"""The GPU pipeline's slot assembler, driven by threads on the CPU: every frame put comes out exactly once, in
full batches (partial only on time-out or at the end), and no buffer is lost. CUDA events are stand-ins here;
the real ones are exercised by tests/gpu."""

from __future__ import annotations

import random
import threading
import time
import types

import numpy as np
import pytest

from engines.video.pipeline import _Assembler, _Buffer, _Stopped


class _Event:
    def record(self, stream=None):
        return self

    def synchronize(self):
        pass


_fake_cp = types.SimpleNamespace(empty=lambda shape, dtype: np.zeros(shape, dtype),
                                 cuda=types.SimpleNamespace(Event=lambda **k: _Event()))


class _Stream:
    def __init__(self, ptr):
        self.ptr = ptr


@pytest.mark.parametrize("n_buffers,batch,sources,frames", [(2, 4, 8, 60), (4, 16, 3, 200), (2, 1, 4, 30)])
def test_every_frame_comes_out_once_and_no_buffer_is_lost(n_buffers, batch, sources, frames):
    bufs = [_Buffer(_fake_cp, (1,), np.float32, batch) for _ in range(n_buffers)]
    asm = _Assembler(bufs, batch)
    asm.sources_live = sources
    written = []

    def producer(i):
        rng = random.Random(i)
        stream = _Stream(i + 1)
        for f in range(frames):
            def launch(slot, value=i * 10000 + f):
                slot[0] = value
                written.append(value)
            asm.put(launch, (i, f), stream)
            if rng.random() < 0.1:
                time.sleep(0.001)
        asm.source_done()

    got, sizes = [], []

    def consumer():
        while True:
            buf = asm.take(0.005)
            if buf is None:
                return
            n = buf.filled
            assert [m[0] * 10000 + m[1] for m in buf.meta] == buf.data[:n, 0].astype(int).tolist()
            got.extend(buf.meta)
            sizes.append(n)
            time.sleep(0.0005)  # inference time: producers must wait for free buffers
            asm.release(buf)

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(sources)]
    threads.append(threading.Thread(target=consumer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(got) == sorted((i, f) for i in range(sources) for f in range(frames))
    assert len(asm.free) == n_buffers and asm.current is None and not asm.ready
    assert max(sizes) == batch and sum(sizes) == sources * frames


def test_halt_unblocks_a_producer_waiting_for_a_buffer():
    bufs = [_Buffer(_fake_cp, (1,), np.float32, 1) for _ in range(2)]
    asm = _Assembler(bufs, 1)
    asm.sources_live = 1
    asm.put(lambda s: None, 0, _Stream(1))
    asm.put(lambda s: None, 1, _Stream(1))  # both buffers now wait for inference
    err = []

    def blocked():
        try:
            asm.put(lambda s: None, 2, _Stream(1))
        except _Stopped:
            err.append("stopped")

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.05)
    asm.halt()
    t.join(timeout=2)
    assert err == ["stopped"] and asm.take(0.01) is None

