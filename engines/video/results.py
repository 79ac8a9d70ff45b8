"""Results in blocks: how a worker process or a Ray actor hands a chunk of predictions to its parent.

A worker used to send one tuple per frame (with two small lists) and the parent built a :class:`Prediction`, its
labels, its dict and its JSON line for every frame, in one Python thread for all the workers: about 20 us a line on
the CI machine (examples/pool_transport_cost.py). A :class:`ResultBlock` carries a chunk as columns (one pickle per
chunk) and, when the caller writes JSON lines (``trtc run``), the lines themselves, formatted in the worker by
:func:`json_line`, the same function the single-process run writes with: the parent writes a block with one call
and builds Predictions only for callers who iterate them.
"""

from __future__ import annotations

import json

from ..errors import UsageProblem
from .pipeline import Prediction, VideoRun, label_names

LINE_MODES = (None, "plain", "latency")  # no lines; JSON lines; JSON lines with latency_ms and decode_ms


def json_line(pred, latency: bool = False) -> str:
    """The JSON line ``trtc run`` writes for ``pred`` (a Prediction or a live source's event), newline included."""
    d = pred.to_dict(latency=latency) if hasattr(pred, "frame") else pred.to_dict()
    return json.dumps(d, allow_nan=False) + "\n"


class ResultBlock:
    """Consecutive predictions of one worker, as columns. ``names``: the distinct sources; ``src[i]``: row i's index
    in ``names``. ``lines``: row i's JSON line (device field included) when the block was packed with a line mode,
    else None. ``device`` and ``labels`` are set by the receiving side (the labels are not sent with every block)."""

    __slots__ = ("names", "src", "frame", "pts", "time", "indices", "scores", "latency", "decode", "received",
                 "lines", "device", "labels")

    def __init__(self, names, src, frame, pts, time, indices, scores, latency, decode, received, lines=None,
                 device=None):
        self.names, self.src, self.frame, self.pts, self.time = names, src, frame, pts, time
        self.indices, self.scores, self.latency, self.decode, self.received = indices, scores, latency, decode, received
        self.lines, self.device, self.labels = lines, device, None

    def __reduce__(self):  # labels stay behind: the receiver knows its worker's labels
        return (ResultBlock, (self.names, self.src, self.frame, self.pts, self.time, self.indices, self.scores,
                              self.latency, self.decode, self.received, self.lines, self.device))

    def __len__(self) -> int:
        return len(self.frame)

    @classmethod
    def pack(cls, preds: list, device: str | None = None, lines: str | None = None) -> ResultBlock:
        """A block of ``preds`` (Predictions, in order); with ``lines`` ("plain" or "latency") their JSON lines too,
        written as the single-process run writes them plus the ``device`` field (when given)."""
        if lines not in LINE_MODES:
            raise ValueError(f"unknown line mode {lines!r}")
        names: dict = {}
        src = [names.setdefault(p.source, len(names)) for p in preds]
        text = None
        if lines is not None:
            if device is not None:
                for p in preds:
                    p.device = device
            text = [json_line(p, lines == "latency") for p in preds]
        return cls(list(names), src, [p.frame for p in preds], [p.pts for p in preds], [p.time for p in preds],
                   [list(p.indices) for p in preds], [list(p.scores) for p in preds], [p.latency_ms for p in preds],
                   [p.decode_ms for p in preds], [p.received for p in preds], text, device)

    def per_source(self) -> dict:
        """{source: (rows, last frame)} of this block."""
        out: dict = {}
        for s, f in zip(self.src, self.frame, strict=True):
            n, _ = out.get(s, (0, None))
            out[s] = (n + 1, f)
        return {self.names[s]: v for s, v in out.items()}

    def keep(self, wanted) -> ResultBlock:
        """The rows for which ``wanted(source, frame)`` is true (a redone Ray source drops frames it already gave)."""
        rows = [i for i, (s, f) in enumerate(zip(self.src, self.frame, strict=True)) if wanted(self.names[s], f)]
        if len(rows) == len(self.frame):
            return self

        def pick(col):
            return None if col is None else [col[i] for i in rows]

        kept = ResultBlock(self.names, pick(self.src), pick(self.frame), pick(self.pts), pick(self.time),
                           pick(self.indices), pick(self.scores), pick(self.latency), pick(self.decode),
                           pick(self.received), pick(self.lines), self.device)
        kept.labels = self.labels
        return kept

    def shifted(self, offsets: dict) -> ResultBlock:
        """The rows with ``offsets[source]`` added to their frame numbers (a live source re-run as a new connection
        numbers its frames on from where the failed run stopped); the lines are formatted again by the receiver."""
        if not any(offsets.get(n) for n in self.names):
            return self
        add = [offsets.get(n, 0) for n in self.names]
        out = ResultBlock(self.names, self.src, [f + add[s] for s, f in zip(self.src, self.frame, strict=True)],
                          self.pts, self.time, self.indices, self.scores, self.latency, self.decode, self.received,
                          None, self.device)
        out.labels = self.labels
        return out

    def renamed(self, names: dict) -> None:
        """Source names as the caller gave them (``names``: the name sent -> the caller's), in place."""
        self.names = [names.get(n, n) for n in self.names]

    def predictions(self):
        """The rows as Predictions (each with ``line`` set when the block carries lines)."""
        names, labels, device = self.names, self.labels, self.device
        lines = self.lines if self.lines is not None else [None] * len(self.frame)
        for s, f, pts, t, idx, sc, lat, dec, rec, line in zip(self.src, self.frame, self.pts, self.time,
                                                              self.indices, self.scores, self.latency, self.decode,
                                                              self.received, lines, strict=True):
            p = Prediction(names[s], f, pts, t, idx, sc, label_names(labels, idx), lat, dec, device=device,
                           received=rec)
            if line is not None:
                p.line = line
            yield p


class BlockRun(VideoRun):
    """A :class:`VideoRun` whose results come in blocks (a worker pool's, a Ray pool's). Iterating gives
    Predictions; :meth:`blocks` gives the same results a :class:`ResultBlock` at a time (with their JSON lines when
    the run was asked for them: what ``trtc run`` writes with one call per block), and live sources' events as
    they come. ``timing``: wall-clock times (Unix seconds) of the first and the last result (``first_result_at``,
    ``last_result_at``) and, for a worker pool, of the first worker pipeline's start after its engine's warm-up
    (``pipeline_started_at``)."""

    def __init__(self, blocks_factory, stats, problems, events=None):
        super().__init__(self._flatten, stats, problems, events)
        self._blocks_factory = blocks_factory
        self.timing: dict = {}

    def blocks(self):
        """Blocks of predictions, and events, in the order they came (once, as iterating is)."""
        if self._started:
            raise UsageProblem("a VideoRun can be iterated once", "call classify() again")
        self._started = True
        return self._blocks_factory()

    def _flatten(self):
        gen = self._blocks_factory()
        try:
            for item in gen:
                if isinstance(item, ResultBlock):
                    yield from item.predictions()
                else:
                    yield item
        finally:
            gen.close()
