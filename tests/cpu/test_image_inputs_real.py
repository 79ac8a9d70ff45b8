"""EfficientNet-Lite0 (real ImageNet weights) on the real photos saved as phones and scanners save them: each
variant, read through the data path of validate, quantize and export's check (calibration.load_data), gets the
upright 8-bit original's top-1. The originals' top-1 comes from the photos read directly (Pillow, 8-bit RGB)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.conftest import needs_quant

pytestmark = needs_quant


def _top1(model, folder, spec):
    import onnxruntime as ort

    from toolchain.precision.calibration import load_data

    data = load_data([folder], spec, [1, 3, 224, 224], "input", want=100)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: data.x})[0]
    return {origin.split("/")[-1].split(".")[0]: int(i) for origin, i in zip(data.origins, logits.argmax(1))}


def test_rotated_and_sixteen_bit_photos_keep_top1(lite0_onnx, photos, tmp_path):
    tifffile = pytest.importorskip("tifffile")
    from engines.manifest import read_manifest

    spec = read_manifest(lite0_onnx[0]).preprocess
    originals, variants = tmp_path / "originals", tmp_path / "variants"
    originals.mkdir()
    variants.mkdir()
    for path in photos:
        name = path.name.split(".")[0]
        with Image.open(path) as im:
            up = np.asarray(im.convert("RGB"))
        grey = up[:, :, 1]
        Image.fromarray(up).save(originals / f"{name}-rgb.png")
        Image.fromarray(np.stack([grey] * 3, axis=2)).save(originals / f"{name}-grey.png")
        exif = Image.Exif()
        exif[0x0112] = 6  # a phone's portrait: stored 90 degrees counter-clockwise, shown rotated back
        Image.fromarray(np.ascontiguousarray(np.rot90(up, 1))).save(variants / f"{name}-rgb-exif6.jpg", exif=exif,
                                                                   quality=100)
        exif[0x0112] = 3
        Image.fromarray(np.ascontiguousarray(up[::-1, ::-1])).save(variants / f"{name}-rgb-exif3.png", exif=exif)
        tifffile.imwrite(variants / f"{name}-rgb-16.tif", up.astype(np.uint16) * 257, photometric="rgb")
        Image.fromarray(grey.astype(np.uint16) * 257).save(variants / f"{name}-grey-16.png")
    want = _top1(lite0_onnx[0], originals, spec)
    got = _top1(lite0_onnx[0], variants, spec)
    assert len(got) == 4 * len(photos)
    for variant, top1 in got.items():
        original = "-".join(variant.split("-")[:2])
        assert top1 == want[original], (variant, top1, want[original])
