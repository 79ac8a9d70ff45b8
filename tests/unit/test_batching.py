"""The GPU pipeline's slot assembler, driven by threads on the CPU: every frame reserved comes out exactly once,
in full batches (partial only on time-out or at the end), runs of several frames stay contiguous, no buffer is
lost, and a failed launch marks its frames lost instead of leaving its slots reserved. CUDA events are stand-ins
here; the real ones are exercised by tests/gpu."""

from __future__ import annotations

import random
import threading
import time
import types

import numpy as np
import pytest

from engines.video.assembler import InputBuffer, SlotAssembler, Stopped


class _Event:
    def record(self, stream=None):
        return self

    def synchronize(self):
        pass


_fake_cp = types.SimpleNamespace(empty=lambda shape, dtype: np.zeros(shape, dtype),
                                 cuda=types.SimpleNamespace(Event=lambda **k: _Event()))


def _buffers(n, batch):
    return [InputBuffer(_fake_cp, (1,), np.float32, batch) for _ in range(n)]


def _write(asm, metas, values, stream_ptr, fail=False):
    """What decode_stage does: reserve runs until every frame has a slot, fill them, commit each run."""
    pos = 0
    while pos < len(metas):
        buf, start, m = asm.reserve(metas[pos:pos + 16])
        ev = None
        try:
            if fail:
                raise RuntimeError("launch failed")
            buf.data[start:start + m, 0] = values[pos:pos + m]
            ev = buf.event_for(stream_ptr)
        except RuntimeError:
            ev = None
        finally:
            asm.commit(buf, start, m, stream_ptr, ev)
        pos += m


@pytest.mark.parametrize("n_buffers,batch,sources,frames,group", [(2, 4, 8, 60, 1), (4, 16, 3, 200, 5),
                                                                   (2, 1, 4, 30, 3), (3, 64, 16, 120, 16)])
def test_every_frame_comes_out_once_and_no_buffer_is_lost(n_buffers, batch, sources, frames, group):
    asm = SlotAssembler(_buffers(n_buffers, batch), batch)
    asm.sources_live = sources

    def producer(i):
        rng = random.Random(i)
        for f0 in range(0, frames, group):
            fs = list(range(f0, min(frames, f0 + group)))
            _write(asm, [(i, f) for f in fs], [i * 10000 + f for f in fs], i + 1)
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
    per_source = {}
    for i, f in got:
        per_source.setdefault(i, []).append(f)
    assert all(v == sorted(v) for v in per_source.values())  # in order per source
    assert len(asm.free) == n_buffers and asm.current is None and not asm.order
    assert max(sizes) == batch and sum(sizes) == sources * frames


def test_a_run_never_crosses_a_buffer_end():
    asm = SlotAssembler(_buffers(2, 4), 4)
    asm.sources_live = 1
    buf, start, m = asm.reserve([0, 1, 2])
    assert (start, m) == (0, 3)
    asm.commit(buf, start, m, 1, buf.event_for(1))
    buf2, start, m = asm.reserve([3, 4, 5])  # only one slot left in the first buffer
    assert buf2 is buf and (start, m) == (3, 1)
    asm.commit(buf2, start, m, 1, buf2.event_for(1))
    assert asm.take(0.0) is buf and buf.meta == [0, 1, 2, 3]
    buf3, start, m = asm.reserve([4, 5])
    assert buf3 is not buf and (start, m) == (0, 2)


def test_buffers_go_to_inference_in_the_order_they_were_opened():
    """Before: a buffer whose last run was still being enqueued was overtaken by a later buffer that completed
    first, and a source's frames 16-31 were classified before its frames 0-15 (seen on the H200 with 16
    sources). Now inference waits for the oldest buffer."""
    asm = SlotAssembler(_buffers(3, 4), 4)
    asm.sources_live = 2
    a, a_start, a_m = asm.reserve([("s", 0), ("s", 1)])  # source s: frames 0-1 in buffer A, launch still running
    _write(asm, [("t", 0), ("t", 1)], [1, 2], 2)  # source t fills A ...
    _write(asm, [("s", 2), ("s", 3), ("t", 2), ("t", 3)], [3, 4, 5, 6], 3)  # ... and B, which completes first
    got = []
    t = threading.Thread(target=lambda: got.append(asm.take(10.0)))
    t.start()
    time.sleep(0.05)
    assert not got, "a later buffer was handed to inference before the older one was complete"
    asm.commit(a, a_start, a_m, 1, a.event_for(1))
    t.join(timeout=5)
    assert got == [a] and [m for m in a.meta] == [("s", 0), ("s", 1), ("t", 0), ("t", 1)]
    b = asm.take(0.0)
    assert b is not a and b.meta == [("s", 2), ("s", 3), ("t", 2), ("t", 3)]


def test_a_failed_launch_marks_its_frames_lost_and_frees_the_slots():
    """Before: a failed launch left its slot reserved (the buffer never became ready) or its stale row was
    returned as a real frame. Now the run's metadata is None, the buffer completes, the others are intact."""
    asm = SlotAssembler(_buffers(2, 4), 4)
    asm.sources_live = 1
    _write(asm, [("a", 0), ("a", 1)], [1, 2], 1)
    _write(asm, [("a", 2)], [3], 1, fail=True)
    _write(asm, [("a", 3)], [4], 1)
    buf = asm.take(0.0)
    assert buf is not None and buf.meta == [("a", 0), ("a", 1), None, ("a", 3)] and buf.lost == 1
    assert buf.writing == 0


def test_halt_unblocks_a_producer_waiting_for_a_buffer():
    asm = SlotAssembler(_buffers(2, 1), 1)
    asm.sources_live = 1
    _write(asm, [0], [0], 1)
    _write(asm, [1], [1], 1)  # both buffers now wait for inference
    err = []

    def blocked():
        try:
            asm.reserve([2])
        except Stopped:
            err.append("stopped")

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.05)
    asm.halt()
    t.join(timeout=2)
    assert err == ["stopped"] and asm.take(0.01) is None
