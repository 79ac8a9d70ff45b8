"""Label events: a classifier's "something happened", from its per-frame top-1 labels.

    events = LabelEvents(hold=3, min_score=0.4)
    for line in results:                       # `trtc run`'s JSON lines of one camera, in frame order
        for event in events.push(line["frame"], line["time"], top["label"], top["score"]):
            publish(event)
    for event in events.close("stopped"):      # the stream ended, the camera was removed
        publish(event)

A label *holds* on a frame where it is the top-1 with a score of at least ``min_score``. ``label_start`` is said
when a label has held on ``hold`` classified frames in a row, dated from the first of them; ``label_end`` when the
active label has then failed to hold on ``hold`` frames in a row (or at close), carrying its first and last
holding frame, the duration between them (stream time), its peak and mean score over the frames it held. The same
count each way is the hysteresis: a label that flickers for fewer than ``hold`` frames neither starts nor ends an
event. One label is active at a time; a new label that holds while another is active ends that one first (at its
last holding frame), then starts.
"""

from __future__ import annotations

from dataclasses import dataclass

# defaults that suit 5-30 classified frames a second: a label must hold for 3 of them (0.1-0.6 s)
HOLD_FRAMES = 3
MIN_SCORE = 0.4


@dataclass
class _Run:
    """Consecutive frames on which one label held."""

    label: str | int
    first: int
    first_time: float | None
    frames: int = 0
    last: int = 0
    last_time: float | None = None
    peak: float = 0.0
    total: float = 0.0

    def add(self, frame: int, time: float | None, score: float) -> None:
        self.frames += 1
        self.last, self.last_time = frame, time
        self.peak = max(self.peak, score)
        self.total += score


class LabelEvents:
    """The label events of one camera (one owner: the thread that feeds it its results in order)."""

    def __init__(self, hold: int = HOLD_FRAMES, min_score: float = MIN_SCORE):
        if not isinstance(hold, int) or hold < 1:
            raise ValueError(f"hold must be a whole number of frames of 1 or more, not {hold!r}")
        if not 0.0 <= min_score <= 1.0:
            raise ValueError(f"min_score must lie in [0, 1], not {min_score!r}")
        self.hold, self.min_score = hold, min_score
        self.active: _Run | None = None  # the event under way
        self._misses = 0  # frames in a row on which the active label did not hold
        self._candidate: _Run | None = None  # another label's run of holding frames

    def push(self, frame: int, time: float | None, label, score: float) -> list[dict]:
        """The events that classified frame ``frame`` (stream time ``time`` s; top-1 ``label`` at ``score``) ends or
        starts, in order: at most a ``label_end`` then a ``label_start``."""
        holds = score >= self.min_score
        out: list[dict] = []
        if self.active is not None and holds and label == self.active.label:
            self.active.add(frame, time, score)
            self._misses, self._candidate = 0, None
            return out
        if self.active is not None:
            self._misses += 1
        if holds:
            if self._candidate is None or self._candidate.label != label:
                self._candidate = _Run(label, frame, time)
            self._candidate.add(frame, time, score)
        else:
            self._candidate = None
        if self.active is not None and (self._misses >= self.hold or self._ready()):
            out.append(self._end("no longer held"))
        if self.active is None and self._ready():
            self.active, self._candidate, self._misses = self._candidate, None, 0
            out.append(self._event("label_start", self.active))
        return out

    def close(self, reason: str) -> list[dict]:
        """The ``label_end`` of the event under way, if any (``reason``: why it ends, e.g. the stream stopped)."""
        self._candidate = None
        return [self._end(reason)] if self.active is not None else []

    def _ready(self) -> bool:
        return self._candidate is not None and self._candidate.frames >= self.hold

    def _end(self, reason: str) -> dict:
        run, self.active, self._misses = self.active, None, 0
        event = self._event("label_end", run)
        duration = (run.last_time - run.first_time) if None not in (run.first_time, run.last_time) else None
        event.update(last_frame=run.last, last_time=run.last_time, frames=run.frames,
                     duration_s=None if duration is None else round(duration, 6), peak_score=round(run.peak, 6),
                     mean_score=round(run.total / run.frames, 6), reason=reason)
        return event

    @staticmethod
    def _event(kind: str, run: _Run) -> dict:
        return {"event": kind, "label": run.label, "first_frame": run.first, "first_time": run.first_time}
