"""Damage NVDEC conceals, counted from what PyNvVideoCodec prints on file descriptor 1.

PyNvVideoCodec 2.2.4 hands Python no decode status: a picture NVDEC decoded with errors (and concealed) is returned
like any other, and the only sign is a line "Decode Error occurred for picture N" that its C++ code prints on file
descriptor 1 from inside ``Decode``. While a file source decodes on NVDEC, fd 1 is therefore a pipe: a thread passes
every byte on to where fd 1 pointed before (whole lines; a line without its newline waits for it) and counts those
lines. A source's count is the lines printed between its :meth:`Tap.begin` and :meth:`Tap.end`; the lines name no
decoder, so the count is the source's own only when no other source decoded meanwhile, which ``end`` says. When
the last source ends, fd 1 points where it did before and everything held is passed on.

Where fd 1 went may fail: a reader that went away (``| head -3``: EPIPE) or a full device (ENOSPC). The tap never
hides that: it keeps the first error (:attr:`Tap.error`) and points fd 1 back where it went at once, so that the next
write of the process meets the same error itself and the process stops as it would without the tap (141 for a closed
pipe, 1 for a full device); until the last window ends the pipe is drained, and NVDEC's lines are no longer counted.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading

MARK = b"Decode Error occurred for picture"
_SYNC = b"\x00trtc-sync-"
_END = _SYNC + b"end\x00\n"  # the reader passes on what it holds and stops


class Watch:
    """One source's window: ``end()`` gives (lines printed meanwhile, the names of the sources that decoded in it
    too)."""

    def __init__(self, tap: "Tap", name: str, start: int):
        self.tap, self.name, self.start, self.others = tap, name, start, set()

    def end(self) -> tuple[int, set]:
        return self.tap.end(self)


class Tap:
    """fd 1 as a counted pipe while at least one :class:`Watch` is open (one per process: :data:`TAP`)."""

    def __init__(self):
        self._lock = threading.Lock()  # owns the windows and fd 1 (begin and end run whole under it)
        self._open: list[Watch] = []
        self._fds = None  # (read end, write end, fd 1 as it was, reader thread) while installed
        self._counted = threading.Lock()  # owns _count and _synced, shared with the reader thread
        self._count = 0
        self._synced: dict[bytes, threading.Event] = {}
        self._ids = itertools.count()
        self.error: OSError | None = None  # the first write to where fd 1 went that failed (kept for good)

    def begin(self, name: str) -> Watch | None:
        """Open a window for ``name`` (None where fd 1 cannot be tapped: it is closed)."""
        with self._lock:
            if self._fds is None:
                if not self._install():
                    return None
            else:
                self._sync()  # lines printed before this window are counted before it
            with self._counted:
                w = Watch(self, name, self._count)
            for other in self._open:
                other.others.add(name)
                w.others.add(other.name)
            self._open.append(w)
            return w

    def end(self, watch: Watch) -> tuple[int, set]:
        with self._lock:
            self._sync()
            with self._counted:
                n = self._count - watch.start
            self._open.remove(watch)
            if not self._open:
                self._uninstall()
        return n, watch.others

    # ------------------------------------------------------------------------------------------------ the pipe
    def _install(self) -> bool:
        try:
            saved = os.dup(1)
        except OSError:
            return False
        _flush_stdio()
        try:
            r, w = os.pipe()
        except OSError:  # out of file descriptors: decode without the count
            os.close(saved)
            return False
        os.dup2(w, 1)
        reader = threading.Thread(target=self._read, args=(r, saved, w), daemon=True, name="trtc-fd1")
        reader.start()
        self._fds = (r, w, saved, reader)
        return True

    def _uninstall(self) -> None:
        r, w, saved, reader = self._fds
        self._fds = None
        _flush_stdio()
        os.dup2(saved, 1)  # from here on, fd 1 writes go where they went before
        os.write(w, _END)  # not the pipe's end of file: a child process may have inherited fd 1
        reader.join(10)
        if not reader.is_alive():
            os.close(r)
        os.close(w)
        os.close(saved)

    def _sync(self) -> None:
        """Wait until the reader has counted everything printed before this call (a marker through the pipe).
        Called under ``_lock`` with the pipe installed."""
        _flush_stdio()
        token = _SYNC + str(next(self._ids)).encode() + b"\x00\n"
        with self._counted:
            done = self._synced[token] = threading.Event()
        os.write(self._fds[1], token)
        done.wait(5)

    def _read(self, r: int, out: int, w: int) -> None:
        held, ended, failed = b"", False, False
        while not ended:
            data = os.read(r, 65536)
            if not data:
                break
            lines = (held + data).split(b"\n")
            held = lines.pop()
            passed = []
            for line in lines:
                at = line.find(_SYNC)
                if at >= 0:  # our marker, after any text of a line that has not ended (passed on as it is)
                    token = line[at:] + b"\n"
                    ended = ended or token == _END
                    with self._counted:
                        event = self._synced.pop(token, None)
                    if event is not None:
                        event.set()
                    passed.append(line[:at])
                    continue
                if MARK in line:
                    with self._counted:
                        self._count += 1
                passed.append(line + b"\n")
            if not failed:
                failed = self._pass_on(out, b"".join(passed), w)
        if not failed:
            self._pass_on(out, held, w)

    def _pass_on(self, out: int, data: bytes, w: int) -> bool:
        """Write ``data`` where fd 1 went; on an error, keep it and give fd 1 back to that place (the next write
        there fails as it would have without the tap). True when it failed."""
        try:
            _write_all(out, data)
            return False
        except OSError as exc:
            with self._counted:
                if self.error is None:
                    self.error = exc
            try:
                if _same_file(1, w):  # fd 1 is still our pipe: point it back (dup2 is atomic for other writers)
                    os.dup2(out, 1)
            except OSError:
                pass
            return True


def _same_file(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd``; an OSError (EPIPE, ENOSPC, EIO) is raised to the caller."""
    while data:
        data = data[os.write(fd, data):]


def _flush_stdio() -> None:
    """Python's and C's buffered stdout out to fd 1 (PyNvVideoCodec prints through C's stdio)."""
    try:
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError):
        pass
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


TAP = Tap()
