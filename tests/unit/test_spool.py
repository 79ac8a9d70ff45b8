"""The disk spool in front of the service's network sinks (toolchain.serve.spool): order kept across segments and
restarts, acknowledged records gone for good, a torn last record cut off, and the bound dropping the oldest whole
segments with a count."""

from __future__ import annotations

import json

from toolchain.serve.spool import Spool


def _rec(i: int) -> bytes:
    return json.dumps({"camera": "door", "frame": i, "pad": "x" * 40}).encode()


def test_records_come_back_in_order_across_segments_and_a_restart(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 16)
    for i in range(3000):  # about 200 kB: several segments
        spool.put(_rec(i))
    assert len(list(tmp_path.glob("*.seg"))) >= 3
    sizes = [len(_rec(i)) + 4 for i in range(3000)]  # each record behind its 4-byte length
    assert spool.waiting_bytes == sum(sizes) == spool.bytes
    got = spool.peek(1000)
    assert [json.loads(r)["frame"] for r in got] == list(range(1000))
    spool.ack(1000)
    assert spool.waiting_bytes == sum(sizes[1000:])  # what /metrics' trtc_spool_bytes shows
    spool.close()
    again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 16)  # a restart: the rest, in order
    frames = []
    while True:
        batch = again.peek(700)
        if not batch:
            break
        frames += [json.loads(r)["frame"] for r in batch]
        again.ack(len(batch))
    assert frames == list(range(1000, 3000))
    assert again.peek(1) == [] and len(list(tmp_path.glob("*.seg"))) == 1
    assert again.waiting_bytes == 0 < again.bytes  # drained: nothing waits, though the last segment stays
    again.put(_rec(3000))  # and it goes on after being emptied
    assert [json.loads(r)["frame"] for r in again.peek()] == [3000]


def test_a_record_torn_by_a_crash_is_cut_off_and_the_next_is_whole(tmp_path):
    spool = Spool(tmp_path)
    spool.put(_rec(0))
    spool.put(_rec(1))
    spool.close()
    (seg,) = tmp_path.glob("*.seg")
    with open(seg, "ab") as f:  # a length prefix and half a record: the process died mid-write
        f.write(b"\x00\x00\x00\x50" + _rec(2)[:20])
    again = Spool(tmp_path)
    again.put(_rec(3))
    assert [json.loads(r)["frame"] for r in again.peek()] == [0, 1, 3]


def test_past_its_bound_the_oldest_whole_segments_go_and_are_counted(tmp_path):
    spool = Spool(tmp_path, max_bytes=64 << 10, segment_bytes=16 << 10)
    n = 2000  # about 140 kB into a 64 kB spool
    for i in range(n):
        spool.put(_rec(i))
    kept = [json.loads(r)["frame"] for r in spool.peek(n)]
    assert spool.bytes <= 64 << 10
    assert kept == list(range(n - len(kept), n))  # the newest, in order, with no gap
    assert spool.dropped == n - len(kept) > 0
    spool.ack(10)
    assert [json.loads(r)["frame"] for r in spool.peek(1)] == [n - len(kept) + 10]
