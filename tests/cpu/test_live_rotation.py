"""Rotation metadata on live sources: a connection's frames are turned as its first frame says (an H.264 display
orientation SEI, which RTP carries, or an MP4 track matrix), read again at every connection, and a camera whose new
connection turns otherwise is said with a ``rotated`` event. The clips are bikes.mp4 turned by numpy and tagged by
FFmpeg's own tools through PyAV (tests/clips.turned_clip), so the reference - the upright clip's top-1 from the real
Lite0 - shares nothing with trtc's reading of the metadata.

The GPU path's reader (NVDEC fed by PyAV's demuxer) reads the turn from the connection's first key frame, decoded
once on the CPU (``TurnProbe``): checked here on the real packets, and end to end on a GPU by
tests/gpu/test_greyscale_rotation_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.clips import turned_clip
from tests.conftest import needs_export

pytestmark = needs_export
FRAMES = 24  # about 1 s per connection at 25 fps


@pytest.fixture(scope="module")
def live_clips(tmp_path_factory, bikes):
    folder = tmp_path_factory.mktemp("live-rotated")
    return {name: turned_clip(bikes, folder / f"{name}.mp4", cw, tag, FRAMES)
            for name, (cw, tag) in {"upright": (0, None), "sei90": (90, "sei"), "sei270": (270, "sei"),
                                    "mp4-180": (180, "container"), "bare90": (90, None)}.items()}


def _probe(path, rotate="auto", src=None):
    """TurnProbe on ``path``'s real packets (PyAV's demuxer, as the GPU path's live reader feeds NVDEC)."""
    import av

    from engines.video.nvdec_feed import TurnProbe
    from engines.video.source_base import SourceInfo
    from engines.video.sources import NvdecSource

    src = src or NvdecSource("cam", live=True, rotate=rotate)
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        src.info = SourceInfo("cam", "h264", stream.width, stream.height, 25.0, None, None)
        probe = TurnProbe(src, stream)
        for n, packet in enumerate(c.demux(stream)):
            probe.packet(packet)
            if not probe.pending:
                break
        assert n == 0, "the first packet is the key frame that says"
    return src


@pytest.mark.parametrize("name, rotate, want", [
    ("sei90", "auto", {"degrees": 270, "mirrored": False, "from": "metadata"}),
    ("sei270", "auto", {"degrees": 90, "mirrored": False, "from": "metadata"}),
    ("mp4-180", "auto", {"degrees": 180, "mirrored": False, "from": "metadata"}),
    ("upright", "auto", {"degrees": 0, "mirrored": False, "from": "none"}),
    ("bare90", "90", {"degrees": 90, "mirrored": False, "from": "--rotate"}),
    ("sei90", "0", {"degrees": 0, "mirrored": False, "from": "--rotate"}),
])
def test_gpu_reader_reads_the_turn_from_the_first_key_frame(live_clips, name, rotate, want):
    """The clockwise turn that undoes each clip's stored turn, from the first key frame, before NVDEC sees it;
    recorded in the source's info (a new info object: another thread may hold the old one)."""
    src = _probe(live_clips[name], rotate)
    assert src.turn.to_dict() == want and src.info.rotation == want


def test_a_new_connection_that_turns_otherwise_is_a_rotated_event(live_clips):
    """Three connections of one live source: the same turn twice says nothing, a changed one says ``rotated``."""
    from engines.video.sources import NvdecSource

    events = []
    src = NvdecSource("cam", live=True)
    src.on_event = events.append
    for name in ("sei90", "sei90", "sei270"):
        _probe(live_clips[name], src=src)
    assert [(e.event, e.extra) for e in events] == [
        ("rotated", {"rotation": {"degrees": 90, "mirrored": False, "from": "metadata"},
                     "previous": {"degrees": 270, "mirrored": False, "from": "metadata"}})]
    assert events[0].line() == ("cam: the new connection's frames are turned 90 degrees clockwise (its metadata); the "
                                "last connection's were turned 270 degrees clockwise (its metadata)")


def classify_reconnecting(rtsp, clips, first: str, second: str, engine, decoder: str):
    """One live source served ``first``, then (the server killed and started again on the same port) ``second``:
    (predictions of each connection by frame, events). The stream ends with each file; one reconnection."""
    import threading

    from engines.video import LiveOptions, SourceEvent, classify

    srv = rtsp.start(file=clips[first])
    swapped = threading.Event()
    preds: list[list] = [[], []]
    events = []
    items = iter(classify([srv.url], engine, batch=4, top_k=1, events=True, decoder=decoder,
                          live_options=LiveOptions(reconnect_for=20, policy="block", read_timeout=5)))
    try:
        for item in items:
            if not isinstance(item, SourceEvent):
                preds[swapped.is_set()].append(item)
                continue
            events.append(item)
            if item.event == "disconnected" and swapped.is_set():
                break  # the second file ended: the run is stopped (the generator closed below)
            if item.event == "disconnected":
                srv.kill()
                srv = rtsp.start(port=srv.port, file=clips[second])
                swapped.set()
    finally:
        items.close()
        srv.kill()
    return [{p.frame: p.indices[0] for p in part} for part in preds], events


def test_live_stream_turned_by_its_sei_and_again_after_it_changes(rtsp, live_clips, cpu_lite0):
    """gst-rtsp-server sends a clip stored turned 90 degrees with an orientation SEI, then - after a restart - one
    turned 270: each connection's frames give the upright clip's top-1 on >= 95% of frames, and the change is a
    ``rotated`` event between ``reconnected`` and the second connection's frames."""
    from engines.video import classify

    upright = {p.frame: p.indices[0] for p in classify([str(live_clips["upright"])], cpu_lite0, batch=4, top_k=1)}
    (one, two), events = classify_reconnecting(rtsp, live_clips, "sei90", "sei270", cpu_lite0, "pyav")
    assert len(one) >= FRAMES - 2 and len(two) >= FRAMES - 2, (len(one), len(two), events)
    for part in (one, two):
        first = min(part)
        agreement = np.mean([part[f] == upright[f - first] for f in part])
        assert agreement >= 0.95, agreement
    kinds = [e.event for e in events]
    assert kinds[kinds.index("reconnected") + 1] == "rotated", kinds
    turned = next(e for e in events if e.event == "rotated").extra
    assert turned["previous"]["degrees"] == 270 and turned["rotation"]["degrees"] == 90


def pushed_turns(engine, clip, n: int = 4) -> dict:
    """Frames of ``clip`` pushed upright, and stored turned counter-clockwise (numpy) with ``rotate=`` the clockwise
    turn back, as RGB and as NV12 (the upright frame's planes turned by numpy): the largest score difference from the
    upright push, per (format, rotate)."""
    import av

    from engines.video import FramePusher

    with av.open(str(clip)) as c:
        rgbs = [f.to_ndarray(format="rgb24") for _, f in zip(range(n), c.decode(video=0))]
    nv12s = [_nv12(rgb) for rgb in rgbs]
    got: dict = {}
    with FramePusher(engine, batch=4, top_k=3, on_lag="block") as pusher:
        for fmt, frames in (("RGB", rgbs), ("NV12", nv12s)):
            pusher.push_many(f"{fmt}-0", frames, format=fmt)
            for rotate in (90, 180, 270):
                turned = [_turn_nv12(f, rotate) if fmt == "NV12" else np.ascontiguousarray(np.rot90(f, rotate // 90))
                          for f in frames]
                pusher.push_many(f"{fmt}-{rotate}", turned, format=fmt, rotate=rotate)
        pusher.close()
        for p in pusher.results(timeout=0):
            got.setdefault(p.source, {})[p.frame] = np.array(p.scores)
    return {(s.split("-")[0], int(s.split("-")[1])): max(float(np.abs(v[f] - got[s.split("-")[0] + "-0"][f]).max())
                                                          for f in v) for s, v in got.items()}


def _nv12(rgb):
    """An NV12 surface of an RGB frame (BT.601 limited, chroma averaged over 2x2), computed here with numpy."""
    r, g, b = (rgb[..., i].astype(np.float64) for i in range(3))
    y = 16 + 0.257 * r + 0.504 * g + 0.098 * b
    u = 128 - 0.148 * r - 0.291 * g + 0.439 * b
    v = 128 + 0.439 * r - 0.368 * g - 0.071 * b
    h, w = y.shape
    sub = lambda a: a.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))  # noqa: E731
    uv = np.stack([sub(u), sub(v)], -1).reshape(h // 2, w)
    return np.clip(np.rint(np.concatenate([y, uv])), 0, 255).astype(np.uint8)


def _turn_nv12(surface, rotate):
    """An NV12 surface stored turned counter-clockwise by ``rotate``: each plane turned (chroma pairs kept whole)."""
    h = surface.shape[0] * 2 // 3
    y, uv = surface[:h], surface[h:].reshape(h // 2, -1, 2)
    k = rotate // 90
    return np.ascontiguousarray(np.concatenate([np.rot90(y, k), np.rot90(uv, k).reshape(-1, y.shape[0]
                                                                                       if k % 2 else y.shape[1])]))


def test_pushed_frames_turned_by_rotate(live_clips, cpu_lite0):
    """FramePusher(rotate=): a frame stored turned and pushed with the clockwise turn back classifies as the upright
    frame does (RGB and NV12; the same samples, so equal within float rounding)."""
    worst = pushed_turns(cpu_lite0, live_clips["upright"])
    assert len(worst) == 8 and max(worst.values()) < 1e-5, worst
