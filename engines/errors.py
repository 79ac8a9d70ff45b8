"""The error hierarchy shared by the runtime and the toolchain.

Every error trtc raises on purpose is a :class:`TrtcError`. Each carries a one-line ``reason`` and, where there
is one, a ``fix``: the CLI prints ``error: <reason>`` and ``  fix: <fix>`` and exits with ``exit_code``
(1 for failed work, 2 for a command line that is wrong). Library users catch ``TrtcError``.

These classes live in ``engines`` (the small runtime an edge box installs) because ``toolchain`` imports
``engines`` and never the reverse; ``toolchain.errors`` re-exports them and adds the offline-side errors.
"""

from __future__ import annotations


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """The first line of an exception's message, for a one-line error; the exception's type name when the message
    is empty (``str(exc).splitlines()[0]`` raises IndexError then, hiding the error being reported)."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else type(exc).__name__
    return line[:limit] if limit else line


class TrtcError(Exception):
    """Base of every error trtc raises on purpose."""

    exit_code = 1

    def __init__(self, reason: str, fix: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.fix = fix

    def __str__(self) -> str:  # one line, the fix after it
        return self.reason if not self.fix else f"{self.reason} (fix: {self.fix})"


class UsageProblem(TrtcError):
    """The command line or the call's arguments are wrong: fix them and run again."""

    exit_code = 2


class MissingDependency(TrtcError):
    """An optional package is not installed; ``fix`` names the install line."""

    def __init__(self, module: str, extra: str | None, purpose: str, package: str | None = None):
        what = package or module
        line = f'pip install "trtc[{extra}]"' if extra else f"pip install {what}"
        super().__init__(f"{purpose} needs the Python package '{what}', which is not installed", line)
        self.module = module
        self.extra = extra


class UnsupportedVersion(TrtcError):
    """An optional package is installed at a version whose API trtc cannot drive; ``fix`` names a tested one."""


class ManifestError(TrtcError):
    """An artifact's sidecar manifest is missing, unreadable, or does not match the artifact or this machine."""


class EngineError(TrtcError):
    """An engine could not be opened or run."""


class OutputNotWritable(TrtcError):
    """An output's folder exists but cannot take a new file (permissions, read-only file system, full disk)."""
