"""The block transport of worker pools and Ray actors (engines/video/results.py): a chunk of Predictions packed in
a worker, pickled, unpacked in the parent gives back every prediction once, in order, equal field for field; its
JSON lines are the bytes trtc run writes for each prediction; a redone source's rows at or before the caller's last
frame are dropped; trtc run's _Lines writes a block as the same bytes as the predictions one by one."""

from __future__ import annotations

import io
import json
import pickle

import pytest

from engines.video.pipeline import Prediction
from engines.video.results import BlockRun, ResultBlock, json_line

LABELS = [f"class {i}" for i in range(10)]


def _preds():
    out = []
    for i in range(7):
        src = "a.mp4" if i % 3 else "/data/b.mp4"
        out.append(Prediction(src, i, None if i == 2 else i * 512, i / 25 if i != 4 else None, [i % 10, 3, 7],
                              [0.5 - i / 100, 0.25, 0.125], None, 1.5 + i if i % 2 else None, 0.25,
                              received=1795507682.143 + i))
    return out


def test_a_block_gives_back_every_prediction_once_in_order():
    preds = _preds()
    block = pickle.loads(pickle.dumps(ResultBlock.pack(preds, "cuda:1")))
    assert block.lines is None and block.labels is None  # labels stay with the receiver
    block.labels = LABELS
    got = list(block.predictions())
    want = [Prediction(p.source, p.frame, p.pts, p.time, p.indices, p.scores, [LABELS[i] for i in p.indices],
                       p.latency_ms, p.decode_ms, device="cuda:1", received=p.received) for p in preds]
    assert got == want
    assert block.per_source() == {"/data/b.mp4": (3, 6), "a.mp4": (4, 5)}


@pytest.mark.parametrize("mode", ["plain", "latency"])
def test_block_lines_are_the_lines_trtc_run_writes(mode):
    preds = _preds()
    for p in preds:
        p.labels = [LABELS[i] for i in p.indices]
    block = pickle.loads(pickle.dumps(ResultBlock.pack([*preds], "cpu", mode)))
    expected = []
    for p in _preds():
        p.labels, p.device = [LABELS[i] for i in p.indices], "cpu"
        expected.append(json.dumps(p.to_dict(latency=mode == "latency"), allow_nan=False) + "\n")
    assert block.lines == expected
    assert all(json.loads(x)["device"] == "cpu" for x in block.lines)
    block.labels = LABELS
    assert [p.line for p in block.predictions()] == expected


def test_keep_drops_the_frames_the_caller_has():
    block = ResultBlock.pack(_preds(), None, "plain")
    last = {"a.mp4": 2, "/data/b.mp4": -1}
    kept = block.keep(lambda s, f: f > last.get(s, -1))
    assert [(p.source, p.frame) for p in kept.predictions()] == [("/data/b.mp4", 0), ("/data/b.mp4", 3),
                                                                ("a.mp4", 4), ("a.mp4", 5), ("/data/b.mp4", 6)]
    assert [json.loads(x)["frame"] for x in kept.lines] == [0, 3, 4, 5, 6]
    assert block.keep(lambda s, f: True) is block and len(block.keep(lambda s, f: False)) == 0


def test_names_go_back_to_the_callers():
    block = ResultBlock.pack(_preds()[:2], None)
    block.renamed({"/data/b.mp4": "b.mp4"})
    assert [p.source for p in block.predictions()] == ["b.mp4", "a.mp4"]


def test_trtc_run_writes_a_block_as_the_predictions_one_by_one():
    from toolchain.run import _Lines, _Prior

    one, many = io.StringIO(), io.StringIO()
    by_one, by_block = _Lines(None, _Prior(), one, True), _Lines(None, _Prior(), many, True)
    preds = _preds()
    for p in preds:  # a worker's Predictions carry the labels its engine's manifest gives, as the parent's do
        p.labels = [LABELS[i] for i in p.indices]
    block = ResultBlock.pack(preds, "cuda:0", "latency")
    block.labels = LABELS
    for p in block.predictions():
        p.line = None
        by_one.write(p)
    assert by_block.write_block(block) == 7
    assert many.getvalue() == one.getvalue() and many.getvalue().count("\n") == 7
    assert by_block.last == by_one.last == {"/data/b.mp4": 6, "a.mp4": 5}
    assert by_block.latencies == by_one.latencies == [2.5, 4.5, 6.5]  # the rows that have a latency_ms


def test_a_block_run_iterates_predictions_or_blocks_once():
    def blocks():
        b = ResultBlock.pack(_preds(), "cpu")
        b.labels = LABELS
        yield b
        yield "an event"

    from engines.video.pipeline import RunStats

    run = BlockRun(blocks, RunStats(), [])
    assert [getattr(p, "frame", p) for p in run] == [0, 1, 2, 3, 4, 5, 6, "an event"]
    again = BlockRun(blocks, RunStats(), [])
    assert [len(b) if isinstance(b, ResultBlock) else b for b in again.blocks()] == [7, "an event"]
    with pytest.raises(Exception, match="iterated once"):
        iter(again)


def test_json_line_of_an_event():
    class Ev:
        def to_dict(self):
            return {"event": "disconnected", "source": "rtsp://cam/1"}

    assert json_line(Ev()) == '{"event": "disconnected", "source": "rtsp://cam/1"}\n'
