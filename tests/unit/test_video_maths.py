"""YUV -> model input maths (the numpy oracle of the GPU kernel), surface layouts, and top-k rules."""

from __future__ import annotations

import numpy as np
import pytest

from engines.errors import UsageProblem
from engines.preprocess import (ColorSpace, PreprocessSpec, YuvPlanes, planes_from_surface, preprocess_rgb,
                                preprocess_yuv, yuv_to_rgb)
from engines.topk import TopK, looks_like_probabilities, topk_host


def test_bt601_limited_matches_the_textbook_constants():
    # R = 1.164 (Y - 16) + 1.596 (V - 128); G = 1.164 (Y-16) - 0.392 (U-128) - 0.813 (V-128); B = ... + 2.017 (U-128)
    k = ColorSpace("bt601", "limited").coefficients()
    assert k[1] == pytest.approx(1.164, abs=1e-3)
    assert k[4] * k[3] == pytest.approx(1.596, abs=1e-3)
    assert k[5] * k[3] == pytest.approx(-0.392, abs=1e-3)
    assert k[6] * k[3] == pytest.approx(-0.813, abs=1e-3)
    assert k[7] * k[3] == pytest.approx(2.017, abs=1e-3)
    k709 = ColorSpace("bt709", "limited").coefficients()
    assert k709[4] * k709[3] == pytest.approx(1.793, abs=1e-3)


@pytest.mark.parametrize("cs", [ColorSpace("bt601", "limited"), ColorSpace("bt709", "full"),
                                ColorSpace("bt2020", "limited")])
def test_grey_and_extremes(cs):
    y_lo, y_hi = (16, 235) if cs.range == "limited" else (0, 255)
    for y, want in ((y_lo, 0.0), (y_hi, 255.0), ((y_lo + y_hi) // 2, None)):
        p = YuvPlanes(np.full((2, 2), y, np.uint8), np.full((1, 1), 128, np.uint8), np.full((1, 1), 128, np.uint8))
        rgb = yuv_to_rgb(p, cs)
        assert np.ptp(rgb) < 1e-9, "neutral chroma must give grey"
        if want is not None:
            assert rgb[0, 0, 0] == pytest.approx(want, abs=1e-9)


def test_colorspace_parse_and_errors():
    assert ColorSpace.parse(None, 1080) == ColorSpace("bt709", "limited")
    assert ColorSpace.parse("auto", 480) == ColorSpace("bt601", "limited")
    assert ColorSpace.parse("BT.601:full") == ColorSpace("bt601", "full")
    with pytest.raises(UsageProblem, match="unknown colour matrix"):
        ColorSpace.parse("bt999")
    with pytest.raises(UsageProblem, match="limited or full"):
        ColorSpace.parse("bt709:wide")


def _frame(h=272, w=640, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(16, 236, (h, w), dtype=np.uint8)
    u = rng.integers(16, 241, ((h + 1) // 2, (w + 1) // 2), dtype=np.uint8)
    v = rng.integers(16, 241, ((h + 1) // 2, (w + 1) // 2), dtype=np.uint8)
    return YuvPlanes(y, u, v)


@pytest.mark.parametrize("spec", [PreprocessSpec(), PreprocessSpec(size=(160, 96), resize=None, color="BGR"),
                                  PreprocessSpec(size=(224, 224), resize=300)])
def test_gather_reference_equals_convert_then_resize(spec):
    """preprocess_yuv reads only the 4 neighbours per output pixel; it must equal converting the whole frame."""
    planes = _frame()
    cs = ColorSpace("bt601", "limited")
    direct = preprocess_yuv(planes, spec, cs, np.float64)
    via_rgb = preprocess_rgb(yuv_to_rgb(planes, cs), spec)
    assert direct.shape == (3, *spec.size)
    assert np.abs(direct - via_rgb).max() < 1e-4


def test_surface_layouts_agree():
    """The same frame as NVDEC's NV12 surface, PyAV's I420 array, and 16-bit P016 gives the same planes."""
    p = _frame(6, 8)
    nv12 = np.concatenate([p.y, np.stack([p.u, p.v], axis=-1).reshape(3, 8)])
    i420 = np.concatenate([p.y.ravel(), p.u.ravel(), p.v.ravel()]).reshape(9, 8)
    a = planes_from_surface(nv12, "NV12", 6, 8)
    b = planes_from_surface(i420, "I420", 6, 8)
    for x, y in ((a.y, b.y), (a.u, b.u), (a.v, b.v), (a.u, p.u), (a.v, p.v)):
        assert np.array_equal(x, y)
    p016 = nv12.astype(np.uint16) << 8  # MSB-aligned 16-bit samples read on an 8-bit scale
    spec = PreprocessSpec(size=(4, 4), resize=None)
    cs = ColorSpace("bt709", "limited")
    wide = preprocess_yuv(planes_from_surface(p016, "P016", 6, 8), spec, cs, np.float64)
    assert np.abs(wide - preprocess_yuv(a, spec, cs, np.float64)).max() < 1e-9
    yuv444 = np.concatenate([p.y, np.repeat(np.repeat(p.u, 2, 0), 2, 1), np.repeat(np.repeat(p.v, 2, 0), 2, 1)])
    c = planes_from_surface(yuv444, "YUV444", 6, 8)
    assert c.subsampling == (0, 0) and a.subsampling == (1, 1)
    assert np.abs(preprocess_yuv(c, spec, cs, np.float64) - preprocess_yuv(a, spec, cs, np.float64)).max() < 1e-9
    with pytest.raises(UsageProblem, match="unsupported surface format"):
        planes_from_surface(nv12, "RGB", 6, 8)


def test_topk_softmax_auto_raw_and_ties():
    logits = np.array([[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 5.0, 1.0]])
    idx, sc = topk_host(logits, 2, apply_softmax=True)
    assert idx.tolist() == [[1, 2], [2, 3]]  # tie keeps the lower index first
    assert sc[0, 0] == pytest.approx(sc[0, 1]) and sc.max() < 1
    t = TopK(3, "auto")
    probs = np.array([[0.1, 0.7, 0.2]])
    i, s = t.host(probs)
    assert t.apply_softmax is False and s[0].tolist() == pytest.approx([0.7, 0.2, 0.1])
    t2 = TopK(1, "auto")
    t2.host(logits)
    assert t2.apply_softmax is True
    assert looks_like_probabilities(probs) and not looks_like_probabilities(logits)
    i, s = TopK(10, "raw").host(logits)  # k above the class count gives every class
    assert i.shape == (2, 4) and s[1, 0] == 5.0
    with pytest.raises(UsageProblem):
        TopK(0)
    with pytest.raises(UsageProblem):
        TopK(1, "logits")
