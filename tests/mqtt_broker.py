"""A real MQTT broker for the tests: Debian's mosquitto on a free port of 127.0.0.1 (.ci/run installs it), with
persistence, so that a subscriber's session and its queued messages survive a restart of the broker, as on a box
whose broker restarts under a running service."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from tests.rtsp_server import free_port

MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)


def available() -> str:
    """Why no broker can run here ("" where one can)."""
    return "" if MOSQUITTO else "needs Debian's mosquitto (apt-get install mosquitto; .ci/run installs it)"


class Broker:
    """``start()``, ``stop()`` (SIGTERM: the broker saves its sessions), ``kill()`` (SIGKILL), ``restart()``."""

    def __init__(self, folder: Path, port: int | None = None):
        self.folder, self.port = Path(folder), port or free_port()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.conf = self.folder / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
                             f"persistence_location {self.folder}/\nautosave_interval 1\nlog_dest none\n"
                             + ("user root\n" if os.geteuid() == 0 else ""))  # as root: no switch to the
        # mosquitto user, which could not write the persistence file into a test's private folder
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> "Broker":
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mosquitto exited with {self.proc.returncode} on port {self.port}")
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {timeout} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> "Broker":
        self.stop()
        return self.start()


class Subscriber:
    """A paho client with a persistent session (QoS 1) that records every message of ``topic``:
    ``messages`` [(topic, payload)], in the order they arrived."""

    def __init__(self, port: int, topic: str = "trtc/#", client_id: str = "test-subscriber"):
        import paho.mqtt.client as mqtt

        self.messages: list[tuple[str, str]] = []
        self.subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
        self.client.reconnect_delay_set(min_delay=0.1, max_delay=0.5)
        self.client.on_connect = lambda c, u, f, rc, p=None: c.subscribe(topic, qos=1)
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        self.client.on_message = lambda c, u, m: self.messages.append((m.topic, m.payload.decode()))
        self.client.connect("127.0.0.1", port, keepalive=5)
        self.client.loop_start()
        if not self.subscribed.wait(10):
            raise RuntimeError(f"no SUBACK from the broker on {port} within 10 s")

    def wait_for(self, predicate, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(list(self.messages)):
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
