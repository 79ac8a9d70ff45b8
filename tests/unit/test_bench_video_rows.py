"""The video benchmark's repeated runs: the median run is the row, every run's fps is kept, and the table says
what the range means. (Timing itself is only measured on a GPU: docs/BENCHMARKS.md.)"""
import io

from rich.console import Console

from toolchain.bench_video import VideoBenchReport, VideoBenchRow, _median_rows
from toolchain.render import render_bench_video


def _row(name, fps):
    return VideoBenchRow(name, 16, 9600, round(9600 / fps, 3), fps)


def _runs(count=3):
    fps = [(3440.0, 3100.0), (3786.0, 3350.0), (3438.0, 3360.0)][:count]
    return [[_row("dec", d), _row("trtc", t)] for d, t in fps]


def test_the_median_run_is_the_row_and_every_run_is_kept():
    dec, ours = _median_rows(_runs(), ceilings=(0,))
    assert dec.fps == 3440.0 and dec.seconds == round(9600 / 3440.0, 3)  # the real run, not an average
    assert dec.fps_runs == [3440.0, 3786.0, 3438.0]
    assert ours.fps == 3350.0 and ours.fps_runs == [3100.0, 3350.0, 3360.0]
    # an even count never flatters trtc: its slower middle run against the decode-only's faster one
    dec, ours = _median_rows(_runs(2), ceilings=(0,))
    assert ours.fps == 3100.0 and dec.fps == 3786.0
    # one run keeps no list
    assert _median_rows(_runs(1))[0].fps_runs is None


def test_the_table_shows_the_range_of_the_runs():
    dec, ours = _median_rows(_runs(), ceilings=(0,))
    ours.vs_decode = round(ours.fps / dec.fps, 3)
    report = VideoBenchReport("clip.mp4", "m.onnx", "cuda:0", 64, [dec, ours], {}, {}, {"gpu": "GPU"}, {},
                              "2026-11-23")
    buf = io.StringIO()
    render_bench_video(Console(file=buf, width=200), report)
    text = buf.getvalue()
    assert "3350.0 (3100-3360)" in text and "3440.0 (3438-3786)" in text
    assert "median of the runs" in text
