"""examples/bench_scaleout.py end to end on the CPU: two copies of bikes.mp4 through one process, a pool of two CPU
workers, two independent processes, a local Ray instance with two actors, and a cluster started by `ray start
--head` (a cold job that keeps its actors, then a warm job on them); every row has every frame once, in order,
with the same top-1 as the one-process row, and the JSON has the figures the docs quote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # eight trtc processes, a local Ray instance and a Ray head: ~60 s on two cores

ROOT = Path(__file__).resolve().parents[2]


def test_scaleout_bench_runs_every_row_on_the_cpu(lite0_onnx, bikes, tmp_path):
    rows = ["one", "pool", "independent"]
    cmd = [sys.executable, str(ROOT / "examples" / "bench_scaleout.py"), "--model", str(lite0_onnx[0]), "--clip",
           str(bikes), "--copies", "2", "--devices", "cpu,cpu", "--stride", "25", "--workdir", str(tmp_path / "w"),
           "--json", str(tmp_path / "out.json")]
    try:
        import ray  # noqa: F401

        rows += ["ray", "ray-cluster", "ray-warm"]
    except ImportError:
        cmd.append("--no-ray")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    table = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [row["row"] for row in table] == rows
    for row in table:
        assert row["frames"] == 20 and row["every_frame_once_in_order"] and row["top1_agreement"] == 1.0, row
        assert row["fps"] > 0 and 0 < row["first_result_s"] < row["wall_s"]
    by = {row["row"]: row for row in table}
    assert by["independent"]["processes"] == 2 and "pool_over_independent" in by["pool"]
    assert by["independent"]["vs_independent"] == 1.0
    assert all(row["x_one"] > 0 and row["vs_independent"] > 0 for row in table)
    if "ray" in by:
        assert set(by["ray"]["ray_startup"]) >= {"import_s", "connect_s", "actors_s", "engine_open_s"}
        cold, warm = by["ray-cluster"]["ray_startup"]["phases"], by["ray-warm"]["ray_startup"]["phases"]
        assert list(cold) == ["connect", "placement", "engine_open", "first_batch", "first_result"]
        assert list(warm) == ["connect", "placement", "first_batch", "first_result"]  # kept actors: no engine open
        assert {"wall_minus_pool_s", "first_minus_pool_s"} <= set(by["ray-warm"])
        assert "ray-warm: start-up phases" in r.stdout
    assert "pool_over_independent" in r.stdout
