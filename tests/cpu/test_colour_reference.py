"""Colour against references that do not come from trtc (issue 32).

1. Clips whose RGB is known by construction: a frame of colour bars (75% and 100%), per-channel and grey ramps and
   128 random colours, every 2x2 block flat (so 4:2:0 chroma subsampling loses nothing), is converted to Y'CbCr
   here with the textbook equations of ITU-R BT.601 / BT.709 / BT.2020 (the Kr/Kb constants typed below from the
   standards, not imported from trtc), quantised to 8 or 10 bits in limited or full range, and encoded losslessly
   by FFmpeg's libx264 (PyAV's wheels bundle it; ``-qp 0``) with the matrix and range written into the stream's VUI.
   trtc's CPU path then reads the file as ``trtc run`` does (PyAVSource: tags read from the stream, planes by
   ``host_planes``) and preprocesses it with ``preprocess_yuv`` at an identity geometry (mean 0, std 1, no resize):
   every output pixel must be the known RGB within the quantisation error of the Y'CbCr step.
2. bikes.mp4: trtc's model input against ``preprocess_rgb`` of PyAV's own ``to_ndarray("rgb24")`` (FFmpeg's
   swscale converts: an independent implementation), mean |difference| < 0.02.

Tolerances (in 8-bit levels of RGB, i.e. x255 of the [0, 1] output): quantising Y', Cb, Cr to integers moves each by
at most half a step; through the inverse matrix that is at most about 1.6 levels on one channel at 8 bits and 0.4 at
10 bits (worst case |dR| <= 0.5 (Y gain + |R/Cr gain|), similar for G and B). Measured with correct code: max 1.53
levels (8-bit), 0.39 (10-bit limited); full-range 10-bit has its own bound (see FULL_10BIT). The planted defects of tests/mutation/run.py give 2.3 to 100+ levels.
"""

from __future__ import annotations

import importlib.util

from fractions import Fraction

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("av") is None, reason="needs PyAV (the video-cpu extra)")

# (Kr, Kb) from the standards: ITU-R BT.601-7 section 2.5.1, BT.709-6 item 3.2, BT.2020-2 table 4 (non-constant
# luminance). Typed here on purpose: the reference must not read trtc's table.
KR_KB = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722), "bt2020": (0.2627, 0.0593)}
# AVColorSpace values written into the stream (libavutil/pixfmt.h): what an encoder tags
AV_COLORSPACE = {"bt601": 6, "bt601-470bg": 5, "bt709": 1, "bt2020": 9}
AV_RANGE = {"limited": 1, "full": 2}

# max |error| allowed per pixel and channel, in 8-bit RGB levels (see the module docstring)
MAX_LEVELS = {8: 1.75, 10: 0.5}
# and on average over the frame: quantisation errors scatter around 0, a wrong coefficient or plane does not
MEAN_LEVELS = {8: 0.4, 10: 0.12}
# Full-range 10-bit: trtc reads high-bit-depth samples MSB-aligned, value / 256 on an 8-bit scale (NVDEC's P016
# convention), so full range's 1023 becomes 255.75 and chroma's gain is 1024/1023 of the standard's: a gain error
# of 0.1%, up to one level. Measured: max 0.99, mean 0.245. Its own bound says so instead of widening the others.
FULL_10BIT = (1.25, 0.3)


def colour_frame() -> np.ndarray:
    """RGB uint8 (96, 256, 3), every 2x2 block one colour: bars, ramps and random colours."""
    img = np.zeros((96, 256, 3), np.uint8)
    bars = [(1, 1, 1), (1, 1, 0), (0, 1, 1), (0, 1, 0), (1, 0, 1), (1, 0, 0), (0, 0, 1), (0, 0, 0)]
    for i, (r, g, b) in enumerate(bars):
        img[0:16, 32 * i:32 * (i + 1)] = np.array([r, g, b]) * 191  # 75% bars
        img[16:32, 32 * i:32 * (i + 1)] = np.array([r, g, b]) * 255  # 100% bars
    ramp = np.repeat(np.arange(0, 256, 2, dtype=np.uint8), 2)  # 0, 0, 2, 2, ... 254, 254
    for c in range(3):
        img[32 + 8 * c:40 + 8 * c, :, c] = ramp
    img[56:64] = ramp[:, None]
    rng = np.random.default_rng(32)
    cols = rng.integers(0, 256, (4, 32, 3), dtype=np.uint8)
    img[64:96] = np.repeat(np.repeat(cols, 8, axis=0), 8, axis=1)
    return img


def rgb_to_ycbcr(rgb: np.ndarray, matrix: str, rng: str, bits: int, subsample: bool):
    """Textbook forward conversion, quantised: (Y, Cb, Cr) integer planes, chroma 2x2-subsampled when asked."""
    kr, kb = KR_KB[matrix.split("-")[0]]
    e = rgb.astype(np.float64) / 255.0
    y = kr * e[..., 0] + (1 - kr - kb) * e[..., 1] + kb * e[..., 2]
    cb = (e[..., 2] - y) / (2 * (1 - kb))
    cr = (e[..., 0] - y) / (2 * (1 - kr))
    m = 1 << (bits - 8)  # 4 at 10 bits
    top = (1 << bits) - 1
    if rng == "limited":  # BT.601/709/2020: Y = (219 E'Y + 16) 2^(n-8), C = (224 E'C + 128) 2^(n-8)
        yq, cbq, crq = (219 * y + 16) * m, (224 * cb + 128) * m, (224 * cr + 128) * m
    else:  # full range (H.273 / BT.2100): Y = (2^n - 1) E'Y, C = (2^n - 1) E'C + 2^(n-1)
        yq, cbq, crq = top * y, top * cb + (1 << (bits - 1)), top * cr + (1 << (bits - 1))
    dtype = np.uint8 if bits == 8 else np.uint16
    q = [np.clip(np.round(a), 0, top).astype(dtype) for a in (yq, cbq, crq)]
    if subsample:  # every 2x2 block is flat: taking its top-left sample loses nothing
        q[1], q[2] = q[1][::2, ::2], q[2][::2, ::2]
    return q


def encode_lossless(path, planes, pix_fmt: str, colorspace: int, color_range: int, frames: int = 2,
                    codec: str = "libx264") -> None:
    """Write the planes as a lossless H.264 (libx264 -qp 0) or HEVC (libx265 lossless=1, which NVDEC decodes)
    stream whose VUI carries the matrix and range."""
    import av

    h, w = planes[0].shape
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=25)
        s.width, s.height, s.pix_fmt = w, h, pix_fmt
        s.codec_context.colorspace = colorspace
        s.codec_context.color_range = color_range
        s.options = {"qp": "0"} if codec == "libx264" else {"x265-params": "lossless=1:log-level=error"}
        for i in range(frames):
            f = av.VideoFrame(w, h, pix_fmt)
            for plane, a in zip(f.planes, planes):
                buf = np.zeros((plane.height, plane.line_size // a.dtype.itemsize), a.dtype)
                buf[:, :a.shape[1]] = a
                plane.update(buf.tobytes())
            f.pts, f.time_base = i, Fraction(1, 25)  # PyAV 19 refuses to mux frames with a pts but no time base
            for pkt in s.encode(f):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)


def trtc_cpu_inputs(path, spec):
    """What trtc's CPU pipeline feeds the model for each frame of ``path``: PyAVSource (as ``trtc run`` opens
    files) -> host planes -> preprocess_yuv with the colour space the source read from the stream."""
    from engines.preprocess import preprocess_yuv
    from engines.video.sources import PyAVSource

    src = PyAVSource(str(path))
    out = []
    for _i, _pts, _t, planes, _received in src.frames():
        out.append(preprocess_yuv(planes, spec, src.info.colorspace, np.float32))
    return out, src.info.colorspace


CASES = [  # (matrix tag, range, bits, pix_fmt)
    ("bt601", "limited", 8, "yuv420p"),
    ("bt601-470bg", "full", 8, "yuv420p"),
    ("bt709", "limited", 8, "yuv420p"),
    ("bt709", "full", 8, "yuv444p"),
    ("bt709", "limited", 10, "yuv420p10le"),
    ("bt709", "full", 10, "yuv420p10le"),
    ("bt2020", "limited", 10, "yuv420p10le"),
    ("bt2020", "full", 8, "yuv420p"),
    ("bt601", "limited", 10, "yuv444p10le"),
]


@pytest.mark.parametrize("matrix,rng,bits,pix", CASES, ids=[f"{m}-{r}-{b}bit-{p}" for m, r, b, p in CASES])
def test_lossless_colour_clip_gives_the_rgb_it_was_made_from(tmp_path, matrix, rng, bits, pix):
    from engines.preprocess import PreprocessSpec

    rgb = colour_frame()
    planes = rgb_to_ycbcr(rgb, matrix, rng, bits, subsample="420" in pix)
    path = tmp_path / f"{matrix}-{rng}-{bits}.mp4"
    encode_lossless(path, planes, pix, AV_COLORSPACE[matrix], AV_RANGE[rng])

    identity = PreprocessSpec(size=rgb.shape[:2], resize=None, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    xs, cs = trtc_cpu_inputs(path, identity)
    assert len(xs) == 2
    assert (cs.matrix, cs.range) == (matrix.split("-")[0], rng), f"trtc read the tags as {cs}"
    want = rgb.astype(np.float64)
    for x in xs:
        got = x.transpose(1, 2, 0).astype(np.float64) * 255.0
        err = np.abs(got - want)
        worst = np.unravel_index(err.argmax(), err.shape)
        msg = (f"{matrix} {rng} {bits}-bit {pix}: max |trtc - known RGB| {err.max():.2f} levels at row/col/channel "
               f"{worst} (known {want[worst[:2]]}, trtc {np.round(got[worst[:2]], 2)}), mean {err.mean():.3f}")
        print(msg)
        most, mean = FULL_10BIT if (rng, bits) == ("full", 10) else (MAX_LEVELS[bits], MEAN_LEVELS[bits])
        assert err.max() <= most, msg
        assert err.mean() <= mean, msg


def test_untagged_clip_is_read_as_bt601_below_720_rows(tmp_path):
    """No matrix in the stream: SD is BT.601 limited (what encoders write when they do not say)."""
    from engines.preprocess import PreprocessSpec

    rgb = colour_frame()
    path = tmp_path / "untagged.mp4"
    encode_lossless(path, rgb_to_ycbcr(rgb, "bt601", "limited", 8, True), "yuv420p", 2, 0)
    identity = PreprocessSpec(size=rgb.shape[:2], resize=None, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    xs, cs = trtc_cpu_inputs(path, identity)
    assert (cs.matrix, cs.range) == ("bt601", "limited")
    assert np.abs(xs[0].transpose(1, 2, 0) * 255.0 - rgb).max() <= MAX_LEVELS[8]


def test_bikes_input_matches_pyav_rgb24(bikes):
    """bikes.mp4 (H.264 4:2:0, BT.601-sized, untagged): trtc's model input vs ``preprocess_rgb`` of FFmpeg's own
    RGB conversion. The two differ in chroma upsampling (nearest here, swscale interpolates) and rounding (swscale
    rounds to uint8), so not exactly: measured 0.007-0.009 mean |difference| (mean = std = 0.5 units); U and V
    swapped measures 0.027-0.127."""
    import av

    from engines.preprocess import PreprocessSpec, preprocess_rgb

    spec = PreprocessSpec(size=(224, 224), resize=256, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    ours, _ = trtc_cpu_inputs(bikes, spec)
    assert len(ours) == 250
    diffs = []
    with av.open(str(bikes)) as c:
        for i, frame in enumerate(c.decode(video=0)):
            if i % 10:
                continue
            ref = preprocess_rgb(frame.to_ndarray(format="rgb24"), spec)
            diffs.append(float(np.abs(ours[i] - ref).mean()))
    print(f"bikes.mp4: mean |trtc - preprocess_rgb(PyAV rgb24)| per frame {min(diffs):.4f}..{max(diffs):.4f}")
    assert len(diffs) == 25
    assert max(diffs) < 0.02
