"""The preprocessing contract and its numpy reference.

A classifier sees ``x = (pixel / 255 - mean) / std`` per channel, in ``color`` order, laid out NCHW, after the
frame was resized so its short side is ``resize`` pixels and centre-cropped to ``size`` (or, with
``resize=None``, stretched to ``size``). Resampling is bilinear with half-pixel centres and no antialiasing
(what ``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)`` and OpenCV's INTER_LINEAR do),
computed in one step from source pixels to the cropped output: the GPU kernels of the video runtime do exactly
this per output pixel, and this numpy code is their test oracle. Calibration, validation and the CPU runtime
all call :func:`preprocess_rgb`, so there is one definition of the maths.

A greyscale classifier (``channels=1``) sees one plane: the resampled RGB value turned grey by the ITU-R BT.601
luma weights, ``grey = 0.299 R + 0.587 G + 0.114 B`` (what Pillow's ``convert("L")`` computes, unrounded), then
normalised with its one mean and std. A greyscale picture (R = G = B) stays exactly its own values. The GPU kernel
computes the same formula in the same place (after the bilinear blend).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import UsageProblem
from .images import IMAGE_SUFFIXES, load_rgb  # noqa: F401  (the one image reader; re-exported)



# BT.601 luma weights: RGB -> the one plane of a greyscale model (Pillow's convert("L"), unrounded)
GREY_WEIGHTS = (0.299, 0.587, 0.114)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# a greyscale model's defaults: the mean of ImageNet's three values (what timm gives a one-channel model)
GREY_MEAN, GREY_STD = (0.449,), (0.226,)


@dataclass(frozen=True)
class PreprocessSpec:
    size: tuple[int, int] = (224, 224)  # model input H, W
    resize: int | None = 256  # short side before the centre crop; None stretches to `size`
    color: str = "RGB"  # channel order the model expects: RGB or BGR (a one-channel model: its grey is from RGB)
    mean: tuple | None = None  # one value per channel, in [0, 1] units, after /255; None: ImageNet's (or GREY_MEAN)
    std: tuple | None = None
    layout: str = "NCHW"
    interpolation: str = "bilinear"
    dtype: str = "float32"
    input: str | None = None  # the model input this feeds
    channels: int = 3  # 3 (colour) or 1 (greyscale: one plane, GREY_WEIGHTS of the RGB value)
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        grey = self.channels == 1
        if self.mean is None:
            object.__setattr__(self, "mean", GREY_MEAN if grey else IMAGENET_MEAN)
        if self.std is None:
            object.__setattr__(self, "std", GREY_STD if grey else IMAGENET_STD)
        object.__setattr__(self, "mean", tuple(self.mean))
        object.__setattr__(self, "std", tuple(self.std))
        check_spec(self)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["size"] = list(self.size)
        d["mean"] = list(self.mean)
        d["std"] = list(self.std)
        if not d["extra"]:
            d.pop("extra")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PreprocessSpec":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        for k in ("size", "mean", "std"):
            if k in known:
                known[k] = tuple(known[k])
        return cls(**known)


def check_spec(spec: PreprocessSpec) -> None:
    if len(spec.size) != 2 or min(spec.size) < 1:
        raise UsageProblem(f"input size must be two positive integers (H, W), got {spec.size}", "e.g. --input-size 224")
    if spec.color not in ("RGB", "BGR"):
        raise UsageProblem(f"colour order must be RGB or BGR, got {spec.color!r}", "--color RGB or --color BGR")
    if spec.channels not in (1, 3) or isinstance(spec.channels, bool):
        raise UsageProblem(f"--channels must be 1 (greyscale) or 3 (colour), got {spec.channels!r}",
                           "--channels 1 for a greyscale model, 3 for a colour one")
    for name, vals in (("mean", spec.mean), ("std", spec.std)):
        if len(vals) != spec.channels:
            if spec.channels == 1:
                raise UsageProblem(f"--{name} needs one value for a greyscale (1-channel) model, got {len(vals)}",
                                   f"e.g. --{name} {GREY_MEAN[0] if name == 'mean' else GREY_STD[0]}")
            raise UsageProblem(f"--{name} needs three values (one per channel), got {len(vals)}",
                               f"e.g. --{name} 0.485,0.456,0.406" if name == "mean" else
                               f"e.g. --{name} 0.229,0.224,0.225; a greyscale model takes one value with "
                               "--channels 1")
        if any(v > 1.0 for v in vals) or (name == "std" and any(v <= 0 for v in vals)):
            raise UsageProblem(f"--{name} {','.join(map(str, vals))} is not in [0, 1] units",
                               f"give --{name} for pixels scaled to [0, 1] (divide 0-255 values by 255)")
    if spec.resize is not None and spec.resize < min(spec.size):
        raise UsageProblem(f"--resize {spec.resize} is smaller than the crop {spec.size[0]}x{spec.size[1]}",
                           "make --resize at least the input size, or --resize 0 to stretch to the input size")
    if spec.interpolation != "bilinear":
        raise UsageProblem(f"interpolation {spec.interpolation!r} is not supported", "use bilinear")
    if spec.layout != "NCHW":
        raise UsageProblem(f"layout {spec.layout!r} is not supported", "use NCHW")


def sampling_grid(src_h: int, src_w: int, spec: PreprocessSpec):
    """Where each output row/column samples the source: (y0, y1, wy, x0, x1, wx), float32 weights.

    Output pixel (i, j) of the cropped model input maps to resized pixel (i + top, j + left), which maps to
    source coordinate ((i + top + 0.5) * sy - 0.5), clamped to the image, interpolated between two neighbours.
    """
    out_h, out_w = spec.size
    if spec.resize:
        s = spec.resize / min(src_h, src_w)
        rh, rw = max(out_h, round(src_h * s)), max(out_w, round(src_w * s))
        top, left = int(round((rh - out_h) / 2.0)), int(round((rw - out_w) / 2.0))
    else:
        rh, rw, top, left = out_h, out_w, 0, 0
    sy, sx = src_h / rh, src_w / rw

    def axis(n_out, offset, scale, n_src):
        c = (np.arange(n_out, dtype=np.float64) + offset + 0.5) * scale - 0.5
        c = np.clip(c, 0.0, n_src - 1)
        i0 = np.floor(c).astype(np.int64)
        i1 = np.minimum(i0 + 1, n_src - 1)
        return i0, i1, (c - i0).astype(np.float32)

    y0, y1, wy = axis(out_h, top, sy, src_h)
    x0, x1, wx = axis(out_w, left, sx, src_w)
    return y0, y1, wy, x0, x1, wx


def grey_of(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) RGB values -> (H, W, 1) grey by :data:`GREY_WEIGHTS`, in the array's float type."""
    r, g, b = (rgb[:, :, i:i + 1] for i in range(3))
    return r * GREY_WEIGHTS[0] + g * GREY_WEIGHTS[1] + b * GREY_WEIGHTS[2]


def preprocess_rgb(rgb: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """One RGB uint8 HxWx3 image -> the model input (C, H, W) in ``spec.dtype`` (C: ``spec.channels``)."""
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise UsageProblem(f"expected an HxWx3 RGB image, got an array of shape {rgb.shape}")
    y0, y1, wy, x0, x1, wx = sampling_grid(rgb.shape[0], rgb.shape[1], spec)
    img = rgb.astype(np.float32)
    top = img[y0][:, x0] * (1 - wx)[None, :, None] + img[y0][:, x1] * wx[None, :, None]
    bot = img[y1][:, x0] * (1 - wx)[None, :, None] + img[y1][:, x1] * wx[None, :, None]
    out = top * (1 - wy)[:, None, None] + bot * wy[:, None, None]  # (H, W, 3) in 0..255, RGB
    if spec.channels == 1:
        out = grey_of(out)
    elif spec.color == "BGR":
        out = out[:, :, ::-1]
    # mean/std are given per channel in the model's input order (after any RGB->BGR swap)
    mean = np.asarray(spec.mean, np.float32)
    std = np.asarray(spec.std, np.float32)
    out = (out / 255.0 - mean) / std
    return np.ascontiguousarray(out.transpose(2, 0, 1)).astype(spec.dtype, copy=False)


def list_images(path: str | Path) -> list[Path]:
    """Image files under a folder (recursive, sorted), or the file itself."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise UsageProblem(f"no such file or folder: {p}")
    return sorted(q for q in p.rglob("*") if q.suffix.lower() in IMAGE_SUFFIXES and q.is_file())


def batch_from_images(paths, spec: PreprocessSpec) -> np.ndarray:
    return np.stack([preprocess_rgb(load_rgb(p), spec) for p in paths])


# --------------------------------------------------------------------------------------------------------------
# Decoded video frames: YUV planes -> the model input, in one step.
#
# Decoders hand out YUV surfaces. Converting a whole 1080p frame to RGB and then resampling wastes work: only the
# 2x2 source neighbours of each output pixel matter. Both the numpy reference below and the GPU kernel therefore,
# for every output pixel, take the same four neighbours as :func:`sampling_grid`, convert each to RGB (chroma from
# the sample covering that pixel: nearest, no chroma interpolation), clamp to [0, 255], blend bilinearly and
# normalise. Converting the whole frame with :func:`yuv_to_rgb` and then calling :func:`preprocess_rgb` on the
# unrounded result computes the same numbers; tests hold the two to each other and the kernel to this code.
#
# Samples are read on an 8-bit scale: 10/12-bit video arrives most-significant-bit aligned in 16-bit words (P016,
# YUV444_16Bit), so value / 256 is its 8-bit-scale value and the limited-range offsets (16, 128) and ranges
# (219, 224) apply unchanged.

# (Kr, Kb) luma coefficients per matrix
MATRICES = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722), "bt2020": (0.2627, 0.0593)}
RANGES = ("limited", "full")


@dataclass(frozen=True)
class ColorSpace:
    matrix: str = "bt709"
    range: str = "limited"

    def __post_init__(self):
        if self.matrix not in MATRICES:
            raise UsageProblem(f"unknown colour matrix {self.matrix!r}", f"use one of {', '.join(MATRICES)}")
        if self.range not in RANGES:
            raise UsageProblem(f"unknown colour range {self.range!r}", "use limited or full")

    @classmethod
    def parse(cls, text: str | None, height: int = 1080) -> "ColorSpace":
        """``"bt709"``, ``"bt601:full"``, or None/"auto": BT.709 for HD (720 rows or more), BT.601 below,
        limited range (what encoders write when a stream does not say)."""
        if not text or text == "auto":
            return cls("bt709" if height >= 720 else "bt601", "limited")
        matrix, _, rng = text.lower().replace("-", "").replace(".", "").partition(":")
        return cls(matrix, rng or "limited")

    def __str__(self) -> str:
        return f"{self.matrix}:{self.range}"

    def coefficients(self) -> np.ndarray:
        """[y_offset, y_gain, c_offset, c_gain, r_cr, g_cb, g_cr, b_cb] such that, on an 8-bit scale,
        y' = (Y - y_offset) * y_gain, cb = (U - c_offset) * c_gain, and
        R = y' + r_cr*cr, G = y' + g_cb*cb + g_cr*cr, B = y' + b_cb*cb (all in 0..255 units)."""
        kr, kb = MATRICES[self.matrix]
        kg = 1.0 - kr - kb
        if self.range == "limited":
            y_off, y_gain, c_gain = 16.0, 255.0 / 219.0, 255.0 / 224.0
        else:
            y_off, y_gain, c_gain = 0.0, 1.0, 1.0
        return np.array([y_off, y_gain, 128.0, c_gain, 2 * (1 - kr), -2 * (1 - kb) * kb / kg,
                         -2 * (1 - kr) * kr / kg, 2 * (1 - kb)], np.float64)


@dataclass
class YuvPlanes:
    """One decoded frame on the host: Y (H, W) and U, V at full or half resolution, uint8 or uint16 (MSB-aligned)."""

    y: np.ndarray
    u: np.ndarray
    v: np.ndarray

    @property
    def height(self) -> int:
        return self.y.shape[0]

    @property
    def width(self) -> int:
        return self.y.shape[1]

    @property
    def subsampling(self) -> tuple[int, int]:
        """(vertical, horizontal) chroma shift: (1, 1) for 4:2:0, (0, 1) for 4:2:2, (0, 0) for 4:4:4."""
        return (int(self.u.shape[0] < self.height), int(self.u.shape[1] < self.width))


def planes_from_surface(surface: np.ndarray, fmt: str, height: int, width: int) -> YuvPlanes:
    """Split a decoder surface laid out as NVDEC hands it out (NV12/P016: Y rows then interleaved UV rows;
    YUV444/YUV444_16BIT: three planes; I420 from PyAV's ``to_ndarray()``: Y, then U, then V planes)."""
    fmt = fmt.upper()
    if fmt in ("NV12", "P016", "P010"):
        y = surface[:height, :width]
        uv = surface[height:height + (height + 1) // 2, :2 * ((width + 1) // 2)]
        return YuvPlanes(y, uv[:, 0::2], uv[:, 1::2])
    if fmt in ("YUV444", "YUV444_16BIT", "YUV444P"):
        return YuvPlanes(surface[:height], surface[height:2 * height], surface[2 * height:3 * height])
    if fmt in ("I420", "YUV420P"):
        ch, cw = (height + 1) // 2, (width + 1) // 2
        flat = surface.reshape(-1)
        n = height * width
        return YuvPlanes(flat[:n].reshape(height, width), flat[n:n + ch * cw].reshape(ch, cw),
                         flat[n + ch * cw:n + 2 * ch * cw].reshape(ch, cw))
    raise UsageProblem(f"unsupported surface format {fmt!r}", "NV12, P016, YUV444, YUV444_16BIT or I420")


def _to_rgb(y, u, v, coeffs: np.ndarray, wide: bool) -> np.ndarray:
    """Vectorised YUV -> RGB in 0..255, clamped; y/u/v are same-shape arrays of samples."""
    s = 1.0 / 256.0 if wide else 1.0
    y_off, y_gain, c_off, c_gain, r_cr, g_cb, g_cr, b_cb = coeffs
    yy = (y.astype(np.float64) * s - y_off) * y_gain
    cb = (u.astype(np.float64) * s - c_off) * c_gain
    cr = (v.astype(np.float64) * s - c_off) * c_gain
    rgb = np.stack([yy + r_cr * cr, yy + g_cb * cb + g_cr * cr, yy + b_cb * cb], axis=-1)
    return np.clip(rgb, 0.0, 255.0)


def yuv_to_rgb(planes: YuvPlanes, colorspace: ColorSpace) -> np.ndarray:
    """The whole frame as float64 RGB HxWx3 in 0..255 (unrounded), chroma by nearest sample."""
    sy, sx = planes.subsampling
    rows = np.arange(planes.height) >> sy
    cols = np.arange(planes.width) >> sx
    u = planes.u[rows][:, cols]
    v = planes.v[rows][:, cols]
    return _to_rgb(planes.y, u, v, colorspace.coefficients(), planes.y.dtype != np.uint8)


def preprocess_yuv(planes: YuvPlanes, spec: PreprocessSpec, colorspace: ColorSpace, dtype=None) -> np.ndarray:
    """One decoded frame -> the model input (C, H, W), C = ``spec.channels``: the numpy reference of the GPU kernel.

    Reads only the four source neighbours of each output pixel, so it is also fast enough for the CPU pipeline.
    """
    y0, y1, wy, x0, x1, wx = sampling_grid(planes.height, planes.width, spec)
    sy, sx = planes.subsampling
    coeffs = colorspace.coefficients()
    wide = planes.y.dtype != np.uint8

    def rgb_at(rows, cols):
        r, c = rows[:, None], cols[None, :]
        return _to_rgb(planes.y[r, c], planes.u[r >> sy, c >> sx], planes.v[r >> sy, c >> sx], coeffs, wide)

    return _blend(rgb_at, (y0, y1, wy, x0, x1, wx), spec, dtype)


def _blend(rgb_at, grid, spec: PreprocessSpec, dtype=None) -> np.ndarray:
    """Bilinear blend of the four neighbours ``rgb_at(rows, cols)`` gives (float64 RGB, 0..255) at the sampling
    ``grid``, then channel order, normalisation and CHW: the part the YUV and packed references share."""
    y0, y1, wy, x0, x1, wx = grid
    wx64, wy64 = wx.astype(np.float64)[None, :, None], wy.astype(np.float64)[:, None, None]
    top = rgb_at(y0, x0) * (1 - wx64) + rgb_at(y0, x1) * wx64
    bot = rgb_at(y1, x0) * (1 - wx64) + rgb_at(y1, x1) * wx64
    out = top * (1 - wy64) + bot * wy64
    if spec.channels == 1:
        out = grey_of(out)
    elif spec.color == "BGR":
        out = out[:, :, ::-1]
    mean = np.asarray(spec.mean, np.float64)
    std = np.asarray(spec.std, np.float64)
    out = (out / 255.0 - mean) / std
    return np.ascontiguousarray(out.transpose(2, 0, 1)).astype(dtype or spec.dtype, copy=False)


# Packed (interleaved) 8-bit pixels, as cameras, OpenCV and PyAV hand them out: where R, G and B sit in a pixel,
# and how many bytes a pixel takes. Rows may be pitched (a row stride larger than width x pixel bytes).
PACKED = {"RGB": (0, 1, 2, 3), "BGR": (2, 1, 0, 3), "RGBA": (0, 1, 2, 4), "BGRA": (2, 1, 0, 4)}


def preprocess_packed(frame: np.ndarray, fmt: str, spec: PreprocessSpec, dtype=None) -> np.ndarray:
    """One packed uint8 frame (H, W, 3 or 4) in ``fmt`` (RGB, BGR, RGBA, BGRA; any strides) -> the model input
    (C, H, W): the numpy reference of the GPU kernel's packed variant, and the CPU path's preprocessing of pushed
    frames. Same maths as :func:`preprocess_yuv` after its colour conversion."""
    r_at, g_at, b_at, step = PACKED[fmt.upper()]
    if frame.ndim != 3 or frame.shape[2] != step or frame.dtype != np.uint8:
        raise UsageProblem(f"a {fmt} frame is an (H, W, {step}) uint8 array, got {frame.dtype} {frame.shape}")
    grid = sampling_grid(frame.shape[0], frame.shape[1], spec)

    def rgb_at(rows, cols):
        px = frame[rows[:, None], cols[None, :]]
        return px[:, :, [r_at, g_at, b_at]].astype(np.float64)

    return _blend(rgb_at, grid, spec, dtype)


# --------------------------------------------------------------------------------------------------------------
# The same maths on the GPU: one CuPy kernel launch writes up to MAX_FRAMES_PER_LAUNCH frames of one source into
# consecutive slots of the engine's input batch (blockIdx.y = frame). The frames' surfaces are passed as raw
# device pointers in kernel parameters: nothing is uploaded per launch.

MAX_FRAMES_PER_LAUNCH = 16

_HEADER = r"""
#include <cuda_fp16.h>
"""

# the RGB value of source pixel (r, c), 0..255: from YUV samples (NV12, P016, YUV444) ...
_FETCH_YUV = r"""
__device__ __forceinline__ float3 trtc_rgb(const SRC_T* __restrict__ src, int r, int c, int pitch,
        long long u_off, long long v_off, int c_pitch, int c_step, int sy, int sx, const float* __restrict__ k) {
    const float s = SCALE;
    long long ci = (long long)(r >> sy) * c_pitch + (long long)(c >> sx) * c_step;
    float y = ((float)src[(long long)r * pitch + c] * s - k[0]) * k[1];
    float cb = ((float)src[u_off + ci] * s - k[2]) * k[3];
    float cr = ((float)src[v_off + ci] * s - k[2]) * k[3];
    float3 o;
    o.x = fminf(fmaxf(y + k[4] * cr, 0.f), 255.f);
    o.y = fminf(fmaxf(y + k[5] * cb + k[6] * cr, 0.f), 255.f);
    o.z = fminf(fmaxf(y + k[7] * cb, 0.f), 255.f);
    return o;
}
"""

# ... or from packed 8-bit pixels (RGB, BGR, RGBA, BGRA): u_off and v_off are the byte offsets of R and B in a
# pixel, c_step the bytes per pixel, pitch the bytes per row
_FETCH_PACKED = r"""
__device__ __forceinline__ float3 trtc_rgb(const SRC_T* __restrict__ src, int r, int c, int pitch,
        long long u_off, long long v_off, int c_pitch, int c_step, int sy, int sx, const float* __restrict__ k) {
    const SRC_T* p = src + (long long)r * pitch + (long long)c * c_step;
    float3 o;
    o.x = (float)p[u_off];
    o.y = (float)p[1];
    o.z = (float)p[v_off];
    return o;
}
"""

# shown pixel (r, c) of a turned frame (transpose: the shown rows are stored columns; the flips are folded into the
# sampling grid on the host) -> its RGB value
_FETCH_TURNED = r"""
__device__ __forceinline__ float3 trtc_at(const SRC_T* __restrict__ src, int r, int c, int transpose, int pitch,
        long long u_off, long long v_off, int c_pitch, int c_step, int sy, int sx, const float* __restrict__ k) {
    return transpose ? trtc_rgb(src, c, r, pitch, u_off, v_off, c_pitch, c_step, sy, sx, k)
                     : trtc_rgb(src, r, c, pitch, u_off, v_off, c_pitch, c_step, sy, sx, k);
}
"""

_KERNEL = r"""
extern "C" __global__ void trtc_preprocess_NAME(SRC_PARAMS,
        const int pitch, const long long u_off, const long long v_off,
        const int c_pitch, const int c_step, const int sy, const int sx,
        const int* __restrict__ y0, const int* __restrict__ y1, const float* __restrict__ wy,
        const int* __restrict__ x0, const int* __restrict__ x1, const float* __restrict__ wx,
        const float* __restrict__ k, OUT_T* __restrict__ out_base, const int out_h, const int out_w, const int bgr,
        const int nhwc, const int grey, const int transpose) {
    unsigned long long sp = 0;
    switch (blockIdx.y) { SRC_CASES }
    const SRC_T* __restrict__ src = (const SRC_T*)sp;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int n = out_h * out_w;
    if (idx >= n) return;
    OUT_T* __restrict__ out = out_base + (long long)blockIdx.y * (grey ? 1 : 3) * n;
    int i = idx / out_w, j = idx - i * out_w;
    int ya = y0[i], yb = y1[i], xa = x0[j], xb = x1[j];
    float fy = wy[i], fx = wx[j];
    float3 a = trtc_at(src, ya, xa, transpose, pitch, u_off, v_off, c_pitch, c_step, sy, sx, k);
    float3 b = trtc_at(src, ya, xb, transpose, pitch, u_off, v_off, c_pitch, c_step, sy, sx, k);
    float3 c = trtc_at(src, yb, xa, transpose, pitch, u_off, v_off, c_pitch, c_step, sy, sx, k);
    float3 d = trtc_at(src, yb, xb, transpose, pitch, u_off, v_off, c_pitch, c_step, sy, sx, k);
    float r = (a.x * (1.f - fx) + b.x * fx) * (1.f - fy) + (c.x * (1.f - fx) + d.x * fx) * fy;
    float g = (a.y * (1.f - fx) + b.y * fx) * (1.f - fy) + (c.y * (1.f - fx) + d.y * fx) * fy;
    float bl = (a.z * (1.f - fx) + b.z * fx) * (1.f - fy) + (c.z * (1.f - fx) + d.z * fx) * fy;
    if (grey) {  // one plane: BT.601 luma of the blended RGB (GREY_WEIGHTS); (H, W, 1) and (1, H, W) are one order
        out[idx] = STORE((GREY_R * r + GREY_G * g + GREY_B * bl) * k[8] + k[11]);
        return;
    }
    if (bgr) { float t = r; r = bl; bl = t; }
    if (nhwc) {  // a (H, W, 3) slot: channels_last memory of the (3, H, W) values
        OUT_T* __restrict__ o = out + 3LL * idx;
        o[0] = STORE(r * k[8] + k[11]);
        o[1] = STORE(g * k[9] + k[12]);
        o[2] = STORE(bl * k[10] + k[13]);
    } else {
        out[idx] = STORE(r * k[8] + k[11]);
        out[n + idx] = STORE(g * k[9] + k[12]);
        out[2 * n + idx] = STORE(bl * k[10] + k[13]);
    }
}
"""


def kernel_source(name: str, wide: bool, half: bool, packed: bool = False) -> str:
    """The CUDA source of one kernel variant (8- or 16-bit YUV samples, or packed 8-bit RGB pixels, in; float32 or
    float16 out)."""
    params = ", ".join(f"const unsigned long long s{i}" for i in range(MAX_FRAMES_PER_LAUNCH))
    cases = " ".join(f"case {i}: sp = s{i}; break;" for i in range(MAX_FRAMES_PER_LAUNCH))
    body = _HEADER + (_FETCH_PACKED if packed else _FETCH_YUV) + _FETCH_TURNED + _KERNEL
    grey = {f"GREY_{ch}": f"{w!r}f" for ch, w in zip("RGB", GREY_WEIGHTS)}
    for key, value in grey.items():
        body = body.replace(key, value)
    return (body.replace("SRC_PARAMS", params).replace("SRC_CASES", cases)
            .replace("SRC_T", "unsigned short" if wide else "unsigned char")
            .replace("SCALE", "0.00390625f" if wide else "1.0f")
            .replace("OUT_T", "__half" if half else "float")
            .replace("STORE", "__float2half_rn" if half else "")
            .replace("NAME", name))


# where U and V live in each surface layout: (u_offset, v_offset, chroma pitch, chroma step, sy, sx) in samples
_LAYOUTS = {
    "NV12": lambda h, w: (h * w, h * w + 1, w, 2, 1, 1),
    "P016": lambda h, w: (h * w, h * w + 1, w, 2, 1, 1),
    "YUV444": lambda h, w: (h * w, 2 * h * w, w, 1, 0, 0),
    "YUV444_16BIT": lambda h, w: (h * w, 2 * h * w, w, 1, 0, 0),
}
_LAYOUTS["P010"] = _LAYOUTS["P016"]


def _packed_layout(r: int, b: int, step: int):
    """Packed pixels: u_off and v_off carry the byte offsets of R and B in a pixel, c_step the bytes per pixel."""
    return lambda h, pitch: (r, b, pitch, step, 0, 0)


_LAYOUTS.update({fmt: _packed_layout(r, b, step) for fmt, (r, _g, b, step) in PACKED.items()})
_WIDE = ("P016", "P010", "YUV444_16BIT")
_KERNELS: dict = {}  # variant name -> compiled RawKernel


def kernel_grid(height: int, width: int, spec: PreprocessSpec, turn=None) -> tuple:
    """The kernel's sampling grid (y0, y1 int32, wy float32, x0, x1 int32, wx float32) for a stored frame of
    ``height`` x ``width`` shown turned by ``turn`` (an :class:`~engines.video.orientation.Orientation`, or None):
    computed on the shown size, its flips folded into the indices (a flipped axis reads index n - 1 - i), so that the
    kernel only swaps rows and columns for a transpose."""
    transpose, flip_rows, flip_cols = _turn_steps(turn)
    shown_h, shown_w = (width, height) if transpose else (height, width)
    y0, y1, wy, x0, x1, wx = sampling_grid(shown_h, shown_w, spec)
    if flip_rows:
        y0, y1 = shown_h - 1 - y0, shown_h - 1 - y1
    if flip_cols:
        x0, x1 = shown_w - 1 - x0, shown_w - 1 - x1
    return (y0.astype(np.int32), y1.astype(np.int32), wy.astype(np.float32), x0.astype(np.int32),
            x1.astype(np.int32), wx.astype(np.float32))


def kernel_coefficients(spec: PreprocessSpec, colorspace: ColorSpace) -> np.ndarray:
    """The kernel's 14 float32 constants: the colour conversion's 8 (:meth:`ColorSpace.coefficients`), then
    1 / (255 std) and -mean / std per output channel (a greyscale model's one value first)."""
    std = np.resize(np.asarray(spec.std, np.float64), 3)
    mean = np.resize(np.asarray(spec.mean, np.float64), 3)
    return np.concatenate([colorspace.coefficients(), 1.0 / (255.0 * std), -mean / std]).astype(np.float32)


def _turn_steps(turn) -> tuple[bool, bool, bool]:
    """(transpose, flip_rows, flip_cols) of an Orientation (engines.video.orientation), or no turn for None."""
    if turn is None:
        return (False, False, False)
    return (bool(turn.transpose), bool(turn.flip_rows), bool(turn.flip_cols))


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch needs but the surface and output pointers, for one kind of surface."""

    kernel: object
    grid_x: int
    mid: tuple
    tail: tuple
    slot_bytes: int  # bytes of one (C, H, W) output slot
    # the launch through the CUDA driver with the arguments packed once (engines/_launch.py); None where that is not
    # available, and every launch goes through CuPy
    driver: object = None


class GpuPreprocessor:
    """Decoded surfaces -> model input slots, on the GPU.

    ``plan(fmt, shape, dtype, height, width, colorspace, out_dtype)`` prepares a kind of surface once;
    ``launch(plan, surface_ptrs, out_ptr, stream)`` enqueues ONE kernel on ``stream`` that writes
    ``len(surface_ptrs)`` (at most :data:`MAX_FRAMES_PER_LAUNCH`) consecutive (C, H, W) slots (C: ``spec.channels``)
    starting at device address ``out_ptr``; with ``layout="NHWC"`` each slot is (H, W, C), channels_last memory of
    the same values (for
    an engine that reads that layout best, ``engine.preferred_layout``). ``pre(surface, fmt, height, width,
    colorspace, out, stream)`` does the same for one CuPy surface and one CuPy slot. Nothing is synchronised per
    launch and nothing crosses to the host: the sampling grid and coefficients are uploaded once per source size and
    colour space, and that upload is finished (its stream synchronised) before any decoder thread's stream can read
    it.
    """

    def __init__(self, spec: PreprocessSpec, layout: str = "NCHW"):
        from ._deps import require

        if layout not in ("NCHW", "NHWC"):
            raise UsageProblem(f"the GPU preprocessor writes NCHW or NHWC slots, not {layout!r}",
                               'give layout="NCHW" or layout="NHWC"')
        self.cp = require("cupy", "GPU preprocessing")
        self.spec, self.layout = spec, layout
        self._grids: dict = {}
        self._coeffs: dict = {}
        self._plans: dict = {}
        self._lock = threading.Lock()
        self._zeros = (np.uint64(0),) * MAX_FRAMES_PER_LAUNCH

    def _cached(self, cache: dict, key, make):
        value = cache.get(key)
        if value is None:
            with self._lock:  # decoder threads share one preprocessor; build each entry once
                value = cache.get(key)
                if value is None:
                    value = cache[key] = make()
        return value

    def _upload(self, *arrays):
        """Host arrays -> device arrays, complete before returning: the first decoder thread's stream uploads,
        every other stream reads them later without an event, so the copy must be finished here."""
        cp = self.cp
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            out = tuple(cp.asarray(a) for a in arrays)
        stream.synchronize()
        return out

    def _kernel(self, src_dtype, out_dtype, packed: bool = False):
        wide = np.dtype(src_dtype).itemsize == 2
        half = np.dtype(out_dtype) == np.float16
        name = ("rgb8" if packed else "u16" if wide else "u8") + ("_f16" if half else "_f32")

        def make():
            kernel = self.cp.RawKernel(kernel_source(name, wide, half, packed), f"trtc_preprocess_{name}")
            kernel.compile()
            return kernel

        return self._cached(_KERNELS, name, make)  # compiled once per process, shared by every preprocessor

    def _grid(self, height: int, width: int, turn=None):
        def make():
            return self._upload(*kernel_grid(height, width, self.spec, turn))

        return self._cached(self._grids, (height, width, *_turn_steps(turn)), make)

    def _coefficients(self, colorspace: ColorSpace):
        def make():
            return self._upload(kernel_coefficients(self.spec, colorspace))[0]

        return self._cached(self._coeffs, colorspace, make)

    def plan(self, fmt: str, shape: tuple, src_dtype, height: int, width: int, colorspace: ColorSpace,
             out_dtype, turn=None) -> LaunchPlan:
        """The launch plan for one kind of surface (computed once, then a dict lookup). ``turn``: how the stored
        frame is turned to be shown (an :class:`~engines.video.orientation.Orientation`; None: as stored): the
        kernel reads the stored surface through it, in the same pass."""
        fmt = fmt.upper()
        if fmt in _WIDE and np.dtype(src_dtype).itemsize == 1 and len(shape) == 2:
            # some decoder versions export 16-bit surfaces as bytes: the same memory read as 16-bit samples
            shape, src_dtype = (shape[0], shape[1] // 2), np.uint16
        key = (fmt, tuple(shape), np.dtype(src_dtype).char, height, width, colorspace, np.dtype(out_dtype).char,
               _turn_steps(turn))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make_plan(fmt, tuple(shape), src_dtype, height, width, colorspace,
                                                      out_dtype, turn)
        return plan

    def _make_plan(self, fmt, shape, src_dtype, height, width, colorspace, out_dtype, turn=None) -> LaunchPlan:
        if fmt not in _LAYOUTS:
            raise UsageProblem(f"the GPU preprocessor does not read {fmt} surfaces",
                               "NV12, P016, YUV444, RGB, BGR, RGBA or BGRA")
        if len(shape) != 2:
            raise UsageProblem(f"expected a 2-D surface (rows, pitch), got shape {shape}")
        # samples per row: NVDEC surfaces are tightly packed (width rounded up to even); a pushed frame gives its
        # row stride (packed pixels: bytes per row)
        pitch = shape[1]
        u_off, v_off, c_pitch, c_step, sy, sx = _LAYOUTS[fmt](height, pitch)
        out_h, out_w = self.spec.size
        n = out_h * out_w
        kernel = self._kernel(src_dtype, out_dtype, packed=fmt in PACKED)
        y0, y1, wy, x0, x1, wx = self._grid(height, width, turn)
        mid = (np.int32(pitch), np.int64(u_off), np.int64(v_off), np.int32(c_pitch), np.int32(c_step),
               np.int32(sy), np.int32(sx), y0, y1, wy, x0, x1, wx, self._coefficients(colorspace))
        channels = self.spec.channels
        tail = (np.int32(out_h), np.int32(out_w), np.int32(self.spec.color == "BGR"), np.int32(self.layout == "NHWC"),
                np.int32(channels == 1), np.int32(_turn_steps(turn)[0]))
        grid_x = (n + 255) // 256
        from ._launch import driver_launch

        fast = driver_launch(kernel, grid_x, 256, MAX_FRAMES_PER_LAUNCH, mid, tail)
        return LaunchPlan(kernel, grid_x, mid, tail, channels * n * np.dtype(out_dtype).itemsize, fast)

    def launch(self, plan: LaunchPlan, surface_ptrs, out_ptr: int, stream) -> None:
        """Enqueue one kernel on ``stream`` writing ``len(surface_ptrs)`` consecutive slots from ``out_ptr``."""
        m = len(surface_ptrs)
        if not 0 < m <= MAX_FRAMES_PER_LAUNCH:
            raise UsageProblem(f"one launch writes 1 to {MAX_FRAMES_PER_LAUNCH} frames, not {m}")
        fast = plan.driver  # the driver API launch (engines/_launch.py); CuPy's below when it declines
        if fast is not None:
            ptr = getattr(stream, "ptr", None)
            if ptr is not None and fast(surface_ptrs, out_ptr, ptr):
                return
        srcs = tuple(np.uint64(p) for p in surface_ptrs) + self._zeros[m:]
        plan.kernel((plan.grid_x, m), (256,), (*srcs, *plan.mid, np.uint64(out_ptr), *plan.tail), stream=stream)

    def __call__(self, surface, fmt: str, height: int, width: int, colorspace: ColorSpace, out, stream=None,
                 turn=None):
        """Enqueue one frame -> one (C, H, W) slot ((H, W, C) with layout NHWC; C: ``spec.channels``) on ``stream``
        (default: the current stream), the stored frame turned by ``turn`` (see :meth:`plan`)."""
        if surface.ndim != 2 or not surface.flags.c_contiguous:
            raise UsageProblem(f"expected a packed 2-D surface, got shape {surface.shape}")
        h, w = self.spec.size
        c = self.spec.channels
        want = (h, w, c) if self.layout == "NHWC" else (c, h, w)
        if out.shape != want or not out.flags.c_contiguous:
            raise UsageProblem(f"output slot must be a contiguous {want} array, got {out.shape}")
        plan = self.plan(fmt, surface.shape, surface.dtype, height, width, colorspace, out.dtype, turn)
        self.launch(plan, [surface.data.ptr], out.data.ptr,
                    stream if stream is not None else self.cp.cuda.get_current_stream())
