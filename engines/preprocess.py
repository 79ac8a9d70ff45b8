"""The preprocessing contract and its numpy reference.

A classifier sees ``x = (pixel / 255 - mean) / std`` per channel, in ``color`` order, laid out NCHW, after the
frame was resized so its short side is ``resize`` pixels and centre-cropped to ``size`` (or, with
``resize=None``, stretched to ``size``). Resampling is bilinear with half-pixel centres and no antialiasing
(what ``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)`` and OpenCV's INTER_LINEAR do),
computed in one step from source pixels to the cropped output: the GPU kernels of the video runtime do exactly
this per output pixel, and this numpy code is their test oracle. Calibration, validation and the CPU runtime
all call :func:`preprocess_rgb`, so there is one definition of the maths.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import TrtcError, UsageProblem

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


@dataclass(frozen=True)
class PreprocessSpec:
    size: tuple[int, int] = (224, 224)  # model input H, W
    resize: int | None = 256  # short side before the centre crop; None stretches to `size`
    color: str = "RGB"  # channel order the model expects: RGB or BGR
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)  # in [0, 1] units, after /255
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    layout: str = "NCHW"
    interpolation: str = "bilinear"
    dtype: str = "float32"
    input: str | None = None  # the model input this feeds
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
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
    for name, vals in (("mean", spec.mean), ("std", spec.std)):
        if len(vals) != 3:
            raise UsageProblem(f"--{name} needs three values (one per channel), got {len(vals)}",
                               f"e.g. --{name} 0.485,0.456,0.406")
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


def preprocess_rgb(rgb: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """One RGB uint8 HxWx3 image -> the model input (3, H, W) in ``spec.dtype``."""
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise UsageProblem(f"expected an HxWx3 RGB image, got an array of shape {rgb.shape}")
    y0, y1, wy, x0, x1, wx = sampling_grid(rgb.shape[0], rgb.shape[1], spec)
    img = rgb.astype(np.float32)
    top = img[y0][:, x0] * (1 - wx)[None, :, None] + img[y0][:, x1] * wx[None, :, None]
    bot = img[y1][:, x0] * (1 - wx)[None, :, None] + img[y1][:, x1] * wx[None, :, None]
    out = top * (1 - wy)[:, None, None] + bot * wy[:, None, None]  # (H, W, 3) in 0..255, RGB
    if spec.color == "BGR":
        out = out[:, :, ::-1]
    # mean/std are given per channel in the model's input order (after any RGB->BGR swap)
    mean = np.asarray(spec.mean, np.float32)
    std = np.asarray(spec.std, np.float32)
    out = (out / 255.0 - mean) / std
    return np.ascontiguousarray(out.transpose(2, 0, 1)).astype(spec.dtype, copy=False)


def load_rgb(path: str | Path) -> np.ndarray:
    """Decode an image file to RGB uint8 HxWx3 (Pillow). Raises TrtcError naming the file if it cannot."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except FileNotFoundError as exc:
        raise UsageProblem(f"image not found: {path}") from exc
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise TrtcError(f"cannot decode image {path}: {exc}", "remove or replace the file") from exc


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
