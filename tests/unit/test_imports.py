"""Importing the CLI or the runtime must stay light: no heavy module may load as a side effect."""

import subprocess
import sys

HEAVY = ["torch", "torchvision", "onnx", "onnxruntime", "onnxscript", "tensorrt", "tensorrt_rtx",
         "tensorrt_bindings", "tensorrt_rtx_bindings", "cupy", "PyNvVideoCodec", "av", "timm", "skimage", "cv2", "ray"]


def _loaded_after(stmt: str) -> list[str]:
    code = f"import sys\n{stmt}\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_cli_import_loads_no_heavy_module():
    assert _loaded_after("import toolchain.cli") == []


def test_engines_import_loads_no_heavy_module_nor_click():
    assert _loaded_after("import engines, engines.manifest, engines.preprocess, engines.onnxruntime_engine, "
                         "engines.tensorrt_engine, engines.opencv_engine, engines.topk, engines.video, "
                         "engines.video.pipeline, engines.video.ray_cluster, toolchain.run") == []
    code = "import sys, engines; print('click' in sys.modules, 'toolchain' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"], "engines must not import click or toolchain"


def test_help_loads_no_heavy_module():
    stmt = ("from click.testing import CliRunner\nfrom toolchain.cli import cli\n"
            "assert CliRunner().invoke(cli, ['export', '--help']).exit_code == 0")
    assert _loaded_after(stmt) == []


def test_quantize_modules_import_lazily():
    assert _loaded_after("import toolchain.quantize, toolchain.precision.calibration, toolchain.parity") == []


def test_importing_engines_leaves_cudas_work_queues_as_the_process_has_them():
    """engines does not set CUDA_DEVICE_MAX_CONNECTIONS: 32 queues did not keep the push at engine speed on an H100
    (4 of 10 pushers slow with 32, 0 of 10 with CUDA's 8 in one call, docs/PUSH.md), so the process's choice stands."""
    import os

    code = "import os, engines; print(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'))"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert got.stdout.strip() == "None"
