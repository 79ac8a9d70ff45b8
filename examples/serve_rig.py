"""Real components for exercising `trtc serve` on one machine, for examples/soak_serve.py: a Mosquitto broker
(Debian's `mosquitto`), an MQTT subscriber that records what the broker delivered, and RTSP cameras (Debian's
gst-rtsp-server, run under /usr/bin/python3, which has its GObject bindings). Everything listens on 127.0.0.1 only.

    broker = Broker(folder).start()          # persistence on: a subscriber's session survives a restart
    sub = Subscriber(broker.port, "soak/#")  # QoS 1, persistent session: .messages [(arrival, topic, payload)]
    cam = Camera(fps=5).start()              # cam.url; cam.kill() / cam.start() (a reboot), cam.pause() / resume()

Packages: `apt-get install mosquitto gstreamer1.0-rtsp gir1.2-gst-rtsp-server-1.0 python3-gi
gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly`, and paho-mqtt (trtc's serve extra).
Run as a script, this file is one camera's server: `/usr/bin/python3 examples/serve_rig.py --port 8554 --fps 5`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

SYSTEM_PYTHON = "/usr/bin/python3"
MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
GST_PACKAGES = ("gstreamer1.0-rtsp gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-base "
                "gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode} (port {port})") from None
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout} s")


def missing() -> list[str]:
    """What this machine lacks to run the rig (empty: nothing)."""
    out = []
    if not MOSQUITTO:
        out.append("mosquitto (apt-get install mosquitto)")
    probe = ("import gi; gi.require_version('GstRtspServer', '1.0'); from gi.repository import Gst, GstRtspServer; "
             "Gst.init(None); assert Gst.ElementFactory.find('x264enc')")
    if not os.path.exists(SYSTEM_PYTHON) or subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True,
                                                           timeout=60).returncode != 0:
        out.append(f"gst-rtsp-server under {SYSTEM_PYTHON} (apt-get install {GST_PACKAGES})")
    try:
        import paho.mqtt.client  # noqa: F401
    except ImportError:
        out.append('paho-mqtt (pip install -e ".[serve]")')
    return out


class Broker:
    """Mosquitto on a port of 127.0.0.1, persistence on (a subscriber's queued messages survive a restart)."""

    def __init__(self, folder: Path, port: int | None = None):
        self.folder, self.port = Path(folder), port or free_port()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.conf = self.folder / "mosquitto.conf"
        root = "user root\n" if os.geteuid() == 0 else ""  # as root: stay root, to write the persistence folder
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
                             f"persistence_location {self.folder}/\nautosave_interval 1\nlog_dest none\n{root}")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Broker":
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        _wait_listening(self.port, self.proc, 10, "mosquitto")
        return self

    def stop(self) -> None:
        """SIGTERM: the broker saves its sessions, as a service restart does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class Subscriber:
    """A QoS 1 subscriber with a persistent session: ``messages`` holds (arrival time, topic, payload text) in the
    order the broker delivered them, across restarts of the broker (it reconnects by itself)."""

    def __init__(self, port: int, topic: str, client_id: str = "soak-subscriber"):
        import paho.mqtt.client as mqtt

        self.messages: list[tuple[float, str, str]] = []
        self.connects = 0
        subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
        self.client.reconnect_delay_set(min_delay=0.2, max_delay=1)

        def on_connect(client, userdata, flags, rc, props=None):
            self.connects += 1
            client.subscribe(topic, qos=1)

        self.client.on_connect = on_connect
        self.client.on_subscribe = lambda *a: subscribed.set()
        self.client.on_message = lambda c, u, m: self.messages.append((time.time(), m.topic, m.payload.decode()))
        self.client.connect("127.0.0.1", port, keepalive=5)
        self.client.loop_start()
        if not subscribed.wait(10):
            raise RuntimeError(f"no SUBACK from the broker on {port} within 10 s")

    def settle(self, quiet: float = 3.0, timeout: float = 60.0) -> None:
        """Wait until nothing new arrived for ``quiet`` s (at most ``timeout`` s)."""
        deadline, seen, since = time.monotonic() + timeout, -1, time.monotonic()
        while time.monotonic() < deadline:
            if len(self.messages) != seen:
                seen, since = len(self.messages), time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.2)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Camera:
    """An RTSP camera: gst-rtsp-server's live test pattern (H.264, ``size``, ``fps``), one process per camera, so
    that a fault touches one camera: ``kill()`` then ``start()`` is a reboot, ``pause()`` (SIGSTOP) a camera that
    hangs with its connections open, ``resume()`` its recovery."""

    def __init__(self, fps: int = 5, size: str = "320x240", port: int | None = None):
        self.fps, self.size, self.port = fps, size, port or free_port()
        self.url = f"rtsp://127.0.0.1:{self.port}/cam"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Camera":
        cmd = [SYSTEM_PYTHON, os.path.abspath(__file__), "--port", str(self.port), "--fps", str(self.fps), "--size",
               self.size]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        _wait_listening(self.port, self.proc, 30, "the RTSP server")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)


def _serve(port: int, fps: int, size: str) -> None:
    """One camera's server (runs under Debian's python3, which has the GObject bindings)."""
    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtsp", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import GLib, Gst, GstRtsp, GstRtspServer

    Gst.init(None)
    width, height = size.split("x")
    server = GstRtspServer.RTSPServer.new()
    server.set_address("127.0.0.1")
    server.set_service(str(port))
    factory = GstRtspServer.RTSPMediaFactory.new()
    factory.set_launch(f"( videotestsrc is-live=true pattern=ball ! video/x-raw,width={width},height={height},"
                       f"framerate={fps}/1 ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} ! "
                       "rtph264pay name=pay0 pt=96 config-interval=1 )")
    factory.set_shared(False)
    factory.set_protocols(GstRtsp.RTSPLowerTrans.TCP)  # RTP inside the RTSP connection: loopback TCP only
    server.get_mount_points().add_factory("/cam", factory)
    if server.attach(None) == 0:
        raise SystemExit(f"cannot listen on 127.0.0.1:{port}")
    GLib.MainLoop().run()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="one RTSP camera: a live test pattern on 127.0.0.1:PORT/cam")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--fps", type=int, default=5)
    ap.add_argument("--size", default="320x240")
    a = ap.parse_args()
    _serve(a.port, a.fps, a.size)
