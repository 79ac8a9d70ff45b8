"""The test lock (.ci/dev.lock), pyproject.toml's extras and engines._deps.TESTED tell one story: the lock pins every
release the dev extra needs, within the extras' ranges, with hashes; the tested range of each optional package runs
from its extra's floor to at least the lock's release. A lock refreshed to a newer release, or an extra edited
without a refresh, fails here until the other files follow."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from engines._deps import TESTED, is_tested, version_tuple

ROOT = Path(__file__).resolve().parents[2]
packaging = pytest.importorskip("packaging.requirements")  # pytest's own dependency


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock() -> dict[str, tuple[str, list[str]]]:
    """name -> (release, hashes) of .ci/dev.lock."""
    text = (ROOT / ".ci" / "dev.lock").read_text()
    found = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", block)
        if m:
            found[_norm(m.group(1))] = (m.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return found


def _extras() -> dict[str, list[str]]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the tests run on 3.11
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _requirements(extra: str, extras: dict[str, list[str]]) -> list:
    """The requirements of ``extra``, with those of the trtc[...] extras it names, recursively."""
    from packaging.requirements import Requirement

    out = []
    for text in extras[extra]:
        req = Requirement(text)
        if req.name == "trtc":
            for inner in req.extras:
                out += _requirements(inner, extras)
        else:
            out.append(req)
    return out


def test_the_lock_pins_every_release_the_dev_extra_asks_for_within_its_range_with_hashes():
    lock = _lock()
    assert len(lock) > 50, "the lock lost its packages"
    for req in _requirements("dev", _extras()):
        assert _norm(req.name) in lock, f"{req.name} is in the dev extra but not in .ci/dev.lock: run .ci/lock"
        release, hashes = lock[_norm(req.name)]
        assert req.specifier.contains(release, prereleases=True), (
            f"{req.name} {release} in .ci/dev.lock is outside the dev extra's {req.specifier}: run .ci/lock")
    assert all(hashes for _, hashes in lock.values()), [n for n, (_, h) in lock.items() if not h]


def test_tested_ranges_run_from_the_extras_floors_to_the_locked_releases():
    lock, extras = _lock(), _extras()
    floors = {}
    for extra in extras:
        for req in _requirements(extra, extras):
            for spec in req.specifier:
                if spec.operator in (">=", "=="):
                    floors.setdefault(_norm(req.name), set()).add(spec.version)
    dists = {"cv2": ("opencv-python", "opencv-python-headless")}
    for module, (_, package, low, _high) in TESTED.items():
        names = dists.get(module, (package,))
        lowest = min(set().union(*(floors.get(n, set()) for n in names)), key=version_tuple)
        assert low == lowest, f"{module}: TESTED's lowest {low} is not the extras' lowest floor {lowest}"
        locked = [lock[n][0] for n in names if n in lock]
        assert locked, f"{module} is not in .ci/dev.lock"
        for release in locked:
            assert is_tested(module, release), (
                f"{module} {release} in .ci/dev.lock is outside TESTED's range: the lock was refreshed; name the "
                "new release in engines/_deps.py TESTED after a green .ci/latest run")
