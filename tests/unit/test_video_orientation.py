"""The display matrix's eight whole-pixel turns (rotations by 90-degree steps, each with or without a mirror) on
YUV planes, against the matrix's own definition applied pixel by pixel: a stored pixel (x, y) is shown at
x' = a*x + c*y, y' = b*x + d*y (FFmpeg's libavutil/display.h), shifted to start at 0. The rotations on real
files, against ffmpeg's own display, are in tests/cpu/test_video_rotation.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engines.errors import UsageProblem
from engines.preprocess import YuvPlanes
from engines.video.orientation import Orientation, check_rotate

ONE = 1 << 16
# every sign pattern of [a, b, c, d] that moves whole pixels: the diagonal ones and the anti-diagonal ones
MATRICES = [(a, 0, 0, d) for a, d in itertools.product((1, -1), repeat=2)] + \
           [(0, b, c, 0) for b, c in itertools.product((1, -1), repeat=2)]


def _shown(stored: np.ndarray, a, b, c, d) -> np.ndarray:
    h, w = stored.shape
    ys, xs = np.mgrid[0:h, 0:w]
    xd, yd = a * xs + c * ys, b * xs + d * ys
    xd, yd = xd - xd.min(), yd - yd.min()
    out = np.full((yd.max() + 1, xd.max() + 1), -1)
    out[yd, xd] = stored
    return out


@pytest.mark.parametrize("signs", MATRICES)
def test_eight_turns_follow_the_matrix(signs):
    a, b, c, d = signs
    matrix = np.array([a * ONE, b * ONE, 0, c * ONE, d * ONE, 0, 0, 0, 1 << 30], np.int32)
    turn = Orientation.from_matrix(matrix)
    y = np.arange(6 * 8).reshape(6, 8)
    u = np.arange(3 * 4).reshape(3, 4) + 100
    got = turn.apply(YuvPlanes(y, u, u + 100))
    np.testing.assert_array_equal(got.y, _shown(y, a, b, c, d))
    np.testing.assert_array_equal(got.u, _shown(u, a, b, c, d))
    np.testing.assert_array_equal(got.v, _shown(u + 100, a, b, c, d))
    # what the results record: the same pixels as numpy's clockwise rotation after an optional left-right mirror
    rec = turn.to_dict()
    expect = np.rot90(y[:, ::-1] if rec["mirrored"] else y, -rec["degrees"] // 90)
    np.testing.assert_array_equal(got.y, expect)
    assert rec["from"] == ("none" if signs == (1, 0, 0, 1) else "metadata")


def test_mirror_is_recorded():
    hflip = np.array([-ONE, 0, 0, 0, ONE, 0, 8 * ONE, 0, 1 << 30], np.int32)
    assert Orientation.from_matrix(hflip).to_dict() == {"degrees": 0, "mirrored": True, "from": "metadata"}


@pytest.mark.parametrize("degrees", [0, 90, 180, 270])
def test_rotate_option_is_clockwise(degrees):
    y = np.arange(12).reshape(3, 4)
    got = Orientation.clockwise(degrees).apply(YuvPlanes(y, y, y)).y
    np.testing.assert_array_equal(got, np.rot90(y, -degrees // 90))


def test_bad_values_refused():
    with pytest.raises(UsageProblem, match="--rotate"):
        check_rotate("45")
    assert check_rotate(90) == "90" and check_rotate(None) == "auto"
    skew = np.array([ONE, ONE // 2, 0, 0, ONE, 0, 0, 0, 1 << 30], np.int32)
    with pytest.raises(UsageProblem, match="not a rotation"):
        Orientation.from_matrix(skew)
