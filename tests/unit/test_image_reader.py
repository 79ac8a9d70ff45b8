"""The one image reader (engines.images.load_rgb) on the real photos saved as phones, scanners and editors save
them: EXIF orientation, 16-bit PNG and TIFF, palette, greyscale with alpha, CMYK, GIF. Each expected array is
computed with numpy from the values written (16-bit PNGs are written by a small PNG writer here, TIFFs by
tifffile), never by reading the file back with the reader under test."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from engines.errors import TrtcError
from engines.images import load_rgb
from engines.preprocess import list_images

ORIENTATION = 0x0112


def _upright(photos, h=48, w=64):
    """A small landscape crop of chelsea (a real photo), as the 8-bit RGB values a viewer shows."""
    with Image.open(photos[2]) as im:
        return np.asarray(im.convert("RGB"))[100:100 + h, 150:150 + w].copy()


def _stored(upright: np.ndarray, orientation: int) -> np.ndarray:
    """The pixels a camera stores for ``upright`` under EXIF ``orientation`` (the inverse of what a viewer does)."""
    return {1: upright, 2: upright[:, ::-1], 3: upright[::-1, ::-1], 4: upright[::-1],
            5: upright.transpose(1, 0, 2), 6: np.rot90(upright, 1), 7: np.rot90(upright, 2).transpose(1, 0, 2),
            8: np.rot90(upright, -1)}[orientation]


def _save_with_orientation(arr: np.ndarray, path, orientation: int, **kw):
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    Image.fromarray(np.ascontiguousarray(arr)).save(path, exif=exif, **kw)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_png_exact(photos, tmp_path, orientation):
    up = _upright(photos)
    path = tmp_path / f"o{orientation}.png"
    _save_with_orientation(_stored(up, orientation), path, orientation)
    got = load_rgb(path)
    assert got.shape == up.shape and got.dtype == np.uint8
    np.testing.assert_array_equal(got, up)


def test_exif_orientation_jpeg_phone_portrait(photos, tmp_path):
    # a phone's portrait photo: sensor pixels stored landscape, orientation 6 (rotate 90 clockwise to show)
    up = _upright(photos, 64, 48)
    path = tmp_path / "phone.jpg"
    _save_with_orientation(_stored(up, 6), path, 6, quality=95)
    got = load_rgb(path)
    assert got.shape == up.shape
    assert np.abs(got.astype(int) - up).mean() < 3.0  # JPEG's loss only; sideways would not even match the shape


def _png16(arr: np.ndarray, colour_type: int) -> bytes:
    """A 16-bit PNG written from scratch (zlib + struct), so the raw values in the file are ``arr``'s."""
    h, w = arr.shape[:2]
    rows = b"".join(b"\x00" + np.ascontiguousarray(arr[i]).astype(">u2").tobytes() for i in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, 16, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _sixteen_bit(up: np.ndarray) -> np.ndarray:
    """The photo on a 16-bit scale with a random low byte (what a 16-bit scan holds)."""
    low = np.random.default_rng(0).integers(0, 256, up.shape)
    return (up.astype(np.uint32) * 256 + low).astype(np.uint16)


def test_sixteen_bit_grey_png(photos, tmp_path):
    raw = _sixteen_bit(_upright(photos)[:, :, 1])
    path = tmp_path / "grey16.png"
    path.write_bytes(_png16(raw, 0))
    want = (raw >> 8).astype(np.uint8)  # the most significant byte
    np.testing.assert_array_equal(load_rgb(path), np.stack([want] * 3, axis=2))


def test_sixteen_bit_rgb_png(photos, tmp_path):
    raw = _sixteen_bit(_upright(photos))
    path = tmp_path / "rgb16.png"
    path.write_bytes(_png16(raw, 2))
    np.testing.assert_array_equal(load_rgb(path), (raw >> 8).astype(np.uint8))


@pytest.mark.parametrize("channels", [1, 3])
def test_sixteen_bit_tiff(photos, tmp_path, channels):
    tifffile = pytest.importorskip("tifffile")
    up = _upright(photos)
    raw = _sixteen_bit(up if channels == 3 else up[:, :, 0])
    path = tmp_path / "scan16.tif"
    tifffile.imwrite(path, raw, photometric="rgb" if channels == 3 else "minisblack")
    want = (raw >> 8).astype(np.uint8)
    np.testing.assert_array_equal(load_rgb(path), want if channels == 3 else np.stack([want] * 3, axis=2))


@pytest.mark.parametrize("fmt", ["png", "gif"])
def test_palette(photos, tmp_path, fmt):
    up = _upright(photos)
    palette = np.random.default_rng(1).integers(0, 256, (256, 3)).astype(np.uint8)
    index = (up[:, :, 0].astype(np.uint16) * 7 % 256).astype(np.uint8)
    im = Image.fromarray(index, "P")
    im.putpalette(palette.tobytes())
    path = tmp_path / f"palette.{fmt}"
    im.save(path)
    np.testing.assert_array_equal(load_rgb(path), palette[index])


def test_animated_gif_first_frame(photos, tmp_path):
    up = _upright(photos)
    grey = [up[:, :, 0], 255 - up[:, :, 0]]
    palette = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
    frames = []
    for g in grey:
        f = Image.fromarray(g, "P")
        f.putpalette(palette.tobytes())
        frames.append(f)
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    np.testing.assert_array_equal(load_rgb(path), np.stack([grey[0]] * 3, axis=2))


def test_grey_with_alpha(photos, tmp_path):
    up = _upright(photos)
    la = np.stack([up[:, :, 1], up[:, :, 2]], axis=2)  # alpha: any values, some transparent
    path = tmp_path / "la.png"
    Image.fromarray(la, "LA").save(path)
    np.testing.assert_array_equal(load_rgb(path), np.stack([la[:, :, 0]] * 3, axis=2))


def test_cmyk(photos, tmp_path):
    up = _upright(photos)
    cmyk = np.concatenate([255 - up, (up[:, :, :1] // 4)], axis=2).astype(np.uint8)
    path = tmp_path / "print.tif"
    Image.fromarray(cmyk, "CMYK").save(path)
    c, k = cmyk[:, :, :3].astype(np.float64), cmyk[:, :, 3:].astype(np.float64)
    want = np.round((255 - c) * (255 - k) / 255)  # Pillow's documented CMYK -> RGB
    assert np.abs(load_rgb(path).astype(np.float64) - want).max() <= 1


@pytest.mark.parametrize("dtype,what", [(np.float32, "floating-point"), (np.int32, "32-bit integer")])
def test_no_defined_reading_refused_by_name(tmp_path, dtype, what):
    tifffile = pytest.importorskip("tifffile")
    path = tmp_path / "depth.tif"
    tifffile.imwrite(path, np.arange(48, dtype=dtype).reshape(6, 8) * 1000)
    with pytest.raises(TrtcError, match=f"depth.tif.*{what}"):
        load_rgb(path)


def test_truncated_refused_by_name(photos, tmp_path):
    path = tmp_path / "cut.png"
    Image.fromarray(_upright(photos)).save(path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(TrtcError, match="cut.png"):
        load_rgb(path)


def test_folders_list_every_format_read(tmp_path):
    for name in ("a.jpg", "b.png", "c.gif", "d.tif", "e.tiff", "f.webp", "g.bmp", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert [p.name for p in list_images(tmp_path)] == ["a.jpg", "b.png", "c.gif", "d.tif", "e.tiff", "f.webp",
                                                         "g.bmp"]
