"""A real RTSP server for the live-source tests: GStreamer's gst-rtsp-server (Debian's gir1.2-gst-rtsp-server-1.0
through python3-gi). It runs under Debian's own python3 (/usr/bin/python3), not the test venv, so tests start it
as a subprocess with :func:`start`.

It listens on 127.0.0.1 only and serves one mount, ``/cam``, with RTP carried inside the RTSP TCP connection
(nothing leaves the loopback):
- ``--file F``: an MP4's H.264 stream as it is, paced by its timestamps (each client gets it from the start; the
  stream ends with the file);
- ``--pattern``: a live test pattern (H.264, 640x360, 30 fps, key frame every 30 frames) that never ends.
``--silent`` instead accepts TCP connections and never answers (a server that hangs).

    /usr/bin/python3 tests/rtsp_server.py --port 8554 --file bikes.mp4
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

SYSTEM_PYTHON = "/usr/bin/python3"
PACKAGES = ("gstreamer1.0-rtsp gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-base "
            "gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly")


def available() -> str | None:
    """None when the server can run here, else why not (for a skip message)."""
    if not os.path.exists(SYSTEM_PYTHON):
        return f"no {SYSTEM_PYTHON} (Debian's python3 runs gst-rtsp-server)"
    probe = ("import gi; gi.require_version('GstRtspServer', '1.0'); from gi.repository import Gst, GstRtspServer; "
             "Gst.init(None); assert Gst.ElementFactory.find('x264enc') and Gst.ElementFactory.find('rtph264pay')")
    r = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60)
    if r.returncode:
        return f"gst-rtsp-server is not installed (apt-get install {PACKAGES})"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running server subprocess; ``url`` is its stream. ``kill()`` stops it at once (as a crash or a power cut
    would), ``restart()`` brings it back on the same port."""

    def __init__(self, port: int, args: list[str]):
        self.port = port
        self.args = args
        self.url = f"rtsp://127.0.0.1:{port}/cam"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "Server":
        cmd = [SYSTEM_PYTHON, os.path.abspath(__file__), "--port", str(self.port), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True)
        line = self.proc.stdout.readline()  # "ready" once it listens
        if "ready" not in line:
            self.kill()
            raise RuntimeError(f"the RTSP server did not start ({cmd})")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # listening for real
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the RTSP server does not accept connections")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> "Server":
        self.kill()
        return self.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


def start(port: int | None = None, file: str | None = None, pattern: bool = False, silent: bool = False) -> Server:
    args = (["--file", str(file)] if file else []) + (["--pattern"] if pattern else []) + (["--silent"] if silent
                                                                                              else [])
    return Server(port or free_port(), args).start()


def _silent(port: int) -> None:
    """Accept connections and never answer."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    print("ready", flush=True)
    held = []
    while True:
        conn, _ = srv.accept()
        held.append(conn)


def _serve(port: int, launch: str) -> None:
    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtsp", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import GLib, Gst, GstRtsp, GstRtspServer

    Gst.init(None)
    server = GstRtspServer.RTSPServer.new()
    server.set_address("127.0.0.1")
    server.set_service(str(port))
    factory = GstRtspServer.RTSPMediaFactory.new()
    factory.set_launch(launch)
    factory.set_shared(False)  # each client its own pipeline: a file from its first frame
    factory.set_protocols(GstRtsp.RTSPLowerTrans.TCP)  # RTP inside the RTSP connection: loopback TCP only
    server.get_mount_points().add_factory("/cam", factory)
    if server.attach(None) == 0:
        sys.exit(f"cannot listen on 127.0.0.1:{port}")
    print("ready", flush=True)
    GLib.MainLoop().run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--file")
    ap.add_argument("--pattern", action="store_true")
    ap.add_argument("--silent", action="store_true")
    a = ap.parse_args()
    if a.silent:
        _silent(a.port)
    elif a.file:
        _serve(a.port, f"( filesrc location={a.file} ! qtdemux ! h264parse ! "
                       "rtph264pay name=pay0 pt=96 config-interval=1 )")
    else:
        _serve(a.port, "( videotestsrc is-live=true pattern=ball ! video/x-raw,width=640,height=360,framerate=30/1 ! "
                       "x264enc tune=zerolatency speed-preset=ultrafast key-int-max=30 ! "
                       "rtph264pay name=pay0 pt=96 config-interval=1 )")


if __name__ == "__main__":
    main()
