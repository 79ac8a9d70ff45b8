"""WorkerPool on the CPU: two worker processes, each with its own EfficientNet-Lite0 engine, share the sources;
the merged results equal the single-process run frame for frame, in order per source; a bad source is reported
by name while the others complete; a worker killed mid-run has its sources reported, the other worker's finish."""

from __future__ import annotations

import shutil

import pytest

pytestmark = pytest.mark.slow  # two worker processes start ONNX Runtime sessions (about 10 s on two cores)


@pytest.fixture(scope="module")
def clips(bikes, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cams")
    out = []
    for i in range(3):
        p = folder / f"cam{i}.mp4"
        shutil.copyfile(bikes, p)
        out.append(str(p))
    return out


@pytest.fixture(scope="module")
def pool(lite0_onnx):
    from engines.video import WorkerPool

    with WorkerPool(lite0_onnx[0], devices=["cpu", "cpu"]) as p:
        yield p


def test_pool_results_equal_the_single_process_run(pool, lite0_onnx, clips):
    import engines
    from engines.video import classify

    with engines.open_engine(lite0_onnx[0], device="cpu") as eng:
        single = [(p.frame, p.indices, p.labels) for p in classify([clips[0]], eng, batch=16, stride=5)]
    run = pool.classify(clips, batch=16, stride=5)
    by_source = {c: [] for c in clips}
    devices = set()
    for p in run:
        by_source[p.source].append((p.frame, p.indices, p.labels))
        devices.add(p.device)
        assert p.to_dict()["device"] == "cpu"
    assert run.ok, run.problems
    for c in clips:
        assert [f for f, _, _ in by_source[c]] == list(range(0, 250, 5)), f"{c}: not every frame once, in order"
        assert [i[0] for _, i, _ in by_source[c]] == [i[0] for _, i, _ in single]
        assert by_source[c][0][2] is not None  # labels from the manifest came through
    assert devices == {"cpu"} and run.stats.frames == 150
    # the pool's stats merge the workers': their decoder and batch sizes (the summary said decoder "2", mean batch 0)
    s = run.stats.to_dict()
    assert s["decoder"] == "pyav" and sum(run.stats.batch_sizes) == 150 and s["batches"] == len(run.stats.batch_sizes)
    assert 0 < s["mean_batch"] <= 16
    assert run.stats.decoded == {c: 250 for c in clips}  # every frame decoded, every 5th classified


def test_a_bad_source_is_reported_and_the_others_complete(pool, clips, tmp_path):
    missing = str(tmp_path / "missing.mp4")
    run = pool.classify([clips[0], missing, clips[1]], batch=16, stride=10)
    preds = list(run)
    assert [p.source for p in run.problems] == [missing]
    assert "no such file" in run.problems[0].reason
    assert sum(p.source == clips[0] for p in preds) == 25 and sum(p.source == clips[1] for p in preds) == 25


def test_a_killed_worker_has_its_sources_reported(lite0_onnx, clips):
    from engines.video import WorkerPool

    with WorkerPool(lite0_onnx[0], devices=["cpu", "cpu"]) as pool:
        run = pool.classify(clips[:2], batch=8, realtime=True)  # paced: the kill lands mid-run
        preds = []
        for p in run:
            preds.append(p)
            if len(preds) == 5:
                pool.workers[1].process.kill()
        doomed = pool.share(clips[:2])[1][0]
        assert [p.source for p in run.problems] == [doomed]
        assert "died" in run.problems[0].reason
        assert sum(p.source == clips[0] for p in preds) == 250


def test_trtc_run_on_two_devices_writes_a_device_per_line(lite0_onnx, clips, tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "preds.jsonl"
    r = subprocess.run([sys.executable, "-m", "toolchain", "-q", "run", *clips[:2], "--model", str(lite0_onnx[0]),
                        "--device", "cpu,cpu", "--stride", "25", "-o", str(out), "--summary",
                        str(tmp_path / "s.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["decoder"] == "pyav" and summary["mean_batch"] > 0 and summary["device"] == "cpu,cpu"
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted((d["source"], d["frame"]) for d in lines) == sorted((c, f) for c in clips[:2]
                                                                      for f in range(0, 250, 25))
    assert {d["device"] for d in lines} == {"cpu"}
    # the lines the workers formatted (blocks) are the single-process run's, but for "device" and "received"
    single = subprocess.run([sys.executable, "-m", "toolchain", "-q", "run", *clips[:2], "--model",
                             str(lite0_onnx[0]), "--device", "cpu", "--stride", "25"], capture_output=True, text=True,
                            timeout=300)
    assert single.returncode == 0, single.stderr

    def by_source(ds):
        out: dict = {}
        for d in ds:
            out.setdefault(d["source"], []).append({k: v for k, v in d.items() if k not in ("device", "received")})
        return out

    assert by_source(lines) == by_source(json.loads(x) for x in single.stdout.splitlines())
    t = summary["timing"]  # start-up is outside the frames/s span, and said apart
    assert 0 < t["ready_s"] <= t["first_result_s"] <= t["last_result_s"] and summary["seconds"] < t["last_result_s"]
