"""Colour on the GPU path against RGB known by construction (issue 32): the clips of tests/cpu/test_colour_reference.py
(bars, ramps and random colours converted with the standards' own Kr/Kb, every 2x2 block flat), tiled to 192x256
(NVDEC's HEVC minimum is 144 rows) and encoded losslessly as HEVC (libx265 lossless=1, which NVDEC decodes),
decoded by NVDEC and converted by the CuPy kernel at an identity geometry (mean 0, std 1, no resize). Every pixel
must be the known RGB within the quantisation error of the Y'CbCr step, the same bounds as on the CPU path. The
kernel test of test_video_gpu.py holds the kernel to the numpy code; this one holds both to something else, so a
coefficient wrong in both (the BT.709 Kb of issue 32) or a plane swapped in the kernel's layout fails here."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.cpu.test_colour_reference import (AV_COLORSPACE, AV_RANGE, FULL_10BIT, MAX_LEVELS, MEAN_LEVELS,
                                             colour_frame, encode_lossless, rgb_to_ycbcr)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("cupy", "PyNvVideoCodec", "av")),
                                 reason="needs the gpu extra (cupy, PyNvVideoCodec) and PyAV")]

CASES = [  # (matrix tag, range, bits, pix_fmt)
    ("bt601", "limited", 8, "yuv420p"),
    ("bt709", "limited", 8, "yuv420p"),
    ("bt709", "full", 8, "yuv420p"),
    ("bt709", "limited", 10, "yuv420p10le"),
    ("bt2020", "limited", 10, "yuv420p10le"),
    ("bt2020", "full", 8, "yuv420p"),
    ("bt709", "limited", 8, "yuv444p"),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("matrix,rng,bits,pix", CASES, ids=[f"{m}-{r}-{b}bit-{p}" for m, r, b, p in CASES])
def test_nvdec_and_kernel_give_the_rgb_the_clip_was_made_from(tmp_path, matrix, rng, bits, pix, dtype):
    import cupy as cp

    from engines.preprocess import GpuPreprocessor, PreprocessSpec
    from tests.gpu.test_video_gpu import _nvdec_frames

    rgb = np.tile(colour_frame(), (2, 1, 1))  # (192, 256, 3)
    path = tmp_path / f"{matrix}-{rng}-{bits}-{pix}.mkv"
    encode_lossless(path, rgb_to_ycbcr(rgb, matrix, rng, bits, subsample="420" in pix), pix,
                    AV_COLORSPACE[matrix], AV_RANGE[rng], codec="libx265")
    frames = _nvdec_frames(path, 2)
    assert frames, f"NVDEC gave no frames for {path.name}"
    identity = PreprocessSpec(size=rgb.shape[:2], resize=None, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    pre = GpuPreprocessor(identity)
    most, mean = FULL_10BIT if (rng, bits) == ("full", 10) else (MAX_LEVELS[bits], MEAN_LEVELS[bits])
    if dtype == "float16":  # FP16 output rounds [0, 1] values by up to 2^-12: 0.06 levels more
        most, mean = most + 0.07, mean + 0.03
    for fmt, surf, _host, info in frames:
        assert (info.colorspace.matrix, info.colorspace.range) == (matrix, rng), f"read as {info.colorspace}"
        out = cp.empty((3, *rgb.shape[:2]), dtype)
        pre(surf, fmt, info.height, info.width, info.colorspace, out)
        got = cp.asnumpy(out).astype(np.float64).transpose(1, 2, 0) * 255.0
        err = np.abs(got - rgb)
        msg = (f"{matrix} {rng} {bits}-bit {pix} ({fmt}) {dtype}: max |kernel - known RGB| {err.max():.2f} levels, "
               f"mean {err.mean():.3f}")
        print(msg)
        assert err.max() <= most, msg
        assert err.mean() <= mean, msg
