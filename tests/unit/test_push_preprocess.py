"""Preprocessing of pushed frames (packed RGB/BGR/RGBA/BGRA, pitched NV12), checked on the CPU:

- the numpy reference for packed pixels (:func:`engines.preprocess.preprocess_packed`) against an independent
  implementation: torch's bilinear interpolate, then a crop, on real photos (as tests/unit/test_preprocess.py does
  for :func:`preprocess_rgb`), atol 2e-5 in model-input units;
- the GPU kernel's own CUDA source (``kernel_source``, the float32 variants), compiled here by g++ with a few
  macros standing in for CUDA's and run over its whole grid, against the numpy references: packed RGB and BGRA
  with a pitched row stride, and NV12 with a pitched row stride, several frames in one launch. This checks the
  kernel's index arithmetic (pitch, pixel step, channel offsets, chroma offsets) without a GPU; the GPU tests run
  the same source on the device.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from engines.errors import UsageProblem
from engines.preprocess import (MAX_FRAMES_PER_LAUNCH, PACKED, ColorSpace, PreprocessSpec, _LAYOUTS, kernel_grid,
                                kernel_source, load_rgb, planes_from_surface, preprocess_packed, preprocess_rgb, preprocess_yuv,
                                sampling_grid)
from tests.conftest import HAS_EXPORT

from tests.unit.test_preprocess import _torch_reference

SPECS = [PreprocessSpec(), PreprocessSpec(size=(192, 256), resize=None, color="BGR"),
         PreprocessSpec(size=(600, 600), resize=650)]


def _as(rgb: np.ndarray, fmt: str, pad: int = 0) -> np.ndarray:
    """``rgb`` (H, W, 3) laid out as ``fmt``, as a view into a buffer whose rows are ``pad`` bytes longer."""
    r, g, b, step = PACKED[fmt]
    h, w = rgb.shape[:2]
    buf = np.full((h, w * step + pad), 77, np.uint8)  # the pad and alpha hold junk the kernel must not read
    px = buf[:, :w * step].reshape(h, w, step)
    px[..., r], px[..., g], px[..., b] = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return px


@pytest.mark.skipif(not HAS_EXPORT, reason="needs torch for the independent reference")
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("fmt", ["RGB", "BGR", "BGRA"])
def test_packed_reference_matches_torch(photos, spec, fmt):
    for path in photos:
        rgb = load_rgb(path)
        frame = _as(rgb, fmt, pad=40)  # pitched: strides (W*step+40, step, 1)
        ours = preprocess_packed(frame, fmt, spec)
        assert ours.shape == (3, *spec.size) and ours.dtype == np.float32
        np.testing.assert_allclose(ours, _torch_reference(rgb, spec), atol=2e-5, rtol=0)
        np.testing.assert_allclose(ours, preprocess_rgb(rgb, spec), atol=2e-5, rtol=0)


def test_packed_reference_refuses_the_wrong_shape():
    with pytest.raises(UsageProblem, match=r"an \(H, W, 4\) uint8 array"):
        preprocess_packed(np.zeros((8, 8, 3), np.uint8), "BGRA", PreprocessSpec(size=(4, 4), resize=None))
    with pytest.raises(UsageProblem, match="uint8"):
        preprocess_packed(np.zeros((8, 8, 3), np.float32), "RGB", PreprocessSpec(size=(4, 4), resize=None))


# ------------------------------------------------------------------------------------ the kernel, run on the CPU
_PRELUDE = r"""
#include <math.h>
#include <stdint.h>
struct float3 { float x, y, z; };
struct uint3_ { unsigned x, y, z; };
static uint3_ blockIdx, threadIdx, blockDim;
#define __device__
#define __forceinline__ inline
#define __global__
#define __restrict__
"""

_DRIVER = r"""
extern "C" void run_grid(int gx, int m, const unsigned long long* s, int pitch, long long u_off, long long v_off,
        int c_pitch, int c_step, int sy, int sx, const int* y0, const int* y1, const float* wy, const int* x0,
        const int* x1, const float* wx, const float* k, float* out, int out_h, int out_w, int bgr, int nhwc,
        int grey, int transpose) {
    blockDim.x = 256;
    for (unsigned by = 0; by < (unsigned)m; by++) for (unsigned bx = 0; bx < (unsigned)gx; bx++)
        for (unsigned t = 0; t < 256; t++) {
            blockIdx.x = bx; blockIdx.y = by; threadIdx.x = t;
            trtc_preprocess_NAME(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12],
                s[13], s[14], s[15], pitch, u_off, v_off, c_pitch, c_step, sy, sx, y0, y1, wy, x0, x1, wx, k, out,
                out_h, out_w, bgr, nhwc, grey, transpose);
        }
}
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    """{packed: run_grid} compiled from the kernel's CUDA source (float32 output, 8-bit samples)."""
    if not shutil.which("g++"):
        pytest.skip("needs g++ to run the kernel's source on the CPU")
    assert MAX_FRAMES_PER_LAUNCH == 16  # the driver passes s[0..15]
    out = {}
    for packed in (False, True):
        name = "rgb8_f32" if packed else "u8_f32"
        src = kernel_source(name, wide=False, half=False, packed=packed).replace("#include <cuda_fp16.h>", "")
        folder = tmp_path_factory.mktemp(name)
        (folder / "k.cpp").write_text(_PRELUDE + src + _DRIVER.replace("NAME", name))
        subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(folder / "k.so"), str(folder / "k.cpp")],
                       check=True)
        out[packed] = ctypes.CDLL(str(folder / "k.so")).run_grid
    return out


def _run_kernel(fn, frames, fmt, height, width, spec, colorspace=ColorSpace(), nhwc=False, turn=None):
    """What GpuPreprocessor.launch passes, with host pointers: ``frames`` are 2-D views (rows, pitch) of uint8.
    Returns (frames, C, H, W); with ``nhwc`` the kernel writes (frames, H, W, C) slots, returned transposed.
    ``turn``: an Orientation the kernel applies (its grid from kernel_grid, as GpuPreprocessor uploads it)."""
    p = ctypes.c_void_p
    pitch = frames[0].strides[0]
    u_off, v_off, c_pitch, c_step, sy, sx = _LAYOUTS[fmt](height, pitch)
    if turn is None:
        y0, y1, wy, x0, x1, wx = sampling_grid(height, width, spec)
    else:
        y0, y1, wy, x0, x1, wx = kernel_grid(height, width, spec, turn)
    grid = [np.ascontiguousarray(a, t) for a, t in ((y0, np.int32), (y1, np.int32), (wy, np.float32),
                                                     (x0, np.int32), (x1, np.int32), (wx, np.float32))]
    std = np.resize(np.asarray(spec.std, np.float64), 3)
    mean = np.resize(np.asarray(spec.mean, np.float64), 3)
    k = np.concatenate([colorspace.coefficients(), 1.0 / (255.0 * std), -mean / std]).astype(np.float32)
    out_h, out_w = spec.size
    c = spec.channels
    out = np.full((len(frames), *((out_h, out_w, c) if nhwc else (c, out_h, out_w))), np.nan, np.float32)
    ptrs = np.zeros(16, np.uint64)
    ptrs[:len(frames)] = [f.__array_interface__["data"][0] for f in frames]
    fn(ctypes.c_int((out_h * out_w + 255) // 256), ctypes.c_int(len(frames)), p(ptrs.ctypes.data),
       ctypes.c_int(pitch), ctypes.c_longlong(u_off), ctypes.c_longlong(v_off), ctypes.c_int(c_pitch),
       ctypes.c_int(c_step), ctypes.c_int(sy), ctypes.c_int(sx), *[p(a.ctypes.data) for a in grid],
       p(k.ctypes.data), p(out.ctypes.data), ctypes.c_int(out_h), ctypes.c_int(out_w),
       ctypes.c_int(spec.color == "BGR"), ctypes.c_int(nhwc), ctypes.c_int(c == 1),
       ctypes.c_int(bool(turn is not None and turn.transpose)))
    return out.transpose(0, 3, 1, 2) if nhwc else out


@pytest.mark.parametrize("spec", SPECS[:2])
@pytest.mark.parametrize("fmt", ["RGB", "BGR", "RGBA", "BGRA"])
def test_kernel_source_reads_pitched_packed_pixels(host_kernels, photos, spec, fmt):
    images = [load_rgb(path) for path in photos[:3]]
    h, w = min(i.shape[0] for i in images), min(i.shape[1] for i in images)  # one launch: one size
    frames = [_as(np.ascontiguousarray(i[:h, :w]), fmt, pad=24) for i in images]
    flat = [np.lib.stride_tricks.as_strided(f, (h, f.strides[0]), (f.strides[0], 1)) for f in frames]
    got = _run_kernel(host_kernels[True], flat, fmt, h, w, spec)
    for g, f in zip(got, frames, strict=True):
        np.testing.assert_allclose(g, preprocess_packed(f, fmt, spec), atol=2e-5, rtol=0)


@pytest.mark.parametrize("cs", [ColorSpace("bt709", "limited"), ColorSpace("bt601", "full")])
def test_kernel_source_reads_pitched_nv12(host_kernels, cs):
    rng = np.random.default_rng(3)
    h, w, pitch = 90, 160, 192  # a row stride past the width, as CUDA's pitched allocations have
    spec = PreprocessSpec(size=(48, 64), resize=None)
    frames, refs = [], []
    for _ in range(5):
        buf = rng.integers(0, 256, (h * 3 // 2, pitch), dtype=np.uint8)
        frames.append(buf)
        refs.append(preprocess_yuv(planes_from_surface(buf[:, :w], "NV12", h, w), spec, cs))
    got = _run_kernel(host_kernels[False], frames, "NV12", h, w, spec, cs)
    for g, r in zip(got, refs, strict=True):
        np.testing.assert_allclose(g, r, atol=5e-5, rtol=0)


def _three_frames(fmt: str, spec, photos, seed: int):
    """Three frames of one size for one launch, and the numpy reference of each: (frames, refs, height, width).
    NV12: random pitched surfaces (90 x 160 in rows of 192 bytes, BT.601 limited); a packed format: the first three
    photos cut to a common size, in rows padded by 8 pixels, as flat pitched views."""
    if fmt == "NV12":
        rng = np.random.default_rng(seed)
        h, w, pitch = 90, 160, 192
        frames = [rng.integers(0, 256, (h * 3 // 2, pitch), dtype=np.uint8) for _ in range(3)]
        refs = [preprocess_yuv(planes_from_surface(f[:, :w], "NV12", h, w), spec, ColorSpace()) for f in frames]
        return frames, refs, h, w
    images = [load_rgb(path) for path in photos[:3]]
    h, w = min(i.shape[0] for i in images), min(i.shape[1] for i in images)
    packed = [_as(np.ascontiguousarray(i[:h, :w]), fmt, pad=8) for i in images]
    frames = [np.lib.stride_tricks.as_strided(f, (h, f.strides[0]), (f.strides[0], 1)) for f in packed]
    return frames, [preprocess_packed(f, fmt, spec) for f in packed], h, w


@pytest.mark.parametrize("fmt", ["NV12", "BGRA"])
def test_kernel_source_writes_channels_last_slots_with_the_same_values(host_kernels, photos, fmt):
    """layout NHWC (the compiled PyTorch engine's): each slot is (H, W, 3), every value the one the NCHW slot holds,
    bit for bit, and the reference's; slots follow each other without overlap (three frames in one launch)."""
    spec = SPECS[0]
    frames, refs, h, w = _three_frames(fmt, spec, photos, seed=5)
    kernel = host_kernels[fmt != "NV12"]
    planar = _run_kernel(kernel, frames, fmt, h, w, spec)
    channels_last = _run_kernel(kernel, frames, fmt, h, w, spec, nhwc=True)
    assert not np.isnan(channels_last).any()  # every value of every slot written
    np.testing.assert_array_equal(channels_last, planar)
    for g, r in zip(channels_last, refs, strict=True):
        np.testing.assert_allclose(g, r, atol=5e-5, rtol=0)


# ------------------------------------------------------------------- one plane (greyscale) and turned frames
GREY = PreprocessSpec(size=(48, 64), resize=None, channels=1, mean=(0.449,), std=(0.226,))


def _pil_grey(rgb: np.ndarray) -> np.ndarray:
    """An independent grey: Pillow's convert("L") (ITU-R 601-2 luma, rounded to 8 bits), as floats."""
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).convert("L"), np.float64)


def test_one_plane_reference_is_pillows_luma(photos):
    """channels=1: one plane, the BT.601 grey of the RGB value, normalised by the one mean/std. Without resampling
    (size = the photo's), it is Pillow's convert("L") within its 8-bit rounding (0.5 of 255, over std)."""
    for path in photos:
        rgb = load_rgb(path)[:64, :96]
        spec = PreprocessSpec(size=rgb.shape[:2], resize=None, channels=1, mean=(0.449,), std=(0.226,))
        got = preprocess_rgb(rgb, spec)
        assert got.shape == (1, *rgb.shape[:2]) and got.dtype == np.float32
        want = (_pil_grey(rgb) / 255.0 - 0.449) / 0.226
        np.testing.assert_allclose(got[0], want, atol=0.51 / 255 / 0.226, rtol=0)
        # the packed and YUV references write the same plane as preprocess_rgb
        np.testing.assert_allclose(preprocess_packed(_as(rgb, "BGRA"), "BGRA", spec), got, atol=2e-5, rtol=0)


def test_a_grey_picture_keeps_its_values():
    """R = G = B (an MNIST digit read as RGB): the plane is the picture itself, bit for bit after /std."""
    digit = np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)
    spec = PreprocessSpec(size=(28, 28), resize=None, channels=1, mean=(0.0,), std=(1 / 255,))
    got = preprocess_rgb(np.repeat(digit[:, :, None], 3, axis=2), spec)
    np.testing.assert_allclose(got[0], digit, atol=1e-3, rtol=0)


@pytest.mark.parametrize("fmt", ["NV12", "RGB"])
def test_kernel_source_writes_one_plane_for_a_greyscale_model(host_kernels, photos, fmt):
    """The kernel's grey (one (1, H, W) slot per frame, slots packed one after another) is the numpy reference's."""
    frames, refs, h, w = _three_frames(fmt, GREY, photos, seed=7)
    got = _run_kernel(host_kernels[fmt != "NV12"], frames, fmt, h, w, GREY)
    assert got.shape == (3, 1, 48, 64) and not np.isnan(got).any()
    for g, r in zip(got, refs, strict=True):
        np.testing.assert_allclose(g, r, atol=5e-5, rtol=0)


@pytest.mark.parametrize("degrees,mirrored", [(90, False), (180, False), (270, False), (0, True), (90, True)])
@pytest.mark.parametrize("spec", [SPECS[1], GREY])
def test_kernel_source_turns_the_frame_in_the_same_pass(host_kernels, degrees, mirrored, spec):
    """A stored NV12 frame with a turn (rotation metadata, --rotate): the kernel reads it through the turned
    sampling grid and gives what the CPU path gives on the turned planes (numpy views: Orientation.apply)."""
    from engines.video.orientation import _STEPS, Orientation

    turn = Orientation(*_STEPS[(degrees, mirrored)])
    rng = np.random.default_rng(degrees + mirrored)
    h, w, pitch = 90, 160, 192
    frames = [rng.integers(0, 256, (h * 3 // 2, pitch), dtype=np.uint8) for _ in range(2)]
    cs = ColorSpace("bt601", "limited")
    refs = [preprocess_yuv(turn.apply(planes_from_surface(f[:, :w], "NV12", h, w)), spec, cs) for f in frames]
    got = _run_kernel(host_kernels[False], frames, "NV12", h, w, spec, cs, turn=turn)
    for g, r in zip(got, refs, strict=True):
        np.testing.assert_allclose(g, r, atol=5e-5, rtol=0)


@pytest.mark.parametrize("degrees,mirrored", [(90, False), (270, False), (90, True)])
@pytest.mark.parametrize("fmt", ["RGB", "BGRA"])
def test_kernel_source_turns_packed_pixels_in_the_same_pass(host_kernels, photos, degrees, mirrored, fmt):
    """A pushed packed frame with a turn (FramePusher's rotate=): what the host path computes on the turned pixels
    (Orientation.plane's numpy view, then preprocess_packed), from pitched rows."""
    from engines.video.orientation import _STEPS, Orientation

    turn = Orientation(*_STEPS[(degrees, mirrored)])
    image = load_rgb(photos[0])[:120, :200]
    h, w = image.shape[:2]
    frame = _as(np.ascontiguousarray(image), fmt, pad=24)
    flat = np.lib.stride_tricks.as_strided(frame, (h, frame.strides[0]), (frame.strides[0], 1))
    got = _run_kernel(host_kernels[True], [flat], fmt, h, w, SPECS[1], turn=turn)
    np.testing.assert_allclose(got[0], preprocess_packed(turn.plane(frame), fmt, SPECS[1]), atol=5e-5, rtol=0)
