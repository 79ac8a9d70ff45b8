import json

from click.testing import CliRunner

from tests.conftest import HAS_EXPORT
from toolchain.cli import cli


def test_doctor_json_describes_this_machine():
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report) == {"system", "packages", "gpu", "features"}
    assert report["system"]["python"].count(".") == 2
    for name in ("torch", "onnx", "onnxruntime", "tensorrt", "tensorrt_rtx", "cupy", "PyNvVideoCodec"):
        assert name in report["packages"]
    features = {f["feature"]: f for f in report["features"]}
    export = features["trtc export (PyTorch -> ONNX)"]
    assert export["ok"] is HAS_EXPORT
    for f in report["features"]:  # every "no" says why and how to fix it
        assert f["ok"] or (f["reason"] and f["fix"]), f
    if HAS_EXPORT:
        assert "CPUExecutionProvider" in report["packages"]["onnxruntime"]["providers"]
    if not report["gpu"]["devices"]:
        assert not features["NVDEC video decode (PyNvVideoCodec)"]["ok"]


def test_doctor_table():
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 0
    assert "what trtc can do here" in result.output and "trtc export" in result.output
