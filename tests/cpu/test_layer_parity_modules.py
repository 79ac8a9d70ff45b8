"""Per-layer parity on a real FP16 overflow and against PyTorch modules (toolchain.layers, toolchain.module_parity).

The overflow: timm's ConvNeXt-Atto (the real architecture; its weights are timm's own initialisation with seed 0,
since none can be downloaded here) whose stem convolution's weight and bias are multiplied by 2**18 = 262144. The
LayerNorm right after the stem normalises each position over its channels, so the FP32 function is unchanged (the
logits move by under 1e-5 relative, checked below), but the convolution's outputs reach about 2e5 on real photos and
frames, beyond FP16's largest value (65504): in FP16 they become inf and every logit NaN. Exported at 64x64 (the
TorchScript exporter, whose node names carry the module scopes). trtc validate --layers must name the stem
convolution, and --fix must keep it in FP32 and pass.

Each figure is recomputed here by another route: ONNX Runtime with every tensor of the model marked as an output, and
the PyTorch modules' outputs from torchvision's FX feature extractor (not forward hooks, which the library uses),
compared in numpy."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest

from tests.conftest import made_once, needs_export, needs_quant
from tests.cpu.test_layer_parity_real import _every_tensor, _rel

SCALE = 2.0 ** 18
STEM = "/stem/stem.0/Conv"
FACTORY = '''import timm
import torch


def make():
    """timm's ConvNeXt-Atto, 10 classes, with the stem-scaled weights beside this file."""
    model = timm.create_model("convnext_atto", pretrained=False, num_classes=10)
    model.load_state_dict(torch.load(__file__.replace("factory.py", "weights.pth")))
    return model
'''


@pytest.fixture(scope="session")
def convnext(tmp_path_factory, photos):
    """(folder, factory spec, FP32 ONNX, FP16 ONNX, FP32 logits change from the scaling) made once per run."""
    pytest.importorskip("timm")

    def make(d):
        import timm
        import torch

        from toolchain.export import export_onnx
        from toolchain.quantize import quantize_onnx

        torch.manual_seed(0)
        model = timm.create_model("convnext_atto", pretrained=False, num_classes=10).eval()
        x = torch.randn(4, 3, 64, 64)
        with torch.no_grad():
            before = model(x)
            model.stem[0].weight.mul_(SCALE)
            model.stem[0].bias.mul_(SCALE)
            change = float((model(x) - before).norm() / before.norm())
        torch.save(model.state_dict(), d / "weights.pth")
        (d / "factory.py").write_text(FACTORY)
        spec = f"{d / 'factory.py'}:make"
        export_onnx(spec, d / "cnx.onnx", input_size=64, exporter="torchscript", check_data=photos)
        quantize_onnx(d / "cnx.onnx", d / "cnx.fp16.onnx", precision="fp16", check=[str(p) for p in photos])
        return d, spec, d / "cnx.onnx", d / "cnx.fp16.onnx", change

    return made_once(tmp_path_factory, "convnext", make)


@needs_export
@needs_quant
def test_a_real_fp16_overflow_is_named_and_fixed_through_the_cli(convnext, photos, bikes, tmp_path):
    import onnx
    from click.testing import CliRunner

    from engines.manifest import read_manifest_if_any
    from toolchain.cli import cli
    from toolchain.layers import sample_indices
    from toolchain.precision import calibration as cal

    folder, _, ref_path, cand_path, change = convnext
    assert change < 1e-5  # the scaling leaves the FP32 function as it was
    cmd = (f"trtc validate --reference {ref_path} --candidate {cand_path} --data {photos[0].parent} --data {bikes} "
           f"--count 4 --layers --layer-samples 4 --top 3 --fix --fix-output {tmp_path / 'f.onnx'} "
           f"--json {tmp_path / 'r.json'}")
    r = CliRunner().invoke(cli, shlex.split(cmd)[1:])
    assert r.exit_code == 0, r.output  # the fixed model passes
    report = json.loads((tmp_path / "r.json").read_text())
    before = report["validate"]["candidates"][0]
    assert not before["passed"] and before["metrics"]["cosine"] == 0.0  # NaN logits: no direction agrees
    lr = before["layers"]
    stem = lr["rows"][0]
    assert stem["node"] == STEM and lr["first_over"] == stem and lr["worst"][0] == 0, lr["worst"]
    assert not stem["overflow_inherited"] and all(lr["rows"][i]["overflow_inherited"] for i in lr["worst"][1:])
    assert f"#0 {STEM} (Conv, rel L2 overflow)" in r.output

    # the counts against numpy, on the same 4 inputs: inf where the reference is beyond FP16's range
    m = read_manifest_if_any(ref_path)
    x = cal.load_data([str(photos[0].parent), str(bikes)], m.preprocess, [1, 3, 64, 64], "input", want=4, seed=0).x
    x = x[sample_indices(len(x), 4)]
    ref_all, cand_all = _every_tensor(ref_path, x), _every_tensor(cand_path, x)
    t = stem["tensor"]
    assert np.abs(ref_all[t]).max() > 65504 and np.isfinite(ref_all[t]).all()
    assert stem["overflow"]["nonfinite"] == int((~np.isfinite(cand_all[stem["candidate_tensor"]])).sum()) > 0
    assert stem["overflow"]["nonfinite"] == pytest.approx(int((np.abs(ref_all[t]) > 65520).sum()), rel=0.01)

    assert report["kept"][0] == STEM and len(report["kept"]) <= 2, report["kept"]  # the conv, and the Transpose
    assert f"--keep-fp32 {STEM}" in report["command"] and report["fixed"]["passed"]
    fixed = onnx.load(str(tmp_path / "f.onnx"))
    conv = next(n for n in fixed.graph.node if n.name == STEM)
    weight = next(i for i in fixed.graph.initializer if i.name == conv.input[1])
    assert weight.data_type == onnx.TensorProto.FLOAT  # kept in FP32
    after = report["fixed"]["candidates"][0]["metrics"]
    assert after["top1_agreement"] == 1.0 and after["cosine"] > 0.9999, after


def _module_outputs(spec: str, names: list[str], x: np.ndarray) -> dict[str, np.ndarray]:
    """The outputs of the modules ``names`` of the PyTorch model ``spec`` on ``x``, by torchvision's FX feature
    extractor."""
    import torch
    from torchvision.models.feature_extraction import create_feature_extractor

    from toolchain.model_source import load_model

    model = load_model(spec).module.eval()
    fe = create_feature_extractor(model, return_nodes={n: n for n in names})
    with torch.no_grad():
        return {k: v.numpy() for k, v in fe(torch.from_numpy(x)).items()}


@needs_export
@needs_quant
def test_convnext_modules_against_its_fp32_and_fp16_exports(convnext, photos):
    from toolchain.model_source import load_model
    from toolchain.module_parity import module_parity
    from toolchain.precision import calibration as cal

    from engines.manifest import read_manifest_if_any

    _, spec, ref_path, cand_path, _ = convnext
    m = read_manifest_if_any(ref_path)
    x = cal.load_data([str(p) for p in photos], m.preprocess, [1, 3, 64, 64], "input", want=3, seed=0).x
    modules = dict(load_model(spec).module.named_modules())
    leaves = {n for n, mod in modules.items() if n and not list(mod.children())}

    fp32 = module_parity(spec, ref_path, x, precision="fp32")
    assert fp32.matched_by == "module" and fp32.matched >= 80 and fp32.first_over is None
    rows = [row for row in fp32.rows if row["node"] in leaves]
    assert len(rows) >= 50
    torch_out = _module_outputs(spec, [row["node"] for row in rows], x)
    onnx_all = _every_tensor(ref_path, x)
    for row in rows:  # the module named is the one whose output the tensor is: equal in FP32
        assert torch_out[row["node"]].shape == onnx_all[row["tensor"]].shape, row
        assert _rel(torch_out[row["node"]], onnx_all[row["tensor"]]) < 1e-4, row
        assert row["rel_l2"] < 1e-4, row

    fp16 = module_parity(spec, cand_path, x, precision="fp16")
    assert fp16.matched == fp32.matched  # the FP16 copy's tensors, mapped through its parent's scopes
    stem = fp16.rows[0]
    assert stem["node"] == "stem.0" and stem["op"] == "Conv2d" and fp16.first_over == stem
    assert fp16.rows[fp16.worst[0]] == stem and stem["overflow"]["nonfinite"] > 0
    cand_all = _every_tensor(cand_path, x)
    ok = [row for row in fp16.rows[:12] if row["node"] in leaves and row["rel_l2"] is not None]
    for row in ok:
        assert row["rel_l2"] == pytest.approx(_rel(torch_out[row["node"]], cand_all[row["tensor"]]), rel=0.05,
                                              abs=2e-4), row


@needs_export
@needs_quant
def test_lite0_modules_against_the_fp16_dynamo_export(lite0_onnx, lite0_fp16, photos):
    """Lite0 exported by the dynamo exporter (module scopes in node metadata; BatchNorm folded into each convolution,
    so the convolution's tensor is the BatchNorm module's output) against its FP16 copy."""
    import torch

    from engines.manifest import read_manifest_if_any
    from toolchain.model_source import load_model
    from toolchain.module_parity import module_parity
    from toolchain.precision import calibration as cal

    m = read_manifest_if_any(lite0_onnx[0])
    x = cal.load_data([str(p) for p in photos], m.preprocess, [1, 3, 224, 224], "input", want=3, seed=0).x
    report = module_parity("pretrained:efficientnet-lite0", lite0_fp16.output, x, precision="fp16")
    assert report.matched_by == "module" and report.matched >= 90 and report.first_over is None, report.first_over
    names = [row["node"] for row in report.rows]
    assert "_bn0" in names and "_conv_stem" not in names and names[-1] == "_fc"  # folded BN: the conv is the BN's
    model = load_model("pretrained:efficientnet-lite0").module.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x)).numpy()
    # FP16's error is as small as ONNX Runtime's choice of kernels moves it: the model run with every tensor an
    # output (as the library runs it, and as in test_layer_parity_real.py), not as it runs unmarked
    got = _every_tensor(lite0_fp16.output, x)[report.rows[-1]["tensor"]]
    assert report.rows[-1]["rel_l2"] == pytest.approx(_rel(logits, got), rel=0.05, abs=2e-5)
