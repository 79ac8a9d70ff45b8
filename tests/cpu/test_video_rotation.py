"""Rotation metadata on the CPU path: bikes.mp4 stored sideways (or upside down) by Debian's ffmpeg with the
rotation tag that makes players show it upright, classified by the real Lite0. Each must give the upright clip's
top-1 on >= 95% of frames. That ffmpeg itself shows each variant upright is checked first (its own decode, with
its autorotation), so the reference does not share trtc's reading of the display matrix."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from tests.conftest import needs_quant

pytestmark = [needs_quant, pytest.mark.skipif(not shutil.which("ffmpeg"), reason="needs ffmpeg: apt-get install ffmpeg")]

FRAMES = 60
STRIDE = 2
# name: (the filter that stores the frames turned, the rotate tag that shows them upright, --rotate)
VARIANTS = {
    "tag90": ("transpose=1", "90", "auto"),  # stored turned clockwise, shown turned back
    "tag180": ("hflip,vflip", "180", "auto"),
    "tag270": ("transpose=2", "270", "auto"),
    "untagged-ccw": ("transpose=2", None, "90"),  # no metadata: --rotate 90 (clockwise) makes it upright
}


def _ffmpeg(*args):
    subprocess.run(["ffmpeg", "-y", "-v", "error", *map(str, args)], check=True, timeout=120)


def _ffmpeg_first_frame(path) -> np.ndarray:
    """The first frame as ffmpeg shows it (autorotation on, its default), RGB."""
    out = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-frames:v", "1", "-f", "image2pipe",
                          "-vcodec", "ppm", "-"], capture_output=True, check=True, timeout=60).stdout
    magic, size, depth, pixels = out.split(b"\n", 3)
    w, h = map(int, size.split())
    return np.frombuffer(pixels, np.uint8).reshape(h, w, 3)


@pytest.fixture(scope="module")
def clips(tmp_path_factory, bikes):
    folder = tmp_path_factory.mktemp("rotated")
    # lossless H.264 in 4:2:0: transpose and flips move whole samples of each plane, so a turned clip holds the
    # upright one's samples exactly and only the reading of its metadata is under test
    encode = ["-frames:v", FRAMES, "-c:v", "libx264", "-preset", "ultrafast", "-qp", 0, "-pix_fmt", "yuv420p"]
    _ffmpeg("-i", bikes, *encode, folder / "upright.mp4")
    for name, (vf, tag, _) in VARIANTS.items():
        stored = folder / f"{name}.stored.mp4"
        _ffmpeg("-i", bikes, "-vf", vf, *encode, stored)
        if tag is None:
            stored.rename(folder / f"{name}.mp4")
        else:
            _ffmpeg("-i", stored, "-c", "copy", "-metadata:s:v", f"rotate={tag}", folder / f"{name}.mp4")
    upright = _ffmpeg_first_frame(folder / "upright.mp4").astype(int)
    for name, (_, tag, _) in VARIANTS.items():
        shown = _ffmpeg_first_frame(folder / f"{name}.mp4")
        if tag is not None:  # ffmpeg shows the tagged variants upright: only compression tells them apart
            assert shown.shape == upright.shape and np.abs(shown - upright).mean() < 2, name
        else:
            assert shown.shape == upright.shape[1::-1] + (3,), name
    return folder


def _top1(engine, path, rotate):
    from engines.video import classify

    run = classify([str(path)], engine, batch=10, top_k=1, stride=STRIDE, decoder="pyav", rotate=rotate)
    got = {p.frame: p.indices[0] for p in run}
    assert run.ok and len(got) == FRAMES // STRIDE, (run.problems, len(got))
    return got, run.stats.rotation.get(str(path))


def test_rotated_clips_classified_upright(lite0_onnx, clips):
    import engines

    engine = engines.open_engine(lite0_onnx[0], device="cpu")
    try:
        upright, turn = _top1(engine, clips / "upright.mp4", "auto")
        assert turn == {"degrees": 0, "mirrored": False, "from": "none"}
        want = {"tag90": 270, "tag180": 180, "tag270": 90, "untagged-ccw": 90}  # clockwise turns applied
        for name, (_, tag, rotate) in VARIANTS.items():
            got, turn = _top1(engine, clips / f"{name}.mp4", rotate)
            agreement = np.mean([got[f] == upright[f] for f in upright])
            assert agreement >= 0.95, (name, agreement)
            assert turn == {"degrees": want[name], "mirrored": False,
                            "from": "metadata" if tag else "--rotate"}, (name, turn)
        sideways, turn = _top1(engine, clips / "tag90.mp4", "0")  # --rotate 0: the stored frames as they are
        assert turn == {"degrees": 0, "mirrored": False, "from": "--rotate"} and np.mean([sideways[f] == upright[f] for f in upright]) < 0.5
    finally:
        engine.close()


def test_cli_records_the_rotation(lite0_onnx, clips, tmp_path):
    from click.testing import CliRunner

    from toolchain.cli import cli

    summary = tmp_path / "s.json"
    r = CliRunner().invoke(cli, ["run", str(clips / "tag270.mp4"), "--model", str(lite0_onnx[0]), "--device", "cpu",
                                 "--stride", "25", "-o", str(tmp_path / "p.jsonl"), "--summary", str(summary)])
    assert r.exit_code == 0, r.output
    by_source = json.loads(summary.read_text())["by_source"][str(clips / "tag270.mp4")]
    assert by_source["rotation"] == {"degrees": 90, "mirrored": False, "from": "metadata"}
    r = CliRunner().invoke(cli, ["run", str(clips / "tag270.mp4"), "--model", str(lite0_onnx[0]), "--rotate", "45"])
    assert r.exit_code == 2 and "--rotate" in r.output


def test_the_gpu_path_turns_a_file_as_the_cpu_path_does(clips):
    """The GPU path reads a file's turn once, before NVDEC decodes it (file_orientation, what NvdecSource records and
    hands to the preprocessing kernel): it is the turn the CPU path applies to the same file's frames, and --rotate
    replaces it. (Run here on the CPU, without NVDEC; tests/gpu/test_greyscale_rotation_gpu.py runs the kernel.)"""
    import av

    from engines.video.orientation import file_orientation, frame_orientation

    for name, (_, tag, rotate) in VARIANTS.items():
        path = str(clips / f"{name}.mp4")
        with av.open(path) as container:
            cpu_turn = frame_orientation(next(container.decode(video=0)), rotate)
        assert file_orientation(path, rotate) == cpu_turn, name
    assert file_orientation(str(clips / "tag90.mp4"), "auto").to_dict() == {"degrees": 270, "mirrored": False,
                                                                           "from": "metadata"}
    assert file_orientation(str(clips / "tag90.mp4"), "0").identity


def test_calibration_and_check_frames_are_turned_as_run_turns_them(clips):
    """quantize's calibration and check data and validate's data read video frames through one loader
    (calibration.load_data): a tagged clip's frames come out as the upright clip's, sample for sample (lossless
    clips: equal exactly), and the data set records each turn; the upright clip records none."""
    from engines.preprocess import PreprocessSpec
    from toolchain.precision import calibration as cal

    spec = PreprocessSpec(size=(64, 64), resize=72)

    def load(name):
        return cal.load_data([clips / name], spec, [1, 3, 64, 64], "input", want=3)

    upright = load("upright.mp4")
    assert upright.rotated == [] and len(upright) == 3
    for name, degrees in (("tag90.mp4", 270), ("tag180.mp4", 180)):
        turned = load(name)
        assert np.array_equal(turned.x, upright.x), name
        assert turned.rotated == [{"file": str(clips / name), "degrees": degrees, "mirrored": False,
                                   "from": "metadata"}]
        assert turned.subset([0]).rotated == turned.rotated


def test_validate_reports_the_turned_frames(lite0_onnx, clips, tmp_path):
    from click.testing import CliRunner

    from toolchain.cli import cli

    model, report = str(lite0_onnx[0]), tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["validate", "--reference", model, "--candidate", model, "--data",
                                 str(clips / "tag270.mp4"), "--count", "2", "--json", str(report)])
    assert r.exit_code == 0, r.output
    assert "Frames turned upright (rotation metadata): tag270.mp4 90 degrees" in " ".join(r.output.split())
    assert json.loads(report.read_text())["data"]["rotated"] == [
        {"file": str(clips / "tag270.mp4"), "degrees": 90, "mirrored": False, "from": "metadata"}]
