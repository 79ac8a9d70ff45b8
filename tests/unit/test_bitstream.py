"""engines.video.bitstream: damage NVDEC decodes without a sign, found from the H.264/HEVC framing rules, on
packets built by hand from the standard's syntax and on bikes.mp4 with bytes zeroed inside packets whose place in
the file PyAV's demuxer gives (the reference: where the damage was put, not what trtc computes)."""

from __future__ import annotations

import random
import threading

import pytest

from engines.video.bitstream import Audit, Auditor, _answer, audit_file, file_damage, nal_length_size, packet_fault
from tests.clips import remux_ts

SPS = bytes([0x67, 0x42, 0xC0, 0x1E, 0xDA, 0x02, 0x80, 0xBF, 0xE5, 0xC0, 0x44, 0x00, 0x00, 0x03, 0x00, 0x04])
SLICE = bytes([0x65, 0x88, 0x84, 0x00, 0x00, 0x03, 0x01, 0x33, 0x00, 0x00, 0x03, 0x00, 0x7F, 0x80])


def avcc(*nals: bytes, size: int = 4) -> bytes:
    return b"".join(len(n).to_bytes(size, "big") + n for n in nals)


def test_clean_packets_pass_in_both_framings():
    assert packet_fault(avcc(SPS, SLICE), 4) is None
    assert packet_fault(avcc(SPS, SLICE, size=2), 2) is None
    # Annex B: a 4-byte start code, a 3-byte one, trailing zeros before the next start code
    assert packet_fault(b"\x00\x00\x00\x01" + SPS + b"\x00\x00\x00\x01" + SLICE, None) is None
    assert packet_fault(b"\x00\x00\x01" + SPS + b"\x00\x00" + b"\x00\x00\x01" + SLICE, None) is None


@pytest.mark.parametrize("bad, why, annexb", [
    (SLICE[:8] + bytes(6) + SLICE[8:], "run of zero bytes", True),
    (SLICE[:8] + b"\x00\x00\x02" + SLICE[8:], "forbid", True),
    (SLICE[:8] + b"\x00\x00\x03\x07" + SLICE[8:], "forbid", True),  # 03 protects only 00-03
    (bytes([SLICE[0] | 0x80]) + SLICE[1:], "forbidden_zero_bit", True),
    # in a byte stream a start code is where a NAL unit ends: the framing holds (two NAL units), only MP4's does not
    (SLICE[:8] + b"\x00\x00\x01" + SLICE[8:], "start code inside", False),
])
def test_a_broken_nal_unit_is_found_in_both_framings(bad, why, annexb):
    assert why in packet_fault(avcc(SPS, bad), 4)
    stream = packet_fault(b"\x00\x00\x00\x01" + SPS + b"\x00\x00\x01" + bad, None)
    assert why in stream if annexb else stream is None


def test_lengths_that_do_not_add_up_are_found():
    assert "length 0" in packet_fault(avcc(SPS) + bytes(4) + SLICE, 4)
    assert "past the packet's end" in packet_fault(avcc(SPS, SLICE)[:-3], 4)
    assert "cut off" in packet_fault(avcc(SPS) + b"\x00\x00", 4)
    assert "before the first start code" in packet_fault(b"\x12\x00\x00\x01" + SLICE, None)
    assert "empty NAL" in packet_fault(b"\x00\x00\x01" + SPS + b"\x00\x00\x01\x00\x00\x01" + SLICE, None)


def test_nal_length_size_from_the_codec_record():
    assert nal_length_size("h264", bytes([1, 0x42, 0xC0, 0x1E, 0xFF])) == 4
    assert nal_length_size("h264", bytes([1, 0x42, 0xC0, 0x1E, 0xFD])) == 2
    hvcc = bytearray(23)
    hvcc[0], hvcc[21] = 1, 0x0F
    assert nal_length_size("hevc", bytes(hvcc)) == 4
    assert nal_length_size("h264", b"\x00\x00\x00\x01" + SPS) is None  # Annex B extradata
    assert nal_length_size("h264", b"") is None


def _packets(path):
    """(position in the file, size) of every video packet, from PyAV's demuxer."""
    import av

    with av.open(str(path)) as c:
        return [(p.pos, p.size) for p in c.demux(c.streams.video[0]) if p.size]


def test_bikes_and_its_mpegts_copy_are_clean(bikes, tmp_path):
    pytest.importorskip("av")
    for path in (bikes, remux_ts(bikes, tmp_path / "bikes.ts")):
        a = audit_file(str(path))
        assert a.checked and a.packets == 250 and a.damaged == 0, (path, a)


def test_zeroed_bytes_are_found_in_the_packet_they_were_put_in(bikes, tmp_path):
    """Zeroed runs of 16-2048 bytes put inside chosen packets of bikes.mp4 (8 seeds): the audit names that packet
    first; FFmpeg's own decoder, for comparison, is printed (it does not see all of them)."""
    pytest.importorskip("av")
    data = bikes.read_bytes()
    packets = _packets(bikes)
    assert len(packets) == 250
    for seed in range(8):
        rng = random.Random(seed)
        k = rng.randrange(1, 250)
        pos, size = packets[k]
        n = min(rng.randint(16, 2048), size - 8)
        at = pos + rng.randrange(5, size - n)  # past the first NAL's length and header
        bad = bytearray(data)
        bad[at:at + n] = bytes(n)
        path = tmp_path / f"zero{seed}.mp4"
        path.write_bytes(bytes(bad))
        a = audit_file(str(path))
        print(f"seed {seed}: {n} bytes zeroed in packet {k} -> {a.damaged} damaged, first {a.first}")
        assert a.checked and a.damaged >= 1 and a.first[0] == k, (seed, k, a)


def test_what_cannot_be_checked_is_said_and_never_called_damaged(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video" * 100)
    for name in (str(junk), "rtsp://127.0.0.1:1/cam", str(tmp_path / "missing.mp4")):
        a = audit_file(name)
        assert not a.checked and a.damaged == 0 and a.note, (name, a)


def test_the_auditor_runs_beside_and_stops_with_the_run(bikes, tmp_path):
    pytest.importorskip("av")
    copy = tmp_path / "b.mp4"
    copy.write_bytes(bikes.read_bytes())
    stop = threading.Event()
    stop.set()
    assert Auditor(str(copy), stop).result().packets == 0  # stopped: not kept as the file's audit
    assert Auditor(str(copy)).result().packets == 250


def test_the_auditor_reads_the_file_in_a_child_process(bikes, tmp_path, monkeypatch):
    """Reading every packet holds this process's interpreter lock, which the decoder threads need: the Auditor
    reads in a child Python, so nothing here opens the file."""
    av = pytest.importorskip("av")
    copy = tmp_path / "b.mp4"
    copy.write_bytes(bikes.read_bytes())

    def refuse(*a, **k):
        raise AssertionError("read in this process")

    monkeypatch.setattr(av, "open", refuse)
    found = Auditor(str(copy)).result()
    assert found.checked and found.packets == 250 and found.damaged == 0


def test_the_childs_answer_is_its_last_line_and_a_child_without_one_leaves_the_file_unchecked():
    import subprocess
    import sys

    said = 'print("a library talking on stdout"); print(\'{"packets": 7, "damaged": 1, "first": [3, "x"], "checked": true}\')'
    child = subprocess.Popen([sys.executable, "-c", said], stdout=subprocess.PIPE)
    found = _answer(child, None)
    assert (found.packets, found.damaged, found.first, found.checked) == (7, 1, (3, "x"), True)
    mute = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], stdout=subprocess.PIPE)
    found = _answer(mute, None)
    assert not found.checked and not found.damaged and "exit 3" in found.note


def test_the_gpu_paths_verdict_counts_each_packet_once():
    audit = Audit(packets=250, damaged=2, first=(44, "a run of zero bytes inside a NAL unit"), checked=True)
    assert file_damage(0, set(), None, 0) == (0, "")
    assert file_damage(0, set(), Audit(packets=250, checked=True), 0) == (0, "")
    add, why = file_damage(0, set(), audit, 0)  # NVDEC gave no sign: the framing is the only witness
    assert add == 2 and "packet 44" in why and "without a sign" in why
    add, why = file_damage(3, set(), audit, 0)  # NVDEC's own count stands; the same packets are not added again
    assert add == 3 and "concealed errors in 3" in why and "packet 44" not in why
    add, why = file_damage(0, set(), audit, 1)  # a refused packet: already counted
    assert add == 0 and "1 packet(s) NVDEC refused" in why
    add, why = file_damage(2, {"b.mp4"}, audit, 0)  # lines another source may have printed: the framing counts
    assert add == 2 and "this source or another" in why and "packet 44" in why


def test_a_file_run_again_is_not_read_again_unless_it_changed(bikes, tmp_path, monkeypatch):
    av = pytest.importorskip("av")
    from engines.video import bitstream

    copy = tmp_path / "b.mp4"
    copy.write_bytes(bikes.read_bytes())
    first = Auditor(str(copy)).result()
    assert first.packets == 250

    def refuse(*a, **k):
        raise AssertionError("the file was read again")

    monkeypatch.setattr(av, "open", refuse)
    assert Auditor(str(copy)).result() is first  # the same unchanged file: what was found before
    copy.write_bytes(copy.read_bytes()[:-1000])  # changed (size and time): read again
    again = bitstream.audit_file_once(str(copy))
    assert again is not first and not again.checked and "could not open" in again.note


def test_a_check_child_that_hangs_is_killed_at_its_deadline_and_the_file_left_unchecked(tmp_path, monkeypatch):
    """The framing check's child gets a deadline scaled to the file's size (CHILD_START_S + size at
    CHILD_BYTES_PER_S); one that never answers (here a stand-in for Python that sleeps) is killed then, and the file
    is left unchecked, never called damaged, without holding up its source."""
    import sys
    import time

    import engines.video.bitstream as bs

    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"\0" * 4_000_000)
    hang = tmp_path / "python"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    monkeypatch.setattr(bs, "CHILD_START_S", 1.0)
    monkeypatch.setattr(bs, "CHILD_BYTES_PER_S", 4e6)  # 4 MB: one more second
    monkeypatch.setattr(sys, "executable", str(hang))
    start = time.monotonic()
    found = bs.Auditor(str(clip)).result()
    took = time.monotonic() - start
    assert 1.9 < took < 6, took
    assert not found.checked and not found.damaged
    assert found.note == "the check did not end within 2 s; stopped", found.note
