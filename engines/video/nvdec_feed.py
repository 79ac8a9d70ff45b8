"""NVDEC fed by PyAV's demuxer: the GPU path's reader for URLs and live sources.

PyNvVideoCodec's own demuxer takes no timeouts and no RTSP options (a silent server hangs it). Here PyAV (FFmpeg)
demuxes, with the open and read timeouts and the RTSP transport of :class:`~engines.video.live.LiveOptions`, and
each compressed packet goes to PyNvVideoCodec's core decoder as a ``PacketData`` pointing at the packet's bytes.
NVDEC's parser reads H.264/HEVC as an Annex B byte stream, so those packets pass FFmpeg's ``*_mp4toannexb``
bitstream filter first (a no-op for streams that are Annex B already, as RTSP's are; for MP4-style streams it
writes start codes and puts the parameter sets before key frames). A packet the decoder refuses is skipped and
counted, and so is a packet the demuxer flags as corrupt (NVDEC conceals damage in what it decodes and
PyNvVideoCodec 2.2.4 hands no decode status to Python: this is the damage the GPU path can see); the stream goes
on. A live source reconnects as on the CPU path (:class:`~engines.video.live.LiveSource`).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from .._deps import require
from ..errors import UsageProblem, first_line
from .live import LagClock, Liveness, NoFrames, network_error, open_url, watched_packets
from .orientation import Orientation, frame_orientation
from .source_base import (DETAIL_CHARS, MAX_REJECTED_PACKETS, FramesOut, SourceError, SourceInfo, Timeline,
                          _colorspace_from_av, _synchronize, count_lost)

# PyAV codec name -> PyNvVideoCodec's cudaVideoCodec member
AV_TO_NVDEC = {"h264": "H264", "hevc": "HEVC", "av1": "AV1", "vp9": "VP9", "vp8": "VP8", "mpeg2video": "MPEG2",
               "mpeg1video": "MPEG1", "mpeg4": "MPEG4", "vc1": "VC1", "mjpeg": "JPEG"}
ANNEXB_FILTERS = {"h264": "h264_mp4toannexb", "hevc": "hevc_mp4toannexb"}
# pixel format -> (chroma "420"/"422"/"444", bit depth)
_PIXFMT = {"yuv420p": ("420", 8), "yuvj420p": ("420", 8), "nv12": ("420", 8), "yuv420p10le": ("420", 10),
           "p010le": ("420", 10), "yuv420p12le": ("420", 12), "yuv422p": ("422", 8), "yuvj422p": ("422", 8),
           "yuv422p10le": ("422", 10), "yuv444p": ("444", 8), "yuvj444p": ("444", 8), "yuv444p10le": ("444", 10),
           "gray": ("400", 8)}


class AnnexB:
    """Compressed packets of one stream in the form NVDEC's parser reads: (numpy bytes, pts) per packet."""

    def __init__(self, stream):
        name = stream.codec_context.name
        self.bsf = None
        if name in ANNEXB_FILTERS:
            from av.bitstream import BitStreamFilterContext

            self.bsf = BitStreamFilterContext(ANNEXB_FILTERS[name], stream)

    def convert(self, packet) -> list:
        out = self.bsf.filter(packet) if self.bsf is not None else [packet]
        return [(np.frombuffer(bytes(p), np.uint8), p.pts if p.pts is not None else p.dts) for p in out if p.size]


def stream_format(stream) -> tuple[str, str, int]:
    """(NVDEC codec member name, chroma "420"/"422"/"444", bit depth) of a PyAV video stream; a SourceError-ready
    text in the first place when NVDEC has no such codec."""
    cc = stream.codec_context
    codec = AV_TO_NVDEC.get(cc.name)
    fmt = cc.pix_fmt or (cc.format.name if cc.format is not None else None) or "yuv420p"
    chroma, depth = _PIXFMT.get(fmt, ("420", 8))
    return codec, chroma, depth


def open_stream(src, av, liveness=None):
    """Open ``src.name`` with PyAV and the source's network options; returns (container, stream). Raises
    SourceError worded for a person (see :func:`engines.video.sources.open_url`)."""
    container = open_url(av, src.name, src.options, liveness)
    if not container.streams.video:
        container.close()
        raise SourceError(src.name, "has no video stream", "check the URL")
    return container, container.streams.video[0]


def make_decoder(src, nvc, stream, stream_ptr: int):
    """Check NVDEC's capabilities for the stream, set ``src.info`` from it (replaced at every connection), and
    create the core decoder on ``stream_ptr``."""
    codec_member, chroma, depth = stream_format(stream)
    cc = stream.codec_context
    if codec_member is None:
        raise SourceError(src.name, f"NVDEC does not decode {cc.name}", "use --device cpu for this source")
    codec = getattr(nvc.cudaVideoCodec, codec_member)
    members = getattr(nvc.cudaVideoChromaFormat, "__members__", {})
    chroma_enum = members.get(chroma) or members.get(f"YUV{chroma}") or members.get("Monochrome")
    if src.live and (cc.width <= 0 or cc.height <= 0):  # the connection opened but no picture told its size: no
        # video came (a camera that answers RTSP without sending any); the liveness rules judge it, as on the CPU
        raise NoFrames("the connection gave no video (its picture size is unknown)",
                       "check the camera: it answers but sends no video")
    src._check_caps(nvc, codec, chroma_enum, depth, cc.width, cc.height, cc.name)
    fps = float(stream.average_rate) if stream.average_rate else None
    # each connection is a new stream: a camera may come back at another size, codec or colour space, and the
    # preprocessing plans (keyed on these) follow the new info; an info another thread holds is replaced, not changed
    src.info = SourceInfo(src.name, cc.name, cc.width, cc.height, fps, None,
                          _colorspace_from_av(cc, cc.height, src.override))
    src.time_base = stream.time_base
    return src._core_decoder(nvc, codec, stream_ptr)


class TurnProbe:
    """How one connection's frames are turned on the GPU path, read as the CPU path reads it: ``rotate`` "auto" decodes
    the connection's first key frame once on the CPU (PyAV, with the stream's own codec parameters), whose display
    matrix is the container's (an MP4's track matrix) or the bitstream's (an H.264/HEVC display orientation SEI);
    a number replaces it. Known before that key frame reaches NVDEC, so no frame NVDEC gives is planned unturned;
    the preprocessing plan follows the source's ``turn`` (a connection that turns differently is re-planned)."""

    def __init__(self, src, stream):
        self.src, self.stream = src, stream
        self.pending = src.rotate == "auto"
        if not self.pending:
            self._set(Orientation.clockwise(int(src.rotate)))
        else:
            src.turn = Orientation()  # until the first key frame says

    def packet(self, packet) -> None:
        """Look at a packet before NVDEC gets it; the first key frame that decodes on the CPU settles the turn."""
        if not self.pending or packet is None or not packet.is_keyframe:
            return
        cc = self.stream.codec_context
        try:
            if not cc.is_open:
                cc.thread_count = 1  # one picture: no frame threads to start
            frames = cc.decode(packet) or cc.decode(None)
        except Exception:  # noqa: BLE001 - a key frame the CPU decoder cannot read: the next one is tried
            frames = []
        finally:
            cc.flush_buffers()
        if frames:
            try:
                turn = frame_orientation(frames[0])
            except UsageProblem as exc:  # a matrix that is no whole-pixel turn
                raise SourceError(self.src.name, exc.reason, exc.fix) from None
            self._set(turn)

    def _set(self, turn) -> None:
        self.pending = False
        self.src._turned(turn)
        self.src.info = replace(self.src.info, rotation=turn.to_dict())  # replaced, not changed: others may read it


class _Lost(Exception):
    """The demuxer failed mid-stream; ``__cause__`` says why."""


class _Feed:
    """One connection's (or pass's) NVDEC decoder and what it keeps between packets: the pts -> feed time of
    packets whose frames have not come out, the run of refused packets, the stream's clock and, for a live
    source, its liveness and lag clock."""

    def __init__(self, src, nvc, stream, stream_ptr: int, on_frame, lv: Liveness | None):
        self.src, self.nvc, self.stream, self.on_frame, self.lv = src, nvc, stream, on_frame, lv
        self.dec = make_decoder(src, nvc, stream, stream_ptr)
        self.clock = Timeline(stream, live=src.live)
        self.lags = LagClock() if lv is not None else None
        self.low = src.latency in ("low", "zero")
        self.fed: dict = {}
        self.rejected = 0
        self.given = self.refused = 0  # packets with data NVDEC took / refused
        self.frames = 0  # frames NVDEC gave out

    def decode(self, data, pts, interrupted: bool):
        """NVDEC's frames for one Annex B chunk (``data`` None: flush), or None for a packet it refused (skipped
        and counted as damage, unless an interrupted read cut it short); too many refusals in a row end the source."""
        nvc, src = self.nvc, self.src
        pkt = nvc.PacketData()
        if data is not None:
            pkt.bsl_data, pkt.bsl = int(data.ctypes.data), int(data.size)
            self.given += 1
            pkt.pts = int(pts) if pts is not None else 0
            if self.low:
                pkt.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
            self.fed[pkt.pts] = time.perf_counter()
        else:
            pkt.bsl = 0
        try:
            frames = self.dec.Decode(pkt)
            self.rejected = 0
            return frames
        except Exception as exc:  # noqa: BLE001 - a damaged packet: skipped and counted
            self.refused += data is not None
            if interrupted:  # cut short by the watchdog's read timeout, not damaged in the stream
                return None
            src.damaged += 1
            if self.lv is not None:  # a live stream's damage is said while the run goes on
                src._damage(1)
            self.rejected += 1
            if self.rejected >= MAX_REJECTED_PACKETS:
                raise SourceError(src.name, f"NVDEC refused {self.rejected} packets in a row "
                                  f"({first_line(exc, DETAIL_CHARS)})", "check the stream; or --device cpu") from exc
            return None
        finally:
            del pkt

    def deliver(self, frames, index: int):
        """Each frame to ``on_frame`` (a live frame past --max-lag is skipped first); the next index, or None when
        ``on_frame`` asked to stop. Keeps no reference to a frame."""
        src, lv = self.src, self.lv
        now = time.perf_counter()
        self.frames += len(frames)
        for i in range(len(frames)):
            frame = frames[i]
            pts, t = self.clock.stamp(_PtsOnly(frame.getPTS(), self.stream.time_base))
            src.decoded += 1
            if lv is not None:
                src._frame_arrived(lv)
                received = time.time()
                src.captured = self.lags.captured(t, received)  # read by on_frame for the lag of the result
                if not src._keep_frame(src.captured, received):  # decoded, not preprocessed
                    del frame
                    index += 1
                    continue
            go = self.on_frame(index, pts, t, frame, self.fed.pop(pts, now))
            del frame
            index += 1
            if go is False:
                return None
        if len(self.fed) > 64:  # packets whose frames never came out (damaged data): forget them
            for k in sorted(self.fed)[:-64]:
                self.fed.pop(k, None)
        return index


def feed_pass(src, nvc, stream_ptr: int, on_frame, index: int, container, stream, lv: Liveness | None = None):
    """Demux ``stream`` with PyAV, decode with NVDEC, call ``on_frame(index, pts, seconds, frame, fed_at)`` per
    frame. Returns the next index, or None when ``on_frame`` asked to stop; raises _Lost when reading fails.
    ``lv``: a live source's :class:`~engines.video.live.Liveness`, told of each decoded frame; its watchdog
    (:func:`~engines.video.live.watched_packets`) raises NoFrames when frames stop."""
    feed = _Feed(src, nvc, stream, stream_ptr, on_frame, lv)
    turn = TurnProbe(src, stream)
    annexb = AnnexB(stream)
    if lv is not None:
        packets = watched_packets(container, stream, lv, src.stop)
    else:
        packets = ((p, False) for p in container.demux(stream))
    try:
        while True:
            try:
                packet, interrupted = next(packets, (None, False))
            except NoFrames:
                raise
            except Exception as exc:  # noqa: BLE001 - av.error.*, OSError: the connection or file failed
                raise _Lost() from exc
            if packet is not None and packet.size == 0:
                continue
            if packet is not None and packet.is_corrupt:  # the demuxer saw the container damaged (e.g. MPEG-TS
                src.damaged += 1  # continuity errors): NVDEC would conceal it without a word
                if lv is not None:
                    src._damage(1)
            turn.packet(packet)
            # None: end of stream, flush the frames the decoder still holds
            chunks = [(None, None)] if packet is None else annexb.convert(packet)
            for data, pts in chunks:
                frames = feed.decode(data, pts, interrupted)
                if frames is None:
                    continue
                index = feed.deliver(frames, index)
                del frames, data
                if index is None:
                    return None
            if packet is None:
                if lv is None:  # a file read to its end: packets NVDEC took without a frame out are damage
                    lost = FramesOut()
                    lost.frames = feed.frames
                    count_lost(src, lost.lost(src.info.codec.lower(), feed.given - feed.refused))
                return index
    finally:
        src.missing += feed.clock.missing
        _synchronize(stream_ptr)  # our kernels' reads of the decoder's surfaces finish before it is freed
        del feed


class _PtsOnly:
    """What :class:`Timeline` reads of a frame, for NVDEC frames (which carry the pts we fed)."""

    def __init__(self, pts, time_base):
        self.pts = pts if (pts is not None and pts >= 0) else None
        self.time_base = time_base


def run_fed(src, nvc, stream_ptr: int, on_frame) -> None:
    """A URL or live source on the GPU path: connect, feed NVDEC, and for a live source reconnect with back-off
    until given up (SourceError), judged by decoded frames with the CPU path's
    :class:`~engines.video.live.Liveness` and watchdog."""
    av = require("av", "Reading network and live sources on the GPU path")
    lv = Liveness(src.options) if src.live else None
    index = 0
    passes = 0
    while True:
        if lv is not None:
            lv.opening()
        try:
            container, stream = open_stream(src, av, lv)
        except SourceError as exc:
            if lv is None:
                raise
            src._lost(lv, exc.detail, exc.fix, getattr(exc, "final", False))
            continue
        reason, fix = "the stream ended: the server closed it", "check the camera or server"
        try:
            index = feed_pass(src, nvc, stream_ptr, on_frame, index, container, stream, lv)
            if index is None:
                return
        except NoFrames as exc:
            reason, fix = exc.reason, exc.fix
        except _Lost as exc:
            if not src.live:
                raise SourceError(src.name, "stopped while reading: "
                                  f"{first_line(exc.__cause__, DETAIL_CHARS)}") from exc
            reason, fix = network_error(src.name, exc.__cause__, src.options, opening=False)
        finally:
            container.close()
        passes += 1
        if lv is None:
            if passes >= src.loop:
                return
            continue
        if src.stop is not None and src.stop.is_set():
            return
        src._lost(lv, reason, fix)
