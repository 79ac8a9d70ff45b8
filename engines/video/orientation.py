"""How a decoded frame is turned to be shown: the stream's display matrix (rotation metadata), or ``--rotate``.

A phone records sideways pixels and a display matrix (MP4's track matrix, the ``rotate`` tag) that tells players to
turn them; FFmpeg hands it to each decoded frame as DISPLAYMATRIX side data. The matrix maps a stored pixel
(x, y) to the shown one: x' = a*x + c*y, y' = b*x + d*y (plus a translation), with a, b, c, d the signs of its
16.16 fixed-point entries [a, b, u, c, d, v, tx, ty, w]. Every matrix a video can carry that keeps pixels whole is
one of eight: a rotation by 0, 90, 180 or 270 degrees, or one of them after a mirror. :class:`Orientation` holds
it as three steps on the stored planes - transpose, then flip the rows, then flip the columns - which numpy does
as views (no copy), and the preprocessing then reads the turned planes as any others.

``--rotate auto`` (the default) applies the stream's matrix; ``--rotate 0|90|180|270`` replaces it with a
clockwise rotation (a camera mounted upside down: 180).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..errors import UsageProblem
from ..preprocess import YuvPlanes

ROTATE_CHOICES = ("auto", "0", "90", "180", "270")


def check_rotate(rotate) -> str:
    """``rotate`` as one of :data:`ROTATE_CHOICES` (an int is accepted); anything else is the caller's mistake."""
    text = "auto" if rotate is None else str(rotate).strip().lower()
    if text not in ROTATE_CHOICES:
        raise UsageProblem(f"--rotate must be auto, 0, 90, 180 or 270, got {rotate!r}",
                           "--rotate auto applies the video's rotation metadata; a number (clockwise degrees) "
                           "replaces it")
    return text


@dataclass(frozen=True)
class Orientation:
    transpose: bool = False
    flip_rows: bool = False
    flip_cols: bool = False
    origin: str = "none"  # "metadata", "--rotate" or "none"

    @classmethod
    def clockwise(cls, degrees: int, origin: str = "--rotate") -> "Orientation":
        return cls(*_STEPS[(int(degrees) % 360, False)], origin=origin)  # --rotate 0 too: it overrides metadata

    @classmethod
    def from_matrix(cls, matrix) -> "Orientation":
        """From a display matrix (9 int32: [a, b, u, c, d, v, tx, ty, w]); the identity (or no matrix, or one that
        is not a whole-pixel rotation or mirror, which the caller is told about) gives no turn."""
        if matrix is None or len(matrix) < 5:
            return cls()
        a, b, c, d = (int(np.sign(v)) for v in (matrix[0], matrix[1], matrix[3], matrix[4]))
        if a and d and not b and not c:
            return cls(False, d < 0, a < 0, "metadata" if (a, d) != (1, 1) else "none")
        if b and c and not a and not d:  # x' = c*y, y' = b*x: the transpose, then the flips
            return cls(True, b < 0, c < 0, "metadata")
        raise UsageProblem(f"the display matrix {list(map(int, matrix))} is not a rotation by a multiple of 90 "
                           "degrees or a mirror", "give --rotate 0, 90, 180 or 270 to say how to turn the frames")

    @property
    def degrees(self) -> int:
        """The clockwise rotation (0, 90, 180, 270) after :attr:`mirrored`'s left-right mirror of the stored frame."""
        return _TURNS[(self.transpose, self.flip_rows, self.flip_cols)][0]

    @property
    def mirrored(self) -> bool:
        return _TURNS[(self.transpose, self.flip_rows, self.flip_cols)][1]

    @property
    def identity(self) -> bool:
        return not (self.transpose or self.flip_rows or self.flip_cols)

    def plane(self, a: np.ndarray) -> np.ndarray:
        """One plane (H x W), or a packed image (H x W x C: the same steps on its first two axes), as shown."""
        if self.transpose:
            a = a.swapaxes(0, 1)
        if self.flip_rows:
            a = a[::-1]
        if self.flip_cols:
            a = a[:, ::-1]
        return a

    def apply(self, planes: YuvPlanes) -> YuvPlanes:
        """The planes as shown (views of the decoded ones)."""
        if self.identity:
            return planes
        return YuvPlanes(self.plane(planes.y), self.plane(planes.u), self.plane(planes.v))

    def to_dict(self) -> dict:
        """What the results record: {"degrees": clockwise, "mirrored": bool, "from": "metadata"|"--rotate"|"none"}."""
        return {"degrees": self.degrees, "mirrored": self.mirrored, "from": self.origin}


def pushed_turn(rotate) -> "Orientation | None":
    """A pushed frame's turn: None (or 0) for none, clockwise degrees (0, 90, 180, 270), or an :class:`Orientation`.
    A pushed frame has no metadata to read, so "auto" is refused."""
    if rotate is None or isinstance(rotate, Orientation):
        return None if rotate is None or rotate.identity else rotate
    text = check_rotate(rotate)
    if text == "auto":
        raise UsageProblem("rotate='auto' reads a video's metadata, and a pushed frame has none",
                           "give the clockwise degrees (0, 90, 180 or 270), or leave rotate out")
    turn = Orientation.clockwise(int(text))
    return None if turn.identity else turn


def _turns() -> dict:
    """(transpose, flip_rows, flip_cols) -> (clockwise degrees, mirrored first), found by turning a small array
    both ways (numpy's rot90 and a column flip against the three steps), so the table cannot disagree with them."""
    probe = np.arange(6).reshape(2, 3)
    out = {}
    for degrees in (0, 90, 180, 270):
        for mirrored in (False, True):
            shown = np.rot90(probe[:, ::-1] if mirrored else probe, -degrees // 90)
            for key in itertools.product((False, True), repeat=3):
                if np.array_equal(Orientation(*key).plane(probe), shown):
                    out[key] = (degrees, mirrored)
    return out


_TURNS = _turns()
_STEPS = {turn: key for key, turn in _TURNS.items()}


def probe_orientation(name: str) -> Orientation:
    """How a local video file's frames are to be turned (its first frame's display matrix, decoded by PyAV on the
    CPU); no turn where PyAV is missing or cannot read the file (the decoder reports real problems)."""
    from .._deps import is_installed

    if "://" in name or not is_installed("av"):
        return Orientation()
    import av

    try:
        with av.open(name) as container:
            for frame in container.decode(video=0):
                return frame_orientation(frame)
    except Exception:  # noqa: BLE001 - av.error.*, a matrix that is no whole-pixel turn: the run says it
        return Orientation()
    return Orientation()


def file_orientation(name: str, rotate: str = "auto") -> Orientation:
    """How the GPU path turns a file's NVDEC frames: ``rotate`` "auto" reads the display matrix of the file's first
    frame (PyAV on the CPU, as the CPU path reads it; a URL or a host without PyAV: no turn), a number replaces it.
    The preprocessing kernel applies it in the same pass (engines.preprocess.kernel_grid), with no extra copy."""
    if rotate != "auto":
        return Orientation.clockwise(int(rotate))
    return probe_orientation(name)


def frame_orientation(frame, rotate: str = "auto") -> Orientation:
    """How to turn a PyAV VideoFrame: ``rotate`` "auto" reads its DISPLAYMATRIX side data, a number replaces it."""
    if rotate != "auto":
        return Orientation.clockwise(int(rotate))
    side = getattr(frame, "side_data", None)
    data = side.get("DISPLAYMATRIX") if side is not None and hasattr(side, "get") else None
    if data is None:
        return Orientation()
    return Orientation.from_matrix(np.frombuffer(bytes(data), np.int32))
