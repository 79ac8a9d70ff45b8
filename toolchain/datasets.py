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
