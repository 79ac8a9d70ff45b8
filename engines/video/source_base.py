"""What every video source module shares: the error a source raises, what a source is, its frames' times, and
the colour space a PyAV stream declares. Nothing here imports another module of this package, so the source
modules (:mod:`.sources`, :mod:`.live`, :mod:`.nvdec_feed`) all import it and none imports the others in a circle
(:mod:`.credentials`, which it imports, imports none of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._deps import require
from ..errors import TrtcError
from ..preprocess import ColorSpace
from .credentials import redact

# AVColorSpace / AVColorRange values (libavutil/pixfmt.h) as PyAV reports them
_AV_MATRIX = {1: "bt709", 5: "bt601", 6: "bt601", 9: "bt2020", 10: "bt2020"}
_AV_FULL_RANGE = 2
# characters of a decoder's or demuxer's own message kept in a source's (FFmpeg and PyNvVideoCodec can say a lot)
DETAIL_CHARS = 300
# packets in a row NVDEC may refuse before a source is given up (one refused packet is skipped and counted)
MAX_REJECTED_PACKETS = 100



class SourceError(TrtcError):
    """One source cannot be opened or stopped early; ``source`` names it."""

    def __init__(self, source: str, reason: str, fix: str | None = None):
        reason, fix = redact(reason), (redact(fix) if fix else fix)  # no camera's user info in a message
        super().__init__(f"{source}: {reason}", fix)
        self.source = source
        self.detail = reason  # the reason without the source's name


@dataclass
class SourceInfo:
    name: str
    codec: str
    width: int
    height: int
    fps: float | None
    frames: int | None  # from the container, when it says
    colorspace: ColorSpace
    rotation: dict | None = None  # how the frames were turned to be shown (Orientation.to_dict), once decoding began



def _colorspace_from_av(frame_or_stream, height: int, override: str | None) -> ColorSpace:
    if override and override != "auto":
        return ColorSpace.parse(override, height)
    cs = getattr(frame_or_stream, "colorspace", None)
    rng = getattr(frame_or_stream, "color_range", None)
    base = ColorSpace.parse(None, height)
    matrix = _AV_MATRIX.get(int(cs) if cs is not None else 2, base.matrix)
    full = rng is not None and int(rng) == _AV_FULL_RANGE
    return ColorSpace(matrix, "full" if full else "limited")



class Timeline:
    """A decoded frame's time from the stream's own timestamps: pts x time base, in seconds. A frame without a pts
    (the first frame of an RTSP session, frames of some damaged streams) gets the previous one's plus one frame
    period (the first: the stream's start, else 0). For a live stream, ``missing`` counts the frames that never
    arrived: the frames the span of timestamps seen holds at the frame rate, less the frames seen (robust to
    servers that stamp frames out of display order)."""

    def __init__(self, stream, live: bool):
        self.tb = stream.time_base
        rate = stream.average_rate or stream.guessed_rate
        self.step = (1 / (rate * self.tb)) if (rate and self.tb) else None  # one frame period in pts units
        self.start = stream.start_time if (stream.start_time is not None and not live) else 0
        self.last = None
        self.live = live
        self.low = self.high = None  # the span of timestamps seen
        self.seen = 0
        self.first = True

    @property
    def missing(self) -> int:
        if not self.live or not self.step or self.low is None:
            return 0
        return max(0, int(round((self.high - self.low) / self.step)) + 1 - self.seen)

    def stamp(self, frame) -> tuple[int | None, float | None]:
        self.first = False
        tb = frame.time_base or self.tb
        pts = frame.pts
        if pts is None:
            if self.last is None:
                pts = self.start
            elif self.step:
                pts = int(round(self.last + self.step))
        if pts is not None:
            self.last = pts
            self.seen += 1
            self.low = pts if self.low is None else min(self.low, pts)
            self.high = pts if self.high is None else max(self.high, pts)
        if pts is None or tb is None:
            return pts, None
        t = float(pts * tb)
        return pts, (t if math.isfinite(t) else None)



def _synchronize(stream_ptr: int) -> None:
    cp = require("cupy", "The GPU video pipeline")
    cp.cuda.runtime.streamSynchronize(stream_ptr)


# codecs whose every packet (with data, not marked to be discarded) is one picture the decoder gives out after its
# flush: for these, a packet in without a frame out is damage. Left out: codecs with packets that legitimately give no
# frame (VP8's hidden alt-ref frames, MPEG-4 part 2's packed B-frames); their damage is what the decoder reports.
ONE_FRAME_PER_PACKET = frozenset({"h264", "hevc", "av1", "vp9"})


class FramesOut:
    """The frames a decoder gave out for one pass over a file, against the packets it was given: :meth:`lost` is the
    number of packets that gave no frame (the decoder dropped a picture it could not decode, as FFmpeg's HEVC
    decoder does without raising or flagging anything)."""

    def __init__(self):
        self.frames = 0
        self.packets = 0  # where the caller counts here the packets it gave the decoder
        self.interlaced = False

    def add(self, frame) -> None:
        self.frames += 1
        if not self.interlaced and getattr(frame, "interlaced_frame", False):
            self.interlaced = True

    def lost(self, codec: str, packets: int) -> int:
        if codec not in ONE_FRAME_PER_PACKET:
            return 0
        # an interlaced H.264 stream may carry the two fields of a frame in two packets (one frame out)
        per_frame = 2 if self.interlaced and codec == "h264" else 1
        return max(0, packets - per_frame * self.frames)


def count_lost(source, lost: int) -> None:
    """``lost`` packets of ``source``'s file that NVDEC took without giving a frame for them (after its flush):
    damage, as on the CPU path (NVDEC's parser drops a picture it cannot decode without an error)."""
    source.lost += lost
    source.damaged += lost
