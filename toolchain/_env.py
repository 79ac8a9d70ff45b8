"""The environment of a child Python process that must import this checkout of trtc (or another tree) before
anything installed: the benchmarks' fresh processes, Ray heads and workers started by the tests and examples."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checkout_env(root: str | os.PathLike = ROOT, base: dict | None = None, **extra: str) -> dict:
    """``base`` (default: this process's environment) with ``extra`` set and ``root`` first on PYTHONPATH, ahead of
    what PYTHONPATH held (nothing empty left in it)."""
    env = dict(os.environ if base is None else base, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    return env
