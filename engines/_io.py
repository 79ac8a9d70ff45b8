"""Atomic file writes and hashing.

An artifact is either there, whole, or not there: writers produce a temporary file in the target's directory,
it is fsynced, ``os.replace``d into place, and the directory is fsynced (so a power cut after the call returns
cannot lose the rename). Nothing is ever half-written, even on Ctrl-C.

A temporary file's name carries its writer (host and process id): the next writer of the same target removes
those of a process of this host that is gone (killed by SIGKILL or a power cut, which skip every clean-up) and
names the ones it cannot judge (:func:`clear_orphans`).

Files that describe an artifact still at its temporary path (its manifest, ``defer_until_placed``) are written
to temporaries of their own and moved into place only after the artifact: an interruption never leaves a
manifest without its artifact.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("trtc")
# temporary artifact path -> [(temporary file, target)] to move into place after that artifact
_PENDING: dict[Path, list[tuple[Path, Path]]] = {}
# (real path, device, inode, size, mtime_ns, ctime_ns) -> sha256 of the files this process has hashed (see
# sha256_verified); a rewrite, a replacement or a touch changes the key, so a changed file is hashed again
_HASHED: dict[tuple, str] = {}


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform without directory handles (Windows): the rename is what it gives
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _host() -> str:
    return "".join(c for c in socket.gethostname() if c.isalnum())[:24] or "host"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):  # another user's process, or cannot tell: alive
        return True
    return True


def orphans(target: Path) -> tuple[list[Path], list[Path]]:
    """Temporary files of ``target`` that earlier writers left (a SIGKILL or a power cut skips their clean-up):
    (those of a process of this host that is gone, safe to remove; those trtc cannot judge: written before the
    names carried their writer, or on another host, whose writer may still be at work)."""
    gone, unsure = [], []
    mine = re.compile(r"trtc-([A-Za-z0-9]*)-(\d+)-[A-Za-z0-9_]+\.tmp" + re.escape(target.suffix) + "$")
    older = re.compile(r"[a-z0-9_]{8}\.tmp" + re.escape(target.suffix) + "$")
    head = f".{target.name}."
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return gone, unsure
    here = _host()
    for e in entries:
        if not e.name.startswith(head):
            continue
        rest = e.name[len(head):]
        m = mine.match(rest)
        if m:
            pid = int(m.group(2))
            if m.group(1) == here and pid != os.getpid() and not _pid_alive(pid):
                gone.append(Path(e.path))
            elif m.group(1) != here:
                unsure.append(Path(e.path))
        elif older.match(rest):
            unsure.append(Path(e.path))
    return gone, unsure


def clear_orphans(target: Path) -> None:
    """Remove what a killed earlier writer of ``target`` left, saying so; name what cannot be judged."""
    gone, unsure = orphans(target)
    for path in gone:
        with contextlib.suppress(OSError):
            path.unlink()
            log.warning("removed %s: a temporary file of %s left by an earlier trtc run that was killed",
                        path.name, target.name)
    for path in unsure:
        log.warning("%s looks like a temporary file of %s left by an earlier run (killed, or still running on "
                    "another machine); remove it if no other trtc is writing %s", path.name, target.name, target.name)


def _temporary(target: Path) -> Path:
    clear_orphans(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.trtc-{_host()}-{os.getpid()}-", suffix=f".tmp{target.suffix}",
                               dir=target.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; artifacts get the usual permissions
    return Path(tmp)


def user_cache_dir(kind: str) -> Path:
    """``$XDG_CACHE_HOME/trtc/KIND`` (default ``~/.cache/trtc/KIND``): what trtc keeps to start faster next time and
    makes again when it is gone (compiled code, calibration ranges, the quick session's model copies)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trtc" / kind


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def sha256_verified(path: str | os.PathLike) -> str:
    """:func:`sha256_file`, remembered in this process for as long as the file's identity, size, mtime and ctime
    stay the same. Opening a model checks its manifest's hash (about 14 ms for a 20 MB model on one core, so 0.1-
    0.7 s for the plans of large models); a process that opens the same file again (a plan is checked by
    ``open_engine`` and again by ``TensorRTEngine``; a benchmark opens its model twice) hashes it once. The file
    is always hashed at least once per process: nothing is skipped."""
    def identity():
        st = os.stat(path)
        return os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    key = identity()
    digest = _HASHED.get(key)
    if digest is None:
        digest = sha256_file(path)
        if identity() == key:  # not remembered if the file changed while it was read
            if len(_HASHED) > 256:  # a long-lived process opening many models: keep the memory bounded
                _HASHED.clear()
            _HASHED[key] = digest
    return digest


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success move it onto ``target``, else delete it.

    The temporary name keeps the target's suffix (``.model.onnx.tmp123.onnx``) so that libraries which look at
    the extension still work.
    """
    target = Path(target)
    _refuse_special(target)
    try:
        tmp_path = _temporary(target)
    except OSError as exc:  # a user's folder that is missing, read-only or full: say so, no traceback
        raise _cannot_write(target, exc) from exc
    _PENDING[tmp_path] = []
    try:
        yield tmp_path
        _fsync_file(tmp_path)
        try:
            os.replace(tmp_path, target)  # the artifact first ...
            for tmp, final in _PENDING[tmp_path]:  # ... then what describes it (fsynced when written)
                os.replace(tmp, final)
        except OSError as exc:
            raise _cannot_write(target, exc) from exc
        _fsync_dir(target.parent)
    except BaseException:
        for path in [tmp_path, *(t for t, _ in _PENDING.get(tmp_path, []))]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        raise
    finally:
        _PENDING.pop(tmp_path, None)


def defer_until_placed(artifact_tmp: str | os.PathLike, target: str | os.PathLike, data: bytes) -> bool:
    """Write ``data`` to ``target`` right after the artifact now at ``artifact_tmp`` (inside its ``atomic_path``)
    is moved into place. False (nothing written) when ``artifact_tmp`` is no artifact in the making."""
    key = Path(artifact_tmp)
    if key not in _PENDING:
        return False
    target = Path(target)
    tmp = _temporary(target)
    _PENDING[key].append((tmp, target))
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return True


def _refuse_special(target: Path) -> None:
    """A device, FIFO or socket at ``target`` is never replaced by the rename (as root, /dev/null would become a
    regular file): refused whatever the caller asked."""
    import stat

    try:
        mode = os.stat(target).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    from .errors import UsageProblem

    raise UsageProblem(f"{target} is not a regular file (a device, a FIFO or a socket): trtc writes regular files "
                       "only, and would replace it", f"write to a file path instead, e.g. {target.stem or 'out'}"
                       f"{target.suffix or '.out'} in the current folder")


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


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))


class OutputBusy(Exception):
    """Raised by :func:`output_lock` when another live process holds the lock; ``holder`` is what its lock file
    says ({"pid", "host", "started"}), empty when it could not be read."""

    def __init__(self, lock: Path, holder: dict):
        super().__init__(str(lock))
        self.lock, self.holder = lock, holder


def lock_file(target: str | os.PathLike) -> Path:
    """The advisory lock file of an output that a process writes for a long time (``trtc run -o``)."""
    target = Path(target)
    return target.with_name(f".{target.name}.lock")


def _read_holder(fd: int) -> dict:
    import json

    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = json.loads(os.read(fd, 4096).decode() or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, UnicodeDecodeError):
        return {}


@contextlib.contextmanager
def output_lock(target: str | os.PathLike) -> Iterator[dict]:
    """Hold the advisory lock of ``target`` while the block runs: one writer per output.

    The lock is an ``flock`` on ``.NAME.lock`` beside the target, which holds the writer's host, process id and
    start time (Unix seconds). The kernel releases an ``flock`` when its process ends however it ends (SIGKILL
    included), so a lock file whose lock can be taken was left by a process that is gone: it is taken over, and
    what it said is yielded as ``{"stale": {...}}`` for the caller to report. A lock held by a live process
    raises :class:`OutputBusy` at once (nothing waits). The lock file is removed when the block ends."""
    import fcntl
    import json
    import time

    lock = lock_file(target)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise OutputBusy(lock, holder) from None
        except OSError:
            os.close(fd)
            raise
        try:  # the file locked must still be the one at the path (its holder may have removed it meanwhile)
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    stale = _read_holder(fd)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": round(time.time(), 3)}
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode() + b"\n")
    except OSError:  # a full disk: the flock still holds; the file only lacks who holds it
        pass
    try:
        yield {"stale": stale} if stale else {}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)
