"""--top-k defaults to min(5, classes), and an explicit one over the class count is refused, alike in `trtc run`
and classify(): on a real 3-class model (EfficientNet-Lite0's three cat classes, its logits gathered in the graph),
adopted with a manifest and without one."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import needs_quant
from toolchain.cli import cli

pytestmark = needs_quant
CATS = [281, 282, 285]  # tabby, tiger cat, Egyptian cat


@pytest.fixture(scope="module")
def cats(tmp_path_factory, lite0_onnx):
    """(the 3-class ONNX without a manifest, the same adopted with one)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder = tmp_path_factory.mktemp("cats")
    model = onnx.load(str(lite0_onnx[0]))
    logits = model.graph.output[0].name
    model.graph.initializer.append(numpy_helper.from_array(np.array(CATS, np.int64), "cats"))
    model.graph.node.append(helper.make_node("Gather", [logits, "cats"], ["cat_logits"], axis=1))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("cat_logits", TensorProto.FLOAT, ["N", 3]))
    bare = folder / "bare" / "cats.onnx"
    bare.parent.mkdir()
    onnx.save(model, str(bare))
    adopted = folder / "adopted" / "cats.onnx"
    adopted.parent.mkdir()
    shutil.copy(bare, adopted)
    (folder / "cats.txt").write_text("tabby\ntiger cat\nEgyptian cat\n")
    r = CliRunner().invoke(cli, ["export", str(adopted), "--labels", str(folder / "cats.txt"), "--mean", "0.5,0.5,0.5",
                                 "--std", "0.5,0.5,0.5", "--resize", "256", "--color", "rgb"])
    assert r.exit_code == 0, r.output
    return bare, adopted


def _run(model, bikes, *extra):
    return CliRunner().invoke(cli, ["run", str(bikes), "--model", str(model), "--device", "cpu", "--stride", "50",
                                    *extra])


@pytest.mark.parametrize("which", ["bare", "adopted"])
def test_default_and_explicit_top_k(cats, bikes, which):
    import engines
    from engines.errors import UsageProblem
    from engines.video import FramePusher, classify

    model = cats[0] if which == "bare" else cats[1]
    r = _run(model, bikes)
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
    assert len(lines) == 5 and all(len(d["top_k"]) == 3 for d in lines), r.output
    assert {e["index"] for d in lines for e in d["top_k"]} == {0, 1, 2}
    r = _run(model, bikes, "--top-k", "4")
    assert r.exit_code == 2
    said = next(line for line in r.output.splitlines() if line.startswith("error:"))
    assert said == "error: --top-k 4 asks for more classes than cats.onnx has (3)", r.output
    engine = engines.open_engine(model, device="cpu")
    try:
        preds = list(classify([str(bikes)], engine, stride=50))
        assert len(preds) == 5 and all(len(p.indices) == 3 for p in preds)
        assert [p.indices for p in preds] == [[e["index"] for e in d["top_k"]] for d in lines]
        with pytest.raises(UsageProblem) as refused:
            classify([str(bikes)], engine, top_k=4)
        assert f"error: {refused.value.reason}" == said
        with pytest.raises(UsageProblem, match="asks for more classes"):
            FramePusher(engine, top_k=4)
    finally:
        engine.close()
