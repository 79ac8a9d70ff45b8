"""Every bad input to `trtc export`: exact exit code, a message naming the problem, and no file left behind."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.conftest import needs_export
from toolchain.cli import cli


def run(args):
    return CliRunner().invoke(cli, args)


def assert_nothing_written(folder, keep=()):
    left = sorted(p.name for p in folder.iterdir() if p.name not in keep)
    assert left == [], f"left behind: {left}"


def test_missing_source_file(tmp_path):
    r = run(["export", str(tmp_path / "nope.pt"), "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 2 and "source file not found" in r.output and "nope.pt" in r.output
    assert_nothing_written(tmp_path)


def test_unknown_source_form(tmp_path):
    r = run(["export", "resnet18", "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 2 and "unknown model source 'resnet18'" in r.output and "torchvision:ARCH" in r.output


@needs_export
def test_unknown_architecture_suggests(tmp_path):
    # with --random-weights: without weights at all, the missing --weights is said first, before PyTorch loads
    r = run(["export", "torchvision:resnet19", "--random-weights", "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 2, r.output
    assert "unknown torchvision architecture 'resnet19'" in r.output and "resnet18" in r.output
    assert_nothing_written(tmp_path)


def test_output_in_missing_folder(tmp_path):
    r = run(["export", "torchvision:resnet18", "-o", str(tmp_path / "no" / "such" / "m.onnx")])
    assert r.exit_code == 2 and "does not exist" in r.output and "mkdir -p" in r.output
    assert_nothing_written(tmp_path)


def test_existing_output_needs_force(tmp_path):
    out = tmp_path / "m.onnx"
    out.write_bytes(b"precious")
    r = run(["export", "torchvision:resnet18", "-o", str(out)])
    assert r.exit_code == 2 and "already exists" in r.output and "--force" in r.output
    assert out.read_bytes() == b"precious"
    assert_nothing_written(tmp_path, keep={"m.onnx"})


@pytest.mark.parametrize("args,match", [
    (["--batch", "8:4:2"], "MIN:OPT:MAX"),
    (["--mean", "0.5,0.5"], "needs 3 values"),
    (["--mean", "124,117,104"], "not in [0, 1] units"),
    (["--input-size", "abc"], "N or HxW"),
    (["--opset", "7"], "outside 13..25"),
    (["--check-data", "/no/such/photos"], "check data not found"),
])
def test_bad_options_are_usage_errors(tmp_path, args, match):
    r = run(["export", "torchvision:resnet18", "--random-weights", "-o", str(tmp_path / "m.onnx"), *args])
    assert r.exit_code == 2, r.output
    assert match in r.output
    assert_nothing_written(tmp_path)


def test_wrong_suffix(tmp_path):
    r = run(["export", "torchvision:resnet18", "-o", str(tmp_path / "m.plan")])
    assert r.exit_code == 2 and "must end in .onnx" in r.output


@needs_export
def test_weights_that_do_not_fit(tmp_path, resnet18_weights):
    weights, _ = resnet18_weights  # a 10-class head
    r = run(["export", "torchvision:resnet18", "--weights", str(weights), "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 1, r.output
    assert "do not fit torchvision:resnet18" in r.output
    assert "fc.weight: file (10, 512) vs model (1000, 512)" in r.output
    assert "--num-classes 10" in r.output  # the fix
    assert "Traceback" not in r.output
    assert_nothing_written(tmp_path)


@needs_export
def test_weights_of_another_architecture(tmp_path, resnet18_weights):
    weights, _ = resnet18_weights
    r = run(["export", "torchvision:mobilenet_v3_small", "--weights", str(weights), "--num-classes", "10",
             "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 1 and "missing from the file" in r.output and "not in the model" in r.output
    assert_nothing_written(tmp_path)


@needs_export
def test_unreadable_weights(tmp_path):
    bad = tmp_path / "w.pth"
    bad.write_bytes(b"garbage, not a torch file")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = run(["export", "torchvision:resnet18", "--weights", str(bad), "-o", str(out_dir / "m.onnx")])
    assert r.exit_code == 1 and "is not a PyTorch weights file" in r.output
    assert_nothing_written(out_dir)
    bad.write_bytes(b"PK\x03\x04 a zip cut short")  # looks like torch.save's format, but torch cannot read it
    r = run(["export", "torchvision:resnet18", "--weights", str(bad), "-o", str(out_dir / "m.onnx")])
    assert r.exit_code == 1 and "cannot read weights" in r.output and "fix: save the weights" in r.output
    assert_nothing_written(out_dir)


UNSUPPORTED = '''
import torch

class Bessel(torch.nn.Module):
    def forward(self, x):
        return torch.special.i0(x)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, stride=2)
        self.odd = Bessel()
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.pool(self.odd(self.stem(x))).flatten(1))

def build():
    return Net()
'''


@needs_export
@pytest.mark.parametrize("exporter", ["auto", "dynamo"])
def test_unsupported_operator_named_with_module(tmp_path, exporter):
    src = tmp_path / "net.py"
    src.write_text(UNSUPPORTED)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = run(["export", f"{src}:build", "--exporter", exporter, "--input-size", "32", "-o", str(out_dir / "m.onnx")])
    assert r.exit_code == 1, r.output
    assert "cannot handle operator" in r.output
    assert "i0" in r.output  # prims.bessel_i0 (dynamo) or aten::i0 (TorchScript)
    assert "odd" in r.output and "Bessel" in r.output  # the module it sits in
    assert_nothing_written(out_dir)


@needs_export
def test_factory_errors(tmp_path):
    src = tmp_path / "net.py"
    src.write_text("def build():\n    return 42\n")
    r = run(["export", f"{src}:build", "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 1 and "not a torch.nn.Module" in r.output
    r = run(["export", f"{src}:missing", "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 2 and "has no function 'missing'" in r.output and "build" in r.output


@needs_export
def test_debug_shows_traceback(tmp_path, resnet18_weights):
    weights, _ = resnet18_weights
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = CliRunner().invoke(cli, ["--debug", "export", "torchvision:resnet18", "--weights", str(weights),
                                 "-o", str(out_dir / "m.onnx")])
    assert r.exit_code == 1 and "Traceback" in r.output


SMALL = '''
import torch

def build(num_classes=10):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, num_classes))
'''


@needs_export
def test_labels_that_do_not_match_the_outputs(tmp_path):
    src = tmp_path / "net.py"
    src.write_text(SMALL)
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\nbird\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = run(["export", f"{src}:build", "--input-size", "32", "--labels", str(labels), "-o", str(out_dir / "m.onnx")])
    assert r.exit_code == 2, r.output
    assert "labels file has 3 entries but the model has 10 outputs" in r.output
    assert_nothing_written(out_dir)


@needs_export
def test_ctrl_c_during_export_leaves_nothing(tmp_path, monkeypatch):
    from toolchain import export as export_mod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(export_mod, "_check", interrupted)  # Ctrl-C after the ONNX was written to its temp file
    src = tmp_path / "net.py"
    src.write_text(SMALL)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = run(["export", f"{src}:build", "--input-size", "32", "-o", str(out_dir / "m.onnx")])
    assert r.exit_code == 130 and "nothing partial was left" in r.output
    assert_nothing_written(out_dir)


@needs_export
@pytest.mark.parametrize("source", ["torchvision:resnet18", "timm:resnet10t"])
def test_an_architecture_without_weights_is_refused(tmp_path, source):
    """Issue 25: `trtc export torchvision:resnet18 -o r.onnx` exported an untrained network, exit 0."""
    r = run(["export", source, "-o", str(tmp_path / "r.onnx")])
    assert r.exit_code == 2, r.output
    lines = r.output.splitlines()[-2:]  # refused before the model is loaded (no seconds of importing PyTorch)
    assert lines[0] == f"error: {source} has no trained weights without --weights: the export would be an " \
                       "untrained network", r.output
    assert lines[1].startswith("  fix: give them: --weights FILE") and lines[1].endswith("add --random-weights")
    assert r.output.count("error:") == 1, r.output
    assert_nothing_written(tmp_path)


@needs_export
@pytest.mark.parametrize("args,match", [
    (["torchvision:resnet18", "--random-weights", "--weights", "W"], "--weights and --random-weights contradict"),
    (["pretrained:efficientnet-lite0", "--random-weights"], "--random-weights applies to torchvision:ARCH and timm"),
])
def test_random_weights_only_where_it_means_something(tmp_path, args, match):
    w = tmp_path / "w.pth"
    w.write_bytes(b"")
    args = [str(w) if a == "W" else a for a in args]
    out = tmp_path / "out"
    out.mkdir()
    r = run(["export", *args, "-o", str(out / "m.onnx")])
    assert r.exit_code == 2 and match in r.output, r.output
    assert_nothing_written(out)
