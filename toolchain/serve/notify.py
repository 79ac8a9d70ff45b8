"""systemd's notify protocol (sd_notify(3)), so that a ``Type=notify`` unit with ``WatchdogSec=`` knows when the service
is ready and restarts it when its loop stops turning. No python-systemd: the protocol is one datagram.

    notify = Notifier.from_env()           # a no-op outside systemd (no $NOTIFY_SOCKET)
    notify.ready()                         # the engine is open
    period = notify.watchdog_interval()    # seconds between pings, or None: no watchdog for this process
    notify.watchdog()                      # once per turn of the loop, at least every ``period`` s
    notify.status("8 cameras, 1 down")     # the line `systemctl status` shows
    notify.stopping()                      # SIGTERM: the stop has begun

The protocol, as sd_notify(3) documents it: the service manager passes a socket's address in ``$NOTIFY_SOCKET``, an
AF_UNIX datagram socket, a file system path, or an abstract name written with a leading ``@`` (a NUL byte in the
address). Each message is one datagram of newline-separated ``KEY=VALUE`` assignments: ``READY=1``, ``RELOADING=1``
(with ``MONOTONIC_USEC=``), ``STOPPING=1``, ``STATUS=...``, ``WATCHDOG=1``, ``EXTEND_TIMEOUT_USEC=``.
``$WATCHDOG_USEC`` is the watchdog's timeout in microseconds; it applies to this process only where
``$WATCHDOG_PID`` is unset or is this process's id (a child that inherited the variables is not the one watched).
The usual ping period is half the timeout.

A send that fails (the manager gone, a full socket buffer) never raises: the service runs on, and the first failure
is logged once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

log = logging.getLogger("trtc")

ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """Messages to systemd's notify socket at ``address`` (a path, or ``@name`` for an abstract one; None: every
    call does nothing). ``watchdog_usec``: the watchdog's timeout for this process, or None."""

    def __init__(self, address: str | None = None, watchdog_usec: int | None = None):
        self.address = _socket_address(address)
        self.watchdog_usec = watchdog_usec
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def from_env(cls, environ=None, unset: bool = False) -> "Notifier":
        """The notifier systemd's variables describe (``environ``: os.environ unless given). ``unset``: remove them
        from ``environ`` afterwards, so that child processes do not notify or ping in the service's name."""
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        notifier = cls(address, _watchdog_usec(env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")))
        if unset:
            for key in ENV:
                env.pop(key, None)
        return notifier

    @property
    def enabled(self) -> bool:
        """Whether messages go anywhere (False outside systemd: every call is a no-op)."""
        return self.address is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between two :meth:`watchdog` pings: half the watchdog's timeout; None where systemd watches
        nothing for this process."""
        return None if not self.watchdog_usec else self.watchdog_usec / 2e6

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *_status(status))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1") if self.watchdog_usec else False

    def stopping(self, status: str | None = None) -> bool:
        return self.send("STOPPING=1", *_status(status))

    def reloading(self) -> bool:
        """A reload has begun (``ready()`` ends it); CLOCK_MONOTONIC's time, as ``Type=notify-reload`` wants."""
        return self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def status(self, text: str) -> bool:
        return self.send(*_status(text))

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for ``seconds`` more before the start (or stop) counts as timed out: a long engine build."""
        return self.send(f"EXTEND_TIMEOUT_USEC={max(1, int(seconds * 1e6))}")

    def send(self, *assignments: str) -> bool:
        """One datagram of ``assignments`` (KEY=VALUE each); True when it was sent. Never raises."""
        if self.address is None or not assignments:
            return False
        data = "\n".join(assignments).encode("utf-8", "replace")
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                    self._sock.settimeout(1.0)  # a manager that does not read never holds the loop for long
                self._sock.sendto(data, self.address)
                return True
            except OSError as exc:
                if not self._warned:
                    self._warned = True
                    log.warning("systemd notify socket %s: %s (the service runs on; further failures are not "
                                "logged)", _shown(self.address), exc)
                return False

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _socket_address(address: str | None) -> str | bytes | None:
    """The address to send to: a path as it is, ``@name`` as the abstract name (a leading NUL byte); None for no
    socket, and for an address of a kind this does not speak (e.g. ``vsock:``), which is logged."""
    if not address:
        return None
    if address.startswith("@"):
        return b"\0" + address[1:].encode()
    if address.startswith("/"):
        return address
    log.warning("NOTIFY_SOCKET=%s is neither a path nor an abstract name (@...): systemd will not hear from this "
                "service", address)
    return None


def _watchdog_usec(usec: str | None, pid: str | None) -> int | None:
    """WATCHDOG_USEC as a positive whole number, where WATCHDOG_PID names this process or is unset; else None."""
    try:
        value = int(usec) if usec else 0
        if pid and int(pid) != os.getpid():
            return None
    except ValueError:
        return None
    return value if value > 0 else None


def _status(text: str | None) -> tuple[str, ...]:
    """``STATUS=`` on one line (a newline would start another assignment)."""
    return () if text is None else ("STATUS=" + " ".join(str(text).split()),)


def _shown(address) -> str:
    return "@" + address[1:].decode(errors="replace") if isinstance(address, bytes) else str(address)
