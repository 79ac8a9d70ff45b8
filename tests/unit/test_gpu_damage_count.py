"""The GPU path counts packets in against frames out, as the CPU path does: a packet NVDEC took without giving a
frame for it (after its flush) is damage. NVDEC itself runs in tests/gpu/test_damage_gpu.py; here stand-in decoders
that drop pictures silently are fed real packets (PyAV's demuxer and Annex B filter) or a recording demuxer."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.skipif(not importlib.util.find_spec("av"), reason="needs PyAV")


def _dropping_nvdec(drop_every: int):
    """PyNvVideoCodec's core decoder as far as feed_pass uses it: one frame per packet with data, except every
    ``drop_every``-th packet, which gives none and raises nothing (as NVDEC's parser drops a picture it cannot
    decode)."""

    class Frame:
        def __init__(self, pts):
            self.pts = pts

        def getPTS(self):  # noqa: N802 - PyNvVideoCodec's name
            return self.pts

    class Dec:
        n = 0

        def Decode(self, pkt):  # noqa: N802
            if not pkt.bsl:
                return []
            Dec.n += 1
            return [] if drop_every and Dec.n % drop_every == 0 else [Frame(pkt.pts)]

    class PacketData:
        bsl, bsl_data, pts, decode_flag = 0, 0, 0, 0

    return NS(cudaVideoCodec=NS(H264=4, HEVC=8), cudaVideoChromaFormat=NS(__members__={"YUV420": 1}),
              DisplayDecodeLatencyType=NS(NATIVE=0, LOW=1, ZERO=2), VideoPacketFlag=NS(ENDOFPICTURE=1),
              GetDecoderCaps=lambda **kw: {"supported": True}, CreateDecoder=lambda **kw: Dec(),
              PacketData=PacketData)


@pytest.fixture(scope="module")
def hevc_clip(tmp_path_factory, bikes):
    from tests.damage import make_clips

    return make_clips(bikes, tmp_path_factory.mktemp("gpu-damage"))["hevc"]


@pytest.mark.parametrize("drop_every", [0, 8])
def test_fed_nvdec_counts_packets_that_gave_no_frame(hevc_clip, monkeypatch, drop_every):
    import av

    from engines.video import nvdec_feed
    from engines.video.sources import NvdecSource

    clip = hevc_clip
    monkeypatch.setattr(nvdec_feed, "_synchronize", lambda ptr: None)
    src = NvdecSource(str(clip), live=False)
    got = []
    with av.open(str(clip)) as c:
        nvdec_feed.feed_pass(src, _dropping_nvdec(drop_every), 0, lambda *a: got.append(a[0]), 0, c,
                             c.streams.video[0])
    dropped = 48 // drop_every if drop_every else 0
    assert len(got) == 48 - dropped and src.lost == src.damaged == dropped


def test_packet_loop_counts_packets_that_gave_no_frame(monkeypatch, tmp_path):
    from engines.video.sources import NvdecSource
    from tests.unit.test_gpu_ordering import _fake_clip

    for per_packet, lost in ((1, 0), (0, 5)):
        _log, clip = _fake_clip(monkeypatch, tmp_path, packets=5, frames_per_packet=per_packet)
        monkeypatch.setattr("engines.video.sources._synchronize", lambda ptr: None)
        src = NvdecSource(str(clip))
        got = []
        src.run(1, lambda *a: got.append(a[0]))
        assert len(got) == 5 * per_packet and src.lost == src.damaged == lost


def test_the_problem_says_which_packets_gave_no_frame():
    from engines.video.bitstream import Audit, file_damage

    audit = Audit(packets=48, damaged=2, first=(3, "x"), checked=True)
    add, why = file_damage(0, set(), audit, 0, lost=4)
    assert add == 0 and why == "4 packet(s) gave no frame (NVDEC dropped the picture)"  # already counted: not added
    assert file_damage(0, set(), Audit(packets=48, checked=True), 0, lost=0) == (0, "")
