"""What `trtc validate --layers` compares, by the kinds of reference and candidate (toolchain.layers._onnx_path)."""

from __future__ import annotations

import pytest


def test_a_compiled_torch_program_reference_is_refused_and_a_module_source_is_not(monkeypatch, tmp_path):
    from toolchain import model_source
    from toolchain.errors import UsageProblem
    from toolchain.layers import _onnx_path

    kinds = {"m.pt": "torchscript", "m2.pt2": "exported", "torchvision:resnet18": "torchvision"}
    monkeypatch.setattr(model_source, "parse_source", lambda spec, use=None: model_source.SourceRef(
        kinds[spec], spec, text=spec))
    with pytest.raises(UsageProblem, match="compiled program .* whose modules cannot be hooked"):
        _onnx_path("m.pt", "reference")
    assert str(_onnx_path("torchvision:resnet18", "reference")) == "torchvision:resnet18"  # compared per module
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"plan")
    assert _onnx_path(str(plan), "candidate") == plan  # listed by its engine inspector
    with pytest.raises(UsageProblem, match="is not an .onnx file"):
        _onnx_path(str(plan), "reference")  # a plan is no reference per layer
    with pytest.raises(UsageProblem, match="is not an .onnx file"):
        _onnx_path("torchvision:resnet18", "candidate")
