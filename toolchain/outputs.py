"""One rule for every file a command writes, checked before any work starts.

- the folder must exist: otherwise exit 2 with the ``mkdir -p`` fix (nothing is created behind the user's back);
- the folder must take a new file: a read-only or otherwise unwritable folder is exit 1, said in one line;
- an existing file is refused without ``--force`` (exit 2);
- anything there that is not a regular file (a device such as /dev/null, a FIFO, a socket) is refused, with or
  without ``--force`` (exit 2): replacing it with a file would break what else uses it.

The writability check really creates (and removes) a temporary file: permission bits alone do not tell, e.g. for
root, on a read-only mount or in a pseudo file system.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from engines.errors import OutputNotWritable, UsageProblem


def check_output_path(output: str | os.PathLike, force: bool, suffix: str | None = ".onnx",
                      option: str = "-o") -> Path:
    """Check an output path before the work: see the module docstring. Returns it as a Path."""
    from .errors import said_as

    out = Path(output)
    another = said_as(f"another {option}", "another output path")
    if suffix is not None and out.suffix.lower() != suffix:
        raise UsageProblem(f"output {out} must end in {suffix}",
                           said_as(f"e.g. {option} {out.stem}{suffix}", f"e.g. {out.with_suffix(suffix)}"))
    parent = out.parent
    if not parent.exists():
        raise UsageProblem(f"output folder {parent} does not exist",
                           f"create it first (mkdir -p {parent}) or give {another}")
    if not parent.is_dir():
        raise UsageProblem(f"output folder {parent} is not a folder (it is a file)",
                           f"give {option} a path inside a folder")
    if out.is_dir():
        raise UsageProblem(f"output {out} is a folder",
                           f"give a file name, e.g. {option} {out / ('out' + (suffix or '.txt'))}")
    refuse_special(out, option, suffix)
    if out.exists() and not force:
        raise UsageProblem(f"{out} already exists", said_as(f"add --force to overwrite it, or give {another}",
                                                            f"pass force=True to overwrite it, or give {another}"))
    probe_writable(parent)
    return out


def special_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a folder ("a character device", ...);
    None otherwise (absent, a regular file, a folder, or a link to one of those)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, what in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None


def refuse_special(out: Path, option: str = "-o", suffix: str | None = None) -> None:
    """Refuse an output that is a device, a FIFO or a socket, with or without --force: trtc writes a temporary
    file and renames it onto the target, which would replace the device with a regular file."""
    what = special_kind(out)
    if what is not None:
        example = f"{out.stem or 'out'}{suffix or out.suffix or '.jsonl'}"
        raise UsageProblem(f"{option} {out} is {what}, not a file: trtc writes regular files only (--force does "
                           "not change that)", f"give {option} a file path, e.g. {option} {example}; to discard "
                           "what a command prints, redirect its stdout instead (> /dev/null)")


def probe_writable(folder: str | os.PathLike) -> None:
    """Create and remove a temporary file in ``folder``; raise :class:`OutputNotWritable` if that fails."""
    folder = Path(folder)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".trtc-write-check.", dir=folder)
    except OSError as exc:
        raise not_writable(folder, exc) from exc
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def not_writable(folder: Path, exc: OSError) -> OutputNotWritable:
    why = exc.strerror or type(exc).__name__
    return OutputNotWritable(f"cannot write in {folder}: {why}",
                             "choose an output in a folder you can write to, or fix its permissions "
                             f"(ls -ld {folder})")


__all__ = ["check_output_path", "probe_writable", "refuse_special", "special_kind", "OutputNotWritable", "not_writable"]
