import pytest

from engines.errors import UsageProblem
from tests.conftest import needs_export
from toolchain.errors import ExportError
from toolchain.model_source import extract_state_dict, parse_source


def test_parse_forms(tmp_path):
    assert parse_source("torchvision:resnet18").kind == "torchvision"
    assert parse_source("timm:resnet18").value == "resnet18"
    assert parse_source("pretrained:efficientnet-lite0").kind == "pretrained"
    f = tmp_path / "net.py"
    f.write_text("def build():\n    pass\n")
    ref = parse_source(f"{f}:build")
    assert (ref.kind, ref.factory) == ("pyfile", "build")
    (tmp_path / "m.pt2").write_bytes(b"x")
    assert parse_source(str(tmp_path / "m.pt2")).kind == "exported"
    (tmp_path / "m.pt").write_bytes(b"x")
    assert parse_source(str(tmp_path / "m.pt")).kind == "torchscript"


@pytest.mark.parametrize("text,match", [
    ("torchvision:", "needs a model name"),
    ("missing.py:build", "not found"),
    ("nowhere/model.pt", "not found"),
    ("nowhere/model.pt2", "not found"),
    ("what-is-this", "unknown model source"),
])
def test_parse_errors(text, match):
    with pytest.raises(UsageProblem, match=match):
        parse_source(text)


@needs_export
def test_state_dict_extraction():
    import torch

    t = torch.zeros(2)
    assert extract_state_dict({"a.weight": t}, "f") == {"a.weight": t}
    assert list(extract_state_dict({"epoch": 1, "model_state_dict": {"module.a": t}}, "f")) == ["a"]
    assert list(extract_state_dict({"ema": {"_orig_mod.module.b": t}}, "f")) == ["b"]
    with pytest.raises(ExportError, match="without a state_dict"):
        extract_state_dict({"epoch": 1, "lr": 0.1}, "f")
    with pytest.raises(ExportError, match="not a state_dict"):
        extract_state_dict([1, 2], "f")
