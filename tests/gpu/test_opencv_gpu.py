"""OpenCV dnn on CUDA (issue 15), for a GPU machine whose OpenCV was built with CUDA and cuDNN. PyPI's OpenCV
wheels never are: there this file checks the no-CUDA error instead and the CUDA tests skip, saying why."""

from __future__ import annotations

import pytest

from tests.conftest import _has, needs_quant

pytestmark = [pytest.mark.gpu, needs_quant, pytest.mark.skipif(not _has("cv2"), reason="needs OpenCV")]


def _status():
    from engines.opencv_engine import cuda_status

    return cuda_status()


def test_no_cuda_build_is_reported_on_a_gpu_machine(lite0_onnx):
    import engines

    status = _status()
    if status["dnn_cuda"]:
        pytest.skip("this OpenCV has a CUDA dnn backend")
    with pytest.raises(engines.EngineError) as err:
        engines.open_engine(f"opencv:{lite0_onnx[0]}", device="cuda:0")
    assert status["reason"] in err.value.reason and "WITH_CUDA=ON" in err.value.fix


@pytest.mark.parametrize("prefix", ["opencv", "opencv-fp16"])
def test_cuda_targets_agree_with_onnxruntime(lite0_onnx, photos, bikes, prefix):
    """DNN_TARGET_CUDA (FP32) and DNN_TARGET_CUDA_FP16 against ONNX Runtime's CUDA EP on the same FP32 file."""
    if not _status()["dnn_cuda"]:
        pytest.skip(f"OpenCV dnn has no CUDA here: {_status()['reason']}")
    from toolchain.validate import validate

    model = lite0_onnx[0]
    report = validate(str(model), [f"{prefix}:{model}"], [*map(str, photos), str(bikes)], device="cuda:0",
                      count=250)
    m = report.candidates[0].metrics
    assert m["top1_agreement"] >= (1.0 if prefix == "opencv" else 0.98), m
    assert m["max_abs_diff"] < (1e-2 if prefix == "opencv" else 0.5), m


def test_cuda_refuses_fp16_graphs_by_layer(lite0_fp16):
    if not _status()["dnn_cuda"]:
        pytest.skip(f"OpenCV dnn has no CUDA here: {_status()['reason']}")
    import engines

    with pytest.raises(engines.EngineError) as err:
        engines.open_engine(f"opencv:{lite0_fp16.output}", device="cuda:0")
    assert "layer " in err.value.reason, err.value.reason
