"""Atomic file writes and hashing.

An artifact is either there, whole, or not there: writers produce a temporary file in the target's directory
and ``os.replace`` it into place. Nothing is ever half-written, even on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success move it onto ``target``, else delete it.

    The temporary name keeps the target's suffix (``.model.onnx.tmp123.onnx``) so that libraries which look at
    the extension still work.
    """
    target = Path(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=f".tmp{target.suffix}", dir=target.parent)
    except OSError as exc:  # a user's folder that is missing, read-only or full: say so, no traceback
        raise _cannot_write(target, exc) from exc
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; artifacts get the usual permissions
    try:
        yield tmp_path
        try:
            os.replace(tmp_path, target)
        except OSError as exc:
            raise _cannot_write(target, exc) from exc
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def _cannot_write(target: Path, exc: OSError):
    from .errors import OutputNotWritable, UsageProblem

    folder = target.parent
    if not folder.is_dir():
        return UsageProblem(f"cannot write {target}: its folder {folder} does not exist",
                            f"create it first (mkdir -p {folder}) or choose another output")
    return OutputNotWritable(f"cannot write {target}: {exc.strerror or type(exc).__name__}",
                             f"choose an output in a folder you can write to, or fix its permissions (ls -ld {folder})")


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> None:
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))
