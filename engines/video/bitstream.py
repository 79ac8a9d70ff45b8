"""Damage in an H.264 or HEVC file that NVDEC decodes without a sign, found by reading the bitstream's framing.

NVDEC conceals errors in what it decodes and PyNvVideoCodec 2.2.4 hands Python no decode status: where its C++
code prints nothing (``native_out``), a file with a run of zeroed bytes decodes, is classified and would be called
clean, while the CPU path's decoder refuses the packet. Both codecs' NAL unit syntax gives a check that needs no
decoding (ITU-T H.264 7.4.1 and H.265 7.4.2):

- inside a NAL unit the byte sequences 00 00 00, 00 00 01 and 00 00 02 never occur (an encoder inserts the
  emulation-prevention byte 03 to avoid them), and 00 00 03 is followed only by 00-03;
- a NAL unit's first bit (``forbidden_zero_bit``) is 0;
- in MP4 and Matroska each NAL unit comes after its length, and the lengths add up to the packet.

A packet that breaks one of these is damaged whatever a decoder makes of it; a conformant stream never breaks them,
so a clean file is never called damaged. Damage that keeps the framing (a flipped bit inside slice data) is not
seen here: that is what NVDEC's own prints are for.

The GPU path reads each file in a child Python running this file (it imports nothing of trtc's): reading every
packet through PyAV holds the interpreter lock for most of its time, which the decoder threads beside it need.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field


CODECS = ("h264", "hevc")
_FORBIDDEN = re.compile(rb"\x00\x00[\x00-\x02]|\x00\x00\x03[\x04-\xff]")
_START = b"\x00\x00\x01"


def nal_length_size(codec: str, extradata: bytes | None) -> int | None:
    """Bytes of each NAL unit's length in the packets of an MP4/Matroska stream (from its avcC or hvcC record), or
    None where the packets are an Annex B byte stream (start codes: MPEG-TS, raw .h264/.hevc)."""
    x = bytes(extradata or b"")
    if not x or x.startswith(_START) or x.startswith(b"\x00" + _START) or x[0] != 1:
        return None
    if codec == "h264" and len(x) >= 5:
        return (x[4] & 3) + 1
    if codec == "hevc" and len(x) >= 22:
        return (x[21] & 3) + 1
    return None


def _nal_fault(nal: bytes | memoryview) -> str | None:
    if not len(nal):
        return "an empty NAL unit"
    if nal[0] & 0x80:
        return "a NAL unit whose forbidden_zero_bit is set"
    m = _FORBIDDEN.search(nal)
    if m is None:
        return None
    return ("a run of zero bytes inside a NAL unit" if m.group()[2] == 0 else
            "a start code inside a NAL unit" if m.group()[2] == 1 else "a byte sequence H.264/HEVC forbid")


def packet_fault(data: bytes, length_size: int | None) -> str | None:
    """Why ``data`` (one packet of an H.264/HEVC stream) breaks the bitstream's framing, or None where it does not.
    ``length_size``: from :func:`nal_length_size` (None: an Annex B byte stream)."""
    if length_size:
        view, pos, end = memoryview(data), 0, len(data)
        while pos < end:
            if pos + length_size > end:
                return "a NAL unit's length is cut off at the packet's end"
            n = int.from_bytes(view[pos:pos + length_size], "big")
            pos += length_size
            if n == 0:
                return "a NAL unit of length 0"
            if pos + n > end:
                return f"a NAL unit of {n} bytes runs {pos + n - end} bytes past the packet's end"
            why = _nal_fault(view[pos:pos + n])
            if why:
                return why
            pos += n
        return None
    parts = data.split(_START)
    if parts[0].strip(b"\x00"):  # what comes before the first start code is leading zeros at most
        return "bytes before the first start code"
    for part in parts[1:]:
        # zeros at a NAL unit's end belong to what follows (a 4-byte start code, trailing_zero_8bits)
        why = _nal_fault(part.rstrip(b"\x00"))
        if why:
            return why
    return None


@dataclass
class Audit:
    """What :func:`audit_file` found: packets read, packets whose framing is broken, the first one's index and why,
    and whether the file could be checked at all (``checked``: False for another codec or without PyAV)."""

    packets: int = 0
    damaged: int = 0
    first: tuple[int, str] | None = None
    checked: bool = False
    note: str = ""

    def reason(self) -> str:
        """One clause for a problem line."""
        i, why = self.first
        return (f"{self.damaged} packet(s) break the bitstream's framing (first: packet {i}, {why}); NVDEC decoded "
                "them without a sign of error (concealed, classified)")


def audit_file(path: str, stop: threading.Event | None = None) -> Audit:
    """Read every video packet of the local file ``path`` with PyAV's demuxer (no decoding) and check each one's
    framing (about 15 us a 40 KB packet beside PyAV's 50 us to read it). Never raises: a file PyAV cannot open is
    left to the decoder (``checked`` False, ``note`` says why); a read that fails
    part-way counts as one damaged packet."""
    out = Audit()
    if not os.path.isfile(path):  # a URL is not read twice; a live stream has no end to read to
        out.note = "not a local file"
        return out
    try:
        import av
    except ImportError:
        out.note = "PyAV is not installed (the gpu extra installs it)"
        return out
    try:
        container = av.open(str(path))
    except Exception as exc:  # noqa: BLE001 - the decoder reports a file that does not open
        out.note = f"PyAV could not open it: {exc}"
        return out
    with container:
        if not container.streams.video:
            out.note = "no video stream"
            return out
        stream = container.streams.video[0]
        codec = stream.codec_context.name
        if codec not in CODECS:
            out.note = f"{codec} is not checked (H.264 and HEVC are)"
            return out
        size = nal_length_size(codec, stream.codec_context.extradata)
        out.checked = True
        try:
            for packet in container.demux(stream):
                if stop is not None and stop.is_set():
                    break
                if packet.size == 0:  # the demuxer's flush packet
                    continue
                why = "the container flags it as corrupt" if packet.is_corrupt else packet_fault(bytes(packet), size)
                if why:
                    out.damaged += 1
                    out.first = out.first or (out.packets, why)
                out.packets += 1
        except Exception as exc:  # noqa: BLE001 - the demuxer gave up part-way: the rest of the file is unread
            out.damaged += 1
            out.first = out.first or (out.packets, f"the demuxer stopped: {exc}")
    return out


# audits of whole files read in this process, by (path, size, modification time): a file run again (the repeats of
# `trtc bench`, a service handed the same file) is not read again. The lock owns the dict; at most _KEPT entries.
_DONE: dict = {}
_DONE_LOCK = threading.Lock()
_KEPT = 256


_CHILDREN = threading.BoundedSemaphore(4)  # files read at once in child processes
# the child's deadline: a start (Python and PyAV, about 1 s) and a read at 20 MB/s, some 30 times slower than
# measured (about 600 MB/s), after which it is killed and the file left unchecked, so that a child hung in the demuxer
# never holds up its source or the run
CHILD_START_S, CHILD_BYTES_PER_S = 20.0, 20e6


def audit_in_child(path: str, stop: threading.Event | None = None) -> Audit:
    """:func:`audit_file` in a child Python, at most four at once; a stop kills it. Never raises: a child that
    fails leaves the file unchecked (``note`` says why), never called damaged."""
    if not os.path.isfile(path):  # nothing to read: said at once, no child
        return audit_file(path, stop)
    with _CHILDREN:
        if stop is not None and stop.is_set():
            return Audit(note="stopped")
        try:
            # -P: the script's folder (engines/video) is not put first on the child's module path
            safe = ["-P"] if sys.version_info >= (3, 11) else []
            child = subprocess.Popen([sys.executable, *safe, os.path.abspath(__file__), path], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        except OSError as exc:
            return Audit(note=f"the check could not start: {exc}")
        out = _answer(child, stop, CHILD_START_S + os.path.getsize(path) / CHILD_BYTES_PER_S)
    return out


def _answer(child: subprocess.Popen, stop: threading.Event | None, deadline_s: float | None = None) -> Audit:
    """The child's Audit once it ends; killed at a stop, or when it runs past ``deadline_s``: an unchecked Audit."""
    import time

    start = time.monotonic()
    while True:
        try:
            text = child.communicate(timeout=0.2)[0]
            break
        except subprocess.TimeoutExpired:
            late = deadline_s is not None and time.monotonic() - start > deadline_s
            if late or (stop is not None and stop.is_set()):
                child.kill()
                child.communicate()
                return Audit(note=f"the check did not end within {deadline_s:.0f} s; stopped" if late else "stopped")
    try:
        found = json.loads(text.strip().splitlines()[-1])  # the answer is the last line
        found["first"] = tuple(found["first"]) if found.get("first") else None
        return Audit(**found)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        return Audit(note=f"the check failed (exit {child.returncode}): {exc}")


def audit_file_once(path: str, stop: threading.Event | None = None, read=audit_file) -> Audit:
    """``read(path, stop)`` (:func:`audit_file` or :func:`audit_in_child`), or what was found before for the same
    unchanged file."""
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    except OSError:
        return read(path, stop)
    with _DONE_LOCK:
        found = _DONE.get(key)
    if found is not None:
        return found
    out = read(path, stop)
    if out.checked and not (stop is not None and stop.is_set()):  # a whole read only
        with _DONE_LOCK:
            _DONE[key] = out
            while len(_DONE) > _KEPT:
                del _DONE[next(iter(_DONE))]
    return out


@dataclass
class Auditor:
    """:func:`audit_file_once` through :func:`audit_in_child`, waited for on a thread of its own beside the decoder:
    ``result()`` joins it."""

    path: str
    stop: threading.Event | None = None
    _out: list = field(default_factory=list)

    def __post_init__(self):
        def run():
            found = audit_file_once(self.path, self.stop, audit_in_child)
            if found.note:  # unchecked: never called damaged, so say why at debug
                logging.getLogger("trtc").debug("%s: framing not checked: %s", self.path, found.note)
            self._out.append(found)

        self._thread = threading.Thread(target=run, name="trtc-bitstream", daemon=True)
        self._thread.start()

    def result(self) -> Audit:
        self._thread.join()
        return self._out[0] if self._out else Audit(note="the check failed")


def file_damage(printed: int, others: set, audit: Audit | None, counted: int, lost: int = 0) -> tuple[int, str]:
    """What the GPU path says about a file it decoded to the end: (damage to add to the source's count, the
    problem's text, "" for a clean file). The signs, in the order they are trusted:

    - ``counted``: packets NVDEC refused or the demuxer flagged corrupt (already in the source's count);
    - ``lost``: packets NVDEC took but gave no frame for, after its flush (already in the source's count);
    - ``printed``: pictures NVDEC concealed errors in (``native_out``'s count), the source's own only when no other
      source decoded meanwhile (``others`` empty);
    - ``audit``: packets whose bitstream framing is broken (:func:`audit_file`), counted only where neither sign
      above is the source's own, so that no packet is counted twice."""
    add, why = 0, []
    if counted:
        why.append(f"{counted} packet(s) NVDEC refused or the demuxer flagged corrupt (skipped)")
    if lost:
        why.append(f"{lost} packet(s) gave no frame (NVDEC dropped the picture)")
    if printed and not others:
        add += printed
        why.append(f"NVDEC concealed errors in {printed} decoded picture(s) (classified)")
    elif printed:
        why.append(f"NVDEC concealed errors in {printed} picture(s) while {len(others)} other source(s) decoded too "
                   "(PyNvVideoCodec does not say whose; this source or another is damaged)")
    if audit is not None and audit.damaged and not counted and not lost and not add:
        add += audit.damaged
        why.append(audit.reason())
    return add, "; ".join(why)


if __name__ == "__main__":  # the child of audit_in_child: one file's Audit as JSON on stdout
    print(json.dumps(asdict(audit_file(sys.argv[1]))), flush=True)
