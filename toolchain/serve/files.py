"""Rotating JSON-lines files, one per camera: every line whole and flushed as it is written, so that `tail -F` follows
it while the service runs; rotated by size, the last ``keep`` kept.

    files = RotatingLines("results/", rotate_bytes=100 << 20, keep=10)
    files.write("door", '{"camera": "door", "frame": 7, ...}')   # results/door.jsonl
    files.close()

At ``rotate_bytes`` the file is renamed ``door.jsonl.1`` (``.1`` to ``.2`` and so on before it, the oldest beyond
``keep`` removed) and a new ``door.jsonl`` begun: a line never straddles two files, and `tail -F` (which follows the
name) goes on with the new one. A line is written with one write() of the whole line, then flushed: a reader sees
whole lines, and a crash loses at most the line being written. This is the live form of trtc's outputs: a result
file that grows while the run goes on, where `trtc run -o` on a file writes it whole at the end (CONVENTIONS.md).
One lock owns the files.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


class RotatingLines:
    def __init__(self, folder: str | os.PathLike, rotate_bytes: int = 100 << 20, keep: int = 10):
        if rotate_bytes < 1 or keep < 1:
            raise ValueError("rotate_bytes and keep must be 1 or more")
        self.folder, self.rotate_bytes, self.keep = Path(folder), rotate_bytes, keep
        self.folder.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, object] = {}
        self._lock = threading.Lock()

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.jsonl"

    def write(self, name: str, line: str) -> None:
        """Append ``line`` (one JSON document, no newline) to ``name``'s file, rotating first if it would pass the
        size."""
        data = (line.rstrip("\n") + "\n").encode()
        with self._lock:
            f = self._files.get(name)
            if f is None:
                f = self._files[name] = open(self.path(name), "ab")
            if f.tell() > 0 and f.tell() + len(data) > self.rotate_bytes:
                f.close()
                self._rotate(name)
                f = self._files[name] = open(self.path(name), "ab")
            f.write(data)
            f.flush()

    def _rotate(self, name: str) -> None:
        base = self.path(name)  # each older file moves up one; os.replace drops the one past keep
        for i in range(self.keep - 1, 0, -1):
            older = Path(f"{base}.{i}")
            if older.exists():
                os.replace(older, f"{base}.{i + 1}")
        os.replace(base, f"{base}.1")

    def close(self, name: str | None = None) -> None:
        """Close ``name``'s file (a camera removed), or every file."""
        with self._lock:
            for key in [name] if name is not None else list(self._files):
                f = self._files.pop(key, None)
                if f is not None:
                    f.close()
