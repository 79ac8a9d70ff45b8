"""An image file as a source of one frame, for ``trtc run photos/`` and ``classify(["a.jpg", ...])``.

The file is read by the one image reader (:func:`engines.images.load_rgb`: EXIF orientation, bit depth, channels),
and its RGB pixels go through :func:`engines.preprocess.preprocess_packed`, the numpy reference of the GPU kernel's
packed-pixel variant: the same sampling grid, resize, crop and normalisation as a video frame. Its one frame is
frame 0, with no pts or time. CPU path only (the GPU path decodes video with NVDEC)."""

from __future__ import annotations

import os
import time

import numpy as np

from ..errors import TrtcError
from ..images import IMAGE_SUFFIXES, load_rgb
from ..preprocess import ColorSpace, preprocess_packed
from .orientation import Orientation
from .source_base import SourceError, SourceInfo


def is_image(name: str) -> bool:
    """A local file name with an image suffix (what the image reader reads)."""
    return "://" not in name and os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES


class ImageSource:
    """One image file: ``frames()`` yields (0, None, None, RGB uint8 HxWx3, received) once per ``loop``."""

    backend = "image"
    live = False

    def __init__(self, name: str, loop: int = 1, rotate: str = "auto"):
        self.name = str(name)
        self.loop = max(1, int(loop))
        self.rotate = rotate  # "auto": as the file's EXIF says; "0".."270": clockwise after that
        self.info: SourceInfo | None = None
        self.decoded = self.missing = self.damaged = self.lagged = 0
        self.captured = None
        self.stop = None
        self.on_event = None

    def frames(self):
        try:
            rgb = load_rgb(self.name)
        except TrtcError as exc:
            raise SourceError(self.name, exc.reason.replace(f"{self.name}: ", ""), exc.fix) from None
        turn = Orientation() if self.rotate == "auto" else Orientation.clockwise(int(self.rotate))
        if not turn.identity:
            rgb = np.rot90(rgb, -turn.degrees // 90)
        h, w = rgb.shape[:2]
        self.info = SourceInfo(self.name, "image", w, h, None, 1, ColorSpace())
        self.info.rotation = turn.to_dict()  # after the EXIF orientation, which the reader always applies
        for index in range(self.loop):
            self.decoded += 1
            yield index, None, None, rgb, time.time()

    @staticmethod
    def preprocess(rgb: np.ndarray, spec, dtype=None) -> np.ndarray:
        return preprocess_packed(rgb, "RGB", spec, dtype)
