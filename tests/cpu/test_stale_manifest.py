"""A model whose manifest describes another file is refused when it is opened (issue 25, item 1): trtc run and
engines.open_engine used the stale manifest's labels and preprocessing without a word."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

import engines
from engines import ManifestError
from engines._io import _HASHED
from toolchain.cli import cli


def _copy(model, folder):
    dst = folder / model.name
    shutil.copyfile(model, dst)
    shutil.copyfile(f"{model}.json", f"{dst}.json")
    return dst


def _stale(model, folder):
    """A copy of ``model`` whose manifest's sha256 differs in one character."""
    dst = _copy(model, folder)
    path = f"{dst}.json"
    m = json.loads(open(path).read())
    sha = m["artifact"]["sha256"]
    m["artifact"]["sha256"] = ("0" if sha[0] != "0" else "1") + sha[1:]
    open(path, "w").write(json.dumps(m, indent=2))
    return dst


def test_open_engine_refuses_a_manifest_of_another_file(lite0_onnx, tmp_path):
    model = _stale(lite0_onnx[0], tmp_path)
    with pytest.raises(ManifestError) as e:
        engines.open_engine(model, device="cpu")
    assert "does not match its manifest" in e.value.reason and "\n" not in e.value.reason
    assert e.value.fix and "re-export" in e.value.fix
    with pytest.raises(ManifestError):  # the OpenCV path reads the same manifest
        engines.open_engine(f"opencv:{model}", device="cpu")


def test_trtc_run_refuses_a_stale_manifest(lite0_onnx, bikes, tmp_path):
    model = _stale(lite0_onnx[0], tmp_path)
    r = CliRunner().invoke(cli, ["run", str(bikes), "--model", str(model), "--device", "cpu"])
    assert r.exit_code == 1, r.output
    lines = r.output.splitlines()
    assert [ln for ln in lines if ln.startswith("error:")] == [ln for ln in lines[:1]], r.output
    assert "does not match its manifest" in lines[0] and lines[1].startswith("  fix: re-export"), r.output
    assert '"frame"' not in r.output  # nothing was classified with the stale manifest


def test_the_hash_is_remembered_but_a_changed_file_is_hashed_again(lite0_onnx, tmp_path):
    model = _copy(lite0_onnx[0], tmp_path)
    with engines.open_engine(model, device="cpu"):
        pass
    assert any(k[0] == os.path.realpath(model) for k in _HASHED)  # hashed once, remembered
    st = os.stat(model)
    data = bytearray(model.read_bytes())
    data[-1] ^= 1  # same size, and the same mtime put back: only the ctime (and the bytes) tell
    model.write_bytes(bytes(data))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ManifestError, match="does not match its manifest"):
        engines.open_engine(model, device="cpu")


def test_a_missing_model_names_the_models_beside_it(lite0_onnx, tmp_path):
    _copy(lite0_onnx[0], tmp_path)
    with pytest.raises(engines.UsageProblem) as e:
        engines.open_engine(tmp_path / "lite0.fp16.onnx", device="cpu")
    assert e.value.fix == f"check the path; {tmp_path} has lite0.onnx"
