"""Damaged copies of short H.264 and HEVC clips (bytes flipped or zeroed inside the MP4's media data, never in its
index), and what FFmpeg itself makes of each: the reference that the CPU and GPU damage tests hold trtc to.

The reference is the ``ffprobe`` program where installed (its decoder's error lines and its own packet and
frame counts); without them, a single-threaded PyAV decode that counts packets, frames, refused packets
and frames flagged corrupt (code that shares nothing with trtc's readers but FFmpeg itself)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEED = 20261205
CASES = 10  # per codec
CLIP_FRAMES = 48
CLIP_SIZE = (256, 144)  # NVDEC decodes HEVC from 144 x 144 (an H200's caps); the CPU path reads the same clips
GPU_CLIP_SIZE = CLIP_SIZE


@dataclass
class Reference:
    """FFmpeg's view of one file: packets demuxed, frames decoded, decoder error lines."""

    packets: int
    frames: int
    errors: list

    @property
    def damaged(self) -> bool:
        return bool(self.errors) or self.frames < self.packets


def make_clips(bikes: Path, folder: Path, size: tuple = CLIP_SIZE) -> dict[str, Path]:
    """{"h264": ..., "hevc": ...}: the first frames of bikes.mp4, small, in MP4 (HEVC with B-frames)."""
    from tests.clips import encode_clip

    out = {}
    x265 = {"x265-params": "log-level=error:keyint=24"}
    for codec, lib, opts in (("h264", "libx264", {}), ("hevc", "libx265", x265)):
        path = folder / f"clip_{codec}.mp4"
        if not path.exists():
            encode_clip(bikes, path, lib, size, frames=CLIP_FRAMES, options=opts)
        out[codec] = path
    return out


def media_data(data: bytes) -> tuple[int, int]:
    """(first, end) byte of the MP4's ``mdat`` payload (the coded pictures; the index is in ``moov``)."""
    at = 0
    while at + 8 <= len(data):
        size, kind = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8]
        head = 8
        if size == 1:
            size, head = int.from_bytes(data[at + 8:at + 16], "big"), 16
        if kind == b"mdat":
            return at + head, at + size
        at += size
    raise ValueError("no mdat box")


def damaged_copies(clip: Path, folder: Path, seed: int = SEED, cases: int = CASES) -> list[tuple[str, Path]]:
    """``cases`` damaged copies of ``clip``: half with 1-16 bytes flipped, half with a run of 16-256 bytes zeroed,
    each inside the media data after the first picture's first 400 bytes (so that every copy opens)."""
    rng = np.random.default_rng(seed)
    data = clip.read_bytes()
    first, end = media_data(data)
    out = []
    for i in range(cases):
        d = bytearray(data)
        at = int(rng.integers(first + 400, end - 300))
        if i % 2:
            n = int(rng.integers(16, 257))
            d[at:at + n] = bytes(n)
            what = f"{n} bytes zeroed at {at}"
        else:
            n = int(rng.integers(1, 17))
            for j in range(n):
                d[at + j] ^= int(rng.integers(1, 256))
            what = f"{n} byte(s) flipped at {at}"
        path = folder / f"{clip.stem}-{i}.mp4"
        path.write_bytes(bytes(d))
        out.append((f"{clip.name}: {what}", path))
    return out


def reference(path: Path) -> Reference:
    if shutil.which("ffprobe"):
        return _ffmpeg_reference(path)
    return _pyav_reference(path)


def _ffmpeg_reference(path: Path) -> Reference:
    """ffprobe counts the packets and decodes every frame (-count_frames); its decoder's error lines come on stderr
    ("[hevc @ 0x...] Could not find ref with POC 15")."""
    probe = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-count_packets", "-select_streams", "v:0",
                            "-show_entries", "stream=nb_read_frames,nb_read_packets", "-of", "json", str(path)],
                           capture_output=True, text=True, timeout=60)
    errors = [line for line in probe.stderr.splitlines() if re.match(r"\[(h264|hevc) @", line)]
    stream = json.loads(probe.stdout)["streams"][0]
    return Reference(int(stream["nb_read_packets"]), int(stream["nb_read_frames"]), errors)


def _pyav_reference(path: Path) -> Reference:
    import av

    packets = frames = 0
    errors = []
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        s.thread_type = "SLICE"
        for p in c.demux(s):
            packets += bool(p.size)
            try:
                for f in p.decode():
                    frames += 1
                    if f.is_corrupt:
                        errors.append(f"frame {frames - 1} flagged corrupt")
            except av.error.FFmpegError as exc:
                errors.append(str(exc))
    return Reference(packets, frames, errors)


def as_transport_stream(mp4: Path) -> Path | None:
    """``mp4``'s packets copied into MPEG-TS (read there by the GPU path's packet loop), or None where FFmpeg's
    muxer refuses the damaged packets (its Annex B filter checks their NAL lengths)."""
    from tests.clips import remux_ts

    try:
        return remux_ts(mp4, mp4.with_suffix(".ts"))
    except Exception:  # noqa: BLE001 - av.error.InvalidDataError: the damage broke the packet's framing
        mp4.with_suffix(".ts").unlink(missing_ok=True)
        return None
