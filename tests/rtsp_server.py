"""A real RTSP server for the live-source tests: GStreamer's gst-rtsp-server (Debian's gir1.2-gst-rtsp-server-1.0
through python3-gi) where it runs, else aio-rtsp-toolkit's file server (pure Python over PyAV: the GPU machine's
image, where Debian's GStreamer does not run). gst-rtsp-server runs under Debian's own python3 (/usr/bin/python3),
aio-rtsp-toolkit under the test's interpreter; tests start either as a subprocess with :func:`start`.

It listens on 127.0.0.1 only and serves one stream (``Server.url``), with RTP carried inside the RTSP TCP connection
(nothing leaves the loopback):
- ``--file F``: an MP4's H.264 stream as it is, paced by its timestamps (each client gets it from the start; the
  stream ends with the file);
- ``--pattern``: a live test pattern (H.264, 640x360, 30 fps, key frame every 30 frames) that never ends (with
  aio-rtsp-toolkit: a 10 s clip of a moving pattern, encoded once by PyAV's libx264, played in a loop).
``--silent`` instead accepts TCP connections and never answers (a server that hangs); ``--status "403 Forbidden"``
answers every request with that status. ``--auth basic|digest --user U --password P``: gst-rtsp-server plays only
for that user (401 without or with other credentials).
``TRTC_TEST_RTSP=aio`` picks aio-rtsp-toolkit's server where gst-rtsp-server runs too (to try the GPU machine's
server on a CPU machine).

    /usr/bin/python3 tests/rtsp_server.py --port 8554 --file bikes.mp4
    python3 tests/rtsp_server.py --aio --port 8554 --pattern
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SYSTEM_PYTHON = "/usr/bin/python3"
PACKAGES = ("gstreamer1.0-rtsp gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-base "
            "gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly")


_backend: list = []  # [name or None, why not], found once per process


def _find_backend() -> tuple:
    """("gst", "") where gst-rtsp-server runs, else ("aio", "") where aio-rtsp-toolkit and PyAV import, else
    (None, why neither)."""
    if not _backend and os.environ.get("TRTC_TEST_RTSP") == "aio":  # the GPU machine's server, tried here
        _backend[:] = ["aio", ""]
    if not _backend:
        why = f"no {SYSTEM_PYTHON} (Debian's python3 runs gst-rtsp-server)"
        if os.path.exists(SYSTEM_PYTHON):
            probe = ("import gi; gi.require_version('GstRtspServer', '1.0'); "
                     "from gi.repository import Gst, GstRtspServer; Gst.init(None); "
                     "assert Gst.ElementFactory.find('x264enc') and Gst.ElementFactory.find('rtph264pay')")
            r = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60)
            why = "" if r.returncode == 0 else f"gst-rtsp-server is not installed (apt-get install {PACKAGES})"
        if not why:
            _backend[:] = ["gst", ""]
        elif all(importlib.util.find_spec(m) for m in ("aio_rtsp_toolkit", "aio_sockets", "av")):
            _backend[:] = ["aio", ""]
        else:
            _backend[:] = [None, f"{why}, and aio-rtsp-toolkit is not installed either (pip install "
                                 "'aio-rtsp-toolkit[server]==0.1.4')"]
    return tuple(_backend)


def available() -> str | None:
    """None when a server can run here, else why not (for a skip message)."""
    return _find_backend()[1] or None


def backend() -> str | None:
    """"gst" or "aio": the server :func:`start` runs here (None: neither)."""
    return _find_backend()[0]


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
        self.aio = "--aio" in args
        # aio-rtsp-toolkit names the stream by its file; play_count=0 plays it in a loop
        self.path = f"/cam.mp4?play_count={1 if '--file' in args else 0}" if self.aio else "/cam"
        self.url = f"rtsp://127.0.0.1:{port}{self.path}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "Server":
        cmd = [sys.executable if self.aio else SYSTEM_PYTHON, os.path.abspath(__file__), "--port", str(self.port),
               *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True)
        line = "log"
        while line and line.strip() != "ready":  # "ready" once it listens (aio-rtsp-toolkit logs a line first)
            line = self.proc.stdout.readline()
        if not line:
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


def start(port: int | None = None, file: str | None = None, pattern: bool = False, silent: bool = False,
          auth: tuple | None = None, status: str | None = None) -> Server:
    """``auth``: (basic or digest, user, password): gst-rtsp-server plays only for that user (401 otherwise).
    ``status``: a stub that answers every request with it (e.g. "403 Forbidden")."""
    args = (["--file", str(file)] if file else []) + (["--pattern"] if pattern else []) + (["--silent"] if silent
                                                                                              else [])
    if auth:
        args += ["--auth", auth[0], "--user", auth[1], "--password", auth[2]]
    if status:
        args += ["--status", status]
    if not (silent or status) and backend() == "aio":
        args.append("--aio")
    return Server(port or free_port(), args).start()


def pattern_clip() -> str:
    """The aio server's test pattern: 10 s of a square moving over a gradient, H.264 640x360 at 30 fps, a key
    frame every 30 frames, encoded once per machine by PyAV's libx264 (written to a temporary name, then renamed)."""
    path = os.path.join(tempfile.gettempdir(), "trtc-rtsp-pattern-640x360-30fps.mp4")
    if os.path.exists(path):
        return path
    import av
    import numpy as np

    tmp = f"{path}.{os.getpid()}.tmp"
    with av.open(tmp, "w", format="mp4") as out:
        s = out.add_stream("libx264", rate=30)
        s.width, s.height, s.pix_fmt = 640, 360, "yuv420p"
        s.options = {"g": "30", "bf": "0", "preset": "ultrafast", "tune": "zerolatency"}
        y, x = np.mgrid[0:360, 0:640]
        for i in range(300):
            img = np.stack([(x + 4 * i) % 256, (y + 2 * i) % 256, np.full_like(x, 128)], -1).astype(np.uint8)
            cx, cy = (20 + 7 * i) % 600, (20 + 3 * i) % 320
            img[cy:cy + 40, cx:cx + 40] = 255
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    os.replace(tmp, path)
    return path


def _serve_aio(port: int, file: str) -> None:
    """aio-rtsp-toolkit's server on 127.0.0.1:port, serving ``file`` as /cam.mp4 (from a folder of its own)."""
    import asyncio

    from aio_rtsp_toolkit.server import RtspServer

    folder = tempfile.mkdtemp(prefix="trtc-rtsp-")
    try:  # not a symbolic link: the server refuses a file that resolves outside its folder
        os.link(file, os.path.join(folder, "cam.mp4"))
    except OSError:
        shutil.copy(file, os.path.join(folder, "cam.mp4"))

    async def run():
        server = await RtspServer(folder, host="127.0.0.1", port=port).start()
        print("ready", flush=True)
        await server.serve_forever()

    asyncio.run(run())


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


def _auth(server, factory, method: str, user: str, password: str):
    """Only ``user`` with ``password`` may play (``method``: basic or digest authentication)."""
    from gi.repository import GstRtsp, GstRtspServer

    auth = GstRtspServer.RTSPAuth()
    token = GstRtspServer.RTSPToken()
    token.set_string("media.factory.role", "viewer")
    if method == "digest":
        auth.add_digest(user, password, token)
    else:
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(user, password), token)
    auth.set_supported_methods(GstRtsp.RTSPAuthMethod.DIGEST if method == "digest" else GstRtsp.RTSPAuthMethod.BASIC)
    server.set_auth(auth)
    permissions = GstRtspServer.RTSPPermissions()
    permissions.add_permission_for_role("viewer", "media.factory.access", True)
    permissions.add_permission_for_role("viewer", "media.factory.construct", True)
    factory.set_permissions(permissions)


def _status(port: int, status: str) -> None:
    """Answer every RTSP request with ``status`` (e.g. "403 Forbidden"): a camera that refuses this client."""
    import threading

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    print("ready", flush=True)

    def answer(conn):
        with conn:
            data = b""
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
                while b"\r\n\r\n" in data:
                    head, data = data.split(b"\r\n\r\n", 1)
                    cseq = next((line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                                 if line.lower().startswith(b"cseq:")), b"1")
                    conn.sendall(b"RTSP/1.0 " + status.encode() + b"\r\nCSeq: " + cseq + b"\r\n\r\n")

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=answer, args=(conn,), daemon=True).start()


def _serve(port: int, launch: str, auth: tuple | None = None) -> None:
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
    if auth:
        _auth(server, factory, *auth)
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
    ap.add_argument("--aio", action="store_true", help="aio-rtsp-toolkit's server instead of gst-rtsp-server")
    ap.add_argument("--status", help='answer every request with this status, e.g. "403 Forbidden"')
    ap.add_argument("--auth", choices=("basic", "digest"), help="play only for --user with --password")
    ap.add_argument("--user", default="cam")
    ap.add_argument("--password", default="")
    a = ap.parse_args()
    auth = (a.auth, a.user, a.password) if a.auth else None
    if a.silent:
        _silent(a.port)
    elif a.status:
        _status(a.port, a.status)
    elif a.aio:
        _serve_aio(a.port, a.file or pattern_clip())
    elif a.file:
        _serve(a.port, f"( filesrc location={a.file} ! qtdemux ! h264parse ! "
                       "rtph264pay name=pay0 pt=96 config-interval=1 )", auth)
    else:
        _serve(a.port, "( videotestsrc is-live=true pattern=ball ! video/x-raw,width=640,height=360,framerate=30/1 ! "
                       "x264enc tune=zerolatency speed-preset=ultrafast key-int-max=30 ! "
                       "rtph264pay name=pay0 pt=96 config-interval=1 )", auth)


if __name__ == "__main__":
    main()
