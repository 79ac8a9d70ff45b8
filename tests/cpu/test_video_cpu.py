"""The video pipeline on the CPU (PyAV + numpy + ONNX Runtime CPU) with real footage and a real model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import needs_export

pytestmark = needs_export


@pytest.fixture(scope="module")
def direct_top1(lite0_onnx, bikes):
    """The reference: every frame decoded here in the main thread, converted with the numpy reference maths and
    run through an ONNX Runtime session directly (no engines wrapper, no batching across threads)."""
    import av
    import onnxruntime as ort

    import engines
    from engines.preprocess import preprocess_yuv
    from engines.video.sources import _colorspace_from_av, host_planes

    spec = engines.read_manifest(lite0_onnx[0]).preprocess
    sess = ort.InferenceSession(str(lite0_onnx[0]), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    xs = []
    with av.open(str(bikes)) as c:
        for f in c.decode(video=0):
            xs.append(preprocess_yuv(host_planes(f), spec, _colorspace_from_av(f, f.height, None), np.float32))
    logits = np.concatenate([sess.run(None, {name: np.stack(xs[i:i + 25])})[0] for i in range(0, len(xs), 25)])
    return logits.argmax(1)


def test_cpu_pipeline_threads_and_batching_match_a_frame_by_frame_run_of_the_same_maths(engine, bikes, direct_top1):
    """Not an independent check of the colour maths: the reference uses the same host_planes / preprocess_yuv /
    colour-space code (tests/cpu/test_colour_reference.py checks those against RGB made outside trtc). This holds the
    threads, queues, batching and result order of the pipeline to a plain frame-by-frame loop."""
    from engines.video import classify

    # max_wait_ms far above any decoder stall: a batch then runs only when full (or at the end), however busy the
    # machine, so the batch sizes below are exact
    run = classify([bikes], engine, batch=16, top_k=5, max_wait_ms=60_000)
    preds = list(run)
    assert run.ok and len(preds) == 250 == len(direct_top1)
    assert [p.frame for p in sorted(preds, key=lambda p: p.frame)] == list(range(250))
    agree = np.mean([p.indices[0] == direct_top1[p.frame] for p in preds])
    print(f"CPU pipeline vs direct ONNX Runtime on bikes.mp4: top-1 agreement {agree:.2%}; "
          f"{run.stats.fps:.0f} fps, batches {run.stats.batch_sizes[:3]}...")
    assert agree >= 0.99
    p = preds[0]
    assert p.labels and len(p.labels) == 5 and p.scores == sorted(p.scores, reverse=True)
    assert 0 < sum(p.scores) <= 1.0 + 1e-6 and p.pts == 0 and p.time == 0.0
    assert run.stats.batch_sizes == [16] * 15 + [10]  # full batches, the rest at the end


def test_several_sources_with_stride(engine, bikes, test_videos, direct_top1):
    from engines.video import classify

    ts = str(test_videos["bikes_ts"])
    run = classify([bikes, ts, bikes], engine, batch=8, stride=5, top_k=1)
    preds = list(run)
    assert run.ok, run.problems
    frames = {}
    for p in preds:
        frames.setdefault(p.source, []).append(p.frame)
    assert sorted(frames[str(bikes)]) == sorted(list(range(0, 250, 5)) * 2)
    assert sorted(frames[ts]) == list(range(0, 250, 5))
    assert run.stats.per_source[str(bikes)] == 100 and run.stats.frames == 150
    agree = np.mean([p.indices[0] == direct_top1[p.frame] for p in preds if p.source == str(bikes)])
    assert agree >= 0.99


def test_bad_sources_are_reported_and_the_good_one_finishes(engine, bikes, test_videos, tmp_path):
    from engines.video import classify

    bad = {k: str(test_videos[k]) for k in ("truncated_mp4", "audio_m4a", "corrupt_mp4")}
    bad["missing"] = str(tmp_path / "nope.mp4")
    run = classify([bikes, *bad.values()], engine, batch=16, top_k=1, stride=5)
    preds = list(run)
    problems = {p.source: p.reason for p in run.problems}
    assert sum(p.source == str(bikes) for p in preds) == 50
    assert set(problems) == set(bad.values())
    assert "no video stream" in problems[bad["audio_m4a"]]
    assert "no such file" in problems[bad["missing"]]
    assert "cannot open" in problems[bad["truncated_mp4"]]
    assert "corrupt packet" in problems[bad["corrupt_mp4"]]
    assert sum(p.source == bad["corrupt_mp4"] for p in preds) > 30  # the readable frames still come out
    assert not run.ok


def test_cli_run_writes_jsonl_and_exits_1_on_a_bad_source(lite0_onnx, bikes, test_videos, tmp_path):
    from toolchain.cli import cli

    out = tmp_path / "preds.jsonl"
    summary = tmp_path / "summary.json"
    args = ["run", str(bikes), "--model", str(lite0_onnx[0]), "--device", "cpu", "--stride", "25", "--top-k", "3",
            "-o", str(out), "--summary", str(summary)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["frame"] for x in lines] == list(range(0, 250, 25))
    assert set(lines[0]) == {"source", "frame", "pts", "time", "received", "top_k"} and len(lines[0]["top_k"]) == 3
    assert json.loads(summary.read_text())["frames"] == 10
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2 and "exists" in r.output  # no silent overwrite
    r = CliRunner().invoke(cli, [*args[:2], str(test_videos["audio_m4a"]), *args[2:], "--force"])
    assert r.exit_code == 1
    # the message may wrap at any space (rich wraps at 80 columns; a longer temporary path moves the break)
    assert len(out.read_text().splitlines()) == 10 and "no video stream" in " ".join(r.output.split())
    r = CliRunner().invoke(cli, ["run", str(bikes), "--model", str(lite0_onnx[0]), "--device", "cpu",
                                 "--decoder", "nvdec"])
    assert r.exit_code == 2 and "NVDEC decoding feeds a GPU engine" in r.output


def test_edge_app_example_alerts_and_reports_a_bad_source(lite0_onnx, bikes, test_videos, capsys):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("edge_app", Path(__file__).parents[2] / "examples" / "edge_app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    rc = app.main([str(lite0_onnx[0]), str(bikes), str(test_videos["audio_m4a"]), "--device", "cpu", "--stride", "2"])
    out, err = capsys.readouterr()
    assert rc == 1  # one source failed
    assert "ALERT" in out and "125 frames from 2 source(s)" in out
    assert "no video stream" in err
