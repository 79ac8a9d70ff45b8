"""The build side and the edge side agree (issue 29 item 3): the lean runtime that trtc checks plans against at
build time (engines._trt.EDGE_LEAN_VERSION) is the one the `edge` extra installs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from engines._trt import EDGE_LEAN_VERSION

ROOT = Path(__file__).resolve().parents[2]


def _pins(extra: str) -> dict[str, str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    out = {}
    for req in extras[extra]:
        m = re.fullmatch(r"\s*(tensorrt-lean-[\w-]+?)\s*==\s*([\w.]+)\s*", req)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_the_edge_extra_pins_the_lean_runtime_trtc_checks_plans_against():
    pins = _pins("edge")
    assert set(pins) == {"tensorrt-lean-cu13-bindings", "tensorrt-lean-cu13-libs"}, pins
    assert set(pins.values()) == {EDGE_LEAN_VERSION}, (
        f"pyproject.toml's edge extra pins {pins}, engines/_trt.py EDGE_LEAN_VERSION is {EDGE_LEAN_VERSION}: "
        "change both together")
