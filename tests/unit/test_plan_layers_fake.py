"""A TensorRT plan's layers under `trtc validate --layers` (toolchain.plan_layers), on CPU against the RECORDING FAKE
of TensorRT (tests/fake_tensorrt.py): the fake plan computes with the real MNIST ONNX on ONNX Runtime, and its engine
inspector answers with JSON in the shape TensorRT 10.x and 11.x write (made up by the fake from the ONNX: a
reformatting copy, pointwise nodes fused into the layer before them, constants folded). This checks trtc's calls
(create_engine_inspector, get_engine_information(JSON)) and its reading of that JSON; the names it calls are checked
against the real bindings in tests/unit/test_trt_real_bindings.py. It was not run on a real TensorRT: what a real
engine lists (its fusions, its names) may differ, and the listing's matching to ONNX nodes is unverified there."""

from __future__ import annotations

import json

import pytest

from tests import fake_cupy, fake_tensorrt

pytest.importorskip("onnxruntime")


def _run(monkeypatch, tmp_path, mnist, info):
    from click.testing import CliRunner

    import engines.onnxruntime_engine as oe
    from toolchain.cli import cli

    npz = mnist[1]
    sess, i_name, o_name, io = fake_tensorrt.mnist_plan(monkeypatch, mnist, tmp_path)
    fake = fake_tensorrt.install(monkeypatch, fake_tensorrt.make(
        "10.13.0", engine_io=io, compute=lambda f: {o_name: sess.run(None, {i_name: f[i_name]})[0]},
        engine_info=info), fake_tensorrt.H100)
    fake_cupy.install(monkeypatch)
    cpu_engine = oe.OnnxRuntimeEngine  # the reference runs on ORT's CPU provider (no GPU here)
    monkeypatch.setattr(oe, "OnnxRuntimeEngine", lambda spec, device="cpu", **kw: cpu_engine(spec, device="cpu", **kw))
    r = CliRunner().invoke(cli, ["validate", "--reference", str(tmp_path / "m.onnx"), "--candidate",
                                 str(tmp_path / "m.plan"), "--data", str(npz), "--count", "8", "--device", "cuda:0",
                                 "--layers", "--json", str(tmp_path / "r.json")])
    return r, fake, json.loads((tmp_path / "r.json").read_text())["candidates"][0]["layers"]


@pytest.mark.parametrize("version", ["10", "11"])
def test_validate_layers_lists_a_plans_layers_with_their_onnx_nodes(monkeypatch, tmp_path, mnist, version):
    import onnx

    info = fake_tensorrt.inspector_info(mnist[0], version=version, input_type="FP16")
    r, fake, lr = _run(monkeypatch, tmp_path, mnist, info)
    assert r.exit_code == 0, r.output
    assert ("engine.create_engine_inspector",) in fake.calls
    assert ("EngineInspector.get_engine_information", "JSON") in fake.calls
    assert lr["kind"] == "plan" and lr["verbosity"] == "detailed" and lr["onnx"] == str(tmp_path / "m.onnx")
    # each layer of the inspector's answer, in order, with the ONNX nodes its Metadata names
    assert [row["name"] for row in lr["layers"]] == [layer["Name"] for layer in info["Layers"]]
    nodes = {n.name: n.op_type for n in onnx.load(str(mnist[0])).graph.node}
    fused = [row for row in lr["layers"] if " + " in row["name"]]
    assert [row["onnx_nodes"] for row in fused] == [row["name"].split(" + ") for row in fused]
    assert [nodes[row["onnx_nodes"][0]] for row in fused] == ["Conv", "Conv", "MatMul"]  # conv + bias + ReLU etc.
    assert lr["layers"][0]["reformat"] and lr["layers"][0]["onnx_nodes"] == []
    assert all(row["precision"] == "fp16" for row in lr["layers"][1:])  # from 10.x's one string or 11.x's fields
    # every ONNX node is in exactly one layer but the reshape of the weights, which TensorRT folds
    covered = [n for row in lr["layers"] for n in row["onnx_nodes"]]
    assert sorted(covered) == sorted(set(nodes) - {"Times212_reshape1"}) and len(covered) == len(set(covered))
    assert lr["not_in_any_layer"] == ["Times212_reshape1"] and lr["onnx_nodes"] == len(nodes)
    assert "TensorRT layers" in r.output and "listed, not compared" in r.output


def test_a_plan_built_without_detailed_verbosity_is_matched_by_layer_names(monkeypatch, tmp_path, mnist):
    info = fake_tensorrt.inspector_info(mnist[0], detailed=False)
    r, fake, lr = _run(monkeypatch, tmp_path, mnist, info)
    assert r.exit_code == 0, r.output
    assert lr["verbosity"] == "names" and all(row["precision"] is None for row in lr["layers"])
    assert lr["layers"][1]["onnx_nodes"] == ["Convolution28", "Plus30", "ReLU32"]  # from "a + b + c"
    assert lr["not_in_any_layer"] == ["Times212_reshape1"]
    assert any("DETAILED profiling verbosity" in w for w in lr["warnings"])


def test_the_lean_runtime_has_no_inspector_and_says_so():
    from toolchain.errors import UsageProblem
    from toolchain.plan_layers import engine_layers

    lean = fake_tensorrt.runtime_only(fake_tensorrt.make("10.13.0", engine_io=[]))
    with pytest.raises(UsageProblem, match="no engine inspector binding"):
        engine_layers(lean, "TensorRT lean 10.13.0", object(), None)
