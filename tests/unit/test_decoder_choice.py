"""Which decoder a run gets (engines.video.pipeline): NVDEC by default on a GPU engine that takes device arrays,
PyAV on the host otherwise; a run with images reads them on the CPU (NVDEC decodes video only), its videos with
them (said as a warning), while an explicit nvdec with an image is refused."""

from __future__ import annotations

import logging

import pytest

from engines.errors import UsageProblem
from engines.video.pipeline import _cpu_only, _images_on_the_cpu, _pick_decoder


class _Engine:
    def __init__(self, device, host_only=False):
        self.device, self.host_arrays_only = device, host_only


@pytest.mark.parametrize("device, host_only, asked, want", [
    ("cuda:0", False, "auto", "nvdec"), ("cpu", False, "auto", "pyav"), ("cuda:0", True, "auto", "pyav"),
    ("cuda:0", False, "pyav", "pyav"), ("cuda:0", False, "nvdec", "nvdec"),
])
def test_the_default_decoder_follows_the_engine(device, host_only, asked, want):
    assert _pick_decoder(_Engine(device, host_only), asked) == want


def test_nvdec_on_a_cpu_engine_is_refused():
    with pytest.raises(UsageProblem, match="feeds a GPU engine"):
        _pick_decoder(_Engine("cpu"), "nvdec")


def test_images_on_a_gpu_engine_are_read_on_the_cpu_and_a_video_among_them_is_said(caplog):
    gpu = _Engine("cuda:0")
    assert _images_on_the_cpu("auto", "nvdec", ["a.jpg", "b.png"], gpu) == "pyav"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with caplog.at_level(logging.WARNING, logger="trtc"):
        assert _images_on_the_cpu("auto", "nvdec", ["a.jpg", "clip.mp4"], gpu) == "pyav"
    assert "1 video source(s) are decoded there too" in caplog.text and "cuda:0" in caplog.text
    assert _images_on_the_cpu("auto", "nvdec", ["clip.mp4"], gpu) == "nvdec"
    assert _images_on_the_cpu("nvdec", "nvdec", ["a.jpg"], gpu) == "nvdec"
    with pytest.raises(UsageProblem, match="a.jpg is an image"):
        _cpu_only("nvdec", ["a.jpg"], "auto")
