"""`trtc run --ray` against a running cluster, as users run it: `ray start --head` (2 CPUs) once for the file, then
`trtc run --ray auto` / `--ray HOST:PORT` jobs of EfficientNet-Lite0 (ONNX Runtime CPU) on bikes.mp4. The start-up
phases appear at -v and in the summary, measured from the process's start; a job kept as a named engine service
(--ray-keep) leaves its actors warm, and the next job on them opens no engine and writes the same lines as the
first and as a run without Ray; another model (or batch) under the same name is refused in one line with its fix;
--ray-stop removes the actors from the cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from pathlib import Path

import pytest

from tests.ray_head import RayHead

pytestmark = pytest.mark.slow  # a Ray head (~5 s), then a few trtc processes of 2-5 s each

PHASES = ["connect", "placement", "engine_open", "first_batch", "first_result"]
COMMON = ["--device", "cpu", "--stride", "25", "--batch", "8"]


@pytest.fixture(scope="module")
def head():
    pytest.importorskip("ray", reason="needs Ray (the ray extra)")
    with RayHead(num_cpus=2) as h:
        yield h


def _trtc(head, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "toolchain", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=head.env)


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _named_actors(head) -> list:
    """The trtc services' actors on the cluster, and its free CPUs, asked by a driver of its own."""
    code = ("import json, ray; ray.init(address='auto', log_to_driver=False); "
            "print(json.dumps([sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True) "
            "if a['namespace'] == 'trtc'), ray.available_resources().get('CPU', 0)]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=head.env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def without_ray(lite0_onnx, bikes, tmp_path_factory):
    out = tmp_path_factory.mktemp("no-ray") / "plain.jsonl"
    r = subprocess.run([sys.executable, "-m", "toolchain", "-q", "run", bikes, "--model", lite0_onnx[0], *COMMON,
                        "-o", out], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return _lines(out)


def _same(got, want):
    import numpy as np

    assert [(d["source"], d["frame"]) for d in got] == [(d["source"], d["frame"]) for d in want]
    assert [[t["index"] for t in d["top_k"]] for d in got] == [[t["index"] for t in d["top_k"]] for d in want]
    np.testing.assert_allclose([[t["score"] for t in d["top_k"]] for d in got],
                               [[t["score"] for t in d["top_k"]] for d in want], atol=1e-4)


def test_a_job_joins_the_running_cluster_and_times_its_start_up(head, lite0_onnx, bikes, without_ray, tmp_path):
    """--ray HOST:PORT (the head's address) with -v: every phase logged and in the summary, in order."""
    out, summary = tmp_path / "cold.jsonl", tmp_path / "cold.json"
    r = _trtc(head, "-v", "run", bikes, "--ray", head.address, "--ray-actors", "1", "--model", lite0_onnx[0],
              *COMMON, "-o", out, "--summary", summary)
    assert r.returncode == 0, r.stderr[-3000:]
    for said in (f"ray: joined the cluster ({head.address}) at", "placed at", "engines open at", "first batch at",
                 "first result at"):
        assert said in r.stderr, said
    s = json.loads(summary.read_text())
    phases = s["ray"]["startup"]["phases"]
    assert list(phases) == PHASES
    seconds = [phases[p] for p in PHASES]
    assert seconds == sorted(seconds) and 0 < seconds[0], phases  # from the process's start, one after the other
    assert s["ray"]["address"] == head.address and "service" not in s["ray"]
    _same(_lines(out), without_ray)
    assert _named_actors(head) == [[], 2.0]  # a job that keeps nothing leaves nothing behind


def test_kept_actors_are_warm_for_the_next_job_and_stop_removes_them(head, lite0_onnx, bikes, without_ray,
                                                                     tmp_path):
    runs = []
    for i in range(2):
        out, summary = tmp_path / f"kept{i}.jsonl", tmp_path / f"kept{i}.json"
        r = _trtc(head, "-v", "run", bikes, "--ray", "auto", "--ray-keep", "lite0-cpu", "--ray-actors", "1",
                  "--model", lite0_onnx[0], *COMMON, "-o", out, "--summary", summary)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append((r.stderr, json.loads(summary.read_text()), _lines(out)))
    (cold_log, cold, cold_lines), (warm_log, warm, warm_lines) = runs
    assert cold["ray"]["service"] == {"name": "lite0-cpu", "warm": False}
    assert list(cold["ray"]["startup"]["phases"]) == PHASES and "engines open at" in cold_log
    assert warm["ray"]["service"] == {"name": "lite0-cpu", "warm": True}
    assert list(warm["ray"]["startup"]["phases"]) == [p for p in PHASES if p != "engine_open"]
    assert "engine_open_s" not in warm["ray"]["startup"]
    assert "every actor warm: no engine to open" in warm_log and "engines open at" not in warm_log
    # the same engine, the same lines (but for "received", the wall-clock time each frame was read)
    assert [dict(d, received=None) for d in warm_lines] == [dict(d, received=None) for d in cold_lines]
    _same(warm_lines, without_ray)
    assert _named_actors(head) == [["lite0-cpu.0"], 1.0]  # kept: it holds its CPU between jobs

    # the name with another model file (a copy elsewhere), or another batch: refused, the service untouched
    other = tmp_path / "other" / "lite0.onnx"
    other.parent.mkdir()
    shutil.copy(lite0_onnx[0], other)
    shutil.copy(f"{lite0_onnx[0]}.json", f"{other}.json")
    kept = f"{lite0_onnx[0]} (fp32, cpu, batch 8)"
    for model, batch, said in ((other, "8", f"holds {kept}; this job asks for {other} (fp32, cpu, batch 8)"),
                               (lite0_onnx[0], "4", "holds lite0.onnx (fp32, cpu, batch 8); this job asks for "
                                                    "lite0.onnx (fp32, cpu, batch 4)")):
        r = _trtc(head, "run", bikes, "--ray", "auto", "--ray-keep", "lite0-cpu", "--model", model,
                  *COMMON[:-1], batch)
        assert r.returncode == 2, r.stderr[-3000:]
        error = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert error == [f"error: Ray engine service 'lite0-cpu' {said}"], r.stderr[-2000:]
        assert "fix: run it with the same model and options, give another --ray-keep name, or stop that one: " \
               "trtc run --ray auto --ray-stop lite0-cpu" in r.stderr
    assert _named_actors(head) == [["lite0-cpu.0"], 1.0]

    r = _trtc(head, "run", "--ray", "auto", "--ray-stop", "lite0-cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "stopped Ray engine service lite0-cpu: 1 actor(s), lite0.onnx (fp32, cpu, batch 8)"
    assert _named_actors(head) == [[], 2.0]
    again = _trtc(head, "run", "--ray", "auto", "--ray-stop", "lite0-cpu")
    assert again.returncode == 2 and "error: no Ray engine service 'lite0-cpu' on the cluster (auto)" in again.stderr


def test_keep_is_refused_where_nothing_could_be_kept(head, lite0_onnx, bikes):
    """A local instance ends with the command; a name Ray's actor names cannot hold; --ray-keep without --ray."""
    for args, said in ((["--ray", "--ray-keep", "a"], "error: --ray-keep a: a local Ray instance ends with the "
                                                       "command, so nothing could be kept"),
                       (["--ray", "auto", "--ray-keep", "a.b"], "error: 'a.b' is not a name for a kept Ray engine "
                                                                "service"),
                       (["--ray-keep", "a"], "error: --ray-actors, --ray-streams and --ray-keep go with --ray")):
        r = _trtc(head, "run", bikes, "--model", lite0_onnx[0], *COMMON, *args)
        assert r.returncode == 2 and said in r.stderr, (args, r.stderr[-2000:])


def test_process_start_is_read_from_the_kernel():
    """process_started_at() counts what ran before it: a child that sleeps 1 s first reads at least 1 s."""
    code = ("import time; time.sleep(1.0); t = time.time(); "
            "from engines.video.ray_cluster import process_started_at; print(t - process_started_at())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))
    assert r.returncode == 0, r.stderr
    assert 1.0 <= float(r.stdout) < 3.0, r.stdout


def test_a_cluster_that_wants_a_token_is_said_so(monkeypatch):
    """The chain ray.init raised against a head in token mode, seen here when a driver named the head's address
    without RAY_AUTH_MODE=token (ConnectionError from RuntimeError from AuthenticationError, after ~20 s of Ray's
    retries): one error that says what is wanted and how to give it."""
    ray = pytest.importorskip("ray", reason="needs Ray (the ray extra)")
    from engines.errors import EngineError
    from engines.video.ray_cluster import connect

    def refused(**_kw):
        try:
            try:
                raise ray.exceptions.AuthenticationError("RPC error: InvalidAuthToken: Authentication token is "
                                                         "missing or incorrect")
            except ray.exceptions.AuthenticationError as exc:
                raise RuntimeError("Failed to connect to GCS.") from exc
        except RuntimeError as exc:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from exc

    monkeypatch.setattr(ray, "init", refused)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(EngineError) as got:
        connect("auto")
    assert got.value.reason == ("could not join the Ray cluster at auto: it uses Ray's token authentication and this "
                              "process sent no valid token")
    assert got.value.fix.startswith("export RAY_AUTH_MODE=token")
