"""Video sources: NVDEC through PyNvVideoCodec (frames stay in GPU memory) and PyAV on the CPU.

A source is a file path or a URL the demuxer understands (rtsp://, http://, ...). Each decoder yields frames in
display order with their index (counting every decoded frame, before any stride), presentation timestamp and
time in seconds. Problems are raised as :class:`SourceError` naming the source; the pipeline turns them into a
per-source report and keeps the other sources going.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from .._deps import is_installed, require
from ..errors import TrtcError, UsageProblem, first_line
import numpy as np

from ..preprocess import ColorSpace, YuvPlanes
from .credentials import scrub, url_of
from .live import (LagClock, LiveOptions, LiveSource, Liveness, NoFrames, is_network, network_error, open_url,
                   watched_packets)
from .image_source import ImageSource, is_image
from .orientation import Orientation, file_orientation, frame_orientation
from .source_base import (DETAIL_CHARS, MAX_REJECTED_PACKETS, FramesOut, SourceError, SourceInfo,  # noqa: F401
                          Timeline, _colorspace_from_av, _synchronize, count_lost)

log = logging.getLogger("trtc")



def is_url(name: str) -> bool:
    return "://" in url_of(name)


def check_exists(name: str) -> None:
    if not is_url(name) and not Path(name).is_file():
        raise SourceError(name, "no such file", "check the path")


def pixel_rate(name: str) -> float | None:
    """Pixels per second of a file's first video stream (width x height x frame rate), read from its container
    by PyAV without decoding anything: how heavy a source is to decode. None for URLs, files PyAV cannot open,
    or without PyAV."""
    if is_url(name) or not is_installed("av"):
        return None
    import av

    try:
        with av.open(name) as container:
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            return float(stream.codec_context.width * stream.codec_context.height * float(rate or 30))
    except Exception:  # noqa: BLE001 - unreadable here: the worker that opens it reports why
        return None


def probe_colorspace(name: str, height: int, override: str | None, demuxer=None) -> ColorSpace:
    """The stream's colour matrix and range: from the container's codec parameters via PyAV (no decoding) when
    PyAV is installed and the source is a file, else from PyNvVideoCodec's ``demuxer`` (its ColorSpace() and
    ColorRange(): BT.601/BT.709, limited/full), else BT.709 for HD / BT.601 for SD, limited range, with a warning
    once per process per assumption. ``override`` ("bt601:full", ...) wins."""
    return probe_stream(name, height, override, demuxer)[0]


def probe_stream(name: str, height: int, override: str | None, demuxer=None):
    """(colour space as :func:`probe_colorspace` says, the time base as a Fraction, the start time in its units)
    of a file's first video stream, from ONE PyAV open of the container (no decoding); (colour space, None, 0)
    for URLs, without PyAV, or for a file PyAV cannot read (times then fall back to index / fps)."""
    given = bool(override and override != "auto")
    if is_url(name) or (given and not is_installed("av")):
        return ColorSpace.parse(override, height), None, 0
    if not is_installed("av"):
        return _colorspace_from_demuxer(name, demuxer, height), None, 0
    try:
        av = require("av", "Reading colour metadata and the time base")
        with av.open(name) as c:
            s = c.streams.video[0]
            cs = ColorSpace.parse(override, height) if given else _colorspace_from_av(s.codec_context, height, None)
            return cs, s.time_base, int(s.start_time or 0)
    except Exception:  # noqa: BLE001 - metadata is a nicety; the decoder reports real problems
        return ColorSpace.parse(override if given else None, height), None, 0


_ASSUMED: set[str] = set()  # the colour assumptions already warned about in this process


def _colorspace_from_demuxer(name: str, demuxer, height: int) -> ColorSpace:
    """What PyNvVideoCodec's demuxer says of the stream's matrix and range (its enums: ColorSpace BT_601, BT_709,
    UNSPEC; ColorRange MPEG = limited, JPEG = full, UDEF); what it leaves unsaid is assumed, and said once."""
    guess = ColorSpace.parse(None, height)
    values = []
    for method in ("ColorSpace", "ColorRange"):
        try:
            v = getattr(demuxer, method)()
            values.append(str(getattr(v, "name", v)).rsplit(".", 1)[-1])
        except Exception:  # noqa: BLE001 - no demuxer, or an older PyNvVideoCodec without the method
            values.append(None)
    matrix = {"BT_601": "bt601", "BT_709": "bt709"}.get(values[0])
    rng = {"MPEG": "limited", "JPEG": "full"}.get(values[1])
    cs = ColorSpace(matrix or guess.matrix, rng or "limited")
    assumed = [what for what, known in ((f"the {cs.matrix.upper().replace('BT', 'BT.')} matrix (BT.709 for 720 rows "
                                         "or more, BT.601 below)", matrix), ("limited range", rng)) if not known]
    key = " and ".join(assumed)
    if assumed and key not in _ASSUMED:
        _ASSUMED.add(key)
        log.warning("%s: the stream's colour %s not known here (no PyAV, and the demuxer does not say): assuming %s "
                    "(said once); if colours look wrong, give --colorspace, e.g. --colorspace bt709:full", name,
                    "matrix and range are" if len(assumed) == 2 else "matrix is" if not matrix else "range is", key)
    return cs


# ---------------------------------------------------------------------------------------------------------- PyAV
class PyAVSource(LiveSource):
    """CPU decoding with PyAV. ``frames()`` yields (index, pts, seconds, YuvPlanes, received) with host planes;
    ``received`` is the wall-clock time (Unix seconds) the frame came out of the decoder.

    A live source (:mod:`engines.video.live`: a network URL, or ``live=True``) reconnects with back-off when its
    connection fails or ends, reports each outage and recovery through ``on_event``, numbers its frames on across
    connections, and ends with a :class:`SourceError` only when it is given up on. ``stop`` (a threading.Event the
    pipeline sets when it closes) interrupts the waits between attempts."""

    backend = "pyav"

    def __init__(self, name: str, colorspace: str | None = None, loop: int = 1, realtime: bool = False,
                 live: bool | None = None, options: LiveOptions | None = None, rotate: str = "auto"):
        self.name = name if isinstance(name, str) else str(name)  # an Address keeps its url for the open
        self.override = colorspace
        self.rotate = rotate  # "auto": the stream's display matrix; "0".."270": clockwise, instead of it
        self.turn = Orientation()
        self.loop = max(1, int(loop))
        self.realtime = realtime
        self.live = is_network(self.name) if live is None else bool(live)
        self.options = options or LiveOptions()
        self.info: SourceInfo | None = None
        self.decoded = 0
        self.missing = 0  # live: frames the stream's timestamps say were sent but never arrived
        self.damaged = 0  # frames the decoder flagged as damaged (not classified)
        self.lagged = 0  # live: frames decoded but skipped because they were past --max-lag
        self.cut = 0  # live: frames left out because trtc's read timeout cut their data short (not damage)
        self.captured = None  # live: the Capture (engines.video.live) of the frame last passed on
        self.stop: threading.Event | None = None
        self.on_event = None  # callable(SourceEvent), set by the pipeline

    def _open(self, liveness=None):
        av = require("av", "Decoding video on the CPU")
        check_exists(self.name)
        if is_url(self.name):
            container = open_url(av, self.name, self.options, liveness)
        else:
            try:
                container = av.open(self.name)
            except Exception as exc:  # noqa: BLE001 - av.error.*, OSError
                raise SourceError(self.name, describe_unreadable(self.name, first_line(exc, DETAIL_CHARS)),
                                  "check the file: ffprobe FILE shows what it holds") from exc
        if not container.streams.video:
            kinds = sorted({s.type for s in container.streams}) or ["no streams"]
            container.close()
            raise SourceError(self.name, f"has no video stream (only {', '.join(kinds)})", "give a video file")
        stream = container.streams.video[0]
        # a live stream keeps frame threads: with slice threads a camera whose RTP payloads had bytes flipped for 6 s
        # showed one damaged picture or none (its concealed pictures went unflagged: the damage test of
        # test_live_rtsp.py timed out 4 times in 4), with frame threads the damage is said within seconds (2 in 2)
        if self.live:
            stream.thread_type = "AUTO"
        else:
            _file_decoding(stream)
        cc = stream.codec_context
        fps = float(stream.average_rate) if stream.average_rate else None
        self.info = SourceInfo(self.name, cc.name, cc.width, cc.height, fps, stream.frames or None,
                               ColorSpace.parse(self.override, cc.height))
        return container, stream

    def frames(self):
        if self.live:
            yield from self._live_frames()
            return
        index = 0
        for _ in range(self.loop):
            container, stream = self._open()
            start = time.perf_counter()
            skipped: list = []
            refused: set = set()  # the pts of packets the decoder refused
            corrupt: list = []  # frames the decoder flagged as damaged (it concealed errors in them)
            withheld: list = []  # frames of packets the decoder refused, given out later (HEVC with err_detect)
            fed = [0]  # packets with data the decoder was given
            out = FramesOut()
            clock = Timeline(stream, live=False)
            try:
                for frame in _decode(container, stream, self.name, skipped, fed=fed, refused=refused):
                    out.add(frame)
                    if clock.first:
                        self.info.colorspace = _colorspace_from_av(frame, frame.height, self.override)
                        self._orient(frame)
                    pts, t = clock.stamp(frame)
                    if self.realtime and t is not None:
                        _sleep_until(start + t)
                    self.decoded += 1
                    if frame.pts is not None and frame.pts in refused:  # its packet was refused: a damaged picture
                        withheld.append(index)
                        self.damaged += 1
                    elif frame.is_corrupt:  # not classified: its picture is partly made up by the decoder
                        corrupt.append(index)
                        self.damaged += 1
                    else:
                        yield index, pts, t, self.turn.apply(host_planes(frame)), time.time()
                    index += 1
            finally:
                container.close()
            self._file_damage(container, stream, out, fed[0], skipped, withheld, corrupt)

    def _file_damage(self, container, stream, out, fed: int, skipped: list, withheld: list, corrupt: list) -> None:
        """Count one pass's damage and raise a :class:`SourceError` naming it, if there was any. Every packet is
        a classified frame or counted here: a refused packet whose frame came out anyway is counted once, as its
        withheld frame; the refused ones that gave no frame are among the packets that gave no frame."""
        lost = out.lost(stream.codec_context.name, fed)  # packets that gave no frame, the skipped included
        dropped = max(0, len(skipped) - len(withheld))  # refused packets that gave no frame
        self.damaged += max(lost, dropped)  # the flagged and withheld frames are counted as they come out
        damage = []
        if dropped > 0:
            damage.append(f"{dropped} corrupt packet(s) skipped ({skipped[0]})")
        if withheld:
            damage.append(f"{len(withheld)} packet(s) the decoder reported damaged, their frame(s) not classified "
                          f"(first: frame {withheld[0]}; {skipped[0]})")
        if lost > dropped:
            damage.append(f"{lost - dropped} packet(s) gave no frame ({fed} packets in, {out.frames} "
                          "frames out)")
        if corrupt:
            damage.append(f"{len(corrupt)} damaged frame(s) not classified (first: frame {corrupt[0]})")
        if _cut_transport_stream(self.name, container):
            damage.append("the file ends inside a transport packet: it was cut short, frames are missing")
        if damage:
            raise SourceError(self.name, "; ".join(damage) + f"; {self.decoded} frames decoded",
                              "check or re-encode the file")

    def _orient(self, frame) -> None:
        """How this connection's frames are turned to be shown (the first frame's display matrix, or --rotate)."""
        try:
            turn = frame_orientation(frame, self.rotate)
        except UsageProblem as exc:
            raise SourceError(self.name, exc.reason, exc.fix) from None
        self._turned(turn)
        self.info.rotation = turn.to_dict()

    def _live_frames(self):
        """Connect, decode, and on any failure, end or watchdog timeout reconnect with back-off until given up
        (then raise); liveness is judged by decoded frames (:class:`~engines.video.live.Liveness`)."""
        lv = Liveness(self.options)
        index = 0
        while True:
            lv.opening()
            try:
                container, stream = self._open(lv)
            except SourceError as exc:
                self._lost(lv, exc.detail, exc.fix, getattr(exc, "final", False))
                continue
            clock = Timeline(stream, live=True)
            lags = LagClock()  # a new connection: the stream's times start again
            skipped: list = []
            cut = [False]  # since a packet an interrupted read cut short, until a whole key frame
            held = [0]  # damage not yet counted: until a whole frame shows that the stream goes on
            reason, fix = "the stream ended: the server closed it", "check the camera or server"
            try:
                for frame in _decode(container, stream, self.name, skipped,
                                     watched_packets(container, stream, lv, self.stop), cut):
                    self._frame_arrived(lv)
                    if clock.first:
                        self.info.colorspace = _colorspace_from_av(frame, frame.height, self.override)
                        self._orient(frame)
                    pts, t = clock.stamp(frame)
                    self.decoded += 1
                    received = time.time()
                    self.captured = lags.captured(t, received)
                    if self._whole(frame, skipped, cut, held) and self._keep_frame(self.captured, received):
                        # (decided before any conversion or preprocessing)
                        yield index, pts, t, self.turn.apply(host_planes(frame)), received
                    index += 1
                    if self.stop is not None and self.stop.is_set():
                        return
            except NoFrames as exc:  # the stream went on sending nothing usable: what is held was damage
                reason, fix = exc.reason, exc.fix
                held[0], skipped[:] = held[0] + len(skipped), []
                self._count_damage(held)
            except SourceError as exc:
                cause = exc.__cause__ or exc
                reason, fix = network_error(self.name, cause, self.options, opening=False)
            finally:
                container.close()
                self.missing += clock.missing
                self.cut += held[0] + len(skipped)  # the connection broke off or ended there: not the stream's damage
            if self.stop is not None and self.stop.is_set():
                return
            self._lost(lv, reason, fix)


    def _whole(self, frame, skipped: list, cut: list, held: list) -> bool:
        """Whether a live ``frame`` is whole (not made up by the decoder). Packets the decoder refused (``skipped``)
        and frames it made up are held (``held[0]``) until a whole frame shows that the stream goes on: then they are
        damage, counted and said while the run goes on (:meth:`_damage`); if the connection breaks off or ends first,
        they were cut by it (``cut``, as the frames made up from data trtc's own read timeout cut short, while
        ``cut[0]``)."""
        held[0] += len(skipped)
        skipped.clear()
        if frame.is_corrupt:
            if cut[0]:
                self.cut += 1
            else:
                held[0] += 1
            return False
        self._count_damage(held)
        return True

    def _count_damage(self, held: list) -> None:
        if held[0]:
            self.damaged += held[0]
            self._damage(held[0])
            held[0] = 0


def _cut_transport_stream(name: str, container) -> bool:
    """An MPEG-TS file is a sequence of 188-byte packets (192 in M2TS, 204 with FEC): a file whose size fits none
    was cut mid-packet, and the demuxer drops the partial frame at its end without a word."""
    if is_url(name) or "mpegts" not in (getattr(container.format, "name", "") or ""):
        return False
    try:
        size = os.path.getsize(name)
    except OSError:
        return False
    return all(size % n for n in (188, 192, 204))


def _decode(container, stream, name, skipped: list, packets=None, cut: list | None = None, fed: list | None = None,
            refused: set | None = None):
    """Frames of one stream; a packet the decoder rejects is skipped and counted (``skipped``), as NVDEC does
    with corrupt pictures; the demuxer failing (file cut off, connection lost) ends the source with an error.
    ``packets``: (packet, interrupted) pairs to decode instead of the container's own
    (:func:`~engines.video.live.watched_packets`); a refused packet that an interrupted read handed back is not
    counted, being cut short by trtc's own watchdog rather than damaged in the stream. ``cut``: a one-item list set
    True at such a packet and False at the next whole key frame (the frames between may be made up from the cut
    data). Its :class:`NoFrames` passes through. ``fed``: a one-item list counting the packets with data given to
    the decoder (those not marked to be discarded: an edit list's pre-roll gives no frame by design). ``refused``: a
    set that gets the pts of each packet counted in ``skipped`` (a decoder may still give its picture out later)."""
    if packets is None:
        packets = ((p, False) for p in container.demux(stream))
    while True:
        try:
            packet, interrupted = next(packets)
        except StopIteration:
            return
        except NoFrames:
            raise
        except Exception as exc:  # noqa: BLE001 - av.error.*, OSError (network)
            if cut is not None:  # the connection broke off: what the decoder makes of its last data is no damage
                cut[0] = True
            try:  # the frames the decoder still holds (reordering, threads) were read whole: give them out
                yield from stream.codec_context.decode(None)
            except Exception:  # noqa: BLE001 - a decoder that cannot even flush has nothing more to give
                pass
            raise SourceError(name, f"stopped while reading: {scrub(name, first_line(exc, DETAIL_CHARS))}") from exc
        if cut is not None and (interrupted or packet.is_keyframe):
            cut[0] = interrupted
        if fed is not None and packet.size and not packet.is_discard:
            fed[0] += 1
        try:
            frames = packet.decode()
        except Exception as exc:  # noqa: BLE001 - av.error.InvalidDataError and friends
            if not interrupted:
                skipped.append(first_line(exc, DETAIL_CHARS))
                if refused is not None and packet.pts is not None:
                    refused.add(packet.pts)
            continue
        yield from frames


def _file_decoding(stream) -> None:
    """How a file's stream is decoded on the CPU, so that the decoder says which pictures are damaged.

    H.264 and HEVC are decoded on one thread. With slice threads FFmpeg's H.264 decoder flagged none of the damaged
    pictures of a 256x144 clip (ffprobe logged a decoder error in 6 of 10 damaged copies), and its HEVC decoder let
    errors in wavefront rows pass unsaid; on one thread H.264 conceals and flags them, and HEVC, which conceals
    nothing, is told to refuse a picture it finds an error in (``err_detect=explode``): the packet raises, and the
    picture, which it still gives out later to keep its references, is known by its pts and not classified. Other
    codecs keep slice threads. Frame threads are no option: with them FFmpeg's H.264 decoder flagged a concealed
    picture in only some decodes (3 of 5 decodes of the same damaged file missed it), and its HEVC decoder dropped
    pictures that one thread decoded with concealment (39 of 48 frames against 47)."""
    cc = stream.codec_context
    if cc.name in ("h264", "hevc"):
        stream.thread_type = "NONE"
        if cc.name == "hevc":
            cc.options = {**cc.options, "err_detect": "explode"}
    else:
        stream.thread_type = "SLICE"


_PLANAR = ("yuv420p", "yuvj420p", "yuv422p", "yuvj422p", "yuv444p", "yuvj444p")


def host_planes(frame) -> YuvPlanes:
    """A PyAV VideoFrame as YUV planes (no conversion for planar 8-10-12-bit 4:2:0/4:2:2/4:4:4; 10/12-bit
    samples shifted to the MSB of 16 bits like NVDEC's P016); anything else is converted to yuv420p first."""
    name = frame.format.name
    bits = 8
    base = name
    for suffix, b in (("p10le", 10), ("p12le", 12), ("p16le", 16)):
        if name.endswith(suffix) and name[:-len(suffix)] + "p" in _PLANAR:
            base, bits = name[:-len(suffix)] + "p", b
    if base not in _PLANAR:
        frame = frame.reformat(format="yuv420p")
        bits = 8
    dtype = np.uint8 if bits == 8 else np.dtype("<u2")
    planes = []
    for plane in frame.planes[:3]:
        itemsize = np.dtype(dtype).itemsize
        a = np.frombuffer(plane, dtype).reshape(plane.height, plane.line_size // itemsize)[:, :plane.width]
        planes.append(a if bits in (8, 16) else (a.astype(np.uint16) << (16 - bits)))
    return YuvPlanes(*planes)


# --------------------------------------------------------------------------------------------------------- NVDEC
_NVDEC_FORMATS = {"NV12": "NV12", "P016": "P016", "P010": "P016", "YUV444": "YUV444",
                  "YUV444_16BIT": "YUV444_16BIT", "YUV444P": "YUV444", "YUV444_16BIT_P": "YUV444_16BIT"}
_CHROMA = {0: "4:0:0", 1: "4:2:0", 2: "4:2:2", 3: "4:4:4"}


_FORMAT_CACHE: dict = {}


def surface_format(frame) -> str:
    """The layout name of a DecodedFrame's surface (cached per PyNvVideoCodec format value: once per stream)."""
    key = frame.format
    fmt = _FORMAT_CACHE.get(key)
    if fmt is None:
        name = str(key).rsplit(".", 1)[-1].upper()
        if name not in _NVDEC_FORMATS:
            raise TrtcError(f"NVDEC returned {name} frames, which the GPU preprocessor does not read")
        fmt = _FORMAT_CACHE[key] = _NVDEC_FORMATS[name]
    return fmt


_CAPS: dict = {}
_CAPS_LOCK = threading.Lock()


def decoder_caps(nvc, gpu: int, codec, chroma, depth: int) -> dict:
    """NVDEC's capabilities for one (GPU, codec, chroma, bit depth), queried once per process: the query costs
    about as much as opening a decoder, and eight sources of one kind would otherwise pay it eight times."""
    key = (gpu, int(codec), int(chroma), depth)
    with _CAPS_LOCK:
        if key not in _CAPS:
            _CAPS[key] = dict(nvc.GetDecoderCaps(gpuid=gpu, codec=codec, chromaformat=chroma, bitdepth=depth))
        return _CAPS[key]


class NvdecSource(LiveSource):
    """NVDEC decoding with PyNvVideoCodec's demuxer and core decoder on a CUDA stream the caller gives.

    :meth:`run` calls back with (index, pts, seconds, DecodedFrame, fed_at) per frame; ``fed_at`` is when the
    packet that carried the frame went into the decoder (``time.perf_counter()``), for latency figures.
    """

    backend = "nvdec"

    def __init__(self, name: str, gpu: int = 0, colorspace: str | None = None, loop: int = 1,
                 realtime: bool = False, latency: str = "native", live: bool | None = None,
                 options: LiveOptions | None = None, rotate: str = "auto"):
        self.name = name if isinstance(name, str) else str(name)  # an Address keeps its url
        self.gpu = gpu
        self.rotate = rotate  # "auto": the file's display matrix; "0".."270": clockwise, instead of it
        self.turn = Orientation()  # applied by the preprocessing kernel (GpuPreprocessor.plan's turn)
        self.override = colorspace
        self.loop = max(1, int(loop))
        self.realtime = realtime
        self.latency = latency
        self.live = is_network(self.name) if live is None else bool(live)
        self.options = options or LiveOptions()
        self.info: SourceInfo | None = None
        self.decoded = 0
        self.caps: dict = {}
        self.time_base = None  # the stream's time base (a Fraction) where known: pts x time_base is the time
        self.start_pts = 0  # the container's start time in time_base units (a file's first frame's pts)
        self._stamp = None  # stamp_index's constants: (fps, time_base, fps x time_base, its numerator, denominator)
        self.missing = 0  # live: frames the stream's timestamps say never arrived
        self.damaged = 0  # packets NVDEC refused (skipped), and packets that gave no frame (``lost``)
        self.lost = 0  # a file's packets that gave no frame though NVDEC took them (counted in ``damaged`` too)
        self.lagged = 0  # live: frames decoded but skipped because they were past --max-lag
        self.captured = None  # live: the Capture (engines.video.live) of the frame last passed on
        self.stop: threading.Event | None = None
        self.on_event = None  # callable(SourceEvent), set by the pipeline

    def _check_caps(self, nvc, codec, chroma, depth: int, width: int, height: int, codec_name: str) -> None:
        """NVDEC's capabilities for this stream (a SourceError naming what is not supported); sets ``caps`` and
        ``_what`` ("h264 4:2:0 8-bit 1920x1080")."""
        chroma_name = _CHROMA.get(int(chroma), str(chroma).rsplit(".", 1)[-1])
        what = f"{codec_name} {chroma_name} {depth}-bit {width}x{height}"
        try:
            caps = decoder_caps(nvc, self.gpu, codec, chroma, depth)
        except Exception as exc:  # noqa: BLE001 - e.g. a codec id NVDEC does not know
            raise SourceError(self.name, f"NVDEC cannot decode {what}: {first_line(exc, DETAIL_CHARS)}",
                              "use --device cpu for this source") from exc
        self.caps = caps
        if not caps.get("supported", False):
            raise SourceError(self.name, f"NVDEC on GPU {self.gpu} does not support {what}",
                              "transcode to H.264/HEVC 4:2:0, or use --device cpu")
        wmax, hmax = caps.get("width_max", 0), caps.get("height_max", 0)
        wmin, hmin = caps.get("width_min", 0), caps.get("height_min", 0)
        if (wmax and width > wmax) or (hmax and height > hmax) or width < wmin or height < hmin:
            raise SourceError(self.name, f"{what} is outside NVDEC's range for this codec on GPU {self.gpu} "
                              f"({wmin}x{hmin} to {wmax}x{hmax})", "scale the video, or use --device cpu")
        self._what = what

    def _open(self, nvc, stream_ptr: int, decoder: bool = True):
        """Open the demuxer, check NVDEC's capabilities for the stream, and (``decoder``) create the core decoder
        on ``stream_ptr``. Returns (demuxer, decoder or None)."""
        check_exists(self.name)
        try:
            dmx = nvc.CreateDemuxer(filename=self.name)
        except Exception as exc:  # noqa: BLE001 - PyNvVideoCodec raises plain exceptions, often without a text
            raise SourceError(self.name, describe_unreadable(self.name, first_line(exc, DETAIL_CHARS))) from exc
        try:
            codec, width, height = dmx.GetNvCodecId(), int(dmx.Width()), int(dmx.Height())
            chroma, depth = dmx.ChromaFormat(), int(dmx.BitDepth())
        except Exception as exc:  # noqa: BLE001
            raise SourceError(self.name, "has no video stream NVDEC can read "
                              f"({first_line(exc, DETAIL_CHARS)})") from exc
        if width <= 0 or height <= 0:
            raise SourceError(self.name, "has no video stream", "give a video file")
        codec_name = str(codec).rsplit(".", 1)[-1]
        if not codec_name.isalnum():  # a codec PyNvVideoCodec has no name for
            codec_name = _codec_name_from_av(self.name) or "an unknown codec"
        self._check_caps(nvc, codec, chroma, depth, width, height, codec_name)
        fps = float(dmx.FrameRate()) if dmx.FrameRate() else None
        if self.info is None:
            self.turn = file_orientation(self.name, self.rotate)
            cs, self.time_base, self.start_pts = probe_stream(self.name, height, self.override, dmx)
            self.info = SourceInfo(self.name, codec_name, width, height, fps, None, cs)
            self.info.rotation = self.turn.to_dict()
        if not decoder:
            return dmx, None
        return dmx, self._core_decoder(nvc, codec, stream_ptr)

    def _core_decoder(self, nvc, codec, stream_ptr: int):
        """PyNvVideoCodec's core decoder for ``codec`` on ``stream_ptr``, with this source's output latency (its
        capabilities checked first: :meth:`_check_caps`)."""
        latency = {"native": nvc.DisplayDecodeLatencyType.NATIVE, "low": nvc.DisplayDecodeLatencyType.LOW,
                   "zero": nvc.DisplayDecodeLatencyType.ZERO}[self.latency]
        try:
            return nvc.CreateDecoder(gpuid=self.gpu, codec=codec, cudacontext=0, cudastream=stream_ptr,
                                     usedevicememory=True, latency=latency)
        except Exception as exc:  # noqa: BLE001
            raise SourceError(self.name, f"NVDEC decoder for {self._what} failed: "
                              f"{first_line(exc, DETAIL_CHARS)}") from exc

    def run(self, stream_ptr: int, on_frame) -> None:
        """Decode every frame and call ``on_frame(index, pts, seconds, frame, fed_at)`` for each, in display
        order; ``on_frame`` returning False stops the source.

        A callback rather than a generator on purpose: a DecodedFrame's surface belongs to the decoder's pool and
        is overwritten by the next ``Decode`` (with copies on ``stream_ptr``'s stream). ``on_frame`` must enqueue
        its reads on that stream and keep no reference to the frame; this loop drops its own references before
        decoding again. (A frame still referenced during ``Decode`` also makes PyNvVideoCodec grow its pool with
        new allocations, which synchronise the device.)"""
        nvc = require("PyNvVideoCodec", "Decoding video on the GPU")
        if self.live or is_url(self.name):  # PyAV's demuxer (timeouts, RTSP transport, reconnects) feeds NVDEC
            from .nvdec_feed import run_fed

            run_fed(self, nvc, stream_ptr, on_frame)
            return
        index = 0
        for _ in range(self.loop):
            index = _packet_pass(self, nvc, stream_ptr, on_frame, index)
            if index is None:
                return

    def _next_packet(self, packets):
        """The demuxer's next packet, or None at the end; the demuxer failing ends the source (the file is cut off or
        unreadable from here)."""
        try:
            return next(packets, None)
        except Exception as exc:  # noqa: BLE001 - demuxer errors
            raise SourceError(self.name, f"stopped while reading: {first_line(exc, DETAIL_CHARS)}") from exc

    def _refused(self, exc: Exception, rejected: int) -> None:
        """A packet NVDEC refused (``exc``), the ``rejected``-th in a row: counted and skipped, as the CPU path does;
        MAX_REJECTED_PACKETS in a row end the source."""
        self.damaged += 1
        if rejected >= MAX_REJECTED_PACKETS:
            raise SourceError(self.name, f"NVDEC refused {rejected} packets in a row "
                              f"({first_line(exc, DETAIL_CHARS)})",
                              "check or re-encode the file; or --device cpu"
                              ) from exc

    def stamp_index(self, index: int) -> tuple[int | None, float | None]:
        """(pts, seconds) of a file's frame from its display index, for the SimpleDecoder path: its frames'
        getPTS() are not display timestamps (on bikes.mp4 with PyNvVideoCodec 2.2.4: -1024, -512, 0, 512 where the
        container's are 0, 512, 1024, 1536; H100), so the time is the container's start plus index / frame rate,
        in the stream's time base where known - the CPU path's figures for a constant-rate file."""
        fps = self.info.fps if self.info is not None else None
        if not fps:
            return None, None
        tb = self.time_base
        if tb is None:
            return None, index / fps
        # the same figures as round(index / (fps x tb)) and float(pts x tb) with Fractions, without a Fraction per frame
        # (they showed among the pipeline's busiest lines at many streams): fps x tb is the same
        # float each time, and an int's true division is correctly rounded, as float(Fraction) is
        if self._stamp is None or self._stamp[:2] != (fps, tb):
            self._stamp = (fps, tb, fps * tb, tb.numerator, tb.denominator)
        step, num, den = self._stamp[2:]
        pts = self.start_pts + int(round(index / step))
        return pts, pts * num / den

    def seconds(self, pts, index: int) -> float | None:
        """A frame's time: pts x the stream's time base where both are known (as the CPU path gives), else the
        frame's index over the frame rate."""
        if self.time_base is not None and pts is not None and pts >= 0:
            return float(pts * self.time_base)
        fps = self.info.fps if self.info is not None else None
        return index / fps if fps else None

    @property
    def batched(self) -> bool:
        """Whether :meth:`run_batches` serves this source: an MP4/MOV file read as fast as possible in display
        order. Live pacing (``realtime``), low-latency output, URLs and other containers use the packet loop of
        :meth:`run` (PyNvVideoCodec's file decoders need a seekable container that declares its frame count)."""
        return (not is_url(self.name) and not self.realtime and self.latency == "native"
                and Path(self.name).suffix.lower() in BATCHED_SUFFIXES)

    def probe(self) -> str:
        """Open the demuxer and check NVDEC's capabilities for the stream (raising :class:`SourceError` with the
        reason, as :meth:`run` would); returns the format a decoder is made for, e.g. "h264 4:2:0 8-bit
        1920x1080" (the key under which :mod:`engines.video.decoders` keeps decoders for reuse)."""
        nvc = require("PyNvVideoCodec", "Decoding video on the GPU")
        dmx, _ = self._open(nvc, 0, decoder=False)
        del dmx
        return self._what

    def run_batches(self, stream_ptr: int, max_frames: int, on_frames, decoder=None):
        """Decode every frame with PyNvVideoCodec's SimpleDecoder and call ``on_frames(first_index, frames)``
        with up to ``max_frames`` DecodedFrames at a time, in display order; returning False stops the source.

        Python runs once per batch instead of once per packet. The decoder enqueues its surface copies on
        ``stream_ptr``'s stream, and a batch's surfaces are unlocked only by the next ``get_batch_frames``:
        ``on_frames`` must enqueue its reads on that stream before returning and keep no reference to a frame.

        ``decoder``: a SimpleDecoder made on ``stream_ptr`` for this source's format (:meth:`probe`), which is
        pointed at this file instead of opening a new one (see :mod:`engines.video.decoders`); every further
        loop of the source reuses the decoder the same way. Returns the decoder when the source was decoded to
        the end without an error, for the caller to keep; otherwise None (the decoder is freed here).

        Not the ThreadedDecoder (demux and decode in a native thread): it crashed test processes in its native
        thread where the SimpleDecoder and the packet loop did not (docs/BENCHMARKS.md).

        A container that declares no frame count, or a SimpleDecoder that cannot open the file, raises
        :class:`BatchUnavailable` before the first frame (use :meth:`run`). A pass that ends before the frame
        count its container declares (a corrupt picture can stop a file decoder) goes on with the packet loop
        from the next frame, so no frame the packet loop would give is lost; a file that still ends early is
        reported as a SourceError, after all its frames."""
        nvc = require("PyNvVideoCodec", "Decoding video on the GPU")

        def one(index, pts, t, frame, fed_at):
            return on_frames(index, [frame])

        if self.info is None:
            self.probe()  # the same checks and messages as run()
        index, dec, kept = 0, decoder, False
        try:
            for _ in range(self.loop):
                dec, declared = _point_decoder(self, nvc, dec, stream_ptr, index)
                start = index
                index, got = _batch_pass(self, dec, declared, max_frames, on_frames, index)
                if index is None:
                    return None
                if declared and got < declared:  # the packet loop decodes the rest of the file
                    _synchronize(stream_ptr)  # our reads of its last batch finish before the decoder goes
                    dec = None
                    index = self._rest_by_packets(nvc, stream_ptr, one, index, start, got, declared)
                    if index is None:
                        return None
            kept = dec is not None
            return dec
        finally:
            _synchronize(stream_ptr)  # our reads of the last batch finish before the decoder goes or is kept
            if not kept:
                dec = None

    def _rest_by_packets(self, nvc, stream_ptr: int, one, index: int, start: int, got: int, declared: int):
        """The SimpleDecoder stopped after ``got`` of ``declared`` frames: the packet loop decodes the rest; a file
        that still ends early is a SourceError (after all its frames). Returns the next index, or None to stop."""
        log.info("%s: SimpleDecoder ended after %d of %d frames; the packet loop goes on", self.name, got, declared)
        lost = self.lost
        index = _packet_pass(self, nvc, stream_ptr, one, index, skip=got)
        if index is not None and index - start < declared:
            # frames its container declares that never came: damage (those the packet loop counted already aside)
            count_lost(self, max(0, declared - (index - start) - (self.lost - lost)))
            raise SourceError(self.name, f"ended after {index - start} of the {declared} frames its container "
                              "declares", "the file is probably cut off or damaged: check or re-encode it")
        return index


# ----------------------------------------------------- NvdecSource.run: the packet loop over a file
def _packet_pass(source: NvdecSource, nvc, stream_ptr: int, on_frame, index: int, skip: int = 0):
    """One pass over ``source``'s file with the packet loop, frames numbered from ``index``, the first ``skip`` not
    passed on (a SimpleDecoder pass that ended early resumes here); packets without a frame out are damage
    (:func:`count_lost`). Returns the next index, or None when ``on_frame`` asked to stop."""
    low = source.latency in ("low", "zero")
    dmx, dec = source._open(nvc, stream_ptr)
    fps = source.info.fps or 30.0
    fed: dict = {}
    start = time.perf_counter()
    n_packets = 0
    out = FramesOut()  # packets with data NVDEC took, frames it gave out
    packets = iter(dmx)
    try:
        rejected = 0  # packets in a row the decoder refused
        while True:
            packet = source._next_packet(packets)
            if packet is None:
                count_lost(source, out.lost(source.info.codec.lower(), out.packets))
                break
            if source.realtime and packet.bsl:
                _sleep_until(start + n_packets / fps)
            n_packets += 1
            if low:
                packet.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
            now = time.perf_counter()
            if packet.bsl:
                fed[packet.pts] = now
            try:  # a packet the decoder refuses is skipped and counted, as the CPU path does; the stream goes on
                frames = dec.Decode(packet)
                rejected, out.packets = 0, out.packets + bool(packet.bsl)
            except Exception as exc:  # noqa: BLE001 - PyNvVCException
                rejected += 1
                source._refused(exc, rejected)
                continue
            finally:
                del packet
            out.frames += len(frames)
            for i in range(len(frames)):
                frame = frames[i]
                pts = frame.getPTS()
                if skip:
                    skip -= 1
                    fed.pop(pts, None)
                    del frame
                    continue
                source.decoded += 1
                go = on_frame(index, pts, source.seconds(pts, index), frame, fed.pop(pts, now))
                del frame
                index += 1
                if go is False:
                    return None
            del frames
            if len(fed) > 64:  # packets whose frames never came out (corrupt data): forget them
                for k in sorted(fed)[:-64]:
                    fed.pop(k, None)
    finally:
        _synchronize(stream_ptr)  # our kernels' reads of its surfaces finish before the decoder is freed
        del packets, dec, dmx
    return index


# ----------------------------------------------------- NvdecSource.run_batches: a SimpleDecoder pass over a file
def _point_decoder(source: NvdecSource, nvc, dec, stream_ptr: int, index: int):
    """(a SimpleDecoder on ``source``'s file, the frame count its container declares): a new one, or ``dec`` (made for
    this format) pointed at the file. Before the first frame a refusal is :class:`BatchUnavailable`."""
    try:
        if dec is None:
            dec = nvc.SimpleDecoder(source.name, gpu_id=source.gpu, cuda_context=0, cuda_stream=stream_ptr,
                                    use_device_memory=True)
        else:  # a decoder made for this format: point it at this file (its frames are all released)
            dec.reconfigure_decoder(source.name)
        return dec, int(getattr(dec.get_stream_metadata(), "num_frames", 0) or 0)
    except Exception as exc:  # noqa: BLE001 - PyNvVideoCodec raises plain exceptions; a failed decoder is dropped
        if index == 0:  # e.g. a container that declares no frame count: the packet loop can read it
            raise BatchUnavailable(f"{source.name}: SimpleDecoder refused it "
                                   f"({first_line(exc, DETAIL_CHARS)})") from exc
        raise SourceError(source.name, f"NVDEC decoder for {source._what} failed: "
                          f"{first_line(exc, DETAIL_CHARS)}") from exc


def _batch_pass(source: NvdecSource, dec, declared: int, max_frames: int, on_frames, index: int):
    """Batches of up to ``max_frames`` frames to ``on_frames`` until the declared count (or the decoder stops).
    Returns (next index, frames got), or (None, got) when ``on_frames`` asked to stop."""
    got = 0
    while not declared or got < declared:
        try:
            # never past the declared count: the SimpleDecoder prints "INVALID INDEX n" on stdout for every frame
            # asked beyond it, which would corrupt a --json report
            frames = dec.get_batch_frames(min(max_frames, declared - got) if declared else max_frames)
        except Exception as exc:  # noqa: BLE001 - the caller goes on with the packet loop
            log.info("%s: SimpleDecoder stopped (%s)", source.name, first_line(exc, DETAIL_CHARS))
            break
        if not frames:
            break
        n = len(frames)
        source.decoded += n
        got += n
        go = on_frames(index, frames)
        del frames
        index += n
        if go is False:
            return None, got
    return index, got


BATCHED_SUFFIXES = (".mp4", ".mov", ".m4v")


class BatchUnavailable(Exception):
    """:meth:`NvdecSource.run_batches` cannot read this source before its first frame; use :meth:`run`."""


def _codec_name_from_av(name: str) -> str | None:
    if is_url(name) or not is_installed("av"):
        return None
    try:
        av = require("av", "Reading the codec name")
        with av.open(name) as c:
            return c.streams.video[0].codec_context.name if c.streams.video else None
    except Exception:  # noqa: BLE001
        return None


def describe_unreadable(name: str, decoder_says: str) -> str:
    """Why a demuxer refused a file, in words: PyAV (when installed) tells a file without a video stream or
    an unreadable container apart; otherwise the demuxer's own message. An empty file is said to be one."""
    if not is_url(name):
        try:
            if os.path.getsize(name) == 0:
                return "is an empty file (0 bytes), not a video"
        except OSError:
            pass
    if not is_url(name) and is_installed("av"):
        try:
            av = require("av", "Reading the container")
            with av.open(name) as c:
                if not c.streams.video:
                    kinds = sorted({s.type for s in c.streams}) or ["no streams"]
                    return f"has no video stream (only {', '.join(kinds)})"
        except Exception as exc:  # noqa: BLE001
            return f"cannot open: {first_line(exc, DETAIL_CHARS)}"
    detail = decoder_says.strip(" :")
    return f"cannot open{': ' + detail if detail and detail != 'PyNvDemuxer' else ''}"


def _sleep_until(t: float) -> None:
    d = t - time.perf_counter()
    if d > 0:
        time.sleep(d)


def make_sources(names, backend: str, gpu: int = 0, colorspace: str | None = None, loop: int = 1,
                 realtime: bool = False, latency: str = "native", live: bool | None = None,
                 live_options: LiveOptions | None = None, rotate: str = "auto"):
    out = []
    for n in names:
        n = os.fspath(n)
        if is_image(n):  # a photo: one frame, read by the image reader (CPU path)
            out.append(ImageSource(n, loop, rotate))
        elif backend == "nvdec":
            out.append(NvdecSource(n, gpu, colorspace, loop, realtime, latency, live, live_options, rotate))
        else:
            out.append(PyAVSource(n, colorspace, loop, realtime, live, live_options, rotate))
    return out
