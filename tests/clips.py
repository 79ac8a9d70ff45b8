"""Test clips re-encoded from real footage with PyAV's bundled encoders (no ffmpeg binary needed)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path


def encode_clip(src: Path, dst: Path, codec: str, size: tuple[int, int], frames: int | None = None,
                fmt: str | None = None, options: dict | None = None) -> Path:
    """The first ``frames`` frames of ``src`` (all without it) scaled to ``size`` (width, height), yuv420p, encoded
    with ``codec`` into ``dst`` (container ``fmt``, else from the suffix) at 25 fps. Each frame carries its pts and
    its time base: without the time base PyAV muxed every packet at pts 0 (the SimpleDecoder then failed at frame
    1, on an H100)."""
    import av

    with av.open(str(src)) as i, av.open(str(dst), "w", format=fmt) as o:
        s = o.add_stream(codec, rate=25)
        s.width, s.height, s.pix_fmt = size[0], size[1], "yuv420p"
        if options:
            s.options = options
        for n, frame in enumerate(i.decode(video=0)):
            if frames is not None and n >= frames:
                break
            f = frame.reformat(width=size[0], height=size[1], format="yuv420p")
            f.pts, f.time_base = n, Fraction(1, 25)
            for p in s.encode(f):
                o.mux(p)
        for p in s.encode():
            o.mux(p)
    return dst


def remux_ts(src: Path, out: Path) -> Path:
    """``src``'s video stream copied into MPEG-TS (no re-encoding): the same pictures in a container the GPU path
    reads with its packet loop, packets framed as an Annex B byte stream."""
    import av

    with av.open(str(src)) as i, av.open(str(out), "w", format="mpegts") as o:
        s = i.streams.video[0]
        t = o.add_stream_from_template(s)
        for p in i.demux(s):
            if p.dts is not None:
                p.stream = t
                o.mux(p)
    return out


def turned_clip(src: Path, dst: Path, clockwise: int, tag: str | None, frames: int, size=(320, 180),
                qp: int = 0) -> Path:
    """``src``'s first ``frames`` frames scaled to ``size`` (the upright picture), stored turned ``clockwise`` degrees
    (numpy's rot90 of the decoded RGB, so nothing of trtc's turning is used), H.264 at ``qp`` (0: lossless, which
    x264 writes in the High 4:4:4 Predictive profile that NVDEC does not decode; give NVDEC a qp above 0), with the
    rotation ``tag`` that shows them upright again: "container" (the MP4 track matrix, set through PyAV's
    ``set_display_rotation``), "sei" (an H.264 display orientation SEI in the first access unit, inserted by FFmpeg's
    ``h264_metadata`` bitstream filter), or None (no metadata). Checked: PyAV's own reading of the first frame
    (``VideoFrame.rotation``, counter-clockwise degrees) says the turn back, or 0 untagged."""
    import av
    import numpy as np

    plain = dst.with_suffix(".plain.mp4") if tag == "sei" else dst
    with av.open(str(src)) as i, av.open(str(plain), "w") as o:
        s = o.add_stream("libx264", rate=25)
        turned = clockwise % 180 == 90
        s.width, s.height = (size[1], size[0]) if turned else size
        s.pix_fmt, s.options = "yuv420p", {"qp": str(qp), "preset": "ultrafast", "bf": "0"}
        if tag == "container":
            s.set_display_rotation(clockwise % 360)  # counter-clockwise degrees: turns the stored frames back
        for n, frame in enumerate(i.decode(video=0)):
            if n >= frames:
                break
            rgb = frame.to_ndarray(width=size[0], height=size[1], format="rgb24")
            f = av.VideoFrame.from_ndarray(np.ascontiguousarray(np.rot90(rgb, -clockwise // 90)), format="rgb24")
            f.pts, f.time_base = n, Fraction(1, 25)
            for p in s.encode(f):
                o.mux(p)
        for p in s.encode():
            o.mux(p)
    if tag == "sei":
        _insert_orientation_sei(plain, dst, clockwise % 360)
        plain.unlink()
    with av.open(str(dst)) as c:
        shown = next(c.decode(video=0)).rotation
    assert shown % 360 == (clockwise % 360 if tag else 0), (dst, tag, shown)
    return dst


def _insert_orientation_sei(src: Path, dst: Path, anticlockwise: int) -> None:
    """``src``'s H.264 stream copied into ``dst`` with a display orientation SEI (FFmpeg's ``h264_metadata``)."""
    import av
    from av.bitstream import BitStreamFilterContext

    with av.open(str(src)) as i, av.open(str(dst), "w") as o:
        ins = i.streams.video[0]
        out = o.add_stream_from_template(ins)
        bsf = BitStreamFilterContext(f"h264_metadata=display_orientation=insert:rotate={anticlockwise}", ins, out)
        for packet in i.demux(ins):
            for p in bsf.filter(packet if packet.size else None):
                p.stream = out
                o.mux(p)
