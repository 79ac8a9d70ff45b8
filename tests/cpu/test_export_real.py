"""Real models exported and checked on CPU: EfficientNet-Lite0 with its real ImageNet weights on real photos,
ResNet-18 with a 10-class head from a saved checkpoint, and the other source forms."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from engines import open_engine, read_manifest
from engines.preprocess import batch_from_images
from tests.conftest import needs_export, softmax
from toolchain.cli import cli
from toolchain.export import export_onnx

pytestmark = needs_export


def _torch_logits(module, x):
    import torch

    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


def _assert_dynamic_batch(onnx_path, x, ref):
    """ONNX Runtime at batch 1 and batch 8 gives PyTorch's logits (max abs diff < 1e-3, same top-1)."""
    with open_engine(onnx_path, device="cpu") as engine:
        assert engine.inputs[0].shape[0] == "batch"
        one = np.concatenate([engine.infer(x[i:i + 1])[0] for i in range(len(x))])
        idx = np.arange(8) % len(x)
        eight = engine.infer(x[idx])[0]
    assert eight.shape[0] == 8
    for got, want in ((one, ref), (eight, ref[idx])):
        assert np.abs(got - want).max() < 1e-3
        assert (got.argmax(1) == want.argmax(1)).all()


def test_lite0_agrees_with_pytorch_on_real_photos(lite0_onnx, photos):
    path, report = lite0_onnx
    c = report.check
    print(f"\nEfficientNet-Lite0 ONNX vs PyTorch on {c.samples} photos: max abs diff {c.max_abs_diff:.2e}, "
          f"top-1 agreement {c.top1_agreement:.0%}")
    assert c.passed and c.samples == 3 and c.max_abs_diff < 1e-3 and c.top1_agreement == 1.0
    assert 1 in c.batch_sizes and max(c.batch_sizes) == 3
    top = {p["file"].rsplit("/", 1)[-1]: p["top5"] for p in report.predictions}
    print({k: v[0] for k, v in top.items()})
    # the real weights see real things: the cup of coffee is an espresso, Chelsea is a cat
    assert top["coffee.png"][0][0] == "espresso" and top["coffee.png"][0][1] > 0.5
    assert top["chelsea.png"][0][0] in {"tabby", "tiger cat", "Egyptian cat"}
    assert abs(sum(p for _, p in top["coffee.png"]) - 1) < 0.1


def test_lite0_manifest(lite0_onnx):
    path, report = lite0_onnx
    m = read_manifest(path)  # also verifies the sha256
    assert m.kind == "onnx" and m.model["num_classes"] == 1000 and m.model["source"] == "pretrained:efficientnet-lite0"
    assert len(m.labels) == 1000 and m.labels[285] == "Egyptian cat"
    p = m.preprocess
    assert (p.size, p.resize, p.mean, p.std, p.color) == ((224, 224), 256, (0.5,) * 3, (0.5,) * 3, "RGB")
    assert (m.batch.min, m.batch.opt, m.batch.max) == (1, 8, 32)
    assert m.inputs[0].to_dict() == {"name": "input", "dtype": "float32", "shape": ["batch", 3, 224, 224]}
    assert m.outputs[0].shape == ("batch", 1000)
    assert m.producer["exporter"] == "dynamo" and m.producer["check"]["passed"] is True
    assert m.precision == {"mode": "fp32"}


def test_lite0_dynamic_batch_against_pytorch(lite0_onnx, photos):
    from toolchain.model_source import load_model

    path, _ = lite0_onnx
    m = read_manifest(path)
    x = batch_from_images(photos, m.preprocess)
    ref = _torch_logits(load_model("pretrained:efficientnet-lite0").module, x)
    _assert_dynamic_batch(path, x, ref)


def test_resnet18_with_weights_and_head(resnet18_onnx, resnet18_weights, photos):
    path, report = resnet18_onnx
    weights, model = resnet18_weights
    assert report.check.passed and report.check.top1_agreement == 1.0 and report.check.max_abs_diff < 1e-3
    m = read_manifest(path)
    assert m.model["num_classes"] == 10 and m.labels == [f"class-{i}" for i in range(10)]
    assert m.parent["role"] == "weights" and len(m.parent["sha256"]) == 64
    x = batch_from_images(photos, m.preprocess)
    ref = _torch_logits(model, x)  # the model we saved, independent of trtc's loading
    _assert_dynamic_batch(path, x, ref)
    probs = softmax(ref)
    assert probs.shape == (3, 10)


def test_cli_export_resnet18_json(tmp_path, resnet18_weights, photos):
    weights, _ = resnet18_weights
    out = tmp_path / "r.onnx"
    r = CliRunner().invoke(cli, ["-q", "export", "torchvision:resnet18", "--weights", str(weights), "--num-classes",
                                 "10", "-o", str(out), "--batch", "1:4:8", "--check-data", str(photos[1]), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["check"]["passed"] and data["num_classes"] == 10 and data["batch"] == {"min": 1, "opt": 4, "max": 8}
    assert out.exists() and (tmp_path / "r.onnx.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.onnx", "r.onnx.json"]
    # --force overwrites; without it the same command is refused
    again = CliRunner().invoke(cli, ["-q", "export", "torchvision:resnet18", "--weights", str(weights),
                                     "--num-classes", "10", "-o", str(out)])
    assert again.exit_code == 2


NET = '''
import torch

class Small(torch.nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.features(x))

def build(num_classes=5):
    torch.manual_seed(0)
    return Small(num_classes)
'''


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_pyfile_source_and_both_exporters(tmp_path, photos, exporter):
    src = tmp_path / "net.py"
    src.write_text(NET)
    out = tmp_path / f"{exporter}.onnx"
    report = export_onnx(f"{src}:build", out, exporter=exporter, input_size=64, num_classes=7, check_data=photos)
    assert report.exporter == exporter and report.check.passed and report.num_classes == 7
    m = read_manifest(out)
    assert m.preprocess.size == (64, 64) and m.preprocess.resize == 73 and m.labels is None
    # what no option gave is said and recorded, as adopting an ONNX does (the input size was given)
    assumed = ["resize 73 (the input size / 0.875)", "colour RGB", "mean 0.485,0.456,0.406 (ImageNet default)",
               "std 0.229,0.224,0.225 (ImageNet default)"]
    assert m.producer["assumed"] == report.assumed == assumed
    assert f"assumed (no option gave them): {', '.join(assumed)};" in " ".join(report.warnings)


GREY_NET = NET.replace("Conv2d(3, 8", "Conv2d(1, 8")


def test_a_greyscale_pytorch_model_is_exported_with_its_channels(tmp_path):
    """The channels are read from the first convolution (1), the greyscale defaults fill mean/std (and are said),
    the ONNX takes (N, 1, H, W), and a --channels that contradicts the model is refused before the export."""
    src = tmp_path / "grey.py"
    src.write_text(GREY_NET)
    out = tmp_path / "g.onnx"
    report = export_onnx(f"{src}:build", out, exporter="torchscript", input_size=28, resize=0, std=(0.3,),
                         batch="1", check_samples=1)
    m = read_manifest(out)
    assert report.check.passed and m.preprocess.channels == 1 and m.inputs[0].shape == (1, 1, 28, 28)
    assert m.preprocess.mean == (0.449,) and m.preprocess.std == (0.3,)
    assert m.producer["assumed"] == ["mean 0.449 (greyscale default)"]
    r = CliRunner().invoke(cli, ["export", f"{src}:build", "--channels", "3", "-o", str(tmp_path / "x.onnx")])
    assert r.exit_code == 2 and "--channels 3, but the model's first convolution takes 1 channels" in r.output


def test_torchscript_and_exported_program_sources(tmp_path, photos):
    import torch

    ns = {}
    exec(NET, ns)
    model = ns["build"]().eval()
    scripted = tmp_path / "small.pt"
    torch.jit.trace(model, torch.randn(2, 3, 64, 64)).save(str(scripted))
    r1 = export_onnx(str(scripted), tmp_path / "ts.onnx", input_size=64, check_data=photos)
    assert r1.exporter == "torchscript" and r1.check.passed
    assert read_manifest(tmp_path / "ts.onnx").producer["assumed"][2:] == [
        "mean 0.485,0.456,0.406 (ImageNet default)", "std 0.229,0.224,0.225 (ImageNet default)"]
    program = tmp_path / "small.pt2"
    batch = torch.export.Dim("batch", min=1, max=16)
    torch.export.save(torch.export.export(model, (torch.randn(2, 3, 64, 64),), dynamic_shapes=({0: batch},)), program)
    r2 = export_onnx(str(program), tmp_path / "ep.onnx", input_size=64, batch="1:4:16", check_data=photos)
    assert r2.exporter == "dynamo" and r2.check.passed
    x = batch_from_images(photos, read_manifest(tmp_path / "ep.onnx").preprocess)
    ref = _torch_logits(model, x)
    for name in ("ts.onnx", "ep.onnx"):
        with open_engine(tmp_path / name) as engine:
            assert np.abs(engine.infer(x)[0] - ref).max() < 1e-4


def test_timm_source(tmp_path):
    pytest.importorskip("timm")
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model("resnet10t", pretrained=False, num_classes=4)
    weights = tmp_path / "timm.pth"
    torch.save(model.state_dict(), weights)
    report = export_onnx("timm:resnet10t", tmp_path / "t.onnx", weights=str(weights), num_classes=4)
    assert report.check.passed and report.check.data == "random" and report.num_classes == 4
    m = read_manifest(tmp_path / "t.onnx")
    cfg = timm.data.resolve_data_config({}, model=model)
    assert m.preprocess.size == tuple(cfg["input_size"][1:])  # from timm's data config
    assert m.preprocess.mean == tuple(cfg["mean"])
    size = cfg["input_size"][1]
    assert m.producer["assumed"][0] == f"input size {size}x{size} (timm's data config for resnet10t)"
    assert len(m.producer["assumed"]) == 5 and any("assumed (no option gave them)" in w for w in report.warnings)


def test_parity_failure_writes_nothing(tmp_path, monkeypatch):
    """If ONNX Runtime disagreed with PyTorch the export must fail and leave nothing: simulate a broken runtime."""
    from engines import onnxruntime_engine
    from toolchain.errors import ExportError

    real = onnxruntime_engine.OnnxRuntimeEngine.infer
    monkeypatch.setattr(onnxruntime_engine.OnnxRuntimeEngine, "infer", lambda self, b: [real(self, b)[0] + 0.01])
    src = tmp_path / "net.py"
    src.write_text(NET)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ExportError, match="disagrees with PyTorch"):
        export_onnx(f"{src}:build", out_dir / "m.onnx", input_size=64)
    assert list(out_dir.iterdir()) == []


def test_random_weights_are_asked_for_and_recorded(tmp_path):
    """--random-weights exports the untrained network on purpose, and the manifest and inspect say so."""
    out = tmp_path / "sq.onnx"
    r = CliRunner().invoke(cli, ["-q", "export", "torchvision:squeezenet1_1", "--random-weights", "--input-size", "64",
                                 "--batch", "1", "--check-samples", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "RANDOM (--random-weights: an untrained network)" in r.output
    m = read_manifest(out)
    assert m.producer["assumed"][-1] == "std 0.229,0.224,0.225 (torchvision's defaults for squeezenet1_1)"
    assert m.model["weights"] == "random" and m.parent is None
    shown = CliRunner().invoke(cli, ["inspect", str(out)])
    assert shown.exit_code == 0 and "RANDOM (--random-weights: an untrained network)" in shown.output, shown.output


def test_check_data_skips_an_undecodable_image_as_every_folder_does(tmp_path, photos):
    """Issue 25 item 7: one undecodable image stopped the export after its work, while quantize and validate skip
    it with a warning. One rule, applied before the export."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for p in photos:
        shutil.copy(p, folder / p.name)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    out = tmp_path / "l.onnx"
    r = CliRunner().invoke(cli, ["export", "pretrained:efficientnet-lite0", "-o", str(out), "--check-data",
                                 str(folder), "--batch", "1:2:4"])
    assert r.exit_code == 0, r.output
    err = "".join(r.stderr.split())  # the log's lines wrap the long path anywhere
    assert f"skipping{folder / 'broken.jpg'}:cannotdecodeimage" in err, r.stderr
    assert "skipped1unreadablecheckimage(s):broken.jpg" in err
    assert "broken.jpg" not in r.stdout  # warnings are not results
    assert read_manifest(out).producer["check"]["samples"] == len(photos)


def test_check_data_with_no_readable_image_fails_before_the_export(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "broken.png").write_bytes(b"\x89PNG cut short")
    out = tmp_path / "l.onnx"
    r = CliRunner().invoke(cli, ["export", "pretrained:efficientnet-lite0", "-o", str(out), "--check-data",
                                 str(folder)])
    assert r.exit_code == 1, r.output
    assert f"error: none of the 1 images in {folder} could be read (first: cannot decode image" in r.output
    assert "exporting to ONNX" not in r.output  # refused before the slow work
    assert list(tmp_path.iterdir()) == [folder]
