"""`trtc run photos/`: images and folders of images are sources (CPU path), one line per image with its path as
the source, in sorted order, beside videos; a broken image is a bad source among good ones; -o and --resume work
as for videos. Scores against an independent reference: the photos' pixels (read directly by Pillow, 8-bit RGB),
the torch-checked float32 preprocessing (preprocess_rgb) and a plain ONNX Runtime session."""

from __future__ import annotations

import json
import shutil

import numpy as np
from click.testing import CliRunner
from PIL import Image

from tests.conftest import needs_quant
from toolchain.cli import cli

pytestmark = needs_quant


def _reference(model, pixels: dict) -> dict:
    import onnxruntime as ort

    from engines.manifest import read_manifest
    from engines.preprocess import preprocess_rgb

    spec = read_manifest(model).preprocess
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = np.stack([preprocess_rgb(rgb, spec) for rgb in pixels.values()])
    logits = session.run(None, {session.get_inputs()[0].name: x})[0]
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = z / z.sum(axis=1, keepdims=True)
    return {name: (int(row.argmax()), float(row.max())) for name, row in zip(pixels, p)}


def test_a_folder_of_images(lite0_onnx, photos, bikes, tmp_path, monkeypatch):
    folder = tmp_path / "photos"
    (folder / "more").mkdir(parents=True)
    pixels = {}
    for path in photos:
        with Image.open(path) as im:
            pixels[path.name] = np.asarray(im.convert("RGB"))
    shutil.copy(photos[0], folder / photos[0].name)
    shutil.copy(photos[1], folder / "more" / photos[1].name)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned counter-clockwise, shown upright
    Image.fromarray(np.ascontiguousarray(np.rot90(pixels[photos[2].name], 1))).save(folder / "phone.png", exif=exif)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a whole jpeg")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["run", "photos/", str(bikes), "--model", str(lite0_onnx[0]), "--device", "cpu",
                                 "--top-k", "1", "--stride", "125", "-o", "out.jsonl"])
    assert r.exit_code == 1, r.output  # the broken image: a bad source, the others classified
    assert "photos/broken.jpg" in r.output.split("error:")[-1]
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    images = [d for d in lines if d["source"] != str(bikes)]
    assert [d["source"] for d in images] == ["photos/astronaut.png", "photos/more/coffee.png", "photos/phone.png"]
    assert all(d["frame"] == 0 and d["pts"] is None for d in images)
    assert [d["frame"] for d in lines if d["source"] == str(bikes)] == [0, 125]
    want = _reference(lite0_onnx[0], {"photos/astronaut.png": pixels[photos[0].name],
                                      "photos/more/coffee.png": pixels[photos[1].name],
                                      "photos/phone.png": pixels[photos[2].name]})
    for d in images:
        index, score = want[d["source"]]
        assert d["top_k"][0]["index"] == index and abs(d["top_k"][0]["score"] - score) < 1e-3, (d, want)
    (folder / "broken.jpg").unlink()
    r = CliRunner().invoke(cli, ["run", "photos/", str(bikes), "--model", str(lite0_onnx[0]), "--device", "cpu",
                                 "--top-k", "1", "--stride", "125", "-o", "out.jsonl", "--resume"])
    assert r.exit_code == 0, r.output
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == len(lines)  # nothing classified twice


def test_a_folder_of_nothing_of_use(tmp_path, lite0_onnx):
    (tmp_path / "notes.txt").write_text("x")
    r = CliRunner().invoke(cli, ["run", str(tmp_path), "--model", str(lite0_onnx[0]), "--device", "cpu"])
    assert r.exit_code == 2 and "no video or image in it" in r.output
