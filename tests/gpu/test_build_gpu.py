"""`trtc build` with a real TensorRT-RTX (skipped where it is not installed). RTX 1.7 builds ahead of time for the
listed compute capabilities and cannot run on 9.0, so on an H100/H200 this checks parse + build + manifest + the
post-build precision check on the network, and that loading fails with our message, not a crash."""

from __future__ import annotations

import importlib.util

import pytest

from engines.errors import ManifestError
from engines.manifest import read_manifest
from tests.conftest import needs_export

pytestmark = [needs_export, pytest.mark.slow, pytest.mark.tensorrt]

if not any(importlib.util.find_spec(m) for m in ("tensorrt_rtx", "tensorrt_rtx_bindings")):
    pytest.skip("needs TensorRT-RTX (pip install \"trtc[rtx]\")", allow_module_level=True)


@pytest.mark.parametrize("which", ["fp32", "fp16", "int8"])
def test_rtx_builds_lite0_with_a_true_manifest(which, lite0_onnx, lite0_fp16, lite0_int8, tmp_path):
    from engines.tensorrt_engine import load_plan
    from toolchain.build import build_engine
    from toolchain.inspect_artifact import inspect_artifact

    src = {"fp32": lite0_onnx[0], "fp16": lite0_fp16.output, "int8": lite0_int8.output}[which]
    out = tmp_path / f"lite0.{which}.plan"
    r = build_engine(src, out, precision=which, backend="tensorrt-rtx", compute_capability=["SM89"],
                     timing_cache=tmp_path / "tc.bin")
    m = read_manifest(out)
    print(f"\n{which}: {r.backend}, {r.bytes / 1e6:.1f} MB plan in {r.timings}, compute layers {r.layers['counts']} "
          f"({r.layers['source']}); {r.layers.get('note')}")
    assert m.kind == "plan" and m.builder["flavor"] == "tensorrt-rtx" and m.builder["compute_capabilities"] == ["SM89"]
    assert m.builder["gpu"]["compute_capability"] and m.builder["driver"] and m.precision["mode"] == which
    assert m.parent["sha256"] == read_manifest(src).artifact["sha256"] and len(m.labels) == 1000
    assert m.batch.to_dict() == {"min": 1, "opt": 8, "max": 32}
    counts = r.layers["counts"]
    if which == "fp32":
        assert counts == {"fp32": 50}
    elif which == "fp16":
        assert counts == {"fp16": 50}
    else:
        assert counts.get("int8") == lite0_int8.layers["int8"] and counts.get("int8") + counts.get("fp16", 0) == 50
    info = inspect_artifact(out)
    if not info["runs_here"]:  # H100/H200: RTX 1.7 has no SM90; loading says so before deserializing
        with pytest.raises(ManifestError, match="cannot run here"):
            load_plan(out)
        print(f"  load: {info['why_not']}")
