"""One output rule for every command that writes a file, and no "bug in trtc" for a user's mistake.

Each command is walked with an output in a missing folder (exit 2, the mkdir fix), under a regular file (exit 2),
in a folder that refuses new files (exit 1) and onto an existing file without --force (exit 2). The checks run
before any work, so these cases cost no export or inference.

Tests run as root here (and in CI), and root ignores permission bits: a chmod 555 folder would not refuse
anything. So the unwritable folder is a real one that refuses file creation even to root - sysfs does (EACCES,
or EROFS where /sys is mounted read-only) - and, for other users, a chmod 555 temporary folder. The fixture
proves that the folder refuses a new file before any test relies on it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolchain.cli import cli


def _refuses_new_files(folder: Path) -> bool:
    try:
        fd, tmp = tempfile.mkstemp(dir=folder)
    except OSError:
        return True
    os.close(fd)
    os.unlink(tmp)
    return False


@pytest.fixture
def unwritable(tmp_path):
    if os.geteuid() != 0:
        d = tmp_path / "readonly"
        d.mkdir()
        d.chmod(0o555)
        yield d
        d.chmod(0o755)
        return
    for cand in (Path("/sys/kernel"), Path("/sys")):
        if cand.is_dir() and _refuses_new_files(cand):
            yield cand
            return
    pytest.skip("running as root and no folder here refuses new files to root (no sysfs)")


@pytest.fixture(scope="module")
def inputs(mnist, bikes):
    model, npz, _x, _labels = mnist
    return {"MODEL": str(model), "NPZ": str(npz), "VIDEO": str(bikes)}


# every command and option that writes a file; OUT is replaced by the output path (its suffix is kept)
COMMANDS = {
    "export": ["export", "pretrained:efficientnet-lite0", "-o", "OUT.onnx"],
    "quantize": ["quantize", "MODEL", "--precision", "fp16", "-o", "OUT.onnx"],
    "build": ["build", "MODEL", "-o", "OUT.plan"],
    "run -o": ["run", "VIDEO", "--model", "MODEL", "--device", "cpu", "-o", "OUT.jsonl"],
    "run --summary": ["run", "VIDEO", "--model", "MODEL", "--device", "cpu", "--summary", "OUT.json"],
    "validate --json": ["validate", "--reference", "MODEL", "--candidate", "MODEL", "--data", "NPZ", "--json",
                        "OUT.json"],
    "validate --html": ["validate", "--reference", "MODEL", "--candidate", "MODEL", "--data", "NPZ", "--html",
                        "OUT.html"],
    "data": ["data", "OUT"],
}


def _argv(name: str, inputs: dict, out: Path) -> list[str]:
    argv = []
    for a in COMMANDS[name]:
        if a.startswith("OUT"):
            a = str(out) + a[3:]
        argv.append(inputs.get(a, a))
    return argv


def _invoke(argv):
    r = CliRunner().invoke(cli, argv)
    text = r.output
    assert "bug in trtc" not in text and "internal error" not in text, text
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, text


def _error_lines(text):
    lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, text
    assert "  fix: " in text, text
    return lines[0]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_output_in_missing_folder(name, inputs, tmp_path):
    out = tmp_path / "not" / "there" / "out"
    code, text = _invoke(_argv(name, inputs, out))
    line = _error_lines(text)
    assert code == 2, text
    assert "does not exist" in line and str(out.parent) in line and "mkdir -p" in text
    assert not (tmp_path / "not").exists()  # nothing is created behind the user's back


@pytest.mark.parametrize("name", list(COMMANDS))
def test_output_under_a_regular_file(name, inputs, tmp_path):
    (tmp_path / "afile").write_text("x")
    code, text = _invoke(_argv(name, inputs, tmp_path / "afile" / "out"))
    assert code == 2, text
    assert "is not a folder" in _error_lines(text)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_output_in_unwritable_folder(name, inputs, unwritable):
    before = sorted(p.name for p in unwritable.iterdir())
    code, text = _invoke(_argv(name, inputs, unwritable / "trtc-out"))
    assert code == 1, text
    line = _error_lines(text)
    assert "cannot write in" in line and str(unwritable) in line
    assert sorted(p.name for p in unwritable.iterdir()) == before


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "data"])
def test_existing_output_needs_force(name, inputs, tmp_path):
    out = tmp_path / "out"
    argv = _argv(name, inputs, out)
    target = Path(next(a for a in argv if a.startswith(str(out))))
    target.write_text("precious")
    code, text = _invoke(argv)
    assert code == 2, text
    assert "already exists" in _error_lines(text) and "--force" in text
    assert target.read_text() == "precious"


def test_atomic_write_into_unwritable_folder_is_a_trtc_error(unwritable):
    """The library's last line of defence: writing an artifact where no file can be created is a TrtcError."""
    from engines._io import atomic_write_text
    from engines.errors import OutputNotWritable

    with pytest.raises(OutputNotWritable, match="cannot write"):
        atomic_write_text(unwritable / "x.json", "{}")


def test_inspect_corrupt_and_foreign_files(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage that is not protobuf\xff" * 10)
    code, text = _invoke(["inspect", str(bad)])
    assert code == 1 and "is not a readable ONNX model" in _error_lines(text), text
    txt = tmp_path / "notes.txt"
    txt.write_text("hello")
    code, text = _invoke(["inspect", str(txt)])
    assert code == 2 and "notes.txt is a text file, not a model" in _error_lines(text), text  # a wrong kind: 2
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")  # protobuf reads no bytes as an empty model: inspect said "runs here: yes"
    code, text = _invoke(["inspect", str(empty)])
    assert code == 1 and "is empty (0 bytes), not an ONNX model" in _error_lines(text), text


def test_data_copies_the_samples_and_prints_their_paths(tmp_path, bikes, photos):
    code, text = _invoke(["data", str(tmp_path / "d")])
    assert code == 0, text
    video, folder = tmp_path / "d" / "bikes.mp4", tmp_path / "d" / "photos"
    assert f"video:  {video}" in text and f"photos: {folder}" in text
    assert video.read_bytes() == Path(bikes).read_bytes()
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in photos)
    code, text = _invoke(["data", str(tmp_path / "d")])  # again: nothing to do, same answer
    assert code == 0, text
    (folder / "coffee.png").write_bytes(b"mine")
    code, text = _invoke(["data", str(tmp_path / "d")])
    assert code == 2 and "differs from the sample" in _error_lines(text)
    assert (folder / "coffee.png").read_bytes() == b"mine"
    (tmp_path / "f.txt").write_text("mine")
    for extra in ([], ["--force"]):  # a file named as FOLDER: never overwritten, and not "add --force" when given
        code, text = _invoke(["data", str(tmp_path / "f.txt"), *extra])
        assert code == 2 and "is a file, and the samples go into a folder" in text, text
    assert (tmp_path / "f.txt").read_text() == "mine"


def test_run_refuses_to_write_over_its_inputs_and_non_finite_numbers(tmp_path, bikes):
    """Mistakes found by a sweep of the CLI (they overwrote inputs, hung, or ended in an internal error). All are
    refused before any model is opened, so an empty model file is enough."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    (tmp_path / "m.onnx.json").write_text("{}")
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(Path(bikes).read_bytes())
    before = clip.read_bytes()

    def run(*args):
        return CliRunner().invoke(cli, ["run", str(clip), "--model", str(model), "--device", "cpu", *args])

    r = run("-o", str(clip), "--force")
    assert r.exit_code == 2 and "is a source video: the predictions would be written over it" in r.output
    assert clip.read_bytes() == before
    r = run("-o", str(tmp_path / "m.onnx.json"), "--force")
    assert r.exit_code == 2 and "is the model's manifest" in r.output
    r = run("-o", str(model), "--force")
    assert r.exit_code == 2 and "is the model:" in r.output
    r = run("-o", str(tmp_path / "p.json"), "--summary", str(tmp_path / "p.json"))
    assert r.exit_code == 2 and "-o and --summary are the same file" in r.output
    for bad in ("nan", "inf"):
        r = run("--max-wait-ms", bad)
        assert r.exit_code == 2 and "is not a finite number" in r.output, r.output
    r = CliRunner().invoke(cli, ["run", str(clip), str(clip), "--model", str(model), "--device", "cpu"])
    assert r.exit_code == 2 and "is listed twice" in r.output and "--loop" in r.output  # lines keyed by source
    r = CliRunner().invoke(cli, ["run", str(clip), "--model", str(model), "--device", ""])
    assert r.exit_code == 2 and "--device is empty" in r.output
    r = CliRunner().invoke(cli, ["bench", str(model), "--duration", "nan"])
    assert r.exit_code == 2 and "is not a finite number" in r.output
    r = CliRunner().invoke(cli, ["bench", str(model), "--duration", "0"])
    assert r.exit_code == 2 and "0 is not above 0" in r.output


def test_run_ray_batch_input_mistakes(tmp_path, bikes):
    """--ray's own inputs: a binary file given as @list, a folder given as @list, a folder where the .done record
    goes, and an address where no Ray listens (Ray itself retried for minutes): one-line errors, nothing started."""
    import socket

    model = tmp_path / "m.onnx"
    model.write_bytes(b"")

    def run(*args):
        return CliRunner().invoke(cli, ["run", *args, "--model", str(model), "--device", "cpu"])

    r = run(f"@{bikes}", "--ray")
    assert r.exit_code == 2 and "is not a text file" in r.output and "without @" in r.output, r.output
    r = run(f"@{tmp_path}", "--ray")
    assert r.exit_code == 2 and "is a folder, not a list of sources" in r.output
    (tmp_path / "p.jsonl.done").mkdir()
    r = run(str(bikes), "--ray", "-o", str(tmp_path / "p.jsonl"))
    assert r.exit_code == 2 and "p.jsonl.done is a folder" in r.output
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run(str(bikes), "--ray", f"127.0.0.1:{port}", "-o", str(tmp_path / "q.jsonl"))
    assert r.exit_code == 1 and f"no Ray cluster answers at 127.0.0.1:{port} (nothing listens there)" in r.output
    assert f"ray start --head --port={port}" in r.output


def test_run_a_model_without_manifest_whose_input_is_not_imagenets(tmp_path, bikes):
    """An ONNX from elsewhere (no manifest) that takes 32x32: the message says the 224x224 came from the defaults,
    not from a manifest there is none of (it said "fix the manifest's preprocess size")."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 32, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)
    model = helper.make_model(helper.make_graph([node], "tiny", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "foreign.onnx"
    onnx.save(model, str(path))
    r = CliRunner().invoke(cli, ["run", str(bikes), "--model", str(path), "--device", "cpu"])
    assert r.exit_code == 2, r.output
    assert "foreign.onnx has no manifest, so its frames get the ImageNet default preprocessing (224x224), but the " \
           "model takes 32x32 inputs" in r.output
    assert "trtc export" in r.output and "manifest's preprocess size" not in r.output


def test_resume_with_another_stride_is_refused(tmp_path, bikes):
    """--resume of an output written every 5th frame, asked to go on every 10th: the file would mix the two (it did,
    silently). The same stride goes on to the model (here an empty file, so the run then fails on it)."""
    import json as _json

    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    out = tmp_path / "p.jsonl"
    out.write_text("".join(_json.dumps({"source": str(bikes), "frame": f, "top_k": []}) + "\n" for f in (0, 5, 10)))
    r = CliRunner().invoke(cli, ["run", str(bikes), "--model", str(model), "--device", "cpu", "-o", str(out),
                                 "--resume", "--stride", "10"])
    assert r.exit_code == 2 and "was written with --stride 5, and this run asks for --stride 10" in r.output, r.output
    assert "resume with --stride 5" in r.output
    r = CliRunner().invoke(cli, ["run", str(bikes), "--model", str(model), "--device", "cpu", "-o", str(out),
                                 "--resume", "--stride", "5"])
    assert "--stride" not in r.output, r.output


def test_resume_with_another_top_k_is_refused(tmp_path, bikes, monkeypatch):
    """Lines with 5 labels each, resumed with --top-k 3: refused. A model with fewer classes than k writes all of
    them, so a 10-class model's lines of 10 go on with --top-k 20 (its class count comes from its manifest)."""
    import json as _json
    import types

    from engines.errors import UsageProblem
    from toolchain.run import _check_resumed_options

    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    out = tmp_path / "p.jsonl"
    out.write_text("".join(_json.dumps({"source": str(bikes), "frame": f, "top_k": [{}] * 5}) + "\n" for f in (0, 1)))
    r = CliRunner().invoke(cli, ["run", str(bikes), "--device", "cpu", "-o", str(out), "--resume", "--model",
                                 str(model), "--top-k", "3"])
    assert r.exit_code == 2 and "was written with --top-k 5, and this run asks for --top-k 3" in r.output, r.output
    assert "resume with --top-k 5" in r.output
    ten = types.SimpleNamespace(outputs=[types.SimpleNamespace(shape=("batch", 10))], labels=None)
    monkeypatch.setattr("engines.manifest.read_manifest_if_any", lambda *a, **k: ten)
    _check_resumed_options(out, model, {1}, {10}, 1, 20)  # 10 classes: k=20 writes 10, as before
    with pytest.raises(UsageProblem, match="written with --top-k 10, and this run asks for --top-k 5"):
        _check_resumed_options(out, model, {1}, {10}, 1, 5)
