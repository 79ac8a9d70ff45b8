"""A whole model pickled by torch.save(model) (the ResNet-18 fixture's): `trtc export FILE` and `--weights FILE`
give one message that says what loading it trusts and how to re-save it, and following that fix gives weights
that load into the architecture. Nothing in the file is unpickled by trtc (torch lists its globals)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from tests.conftest import needs_export
from toolchain.cli import cli

pytestmark = needs_export


def _said(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.strip().startswith(("error:", "fix:"))]


def test_pickled_whole_model(resnet18_weights, tmp_path, monkeypatch):
    import torch
    import torchvision

    from toolchain.model_source import load_weights

    _, model = resnet18_weights
    full = tmp_path / "r18_full.pt"
    torch.save(model, full)
    monkeypatch.chdir(tmp_path)
    as_source = CliRunner().invoke(cli, ["export", str(full), "-o", "x.onnx"])
    as_weights = CliRunner().invoke(cli, ["export", "torchvision:resnet18", "--weights", str(full),
                                          "--num-classes", "10", "-o", "x.onnx"])
    for r in (as_source, as_weights):
        assert r.exit_code == 2, r.output
    said = _said(as_source.output)
    assert said == _said(as_weights.output)
    assert said[0].startswith(f"error: {full} is a whole model pickled by torch.save(model) "
                              "(torchvision.models.resnet.BasicBlock, torchvision.models.resnet.ResNet)")
    assert "weights_only=False" in said[0] and not (tmp_path / "x.onnx").exists()
    command = re.search(r'python -c "(.*?)"', said[1]).group(1)  # the fix's code, run as written (in the folder)
    exec(compile(command, "<the fix>", "exec"), {})  # noqa: S102 - the message's own line, on the test's own file
    fresh = torchvision.models.resnet18(weights=None, num_classes=10)
    load_weights(fresh, str(tmp_path / "weights.pt"), "torchvision:resnet18")
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name


@pytest.mark.parametrize("saved", ["state_dict", "checkpoint"])
def test_weights_are_not_called_a_pickled_model(resnet18_weights, tmp_path, saved):
    import torch

    from toolchain.model_source import pickled_model

    _, model = resnet18_weights
    path = tmp_path / "w.pt"
    torch.save(model.state_dict() if saved == "state_dict" else {"epoch": 1, "model": model.state_dict()}, path)
    assert pickled_model(path) is None
