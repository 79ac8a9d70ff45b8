"""A bounded disk spool: what a network sink cannot send now is kept in order on disk, and sent when the consumer
returns, also after a restart.

    spool = Spool("spool/mqtt", max_bytes=512 << 20)
    spool.put(b'{"camera": "door", ...}')      # appended; the oldest go past max_bytes (counted in spool.dropped)
    for record in spool.peek(100): ...         # the oldest records, in order, not yet taken
    spool.ack(n)                               # the first n of them were delivered: gone for good

Records live in segment files (``NNNNNNNNNNNN.seg``, each at most ``segment_bytes``) of length-prefixed entries; the
read position is in ``head`` (segment number, byte offset), replaced atomically after each ack. A record is written
whole before it counts (a crash mid-write leaves a torn tail that the next open cuts off), so the guarantee is
at-least-once: a record acknowledged by the consumer but not yet by ``ack`` is sent again after a crash. Past
``max_bytes`` whole segments go, oldest first, and their records are counted as dropped. One lock owns the spool:
any thread may put, peek and ack.
"""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

_LEN = struct.Struct(">I")
MAX_RECORD = 16 << 20  # a record larger than this is refused (a message, not a file)


class Spool:
    def __init__(self, folder: str | os.PathLike, max_bytes: int = 512 << 20, segment_bytes: int = 4 << 20):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.segment_bytes = max_bytes, min(segment_bytes, max(max_bytes // 4, 1 << 16))
        self.dropped = 0  # records lost to the bound since this object was made
        self._lock = threading.Lock()
        self._head = self._read_head()
        segments = self._segments()
        self._tail_no = segments[-1] if segments else max(self._head[0], 1)
        self._cut_torn_tail()
        self._writer = open(self._path(self._tail_no), "ab")

    # public ----------------------------------------------------------------------------------------------------
    def put(self, record: bytes) -> None:
        if len(record) > MAX_RECORD:
            raise ValueError(f"a spool record of {len(record)} bytes is over {MAX_RECORD}")
        with self._lock:
            if self._writer.tell() + _LEN.size + len(record) > self.segment_bytes and self._writer.tell() > 0:
                self._writer.close()
                self._tail_no += 1
                self._writer = open(self._path(self._tail_no), "ab")
            self._writer.write(_LEN.pack(len(record)) + record)
            self._writer.flush()
            self._bound()

    def peek(self, limit: int = 100) -> list[bytes]:
        """Up to ``limit`` of the oldest records not yet acknowledged, in the order they were put."""
        with self._lock:
            out: list[bytes] = []
            seg, offset = self._head
            while len(out) < limit and seg <= self._tail_no:
                out += self._read(seg, offset, limit - len(out))[0]
                seg, offset = seg + 1, 0
            return out

    def ack(self, count: int) -> None:
        """The first ``count`` records that :meth:`peek` gave were delivered: remove them."""
        with self._lock:
            seg, offset = self._head
            while count > 0 and seg <= self._tail_no:
                records, end = self._read(seg, offset, count)
                count -= len(records)
                offset = end
                if count > 0 or (end >= self._size(seg) and seg < self._tail_no):
                    self._remove(seg)
                    seg, offset = seg + 1, 0
            self._head = (seg, offset)
            self._write_head()

    def empty(self) -> bool:
        """No record waits (cheap: compares positions, reads nothing)."""
        with self._lock:
            return self._head >= (self._tail_no, self._writer.tell())

    @property
    def bytes(self) -> int:
        """Bytes on disk (records not yet acknowledged, and the acknowledged part of the oldest segment)."""
        with self._lock:
            return sum(self._size(s) for s in self._segments())

    @property
    def waiting_bytes(self) -> int:
        """Bytes of the records not yet acknowledged (0 once the spool has drained, whatever stays on disk)."""
        with self._lock:
            if self._head >= (self._tail_no, self._writer.tell()):
                return 0
            seg, offset = self._head
            return sum(self._size(s) for s in self._segments() if s >= seg) - offset

    def __len__(self) -> int:
        return len(self.peek(1 << 30))

    def close(self) -> None:
        with self._lock:
            self._writer.close()

    # inside ----------------------------------------------------------------------------------------------------
    def _path(self, no: int) -> Path:
        return self.folder / f"{no:012d}.seg"

    def _segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.folder.glob("*.seg") if p.stem.isdigit())

    def _size(self, no: int) -> int:
        try:
            return self._path(no).stat().st_size
        except FileNotFoundError:
            return 0

    def _read(self, seg: int, offset: int, limit: int) -> tuple[list[bytes], int]:
        out = []
        try:
            with open(self._path(seg), "rb") as f:
                f.seek(offset)
                while len(out) < limit:
                    size = f.read(_LEN.size)
                    if len(size) < _LEN.size:
                        break
                    (n,) = _LEN.unpack(size)
                    data = f.read(n)
                    if len(data) < n:
                        break
                    out.append(data)
                    offset = f.tell()
        except FileNotFoundError:
            pass
        return out, offset

    def _remove(self, no: int) -> None:
        if no == self._tail_no:  # the one being written: emptied, not removed
            self._writer.truncate(0)
            self._writer.seek(0)
            return
        try:
            self._path(no).unlink()
        except FileNotFoundError:
            pass

    def _bound(self) -> None:
        """Drop the oldest whole segments while the spool is over max_bytes (never the one being written)."""
        segments = self._segments()
        total = sum(self._size(s) for s in segments)
        while total > self.max_bytes and len(segments) > 1:
            oldest = segments.pop(0)
            start = self._head[1] if self._head[0] == oldest else 0
            self.dropped += len(self._read(oldest, start, 1 << 30)[0]) if oldest >= self._head[0] else 0
            total -= self._size(oldest)
            self._remove(oldest)  # a head inside it reads on from the next segment (a missing one reads empty)

    def _read_head(self) -> tuple[int, int]:
        try:
            seg, offset = (self.folder / "head").read_text().split()
            return int(seg), int(offset)
        except (FileNotFoundError, ValueError):
            segments = self._segments()
            return (segments[0] if segments else 1), 0

    def _write_head(self) -> None:
        tmp = self.folder / "head.tmp"
        tmp.write_text(f"{self._head[0]} {self._head[1]}\n")
        os.replace(tmp, self.folder / "head")

    def _cut_torn_tail(self) -> None:
        """A record half-written when the process died is cut off, so the next put starts whole."""
        path = self._path(self._tail_no)
        if not path.exists():
            return
        start = self._head[1] if self._head[0] == self._tail_no else 0
        _, end = self._read(self._tail_no, start, 1 << 30)
        if end < path.stat().st_size:
            with open(path, "r+b") as f:
                f.truncate(end)
