"""Stop signals: SIGTERM (systemctl stop, docker stop, timeout) ends a command as Ctrl-C does.

:func:`install` makes SIGTERM raise KeyboardInterrupt in the main thread, so every command's Ctrl-C handling
(results so far kept, files written whole or not at all, a summary) runs for it too. :func:`stop_signal` says
which signal it was, for the exit code: 130 after Ctrl-C (SIGINT), 143 after SIGTERM, as shells report them.
"""

from __future__ import annotations

import signal

_received: list[str] = []


def _on_term(signum, frame):  # noqa: ARG001 - the signal module's signature
    _received.append("SIGTERM")
    raise KeyboardInterrupt


def install() -> None:
    """Handle SIGTERM like Ctrl-C (main thread only; a no-op elsewhere)."""
    try:
        signal.signal(signal.SIGTERM, _on_term)
    except ValueError:  # not the main thread (an embedding app): leave its handlers alone
        pass


def stop_signal() -> str | None:
    """"SIGTERM" when one was received, else None (Ctrl-C or nothing)."""
    return _received[-1] if _received else None


def exit_code() -> int:
    return 143 if stop_signal() == "SIGTERM" else 130
