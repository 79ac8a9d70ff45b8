"""examples/soak_serve.py's judgement, on made-up runs: what the subscriber holds of a camera (distinct frames,
repeats, frames out of order), which events a fault, an edit, a label change or the final stop explains and which
none does, and its reading of serve's real /metrics text."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak_serve", ROOT / "examples" / "soak_serve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _result(camera, frame, arrived=0.0):
    return (arrived, f"soak/{camera}/result", json.dumps({"camera": camera, "frame": frame}))


def _event(camera, event, wall):
    return (wall + 0.5, f"soak/{camera}/event", json.dumps({"camera": camera, "event": event, "wall": wall}))


def test_repeats_are_allowed_but_a_frame_first_seen_late_is_out_of_order(soak):
    messages = [_result("door", f) for f in (0, 1, 2, 2, 1, 3, 5, 4)] + [_result("dock", 9)]
    messages.append((0.0, "soak/door/result", "not json"))
    got = soak.delivered(messages, "door")
    assert got == {"messages": 9, "distinct": 6, "repeats": 2, "unreadable": 1, "out_of_order": 1}


def test_each_event_is_explained_by_a_fault_an_edit_a_label_or_the_stop_or_is_reported(soak):
    faults = [{"camera": "cam0", "kind": "reboot", "wall": 100.0, "seconds": 8},
              {"camera": "cam1", "kind": "hang", "wall": 200.0, "seconds": 8}]
    run = SimpleNamespace(a=SimpleNamespace(explain_s=30), faults=faults, edits=[{"kind": "remove", "wall": 300.0}],
                          stop_wall=400.0)
    messages = [_event("cam0", "disconnected", 100.3), _event("cam0", "reconnected", 121.0),
                _event("cam1", "disconnected", 203.1),  # its camera never came back within the window
                _event("cam1", "reconnected", 260.0),   # too late to be the fault's
                _event("cam2", "lagging", 150.0),       # no fault of cam2
                _event("cam2", "label_start", 151.0), _event("extra", "removed", 301.0),
                _event("service", "reloaded", 301.0), _event("cam3", "stopped", 400.2)]
    faults, unexplained = soak.explain(run, soak.events_of(messages))
    assert [f["detected"] for f in faults] == [True, False]
    assert faults[0]["events"] == [("disconnected", 0.3), ("reconnected", 21.0)]
    assert [(e["camera"], e["event"]) for e in unexplained] == [("cam1", "reconnected"), ("cam2", "lagging")]


def test_the_metrics_are_read_from_serves_own_text(soak):
    pytest.importorskip("prometheus_client", reason='needs the serve extra: pip install -e ".[dev]"')
    from toolchain.serve.http import Metrics

    m = Metrics()
    m.count("classified", "cam0", 41)
    m.count("classified", "cam1", 2)
    m.count("published", "cam0", 40, sink="mqtt")
    m.count("reloads", result="refused")
    series = soak.parse_metrics(m._generate(m.registry).decode())
    assert soak.metric(series, "trtc_frames_classified_total", camera="cam0") == 41
    assert soak.metric(series, "trtc_frames_classified_total") == 43
    assert soak.metric(series, "trtc_messages_published_total", camera="cam0", sink="mqtt") == 40
    assert soak.metric(series, "trtc_config_reloads_total", result="refused") == 1
    assert soak.metric(series, "trtc_config_reloads_total", result="accepted") == 0
