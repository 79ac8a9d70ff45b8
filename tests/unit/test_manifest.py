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


def _written(tmp_path, name="m.onnx"):
    """A real artifact and the manifest trtc writes for it, as parsed JSON."""
    art = tmp_path / name
    art.write_bytes(b"model bytes")
    write_manifest(art, _manifest())
    return art, json.loads(manifest_path(art).read_text())


def _refused(art, data=None, raw=None):
    if raw is not None:
        manifest_path(art).write_bytes(raw)
    else:
        manifest_path(art).write_text(json.dumps(data))
    with pytest.raises(ManifestError) as info:
        read_manifest(art, verify_hash=False)
    err = info.value
    assert type(err) is ManifestError and "\n" not in err.reason and err.fix
    return err


@pytest.mark.parametrize("raw,what", [(b"[1, 2]", "it holds a list, not a JSON object"),
                                      (b'"text"', "it holds a string, not a JSON object"),
                                      (b"null", "it holds null, not a JSON object"),
                                      (b"3", "it holds a number, not a JSON object")])
def test_json_that_is_not_an_object_is_refused(tmp_path, raw, what):
    art, _ = _written(tmp_path)
    err = _refused(art, raw=raw)
    assert err.reason == f"m.onnx.json is not a trtc manifest: {what}"
    assert err.fix.startswith("re-create it with the trtc export command that made m.onnx, run again with --force")
    assert "deleting m.onnx.json instead runs the model as an ONNX from elsewhere" in err.fix


def test_manifest_that_is_not_utf8_or_json_is_refused(tmp_path):
    art, _ = _written(tmp_path)
    err = _refused(art, raw=b"\xff\xfe\x00\x81 binary")
    assert err.reason == "m.onnx.json is not a trtc manifest: it is not UTF-8 text (byte 0xff at offset 0)"
    err = _refused(art, raw=b'{"schema": 1,')
    assert err.reason.startswith("m.onnx.json is not a trtc manifest: it is not valid JSON (")
    err = _refused(art, raw=b"[" * 100_000)
    assert err.reason.startswith("m.onnx.json is not a trtc manifest: it ")


@pytest.mark.parametrize("field,value,what", [
    ("precision", "fp16", "its 'precision' is a string, not an object"),
    ("precision", ["fp16"], "its 'precision' is a list, not an object"),
    ("producer", "trtc export", "its 'producer' is a string, not an object"),
    ("builder", 3, "its 'builder' is a number, not an object"),
    ("parent", "m.pt", "its 'parent' is a string, not an object"),
    ("artifact", [], "its 'artifact' is a list, not an object"),
    ("model", "resnet18", "its 'model' is a string, not an object"),
    ("model", None, "its 'model' is null, not an object"),
    ("preprocess", "imagenet", "its 'preprocess' is a string, not an object"),
    ("inputs", {"name": "input"}, "its 'inputs' is an object, not a list"),
    ("outputs", ["logits"], "its outputs[0] is a string, not an object"),
    ("batch", "1:8:32", "its 'batch' is a string, not an object"),
    ("kind", 1, "its 'kind' is a number, not a string"),
    ("created", 20260101, "its 'created' is a number, not a string"),
    ("labels", "cat,dog", "its 'labels' is a string, not a list of strings"),
    ("labels", ["cat", 2], "its labels[1] is a number, not a string"),
    ("labels", ["cat", None], "its labels[1] is null, not a string"),
    ("labels", {"0": "cat"}, "its 'labels' is an object, not a list of strings"),
])
def test_field_of_the_wrong_type_is_refused(tmp_path, field, value, what):
    art, data = _written(tmp_path)
    data[field] = value
    err = _refused(art, data)
    assert err.reason == f"m.onnx.json is a malformed trtc manifest: {what}"
    assert "re-create it with the trtc export command that made m.onnx" in err.fix


@pytest.mark.parametrize("change,what", [
    (lambda d: d["batch"].update(min="1"), "its batch.min is a string, not an integer"),
    (lambda d: d["batch"].update(max=True), "its batch.max is a boolean, not an integer"),
    (lambda d: d["batch"].pop("opt"), "its batch has no 'opt'"),
    (lambda d: d["batch"].update(step=2), "its batch has an unknown field 'step'"),
    (lambda d: d["inputs"][0].pop("name"), "its inputs[0] has no 'name'"),
    (lambda d: d["inputs"][0].update(shape="batch,3,224,224"), "its inputs[0].shape is a string, not a list"),
    (lambda d: d["preprocess"].update(size="224"), "its preprocess.size is a string, not a list of integers"),
    (lambda d: d["preprocess"].update(mean=[0.5, "0.5", 0.5]), "its preprocess.mean[1] is a string, not a number"),
    (lambda d: d["preprocess"].update(color=None), "its preprocess.color is null, not a string"),
    (lambda d: d["preprocess"].update(mean=[2, 2, 2]),
     "its 'preprocess' is invalid: --mean 2,2,2 is not in [0, 1] units"),
    (lambda d: d["precision"].update(mode=16), "its precision.mode is a number, not a string"),
    (lambda d: d.update(builder={"flags": "version_compatible"}), "its builder.flags is a string, not an object"),
    (lambda d: d.update(parent={"file": 5}), "its parent.file is a number, not a string"),
    (lambda d: d.pop("kind"), "it has no 'kind'"),
    (lambda d: d.update(labels=["cat", "dog", "bird"]), "its 'labels' names 3 classes, but its output has 2"),
])
def test_nested_field_of_the_wrong_type_is_refused(tmp_path, change, what):
    art, data = _written(tmp_path)
    change(data)
    assert _refused(art, data).reason == f"m.onnx.json is a malformed trtc manifest: {what}"


def test_plan_fix_rebuilds_and_quantized_fix_names_quantize(tmp_path):
    plan, data = _written(tmp_path, "m.plan")
    data.update(precision="fp16", parent={"file": "m.fp16.onnx", "sha256": "0" * 64})
    err = _refused(plan, data)
    assert err.reason == "m.plan.json is a malformed trtc manifest: its 'precision' is a string, not an object"
    assert err.fix == "rebuild it: trtc build m.fp16.onnx -o m.plan --force (a plan is not loaded without its manifest)"
    q, data = _written(tmp_path, "m.int8.onnx")
    err = _refused(q, raw=b"[]")
    assert err.fix.startswith("re-create it with the trtc quantize command that made m.int8.onnx")
    data.update(labels="ab", producer={"tool": "trtc export"})
    assert _refused(q, data).fix.startswith("re-create it with the trtc export command that made m.int8.onnx")


def test_valid_manifest_variants_still_read(tmp_path):
    """What trtc writes, and the nulls and absences it has always accepted, read as before."""
    art, data = _written(tmp_path)
    for change in ({"labels": None}, {"precision": None}, {"precision": {}}, {"producer": None},
                   {"builder": None}, {"parent": None}, {"created": None}, {"labels": []}):
        manifest_path(art).write_text(json.dumps({**data, **change}))
        m = read_manifest(art)
        assert m.labels == change.get("labels", ["cat", "dog"]) and m.batch == BatchProfile(1, 8, 32)
        assert m.precision == {"mode": "fp32"} and m.created == change.get("created", data["created"])
    trimmed = {k: v for k, v in data.items() if k not in ("labels", "precision", "producer", "builder", "parent",
                                                          "created")}
    manifest_path(art).write_text(json.dumps(trimmed))
    m = read_manifest(art)
    assert m.labels is None and m.precision == {"mode": "fp32"} and m.producer == {} and m.created == ""
    plan = {**data, "kind": "plan", "builder": {"flavor": "tensorrt", "gpu": None, "flags": {},
                                                "compute_capabilities": ["9.0"]}}
    manifest_path(art).write_text(json.dumps(plan))
    assert read_manifest(art).builder["compute_capabilities"] == ["9.0"]
