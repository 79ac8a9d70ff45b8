"""systemd's notify protocol (toolchain.serve.notify) against a real AF_UNIX datagram socket, as the service manager
listens on one: a file system path and an abstract name (``@...``), the watchdog's period from $WATCHDOG_USEC, a
$WATCHDOG_PID of another process meaning "not this one", no-ops outside systemd, and a send that fails never
raising (and logged once)."""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from toolchain.serve.notify import Notifier

ROOT = Path(__file__).resolve().parents[2]


class Manager:
    """The service manager's side: a datagram socket that records each message's assignments and its sender's pid
    (SO_PASSCRED, which is how systemd checks NotifyAccess=main)."""

    def __init__(self, address: str):
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(b"\0" + address[1:].encode() if address.startswith("@") else address)
        self.sock.settimeout(5)

    def receive(self) -> tuple[list[str], int]:
        data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        pid = next(struct.unpack("iII", d)[0] for level, kind, d in ancillary
                   if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS)
        return data.decode().split("\n"), pid

    def nothing_waits(self) -> bool:
        self.sock.settimeout(0.05)
        try:
            self.sock.recv(4096)
            return False
        except (BlockingIOError, socket.timeout):
            return True
        finally:
            self.sock.settimeout(5)

    def close(self):
        self.sock.close()


@pytest.fixture(params=["path", "abstract"])
def manager(request, tmp_path):
    address = str(tmp_path / "notify") if request.param == "path" else f"@trtc-test-{uuid.uuid4().hex}"
    m = Manager(address)
    yield m
    m.close()


def test_each_message_arrives_as_one_datagram_of_assignments(manager):
    notify = Notifier.from_env({"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "20000000"})
    assert notify.enabled and notify.watchdog_interval() == 10.0
    assert notify.ready(status="2 cameras")
    assert manager.receive() == (["READY=1", "STATUS=2 cameras"], os.getpid())
    notify.watchdog()
    assert manager.receive()[0] == ["WATCHDOG=1"]
    notify.status("door: down\nSTOPPING=1")  # a newline in the text would have been a second assignment
    assert manager.receive()[0] == ["STATUS=door: down STOPPING=1"]
    notify.reloading()
    reloading = manager.receive()[0]
    assert reloading[0] == "RELOADING=1" and reloading[1].startswith("MONOTONIC_USEC=")
    notify.extend_timeout(90)
    assert manager.receive()[0] == ["EXTEND_TIMEOUT_USEC=90000000"]
    notify.stopping()
    assert manager.receive()[0] == ["STOPPING=1"]
    notify.close()


def test_the_watchdog_is_for_the_process_watchdog_pid_names(manager):
    env = {"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "3000000"}
    assert Notifier.from_env({**env, "WATCHDOG_PID": str(os.getpid())}).watchdog_interval() == 1.5
    other = Notifier.from_env({**env, "WATCHDOG_PID": str(os.getppid())})  # a process that is not this one
    assert other.watchdog_interval() is None and other.watchdog() is False
    assert manager.nothing_waits()
    assert other.ready() and manager.receive()[0] == ["READY=1"]  # the socket itself is still this process's
    for usec in ("0", "", "ten"):
        assert Notifier.from_env({**env, "WATCHDOG_USEC": usec}).watchdog_interval() is None


def test_outside_systemd_every_call_does_nothing():
    notify = Notifier.from_env({})
    assert not notify.enabled and notify.watchdog_interval() is None
    assert not any([notify.ready(), notify.watchdog(), notify.status("x"), notify.stopping()])
    assert not Notifier.from_env({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled  # an address this does not speak


def test_unset_keeps_the_variables_from_child_processes(manager):
    env = {"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid()),
           "PATH": "/bin"}
    notify = Notifier.from_env(env, unset=True)
    assert env == {"PATH": "/bin"} and notify.enabled and notify.watchdog_interval() == 0.5


def test_a_send_that_fails_never_raises_and_is_logged_once(tmp_path, caplog):
    notify = Notifier(str(tmp_path / "nobody-listens"), watchdog_usec=1_000_000)
    with caplog.at_level(logging.WARNING, logger="trtc"):
        assert notify.ready() is False and notify.watchdog() is False and notify.stopping() is False
    warnings = [r for r in caplog.records if "notify socket" in r.getMessage()]
    assert len(warnings) == 1 and "nobody-listens" in warnings[0].getMessage()


def test_the_service_process_itself_is_the_sender(manager):
    """What systemd's NotifyAccess=main checks: the datagram's sender is the process that systemd started, which
    read the variables from its own environment."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; from toolchain.serve.notify import Notifier; n = Notifier.from_env(); "
                               "print(os.getpid(), n.watchdog_interval(), n.ready('up'), n.watchdog())"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "4000000"},
        capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert child.returncode == 0, child.stderr
    pid, interval, ready, pinged = child.stdout.split()
    assert (interval, ready, pinged) == ("2.0", "True", "True")
    assert manager.receive() == (["READY=1", "STATUS=up"], int(pid))
    assert manager.receive() == (["WATCHDOG=1"], int(pid))
