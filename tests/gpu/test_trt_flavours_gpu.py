"""TensorRT's lean and dispatch runtimes on a real GPU: load, report versions, and exercise what a runtime can do
WITHOUT a plan. No plan is built or executed here (the lean and dispatch wheels have no builder).

Run on the GPU machine (needs the dev extra's tensorrt-lean-cu13 / tensorrt-dispatch-cu13 11.4 wheels, or the edge
extra for lean only):
    python -m pytest tests/gpu/test_trt_flavours_gpu.py -v -s
"""

from __future__ import annotations

import importlib

import pytest

from engines._gpu import device as gpu_device
from engines._trt import installed, make_logger

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("flavor", ["tensorrt-lean", "tensorrt-dispatch"])
def test_runtime_flavour_loads_and_works_without_a_plan(flavor):
    import_name = installed(flavor)
    if import_name is None:
        pytest.skip(f"{flavor} not installed: pip install -e '.[dev]'")
    trt = importlib.import_module(import_name)
    gpu = gpu_device(0)
    assert gpu is not None
    logger = make_logger(trt)
    runtime = trt.Runtime(logger)
    assert runtime is not None, logger.errors
    # what a runtime can do without a plan: its settings, the plugin registry, and refusing garbage cleanly
    runtime.engine_host_code_allowed = True
    assert runtime.engine_host_code_allowed is True
    runtime.max_threads = 2
    assert runtime.max_threads == 2
    registry = runtime.get_plugin_registry()
    creators = list(getattr(registry, "all_creators", []) or [])
    engine = runtime.deserialize_cuda_engine(b"not a plan" * 100)
    assert engine is None and logger.errors, "garbage must be refused with a logged error"
    print(f"\n{flavor}: {import_name} {trt.__version__} on {gpu['name']} (cc {gpu['compute_capability']}, driver "
          f"{gpu['driver']}); plugin creators: {len(creators)}; garbage refused with: {logger.errors[-1][:120]!r}. "
          "NO plan was executed.")
