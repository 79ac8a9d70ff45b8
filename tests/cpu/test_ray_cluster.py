"""trtc on a local Ray instance (ray.init(num_cpus=2)): two engine actors of EfficientNet-Lite0 on the CPU share
bikes.mp4 and two clips made here; the results equal the single-process run frame for frame; a bad source is
reported by name while the others complete; an actor killed mid-run has its source redone on the other actor
without a duplicated or missing line; `trtc run --ray` over a folder and an @list writes the single-process lines
and a rerun with --resume skips the videos already complete and finishes a partial one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.clips import encode_clip

pytestmark = pytest.mark.slow  # Ray starts in ~5 s, each actor loads ONNX Runtime (~3 s on two cores)


def _clip(bikes, path, frames, size, fmt=None):
    return str(encode_clip(bikes, path, "libx264", size, frames=frames, fmt=fmt))


@pytest.fixture(scope="module")
def clips(bikes, tmp_path_factory):
    """bikes.mp4 (250 frames, 640x272) and two clips made from it: 100 frames at 320x136 (MP4), 75 frames at
    480x204 (MPEG-TS)."""
    folder = tmp_path_factory.mktemp("ray-clips")
    return [str(bikes), _clip(bikes, folder / "small.mp4", 100, (320, 136)),
            _clip(bikes, folder / "mid.ts", 75, (480, 204), fmt="mpegts")]


@pytest.fixture(scope="module")
def ray_local():
    try:
        import ray
    except ImportError:
        pytest.skip("needs Ray (the ray extra)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(ray_local, lite0_onnx):
    from engines.video import RayPool

    with RayPool(lite0_onnx[0], device="cpu", actors=2) as p:
        yield p


@pytest.fixture(scope="module")
def single(lite0_onnx, clips):
    """The single-process run of each clip: {source: [(frame, indices, scores, labels)]}."""
    import engines
    from engines.video import classify

    out = {}
    with engines.open_engine(lite0_onnx[0], device="cpu") as eng:
        for c in clips:
            out[c] = [(p.frame, p.indices, p.scores, p.labels) for p in classify([c], eng, batch=16, stride=5)]
    return out


def _same(got, want):
    import numpy as np

    assert [g[0] for g in got] == [w[0] for w in want], "not every frame once, in order"
    assert [g[1] for g in got] == [w[1] for w in want]
    np.testing.assert_allclose([g[2] for g in got], [w[2] for w in want], atol=1e-4)
    assert [g[3] for g in got] == [w[3] for w in want]


def test_results_equal_the_single_process_run(pool, clips, single):
    run = pool.classify(clips, batch=16, stride=5)
    by_source = {c: [] for c in clips}
    for p in run:
        by_source[p.source].append((p.frame, p.indices, p.scores, p.labels))
        assert "device" not in p.to_dict()  # the lines are the single-process lines
    assert run.ok, run.problems
    assert not run.failures
    for c in clips:
        _same(by_source[c], single[c])
    assert [len(single[c]) for c in clips] == [50, 20, 15]
    assert len(set(run.placement.values())) == 2, run.placement  # both actors worked
    assert run.stats.frames == 85 and run.stats.per_source == {c: len(single[c]) for c in clips}
    # the actors' stats come back under the caller's source names: every frame decoded, 5x what was classified
    assert run.stats.decoded == {c: 5 * len(single[c]) for c in clips} and run.stats.decoder == "pyav"


def test_a_bad_source_is_reported_and_the_others_complete(pool, clips, single, tmp_path):
    missing = str(tmp_path / "missing.mp4")
    done = []
    run = pool.classify([clips[1], missing, clips[2]], batch=16, stride=5,
                        on_source_done=lambda s, ok: done.append((s, ok)))
    preds = list(run)
    assert [p.source for p in run.problems] == [missing]
    assert "no such file" in run.problems[0].reason
    assert not run.failures  # a source that cannot be read is not an actor failure: not retried
    for c in clips[1:]:
        _same([(p.frame, p.indices, p.scores, p.labels) for p in preds if p.source == c], single[c])
    assert sorted(done) == sorted([(clips[1], True), (missing, False), (clips[2], True)])


def test_a_killed_actors_source_is_redone_on_the_other(pool, ray_local, clips, single):
    """Runs last: it leaves the module's pool with one actor."""
    run = pool.classify(clips[:2], batch=8, stride=5, realtime=True)  # paced: the kill lands mid-run
    got = {c: [] for c in clips[:2]}
    victim = None
    for p in run:
        got[p.source].append((p.frame, p.indices, p.scores, p.labels))
        if victim is None and p.source == clips[0] and len(got[clips[0]]) == 5:
            victim = next(a for a in pool.actors if a.name == run.placement[clips[0]])
            ray_local.kill(victim.handle)
    assert victim is not None and not victim.alive
    assert run.ok, run.problems  # redone: nothing is missing
    assert run.retried == [clips[0]]
    assert len(run.failures) == 1 and victim.name in run.failures[0] and "died" in run.failures[0]
    assert run.placement[clips[0]] != victim.name
    for c in clips[:2]:
        _same(got[c], single[c])  # ...and nothing is duplicated


def _trtc(*args, timeout=300):
    r = subprocess.run([sys.executable, "-m", "toolchain", "-q", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    return r


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_trtc_run_ray_batch_and_resume(lite0_onnx, clips, single, tmp_path):
    """A folder of two videos, then an @list of three with --resume: the first two are skipped; then an output cut
    in the middle of a video is finished. Every line equals the single-process run's; no line is duplicated.
    Each `trtc run --ray` starts its own local Ray instance."""
    import shutil

    folder = tmp_path / "archive"
    folder.mkdir()
    a, b = shutil.copy(clips[1], folder / "a.mp4"), shutil.copy(clips[2], folder / "b.ts")
    (folder / "notes.txt").write_text("not a video")
    out, summary = tmp_path / "preds.jsonl", tmp_path / "summary.json"
    common = ["--model", lite0_onnx[0], "--device", "cpu", "--stride", "5", "--batch", "16", "-o", out]
    r = _trtc("run", folder, "--ray", "--ray-actors", "2", *common, "--summary", summary)
    assert r.returncode == 0, r.stderr
    first = _lines(out)
    assert sorted({d["source"] for d in first}) == [str(a), str(b)]
    assert out.with_name("preds.jsonl.done").read_text().splitlines() == [str(a), str(b)]
    s = json.loads(summary.read_text())
    assert len(s["ray"]["actors"]) == 2 and s["ray"]["skipped"] == 0 and s["frames"] == 35

    again = _trtc("run", folder, "--ray", *common)
    assert again.returncode == 2 and "--resume" in again.stderr  # an existing -o is not silently overwritten

    listing = tmp_path / "list.txt"
    listing.write_text(f"# three videos\n{a}\n{b}\n\n{clips[0]}\n")
    r = _trtc("run", f"@{listing}", "--ray", "--ray-actors", "2", *common, "--resume", "--summary", summary,
              "--force")
    assert r.returncode == 0, r.stderr
    s = json.loads(summary.read_text())
    assert s["ray"]["skipped"] == 2 and s["frames"] == 50 and s["resumed_lines"] == 35

    # an interrupted run: bikes.mp4 cut after its 10th line, and not recorded complete
    lines = out.read_text().splitlines(keepends=True)
    keep = [x for x in lines if json.loads(x)["source"] != clips[0]]
    keep += [x for x in lines if json.loads(x)["source"] == clips[0]][:10]
    out.write_text("".join(keep))
    out.with_name("preds.jsonl.done").write_text(f"{a}\n{b}\n")
    r = _trtc("run", f"@{listing}", "--ray", "--ray-actors", "1", *common, "--resume", "--summary", summary,
              "--force")
    assert r.returncode == 0, r.stderr
    s = json.loads(summary.read_text())
    assert s["ray"]["skipped"] == 2 and s["frames"] == 40 and s["last_frame"][clips[0]] == 245

    final = _lines(out)
    for c in (str(a), str(b), clips[0]):
        want = single[clips[0]] if c == clips[0] else single[clips[1] if c == str(a) else clips[2]]
        _same([(d["frame"], [t["index"] for t in d["top_k"]], [t["score"] for t in d["top_k"]],
                [t["label"] for t in d["top_k"]]) for d in final if d["source"] == c], want)
    assert sorted(out.with_name("preds.jsonl.done").read_text().splitlines()) == sorted([str(a), str(b), clips[0]])
