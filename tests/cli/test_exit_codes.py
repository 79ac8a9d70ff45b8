"""Every command gives the same exit code for the same mistake (docs/CONVENTIONS.md's table): a missing input and
a file of the wrong kind are 2, whatever the command, with one `error:` line that says what the file is and a
`fix:`. Each case is refused before any slow work, so no model is exported here."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from toolchain.cli import cli


@pytest.fixture(scope="module")
def files(tmp_path_factory, mnist):
    d = tmp_path_factory.mktemp("bad-inputs")
    (d / "notes.txt").write_text("meeting notes\n")
    (d / "empty").mkdir()
    return {"TXT": str(d / "notes.txt"), "MISSING": str(d / "missing.onnx"), "EMPTY": str(d / "empty"),
            "MODEL": str(mnist[0]), "NPZ": str(mnist[1]), "NOVIDEO": str(d / "missing.mp4")}


# {command: argv with BAD where the bad model goes}
MODEL_ARG = {
    "run": ["run", "NOVIDEO_OK", "--model", "BAD", "--device", "cpu"],
    "bench": ["bench", "BAD", "--device", "cpu"],
    "export": ["export", "BAD", "-o", "OUT.onnx"],
    "quantize": ["quantize", "BAD", "--precision", "fp16"],
    "inspect": ["inspect", "BAD"],
    "validate": ["validate", "--reference", "BAD", "--candidate", "MODEL", "--data", "NPZ"],
    "build": ["build", "BAD"],
}


def _invoke(argv):
    r = CliRunner().invoke(cli, argv)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "  fix: " in r.output, r.output
    assert "bug in trtc" not in r.output and "Traceback" not in r.output, r.output
    return r.exit_code, errors[0], r.output


def _argv(template, files, bad, tmp_path, bikes):
    out = []
    for a in template:
        a = {"BAD": bad, "NOVIDEO_OK": str(bikes)}.get(a, a)
        a = str(tmp_path / "out.onnx") if a == "OUT.onnx" else a
        out.append(files.get(a, a))
    return out


# build asks for TensorRT before it reads its model: without TensorRT its first error is the missing package
@pytest.mark.parametrize("command", [c for c in MODEL_ARG if c != "build"])
def test_a_text_file_as_the_model_is_2_everywhere(command, files, tmp_path, bikes):
    code, line, text = _invoke(_argv(MODEL_ARG[command], files, files["TXT"], tmp_path, bikes))
    assert code == 2, text
    assert "notes.txt" in line and "text file" in line, text
    assert "Wire format" not in text


@pytest.mark.parametrize("command", list(MODEL_ARG))
def test_a_missing_model_is_2_everywhere(command, files, tmp_path, bikes):
    code, line, text = _invoke(_argv(MODEL_ARG[command], files, files["MISSING"], tmp_path, bikes))
    assert code == 2, text
    assert "missing.onnx" in line, text


@pytest.mark.parametrize("argv,says", [
    (["run", "NOVIDEO", "--model", "MODEL", "--device", "cpu"], "no such file"),
    (["run", "TXT", "--model", "MODEL", "--device", "cpu"], "is a text file, not a video"),
    (["run", "EMPTY", "--model", "MODEL", "--device", "cpu"], "is a folder with no video or image in it"),
    (["validate", "--reference", "MODEL", "--candidate", "MODEL", "--data", "EMPTY"], "no images"),
    (["validate", "--reference", "MODEL", "--candidate", "MODEL", "--data", "NOVIDEO"], "not found"),
    (["quantize", "MODEL", "--precision", "int8", "--calib", "NOVIDEO"], "missing.mp4"),
])
def test_a_missing_or_wrong_input_is_2(argv, says, files):
    code, line, text = _invoke([files.get(a, a) for a in argv])
    assert code == 2, text
    assert says in line, text


def test_a_cut_off_video_is_a_bad_source_1(files, test_videos, lite0_onnx, tmp_path):
    """A damaged video is read and fails: a bad source (1), its reason without FFmpeg's error number and with a
    fix that names the file (not "ffprobe FILE")."""
    cut = str(test_videos["truncated_mp4"])
    r = CliRunner().invoke(cli, ["run", cut, "--model", str(lite0_onnx[0]), "--device", "cpu"])
    assert r.exit_code == 1, r.output
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {cut}: "), r.output
    assert "[Errno" not in errors[0] and "ffprobe FILE" not in r.output.split("error:")[-1]
    assert f"  fix: check the file: ffprobe {cut} shows what it holds" in r.output


def test_missing_and_empty_files_among_good_ones_are_bad_sources_1(lite0_onnx, bikes, tmp_path):
    """What `run --help` says: a missing or an empty file among readable sources is reported with its name, the good
    source's lines are all there, and the exit code is 1 (it was 2 with no line); alone, either is still 2."""
    empty = tmp_path / "zero.mp4"
    empty.touch()
    missing = str(tmp_path / "missing.mp4")
    r = CliRunner().invoke(cli, ["run", str(bikes), missing, str(empty), "--model", str(lite0_onnx[0]), "--device",
                                 "cpu", "--stride", "100", "--top-k", "1"])
    assert r.exit_code == 1, r.output
    lines = [json.loads(ln) for ln in r.output.splitlines() if ln.startswith("{")]
    assert [d["frame"] for d in lines if d["source"] == str(bikes)] == [0, 100, 200], r.output
    assert "no such file" in r.output and "is an empty file (0 bytes)" in r.output
    for alone, says in ((missing, "no such file"), (str(empty), "is an empty file (0 bytes)")):
        code, line, text = _invoke(["run", alone, "--model", str(lite0_onnx[0]), "--device", "cpu"])
        assert code == 2 and says in line, text


def test_top_k_above_the_classes_is_refused(lite0_onnx, bikes):
    code, line, text = _invoke(["run", str(bikes), "--model", str(lite0_onnx[0]), "--device", "cpu",
                                "--top-k", "5000"])
    assert code == 2 and line == "error: --top-k 5000 asks for more classes than lite0.onnx has (1000)", text
    assert "fix: give --top-k 1000 or less" in text


def test_export_without_weights_refused_before_loading(tmp_path, monkeypatch):
    """`trtc export torchvision:resnet18` without --weights: refused before PyTorch is loaded."""
    import toolchain.export as export_mod

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(export_mod, "load_model", no_load)
    code, line, text = _invoke(["export", "torchvision:resnet18", "-o", str(tmp_path / "r.onnx")])
    assert code == 2 and "has no trained weights without --weights" in line, text


def test_library_errors_name_python_arguments(tmp_path):
    """From Python, the fix names force=True, not --force (the CLI's words stay the CLI's)."""
    from engines.errors import UsageProblem
    from toolchain.outputs import check_output_path

    out = tmp_path / "m.onnx"
    out.write_text("x")
    with pytest.raises(UsageProblem) as e:
        check_output_path(out, force=False)
    assert "force=True" in e.value.fix and "--force" not in e.value.fix
    from toolchain.export import export_onnx

    with pytest.raises(UsageProblem) as e:  # the function the issue met it in, onto an existing file
        export_onnx("pretrained:efficientnet-lite0", out)
    assert e.value.fix == "pass force=True to overwrite it, or give another output path"
    assert out.read_text() == "x"
    code, line, text = _invoke(["export", "pretrained:efficientnet-lite0", "-o", str(out)])
    assert code == 2 and "add --force to overwrite it, or give another -o" in text, text
