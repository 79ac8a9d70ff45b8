"""Label events (toolchain.serve.events) on a recorded sequence of real predictions: EfficientNet-Lite0's top-1 on
every frame of bikes.mp4 (tests/data/bikes_lite0_top1.json). The expected events below were worked out by hand
from that file's rows, frame by frame; each window's comment gives the reasoning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolchain.serve.events import LabelEvents

ROWS = json.loads((Path(__file__).resolve().parents[1] / "data" / "bikes_lite0_top1.json").read_text())["frames"]


def _events(first: int, last: int, close: str | None = None, **settings) -> list[tuple[int, dict]]:
    """(frame that said it, event) for frames first..last fed in order; then close(``close``)."""
    events = LabelEvents(**settings)
    out = []
    for frame, time, label, score in ROWS[first:last + 1]:
        out += [(frame, e) for e in events.push(frame, time, label, score)]
    if close:
        out += [(None, e) for e in events.close(close)]
    return out


def _mean(scores):
    return round(sum(scores) / len(scores), 6)


def test_the_opening_switch_and_suit_runs_with_the_defaults():
    """Frames 0-45, hold 3, min score 0.4. "switch" holds at 0 and 1, not at 2 (0.381): a two-frame flicker, no event;
    it holds at 3, 4, 5: label_start at 5, dated frame 3; it holds at 6 and 7, then misses 8, 9, 10 (0.237, 0.282,
    0.33): label_end at 10, its last holding frame 7. Frames 11 and 20 hold alone. "suit" holds at 30, 31, 32: start at
    32; it holds at 33, misses 34 (0.391), 35, 36: end at 36, last frame 33. "abaya" holds once (41)."""
    got = _events(0, 45)
    assert [(at, e["event"], e["label"], e["first_frame"]) for at, e in got] == [
        (5, "label_start", "switch", 3), (10, "label_end", "switch", 3),
        (32, "label_start", "suit", 30), (36, "label_end", "suit", 30)]
    switch_end, suit_end = got[1][1], got[3][1]
    assert switch_end["last_frame"] == 7 and switch_end["frames"] == 5 and switch_end["reason"] == "no longer held"
    assert switch_end["first_time"] == 0.12 and switch_end["last_time"] == 0.28
    assert switch_end["duration_s"] == pytest.approx(0.16)
    assert switch_end["peak_score"] == 0.698991
    assert switch_end["mean_score"] == _mean([0.467799, 0.570571, 0.486654, 0.698991, 0.443599])
    assert (suit_end["last_frame"], suit_end["frames"], suit_end["peak_score"]) == (33, 4, 0.805494)
    assert suit_end["duration_s"] == pytest.approx(0.12)
    assert suit_end["mean_score"] == _mean([0.805494, 0.731676, 0.654788, 0.578642])


def test_flickers_of_the_unicycle_before_it_holds_are_no_event():
    """Frames 105-140, hold 3, min score 0.4: "unicycle" holds alone at 109, 113 and 117-... (110, 112 and 114 are
    under 0.4, 111 and 115-116 are "gas pump" under 0.4): the run that starts at 117 reaches three frames at 119.
    It holds through 128, misses 129, 130, 131 (0.381, 0.375, 0.388): end at 131. 133-134 hold twice, 135 misses,
    136 holds once: no second event."""
    got = _events(105, 140)
    assert [(at, e["event"], e["first_frame"]) for at, e in got] == [(119, "label_start", 117), (131, "label_end", 117)]
    end = got[1][1]
    held = [0.40847, 0.455238, 0.467553, 0.492509, 0.610018, 0.63062, 0.54136, 0.474825, 0.525857, 0.468589,
            0.404528, 0.413873]
    assert (end["label"], end["last_frame"], end["frames"]) == ("unicycle", 128, 12)
    assert end["duration_s"] == pytest.approx(5.12 - 4.68)
    assert (end["peak_score"], end["mean_score"]) == (0.63062, _mean(held))


def test_a_lower_bar_starts_earlier_and_a_two_frame_gas_pump_does_not_end_it():
    """Frames 105-140, hold 3, min score 0.3: "unicycle" holds at 109 and 110, "gas pump" at 111 (0.375) breaks that
    run; "unicycle" holds at 112, 113, 114: start at 114, dated 112. "gas pump" holds at 115 and 116 (two misses of
    the active label, two frames of a candidate: neither reaches 3), "unicycle" holds again from 117 to 136 (all of
    them at 0.3 or more), then "jinrikisha" under 0.3 at 137, 138, 139: end at 139, last frame 136, 23 frames."""
    got = _events(105, 140, min_score=0.3)
    assert [(at, e["event"], e["first_frame"]) for at, e in got] == [(114, "label_start", 112), (139, "label_end", 112)]
    end = got[1][1]
    assert (end["last_frame"], end["frames"], end["peak_score"]) == (136, 23, 0.63062)
    assert end["duration_s"] == pytest.approx(5.44 - 4.48)


def test_a_new_label_that_holds_ends_the_active_one_first_and_close_ends_what_is_under_way():
    """Frames 105-140 with hold 2, min score 0.3: "unicycle" 109-110 starts at 110; "gas pump" 111 (one frame) does not
    end it; 112 holds again. "gas pump" 115-116 is a two-frame run of another label: at 116 it ends "unicycle" (last
    frame 114) and starts "gas pump" dated 115; "unicycle" 117-118 then ends that one (last 116) and starts again at
    118, dated 117. Stopped at 125: close ends the one under way, last frame 125."""
    got = _events(105, 125, close="removed", hold=2, min_score=0.3)
    assert [(at, e["event"], e["label"], e["first_frame"]) for at, e in got] == [
        (110, "label_start", "unicycle", 109),
        (116, "label_end", "unicycle", 109), (116, "label_start", "gas pump", 115),
        (118, "label_end", "gas pump", 115), (118, "label_start", "unicycle", 117),
        (None, "label_end", "unicycle", 117)]
    assert got[1][1]["last_frame"] == 114 and got[3][1]["last_frame"] == 116
    assert got[5][1]["last_frame"] == 125 and got[5][1]["reason"] == "removed" and got[5][1]["frames"] == 9


def test_settings_are_checked():
    with pytest.raises(ValueError):
        LabelEvents(hold=0)
    with pytest.raises(ValueError):
        LabelEvents(min_score=1.5)
