"""`trtc bench MODEL`'s engine rows without timing anything real: the ratios against the reference row and the
untuned row (hand-computed), the span loop's calls and waits, the options' refusals, and where the reference's
PyTorch model comes from. (The GPU figures: docs/BENCHMARKS.md.)"""

from __future__ import annotations

import types

import pytest

from engines.errors import UsageProblem
from toolchain.bench import SPAN, UNTUNED, BenchRow, input_mode, ratios, reference_mode, time_spans


def _row(model, backend, batch, img_s, role="engine", reference="r50 (fp16)"):
    r = BenchRow(model, "onnx", "fp16", batch, 10, 1.0, 1.0, 1.0, batch / img_s * 1000.0, 0.0, img_s,
                 backend=backend, role=role, reference=reference)
    r.img_s = img_s
    return r


def test_ratios_divide_by_the_reference_row_of_the_same_batch_and_the_untuned_row_of_the_same_model():
    rows = [_row("r50.fp16.onnx", "onnxruntime", 64, 20000.0), _row("r50.fp16.onnx", UNTUNED, 64, 13568.0),
            _row("r50.fp16.onnx", "onnxruntime", 8, 9000.0),
            _row("r50 (fp16)", "torch.compile (reduce-overhead)", 64, 25848.0, role="reference"),
            _row("r50 (fp16)", "torch.compile (reduce-overhead)", 8, 12000.0, role="reference"),
            _row("other.onnx", "onnxruntime", 64, 5000.0, reference=None)]
    ratios(rows)
    tuned64, untuned64, tuned8, ref64, ref8, other = rows
    assert tuned64.ratio_to_reference == 0.774  # 20000 / 25848 = 0.77375...
    assert untuned64.ratio_to_reference == 0.525  # 13568 / 25848 = 0.52491...
    assert tuned8.ratio_to_reference == 0.75  # 9000 / 12000: its own batch's reference, not batch 64's
    assert ref64.ratio_to_reference == 1.0 and ref8.ratio_to_reference == 1.0
    assert other.ratio_to_reference is None  # no reference: no ratio, not 0 and not 1
    assert tuned64.vs_untuned == 1.474  # 20000 / 13568 = 1.47406...
    assert tuned8.vs_untuned is None and untuned64.vs_untuned is None and ref64.vs_untuned is None


class _Clock:
    """Marks are call counts; a call's 'seconds' is 1 + its index, so the times say which calls they are."""

    def __init__(self):
        self.calls, self.waits = 0, []

    def mark(self):
        return self.calls

    def wait(self, mark):
        self.waits.append(mark)

    def seconds(self, a, b):
        assert b == a + 1  # one call between two marks
        return float(b)


def test_the_span_loop_times_each_call_and_waits_only_at_the_end_of_a_span():
    clock = _Clock()

    def call():
        clock.calls += 1

    times = time_spans(call, clock, warmup=3, iterations=SPAN + 5, duration=None)
    assert clock.calls == 3 + SPAN + 5
    assert times == [float(i) for i in range(4, 3 + SPAN + 5 + 1)]  # the warm-up calls are not timed
    assert clock.waits == [3, 3 + SPAN, 3 + SPAN + 5]  # after the warm-up, then once per span


def test_input_and_reference_modes(monkeypatch):
    monkeypatch.setattr("engines._deps.is_installed", lambda m: False)
    assert input_mode("auto", "cuda:0") == "host" and input_mode("auto", "cpu") == "host"
    assert reference_mode("auto", "cuda:0") is None and reference_mode("torch-eager", "cpu") == "torch-eager"
    with pytest.raises(UsageProblem, match="is not a GPU") as err:
        input_mode("device", "cpu")
    assert "--device cuda:0" in err.value.fix and "--input host" in err.value.fix
    monkeypatch.setattr("engines._gpu.gpus", lambda: {"devices": [], "reason": "nvidia-smi not found"})
    with pytest.raises(UsageProblem, match="has no NVIDIA GPU") as err:
        input_mode("device", "cuda:0")
    assert "--input host" in err.value.fix
    monkeypatch.setattr("engines._gpu.gpus", lambda: {"devices": [{"index": 0, "name": "NVIDIA H200"}]})
    with pytest.raises(UsageProblem, match="CuPy, which is not installed") as err:
        input_mode("device", "cuda:0")
    assert "trtc[gpu]" in err.value.fix
    monkeypatch.setattr("engines._deps.is_installed", lambda m: True)
    assert input_mode("auto", "cuda:0") == "device" and input_mode("device", "cuda:0") == "device"
    assert reference_mode("auto", "cuda:0") == "torch-compile" and reference_mode("auto", "cpu") is None


def _ref(kind="onnx", source=None, classes=1000, manifest=True):
    m = types.SimpleNamespace(model={"source": source, "num_classes": classes}) if manifest else None
    return types.SimpleNamespace(kind=kind, manifest=m, precision="fp16")


def test_the_reference_source_is_the_manifests_or_a_pt2_beside_the_model(tmp_path):
    from toolchain.bench_reference import ReferenceUnavailable, reference_source

    model = tmp_path / "r50.fp16.onnx"
    assert reference_source(str(model), _ref(source="pretrained:efficientnet-lite0")) == \
        ("pretrained:efficientnet-lite0", None)
    assert reference_source(str(model), _ref(source="torchvision:resnet50", classes=10)) == \
        ("torchvision:resnet50", 10)
    assert reference_source("pretrained:efficientnet-lite0", _ref(kind="pytorch", manifest=False))[0] == \
        "pretrained:efficientnet-lite0"
    with pytest.raises(ReferenceUnavailable, match="has no trtc manifest") as err:
        reference_source(str(model), _ref(manifest=False))
    assert "r50.fp16.pt2" in err.value.fix
    foreign = tmp_path / "foreign.onnx"
    foreign.write_bytes(b"\x08\x07")
    with pytest.raises(ReferenceUnavailable, match="is not a PyTorch model here"):
        reference_source(str(model), _ref(source=str(foreign)))  # an adopted ONNX: its source is itself
    (tmp_path / "r50.fp16.pt2").write_bytes(b"PK")
    assert reference_source(str(model), _ref(source=str(foreign))) == (str(tmp_path / "r50.fp16.pt2"), None)
    assert reference_source(f"opencv:{model}", _ref(manifest=False))[0] == str(tmp_path / "r50.fp16.pt2")


@pytest.mark.parametrize("preferred, strides", [("NHWC", (3 * 4 * 5 * 4, 4, 5 * 3 * 4, 3 * 4)),
                                                ("NCHW", (3 * 4 * 5 * 4, 4 * 5 * 4, 5 * 4, 4)),
                                                (None, (3 * 4 * 5 * 4, 4 * 5 * 4, 5 * 4, 4))])
def test_device_input_is_laid_out_as_the_engine_prefers(monkeypatch, preferred, strides):
    """Device mode gives the compiled PyTorch engine (preferred_layout NHWC) an (N, C, H, W) view of channels_last
    memory holding the same values, as a pipeline writing its input for that engine would; other engines get
    C-contiguous NCHW. The row says which (layout)."""
    import numpy as np

    from tests import fake_cupy
    from toolchain import bench

    fake_cupy.install(monkeypatch)
    seen = []
    engine = types.SimpleNamespace(device="cuda:0", device_id=0, infer=lambda a, stream=None: seen.append(a))
    if preferred:
        engine.preferred_layout = preferred
    runner = types.SimpleNamespace(engine=engine, fn=None)
    plan = types.SimpleNamespace(input="device")
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    call, _clock, where, layout = bench._call(runner, types.SimpleNamespace(kind="torch"), x, plan)
    call()
    assert where == "device" and layout == ("NHWC" if preferred == "NHWC" else "NCHW")
    assert seen[0].shape == x.shape and seen[0].strides == strides
    np.testing.assert_array_equal(seen[0].host, x)  # the same values, element for element
