"""The numpy reference preprocessing against an independent implementation (torch's bilinear interpolate,
then a crop) on real photos."""

import numpy as np
import pytest

from engines.errors import UsageProblem
from engines.preprocess import PreprocessSpec, load_rgb, preprocess_rgb, sampling_grid
from tests.conftest import HAS_EXPORT


def _torch_reference(rgb, spec):
    import torch
    import torch.nn.functional as F

    h, w = rgb.shape[:2]
    oh, ow = spec.size
    x = torch.from_numpy(rgb.copy()).permute(2, 0, 1)[None].double()
    if spec.resize:
        s = spec.resize / min(h, w)
        rh, rw = round(h * s), round(w * s)
        x = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False, antialias=False)
        top, left = int(round((rh - oh) / 2)), int(round((rw - ow) / 2))
        x = x[:, :, top:top + oh, left:left + ow]
    else:
        x = F.interpolate(x, size=(oh, ow), mode="bilinear", align_corners=False, antialias=False)
    x = x[0] / 255.0
    if spec.color == "BGR":
        x = x.flip(0)
    mean = torch.tensor(spec.mean, dtype=torch.float64)[:, None, None]
    std = torch.tensor(spec.std, dtype=torch.float64)[:, None, None]
    return ((x - mean) / std).numpy()


@pytest.mark.skipif(not HAS_EXPORT, reason="needs torch for the independent reference")
@pytest.mark.parametrize("spec", [
    PreprocessSpec(),
    PreprocessSpec(size=(224, 224), resize=256, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    PreprocessSpec(size=(192, 256), resize=None, color="BGR"),
    PreprocessSpec(size=(299, 299), resize=342),
    PreprocessSpec(size=(600, 600), resize=650),  # upscaling a 512-pixel photo
])
def test_matches_torch_bilinear(photos, spec):
    for path in photos:
        rgb = load_rgb(path)
        ours = preprocess_rgb(rgb, spec)
        ref = _torch_reference(rgb, spec)
        assert ours.shape == (3, *spec.size) and ours.dtype == np.float32
        np.testing.assert_allclose(ours, ref, atol=2e-5, rtol=0)


def test_grid_on_a_synthetic_ramp():
    # a horizontal ramp resampled bilinearly stays a ramp: exact values check the half-pixel convention
    w = 8
    rgb = np.repeat(np.repeat((np.arange(w, dtype=np.uint8) * 10)[None, :, None], 4, 0), 3, 2)
    spec = PreprocessSpec(size=(4, 4), resize=None, mean=(0, 0, 0), std=(1, 1, 1))
    out = preprocess_rgb(rgb, spec)[0, 0] * 255
    # output column j samples source x = (j + 0.5) * 2 - 0.5 = 0.5, 2.5, 4.5, 6.5 -> 5, 25, 45, 65
    np.testing.assert_allclose(out, [5, 25, 45, 65], atol=1e-4)
    y0, y1, wy, x0, x1, wx = sampling_grid(4, 8, spec)
    assert list(x0) == [0, 2, 4, 6] and np.allclose(wx, 0.5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mean=(123.0, 116.0, 103.0)), "not in \\[0, 1\\] units"),
    (dict(std=(0.0, 0.2, 0.2)), "not in \\[0, 1\\] units"),
    (dict(mean=(0.5, 0.5)), "three values"),
    (dict(color="YUV"), "RGB or BGR"),
    (dict(resize=100), "smaller than the crop"),
])
def test_bad_specs(kwargs, match):
    with pytest.raises(UsageProblem, match=match):
        PreprocessSpec(**kwargs)


def test_spec_roundtrip():
    spec = PreprocessSpec(size=(192, 256), resize=None, color="BGR", input="x")
    assert PreprocessSpec.from_dict(spec.to_dict()) == spec


def test_corrupt_image_named(tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    with pytest.raises(Exception, match="broken.jpg"):
        load_rgb(bad)
