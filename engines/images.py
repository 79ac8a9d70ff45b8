"""The one image reader: a file as a viewer shows it, as RGB uint8 HxWx3.

Every command that reads image files (validate --data, quantize --calib/--check, export --check-data, run on
images, the examples) calls :func:`load_rgb`, so a photo is read the same way everywhere:

- EXIF orientation (all 8 values, JPEG, PNG, TIFF, WebP) is applied, as viewers apply it, before anything else.
- Bit depth: 16-bit samples keep their most significant byte (``value >> 8``). Pillow itself decodes 16-bit RGB,
  RGBA and grey-with-alpha PNG and 16-bit RGB TIFF that way, and the video path reads 10/12/16-bit frames on the
  same scale (value / 256), so 16-bit greyscale (Pillow's ``I;16`` modes, which ``convert("RGB")`` would clip to
  white) is scaled the same way: one rule for every 16-bit input, at most 1/255 from exact rounding (value / 257).
- Channels, by Pillow's documented conversions: greyscale (``L``, ``1``) is repeated to three channels; palette
  (``P``, ``PA``) is looked up; alpha (``RGBA``, ``LA``, ``PA``) is dropped, not composited: the colour under a
  transparent pixel is kept, as torchvision's image-folder loader (``convert("RGB")``) gives it to training; CMYK,
  YCbCr, LAB and HSV go through Pillow's conversion to RGB.
- Animated images (GIF, WebP, APNG) give their first frame.
- What has no defined 8-bit reading (32-bit integer or floating-point pixels) or cannot be decoded is refused with
  a :class:`TrtcError` naming the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import TrtcError, UsageProblem

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")

# modes Pillow converts to RGB by its documented rules (alpha dropped, palette looked up, CMYK/YCbCr/LAB/HSV
# converted); "1" and "L" are repeated to three channels by the same conversion
_CONVERTED = {"RGB", "RGBA", "RGBa", "RGBX", "P", "PA", "L", "LA", "La", "1", "CMYK", "YCbCr", "LAB", "HSV"}
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N"}


def load_rgb(path: str | Path) -> np.ndarray:
    """Decode an image file to RGB uint8 HxWx3, upright as its EXIF orientation says (see the module's rules).
    Raises TrtcError naming the file if it cannot be read as shown."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.seek(0)
            upright = ImageOps.exif_transpose(im)
            return _as_rgb(upright if upright is not None else im, path)
    except FileNotFoundError as exc:
        raise UsageProblem(f"image not found: {path}") from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise TrtcError(f"cannot decode image {path}: {exc}", "remove or replace the file") from exc


def _as_rgb(im, path) -> np.ndarray:
    mode = im.mode
    if mode == "RGB":
        return np.asarray(im)
    if mode in _SIXTEEN_BIT:
        grey = (np.asarray(im).astype(np.uint16) >> 8).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    if mode in _CONVERTED:
        return np.asarray(im.convert("RGB"))
    what = {"I": "32-bit integer", "F": "floating-point"}.get(mode, f"Pillow mode {mode!r}")
    raise TrtcError(f"cannot read image {path} as shown: {what} pixels have no defined 8-bit reading",
                    "save it as 8- or 16-bit RGB or greyscale (PNG, TIFF or JPEG)")
