"""`trtc validate` on real models and data (CPU): FP16 and INT8 Lite0 pass the defaults, a damaged candidate
fails naming the metric, MNIST reports accuracy deltas on its 5000 labelled digits, JSON and HTML reports."""

from __future__ import annotations

import html.parser
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import needs_export, needs_quant
from toolchain.cli import cli

pytestmark = needs_quant


def run(args):
    return CliRunner().invoke(cli, args)


def _damage(src, dst):
    """The FP16 Lite0 with its stem convolution's weights scaled by 1.6: a plausible broken conversion."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    m = onnx.load(str(src))
    stem = next(n for n in m.graph.node if n.op_type == "Conv")
    w = next(i for i in m.graph.initializer if i.name == stem.input[1])
    w.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(w) * 1.6).astype(np.float16), w.name))
    onnx.save(m, str(dst))
    meta = json.loads(open(f"{src}.json").read())
    from engines._io import sha256_file

    meta["artifact"]["sha256"] = sha256_file(dst)  # a manifest that matches the damaged file: only parity can tell
    meta["artifact"]["file"] = dst.name
    (dst.parent / f"{dst.name}.json").write_text(json.dumps(meta))


@needs_export
@pytest.mark.slow
def test_fp16_and_int8_pass_a_damaged_candidate_fails(lite0_onnx, lite0_fp16, lite0_int8, photos, bikes, tmp_path):
    bad = tmp_path / "lite0.broken.onnx"
    _damage(lite0_fp16.output, bad)
    data = [a for p in photos for a in ("--data", str(p))] + ["--data", str(bikes)]
    r = run(["validate", "--reference", str(lite0_onnx[0]), "--candidate", lite0_fp16.output, "--candidate",
             lite0_int8.output, *data, "--json", str(tmp_path / "ok.json"), "--html", str(tmp_path / "ok.html")])
    print("\n" + r.output)
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "ok.json").read_text())
    fp16, int8 = report["candidates"]
    assert report["schema"] == 1 and report["data"]["samples"] == 253 and report["passed"] is True
    assert fp16["precision"] == "fp16" and fp16["metrics"]["top1_agreement"] >= 0.98
    assert int8["precision"] == "int8" and int8["metrics"]["top1_agreement"] >= 0.95
    assert int8["thresholds"] == {"min_top1_agreement": 0.95, "min_cosine": 0.98, "max_accuracy_drop": 0.01}
    assert all(f["sample"].startswith(("bikes.mp4#", "/")) for f in fp16["flips"])
    r = run(["validate", "--reference", str(lite0_onnx[0]), "--candidate", str(bad), *data, "--count", "64"])
    assert r.exit_code == 1, r.output
    assert "lite0.broken.onnx fails top1_agreement" in r.output and "threshold 0.98" in r.output
    assert "off by" in r.output


def test_mnist_accuracy_deltas_on_labelled_digits(mnist, tmp_path):
    from toolchain.quantize import quantize_onnx

    model, npz, _, _ = mnist
    shutil.copy(model, tmp_path / "mnist.onnx")
    for p in ("fp16", "int8"):
        quantize_onnx(tmp_path / "mnist.onnx", precision=p, calib=[str(npz)], calib_count=500, calib_cache=False)
    r = run(["validate", "--reference", str(tmp_path / "mnist.onnx"), "--candidate", str(tmp_path / "mnist.fp16.onnx"),
             "--candidate", str(tmp_path / "mnist.int8.onnx"), "--data", str(npz), "--count", "5000", "--json", "-"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["data"] == {"sources": [str(npz)], "samples": 5000, "labelled": True, "skipped": [], "rotated": [],
                              "device": "cpu"}
    for c in report["candidates"]:
        m = c["metrics"]
        print(f"\nMNIST {c['precision']}: accuracy {m['accuracy_reference']:.2%} -> {m['accuracy']:.2%} "
              f"({100 * m['accuracy_delta']:+.2f} pp), top-1 agreement {m['top1_agreement']:.2%}")
        assert m["accuracy_reference"] > 0.98 and abs(m["accuracy_delta"]) <= 0.003
    # a threshold override that the INT8 model cannot meet fails, naming it
    r = run(["validate", "--reference", str(tmp_path / "mnist.onnx"), "--candidate", str(tmp_path / "mnist.int8.onnx"),
             "--data", str(npz), "--count", "300", "--min-cosine", "0.9999999"])
    assert r.exit_code == 1 and "fails cosine" in r.output


@needs_export
def test_pytorch_reference_class_folders_and_html(lite0_onnx, photos, tmp_path):
    d = tmp_path / "val"
    for label, photo in (("espresso", photos[1]), ("tiger cat", photos[2])):
        (d / label).mkdir(parents=True)
        shutil.copy(photo, d / label / photo.name)
    r = run(["validate", "--reference", "pretrained:efficientnet-lite0", "--candidate", str(lite0_onnx[0]),
             "--data", str(d), "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    c = json.loads((tmp_path / "r.json").read_text())["candidates"][0]
    assert c["kind"] == "onnx" and c["metrics"]["top1_agreement"] == 1.0 and c["metrics"]["max_abs_diff"] < 1e-3
    assert c["metrics"]["accuracy"] == 1.0 and c["metrics"]["accuracy_delta"] == 0.0  # folders named like labels
    text = (tmp_path / "r.html").read_text()
    html.parser.HTMLParser().feed(text)
    assert "trtc validate: PASS" in text and text.count("<svg") == 1 and "<circle" in text  # no flips: no bars


def test_bad_validate_input(tmp_path, mnist):
    model, npz, _, _ = mnist
    r = run(["validate", "--reference", str(model), "--candidate", str(tmp_path / "nope.onnx"), "--data", str(npz)])
    assert r.exit_code == 2 and "model not found" in r.output
    r = run(["validate", "--reference", str(model), "--candidate", str(model), "--data", str(npz)])
    assert r.exit_code == 2 and "no model has a manifest" in r.output
    r = run(["validate", "--reference", "resnet", "--candidate", str(model), "--data", str(npz)])
    assert r.exit_code == 2 and "unknown model source" in r.output


def _tiny_classifier(path, classes: int, size: int, fixed: bool = True):
    """A real ONNX classifier (global average pool, then a dense layer) with a trtc manifest beside it."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from engines.base import TensorSpec
    from engines.manifest import BatchProfile, Manifest, write_manifest
    from engines.preprocess import PreprocessSpec

    hw = [size, size] if fixed else ["h", "w"]
    w = np.random.default_rng(classes).normal(size=(3, classes)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["flat"]),
         helper.make_node("MatMul", ["flat", "w"], ["logits"])],
        "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, *hw])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    write_manifest(path, Manifest(
        kind="onnx", model={"name": path.stem, "source": "tiny", "num_classes": classes},
        preprocess=PreprocessSpec(size=(size, size), resize=None, input="input"),
        inputs=[TensorSpec("input", "float32", ("batch", 3, *hw))],
        outputs=[TensorSpec("logits", "float32", ("batch", classes))], batch=BatchProfile(1, 8, 32)))
    return path


def test_models_that_do_not_classify_the_same_classes_or_sizes_are_a_usage_problem(tmp_path, monkeypatch):
    """A 1000-class reference against a 10-class candidate (or 224 against 32 pixels) is the user's mistake: a
    UsageProblem naming both models, before the whole data set runs; never parity's internal ValueError."""
    from toolchain import validate as v
    from toolchain.errors import UsageProblem

    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((40, 3, 32, 32), dtype=np.float32))
    big = _tiny_classifier(tmp_path / "big.onnx", 1000, 32)
    small = _tiny_classifier(tmp_path / "small.onnx", 10, 32)
    wide = _tiny_classifier(tmp_path / "wide.onnx", 10, 224)
    data = ["--data", str(tmp_path / "x.npy")]

    # declared by both manifests: refused before any model runs
    batches = []
    monkeypatch.setattr(v.Runner, "logits", lambda self, x, bar, first=None: batches.append(self.ref.spec))
    with pytest.raises(UsageProblem) as e:
        v.validate(str(big), [str(small)], [str(tmp_path / "x.npy")])
    assert e.value.reason == ("the reference big.onnx gives 1000 classes and the candidate small.onnx gives 10: "
                              "they do not classify the same classes")
    assert e.value.fix.startswith("compare a model with its own export, build or quantized copy")
    assert batches == []
    monkeypatch.undo()

    # not declared (the reference's manifest is gone): found from the loaded model, before it runs
    (tmp_path / "big.onnx.json").unlink()
    r = run(["validate", "--reference", str(big), "--candidate", str(small), *data])
    assert r.exit_code == 2, r.output
    assert ("error: the reference big.onnx gives 1000 classes and the candidate small.onnx gives 10: they do not "
            "classify the same classes") in r.output
    assert "  fix: compare a model with its own export" in r.output
    assert "internal error" not in r.output and "ValueError" not in r.output and "✓ reference" not in r.output

    # only seen in the output (an ONNX without declared classes): after the first batch, not the whole data set
    calls = []
    real = v.Runner.__init__

    def undeclared(self, ref, device, **kw):
        real(self, ref, device, **kw)
        if self.ref.spec == str(big):
            from engines.base import TensorSpec

            self.engine.outputs = [TensorSpec("logits", "float32", ("batch", "classes"))]
            self.batch, fn = 8, self.fn
            self.fn = lambda x: calls.append(len(x)) or fn(x)

    monkeypatch.setattr(v.Runner, "__init__", undeclared)
    with pytest.raises(UsageProblem, match="gives 1000 classes and the candidate small.onnx gives 10"):
        v.validate(str(big), [str(small)], [str(tmp_path / "x.npy")])
    assert calls == [8]  # one batch of the 40 samples
    monkeypatch.undo()

    # input sizes differ (224x224 against 32x32): a usage problem too, not ONNX Runtime's error
    r = run(["validate", "--reference", str(wide), "--candidate", str(small), *data])
    assert r.exit_code == 2, r.output
    assert ("error: the reference wide.onnx takes 3x224x224 inputs and the candidate small.onnx takes 3x32x32: "
            "they cannot run on the same data") in r.output
    assert "  fix: compare a model with its own export" in r.output and "internal error" not in r.output
    (tmp_path / "wide.onnx.json").unlink()  # the data then follow the candidate's manifest; the reference says 224
    r = run(["validate", "--reference", str(wide), "--candidate", str(small), *data])
    assert r.exit_code == 2 and "takes 3x224x224 inputs and the candidate small.onnx takes 3x32x32" in r.output

    # the same classes and sizes still validate
    twin = tmp_path / "twin.onnx"
    shutil.copy(small, twin)
    shutil.copy(f"{small}.json", f"{twin}.json")
    meta = json.loads((tmp_path / "twin.onnx.json").read_text())
    meta["artifact"]["file"] = "twin.onnx"
    (tmp_path / "twin.onnx.json").write_text(json.dumps(meta))
    r = run(["validate", "--reference", str(small), "--candidate", str(twin), *data])
    assert r.exit_code == 0, r.output


@needs_export
def test_a_reference_built_by_code_needs_its_weights(photos, tmp_path):
    """`--reference net.py:build` builds the network with its initial weights: without --reference-weights it is
    refused with that fix (it ran random weights, and a trained candidate "failed" against them); with the trained
    weights the candidate exported from them agrees with it exactly, which the factory's own weights do not."""
    import torch

    from tests.cpu.test_export_real import NET
    from toolchain.export import export_onnx

    src = tmp_path / "net.py"
    src.write_text(NET)
    ns: dict = {}
    exec(NET, ns)
    torch.manual_seed(1)
    trained = ns["Small"]()  # other weights than build()'s seed-0 ones
    weights = tmp_path / "trained.pt"
    torch.save(trained.state_dict(), weights)
    onnx_path = tmp_path / "m.onnx"
    export_onnx(f"{src}:build", onnx_path, weights=str(weights), input_size=64, batch="1:4:8", check_samples=2)
    folder = tmp_path / "photos"
    folder.mkdir()
    for p in photos:
        shutil.copy(p, folder / p.name)
    args = ["validate", "--reference", f"{src}:build", "--candidate", str(onnx_path), "--data", str(folder)]
    r = run(args)
    assert r.exit_code == 2, r.output
    assert "built by its code with random weights" in r.output and "--reference-weights FILE" in r.output
    r = run([*args, "--reference-weights", str(weights), "--json", "-"])
    assert r.exit_code == 0, r.output
    (cand,) = json.loads(r.stdout)["candidates"]
    assert cand["metrics"]["max_abs_diff"] < 1e-4 and cand["metrics"]["top1_agreement"] == 1.0
    r = run([*args, "--reference-weights", str(tmp_path / "missing.pt")])
    assert r.exit_code == 2 and "reference weights not found" in r.output, r.output
    r = run(["validate", "--reference", str(onnx_path), "--candidate", str(onnx_path), "--data", str(folder),
             "--reference-weights", str(weights)])
    assert r.exit_code == 2 and "drop --reference-weights" in r.output, r.output


@needs_export
def test_a_reference_fine_tuned_on_its_own_classes(resnet18_weights, resnet18_onnx, photos, tmp_path):
    """A ResNet-18 fine-tuned on 10 classes: `--reference torchvision:resnet18 --reference-weights w.pth` alone is
    refused naming the weights' classes and the option; with --num-classes 10 the reference is built with that
    head and gives the fine-tuned model's own logits (computed here by the model itself). --num-classes with a
    reference that has its own classes is refused."""
    import torch

    from toolchain.validate import validate

    weights, model = resnet18_weights
    onnx_path, _ = resnet18_onnx
    folder = tmp_path / "photos"
    folder.mkdir()
    for p in photos[:3]:
        shutil.copy(p, folder / p.name)
    args = ["validate", "--reference", "torchvision:resnet18", "--reference-weights", str(weights), "--candidate",
            str(onnx_path), "--data", str(folder)]
    r = run(args)
    assert r.exit_code == 1 and "fix: the weights have 10 classes: add --num-classes 10" in r.output, r.output

    seen = {}
    report = validate("torchvision:resnet18", [str(onnx_path)], [str(folder)], reference_weights=str(weights),
                      reference_num_classes=10, each=lambda c, ref, x, logits, result: seen.update(x=x, y=logits))
    with torch.inference_mode():
        own = model(torch.from_numpy(seen["x"])).numpy()
    assert seen["y"].shape == (3, 10)
    np.testing.assert_allclose(seen["y"], own, rtol=1e-5, atol=1e-5)
    assert report.passed, report.candidates[0].failures

    r = run(["validate", "--reference", str(onnx_path), "--candidate", str(onnx_path), "--data", str(folder),
             "--num-classes", "10"])
    assert r.exit_code == 2 and "is an ONNX model with its own classes" in r.output, r.output
    assert "fix: drop --num-classes" in r.output
