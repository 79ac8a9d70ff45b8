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
