"""An input fuzz: variants of the real photos and of bikes.mp4 as teams feed them to trtc, through `trtc run` with
the real Lite0 on the CPU path. Every variant is either classified as the picture it shows, or refused with a
one-line reason; never a silently different answer, never a traceback.

The picture a variant shows (its "upright 8-bit original") is computed here with numpy from the values the
generator stored, without trtc's reader: for the EXIF orientations, 16-bit, alpha, CMYK and the rotated video it
is the original photo or clip itself; for palette, greyscale and 1-bit it is the palette lookup or the grey values
repeated to three channels (those pictures are not the colour photo, so they are held to their own colours);
portrait and the odd sizes show their own stored pixels. Tolerance: the same top-1 class as ONNX Runtime gives on
that picture (the preprocessing under test's float32 reference, preprocess_rgb), and a top-1 score within 1e-3;
the rotated clip: the upright clip's top-1 on every frame, scores within 1e-3 (lossless: the same samples).
Truncated and zero-byte files must be refused by name with a one-line reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from tests.conftest import needs_quant

pytestmark = [needs_quant,
              pytest.mark.skipif(not shutil.which("ffmpeg"), reason="needs ffmpeg: apt-get install ffmpeg")]

CLIP_FRAMES = 6
SCORE_TOLERANCE = 1e-3
# EXIF orientation -> the stored array whose display (as the tag says) is the upright picture a
STORED = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],  # mirrored left-right
    3: lambda a: a[::-1, ::-1],  # turned 180
    4: lambda a: a[::-1],  # mirrored top-bottom
    5: lambda a: a.transpose(1, 0, 2),  # transposed (its own inverse)
    6: lambda a: np.rot90(a, 1),  # stored turned counter-clockwise: shown turned 90 clockwise
    7: lambda a: np.rot90(a, 2).transpose(1, 0, 2),  # transversed (its own inverse)
    8: lambda a: np.rot90(a, -1),  # stored turned clockwise: shown turned 90 counter-clockwise
}


def _save_exif(array: np.ndarray, path: Path, orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    _save(Image.fromarray(np.ascontiguousarray(array)), path, exif=exif)


def _save(im, path: Path, **options) -> None:
    if path.suffix == ".png":
        options["compress_level"] = 1  # fast: the fuzz makes many
    im.save(path, **options)


def _sixteen(x: np.ndarray) -> np.ndarray:
    """8-bit ``x`` as 16-bit samples that show ``x``: the high byte is ``x`` and round(v / 257) is ``x`` too; the
    low byte differs from the high one, so a reader that takes the wrong byte shows another picture."""
    x = x.astype(np.uint16)
    return x * 256 + x // 2


def _grey3(g: np.ndarray) -> np.ndarray:
    return np.repeat(g[:, :, None], 3, axis=2)


def make_image_variants(photo: Path, folder: Path) -> tuple[dict, list]:
    """({file: the RGB picture it shows}, [files that must be refused]) for one photo."""
    import cv2

    with Image.open(photo) as im:  # the original, smaller (Lite0 reads 224 x 224): short side 256
        im = im.convert("RGB")
        scale = 256 / min(im.size)
        a = np.asarray(im.resize((round(im.width * scale), round(im.height * scale)), Image.BILINEAR))
    stem = photo.stem
    shown: dict[Path, np.ndarray] = {}
    for o, stored in STORED.items():
        path = folder / f"{stem}-exif{o}.png"
        _save_exif(stored(a), path, o)
        shown[path] = a
    jpg = folder / f"{stem}-exif6.jpg"  # a phone photo: JPEG, stored sideways
    _save_exif(np.rot90(a, 1), jpg, 6)
    with Image.open(jpg) as im:  # its decoded samples as stored, turned back here
        shown[jpg] = np.rot90(np.asarray(im.convert("RGB")), -1)
    path = folder / f"{stem}-rgb16.png"  # 16 bits per sample (v = 256 x + x // 2: x by its high byte and by v / 257)
    cv2.imwrite(str(path), np.ascontiguousarray(_sixteen(a)[:, :, ::-1]),  # OpenCV writes BGR
                [cv2.IMWRITE_PNG_COMPRESSION, 1])
    shown[path] = a
    grey = np.asarray(Image.fromarray(a).convert("L"))
    path = folder / f"{stem}-grey16.png"
    _save(Image.fromarray(_sixteen(grey)), path)  # 16-bit greyscale (Pillow's "I;16")
    shown[path] = _grey3(grey)
    path = folder / f"{stem}-grey.png"
    _save(Image.fromarray(grey), path)
    shown[path] = _grey3(grey)
    path = folder / f"{stem}-1bit.png"
    bits = grey >= 128
    _save(Image.fromarray(bits), path)
    shown[path] = _grey3(bits.astype(np.uint8) * 255)
    pal = Image.fromarray(a).quantize(256)
    path = folder / f"{stem}-palette.png"
    _save(pal, path)
    lut = np.asarray(pal.getpalette(), np.uint8).reshape(-1, 3)
    shown[path] = lut[np.asarray(pal)]
    alpha = np.linspace(0, 255, a.shape[0] * a.shape[1]).astype(np.uint8).reshape(a.shape[:2])
    path = folder / f"{stem}-alpha.png"
    _save(Image.fromarray(np.dstack([a, alpha])), path)  # alpha dropped, not composited (engines.images)
    shown[path] = a
    path = folder / f"{stem}-grey-alpha.png"
    _save(Image.fromarray(np.dstack([grey, alpha]), "LA"), path)
    shown[path] = _grey3(grey)
    cmyk = Image.fromarray(a).convert("CMYK")
    path = folder / f"{stem}-cmyk.tif"
    cmyk.save(path)
    c = np.asarray(cmyk)
    assert not c[:, :, 3].any()  # no black ink: red, green and blue are 255 minus cyan, magenta and yellow
    shown[path] = 255 - c[:, :, :3]
    path = folder / f"{stem}-portrait.png"
    _save(Image.fromarray(np.ascontiguousarray(np.rot90(a))), path)
    shown[path] = np.rot90(a)
    png = (folder / f"{stem}-exif1.png").read_bytes()
    refused = [folder / f"{stem}-truncated.png", folder / f"{stem}-truncated.jpg"]
    refused[0].write_bytes(png[: len(png) // 2])
    refused[1].write_bytes(jpg.read_bytes()[: jpg.stat().st_size // 2])
    return shown, refused


def _ffmpeg(*args):
    subprocess.run(["ffmpeg", "-y", "-v", "error", *map(str, args)], check=True, timeout=120)


@pytest.fixture(scope="module")
def variants(tmp_path_factory, photos, bikes):
    folder = tmp_path_factory.mktemp("fuzz-inputs")
    images = folder / "images"
    images.mkdir()
    shown, refused = {}, []
    for photo in photos[1:]:  # the coffee cup and the cat: landscape photos (the astronaut is square)
        s, r = make_image_variants(photo, images)
        shown.update(s)
        refused += r
    rng = np.random.default_rng(5)
    for name, size in (("dot", (1, 1)), ("sliver", (5000, 7))):  # (height, width)
        pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        _save(Image.fromarray(pixels), images / f"{name}.png")
        shown[images / f"{name}.png"] = pixels
    (images / "empty.png").write_bytes(b"")
    refused.append(images / "empty.png")
    # lossless H.264: the turned clip holds the upright clip's samples exactly, only its display matrix differs
    encode = ["-frames:v", CLIP_FRAMES, "-c:v", "libx264", "-preset", "ultrafast", "-qp", 0, "-pix_fmt", "yuv420p"]
    _ffmpeg("-i", bikes, *encode, folder / "upright.mp4")
    _ffmpeg("-i", bikes, "-vf", "transpose=1", *encode, folder / "stored.mp4")
    _ffmpeg("-i", folder / "stored.mp4", "-c", "copy", "-metadata:s:v", "rotate=90", folder / "tag90.mp4")
    data = (folder / "upright.mp4").read_bytes()
    (folder / "truncated.mp4").write_bytes(data[: len(data) * 6 // 10])  # its index (at the end) is lost
    (folder / "empty.mp4").write_bytes(b"")
    return folder, shown, refused


def _reference(model, pictures: dict) -> dict:
    """{file: (top-1 index, score)} from ONNX Runtime on the pictures the files show."""
    import onnxruntime as ort

    from engines.manifest import read_manifest
    from engines.preprocess import preprocess_rgb

    spec = read_manifest(model).preprocess
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    paths = list(pictures)
    x = np.stack([preprocess_rgb(np.ascontiguousarray(pictures[p]), spec) for p in paths])
    logits = np.concatenate([session.run(None, {name: x[i:i + 8]})[0] for i in range(0, len(x), 8)])
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return {path: (int(row.argmax()), float(row.max())) for path, row in zip(paths, p)}


def _quiet(output: str) -> None:
    for bad in ("Traceback", "internal error", "this is a bug"):
        assert bad not in output, output


def _one_line(reason: str) -> None:
    assert reason and "\n" not in reason.strip(), repr(reason)


def test_every_variant_is_classified_as_shown_or_refused_by_name(variants, lite0_onnx, tmp_path):
    from toolchain.cli import cli

    folder, shown, refused = variants
    model = lite0_onnx[0]
    videos = [folder / n for n in ("upright.mp4", "tag90.mp4", "truncated.mp4")]
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    r = CliRunner().invoke(cli, ["run", str(folder / "images"), *map(str, videos), "--model", str(model),
                                 "--device", "cpu", "--top-k", "1", "-o", str(out), "--summary", str(summary)])
    _quiet(r.output)
    assert r.exit_code == 1, r.output  # the bad files among good ones: reported, the others classified
    report = json.loads(summary.read_text())
    problems = {p["source"]: p["reason"] for p in report["problems"]}
    assert set(problems) == {str(p) for p in refused} | {str(folder / "truncated.mp4")}, problems
    for reason in problems.values():
        _one_line(reason)
    got: dict = {}
    for line in out.read_text().splitlines():
        d = json.loads(line)
        got.setdefault(d["source"], []).append((d["top_k"][0]["index"], d["top_k"][0]["score"]))

    want = _reference(model, shown)
    wrong = []
    for path, (index, score) in want.items():
        rows = got.get(str(path))
        if rows is None:
            wrong.append(f"{path.name}: not classified and not refused")
        elif rows[0][0] != index or abs(rows[0][1] - score) > SCORE_TOLERANCE:
            wrong.append(f"{path.name}: {rows[0]} where the picture it shows gives {(index, score)}")
    assert not wrong, "\n".join(wrong)
    upright, turned = got[str(videos[0])], got[str(videos[1])]
    assert len(upright) == len(turned) == CLIP_FRAMES
    for (i, s), (j, t) in zip(upright, turned):
        assert i == j and abs(s - t) <= SCORE_TOLERANCE, (upright, turned)
    print(f"input fuzz: {len(want)} images and 2 clips classified as shown, {len(problems)} refused: "
          + "; ".join(f"{Path(k).name}: {v}" for k, v in problems.items()))


def test_a_zero_byte_video_is_refused_by_name(variants, lite0_onnx):
    from toolchain.cli import cli

    folder, _, _ = variants
    r = CliRunner().invoke(cli, ["run", str(folder / "empty.mp4"), "--model", str(lite0_onnx[0]), "--device", "cpu"])
    _quiet(r.output)
    assert r.exit_code in (1, 2) and str(folder / "empty.mp4") in r.output, r.output
    lines = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "empty file (0 bytes)" in lines[0], r.output
