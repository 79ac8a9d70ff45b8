import json

import pytest

from engines.base import TensorSpec
from engines.errors import ManifestError, UsageProblem
from engines.manifest import BatchProfile, Manifest, manifest_path, read_manifest, write_manifest
from engines.preprocess import PreprocessSpec


@pytest.mark.parametrize("text,expected", [("1:8:32", (1, 8, 32)), ("4", (4, 4, 4)), ("1:16", (1, 16, 16))])
def test_batch_profile_parse(text, expected):
    p = BatchProfile.parse(text)
    assert (p.min, p.opt, p.max) == expected
    assert p.dynamic == (expected[0] != expected[2])


@pytest.mark.parametrize("text", ["0:1:2", "8:4:32", "a:b:c", "1:2:3:4", ""])
def test_batch_profile_rejects(text):
    with pytest.raises(UsageProblem):
        BatchProfile.parse(text)


def _manifest():
    return Manifest(kind="onnx", model={"name": "m", "source": "x", "num_classes": 2},
                    preprocess=PreprocessSpec(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), input="input"),
                    inputs=[TensorSpec("input", "float32", ("batch", 3, 224, 224))],
                    outputs=[TensorSpec("logits", "float32", ("batch", 2))], batch=BatchProfile(1, 8, 32),
                    labels=["cat", "dog"])


def test_roundtrip_and_hash(tmp_path):
    art = tmp_path / "m.onnx"
    art.write_bytes(b"not really onnx but bytes to hash")
    path = write_manifest(art, _manifest())
    assert path == manifest_path(art) == tmp_path / "m.onnx.json"
    data = json.loads(path.read_text())
    assert data["schema"] == 1 and data["artifact"]["bytes"] == art.stat().st_size
    assert len(data["artifact"]["sha256"]) == 64
    m = read_manifest(art)
    assert m.labels == ["cat", "dog"] and m.batch == BatchProfile(1, 8, 32)
    assert m.preprocess.mean == (0.5, 0.5, 0.5) and m.inputs[0].shape == ("batch", 3, 224, 224)
    assert m.label(1) == "dog" and m.label(7) == "7"


def test_changed_artifact_is_refused(tmp_path):
    art = tmp_path / "m.onnx"
    art.write_bytes(b"one")
    write_manifest(art, _manifest())
    art.write_bytes(b"two")
    with pytest.raises(ManifestError, match="does not match its manifest"):
        read_manifest(art)


def test_missing_and_malformed_manifest(tmp_path):
    art = tmp_path / "m.onnx"
    art.write_bytes(b"x")
    with pytest.raises(ManifestError, match="no manifest"):
        read_manifest(art)
    manifest_path(art).write_text('{"schema": 1, "kind": "onnx"}')
    with pytest.raises(ManifestError, match="malformed"):
        read_manifest(art)
    manifest_path(art).write_text('{"schema": 99}')
    with pytest.raises(ManifestError, match="schema"):
        read_manifest(art)
