"""The service's health and metrics over HTTP: what a watchdog, Prometheus and a person read.

    state = ServiceState()                     # the service's loop updates it; this module only reads it
    server = StatusServer(state, host="127.0.0.1", port=9108).start()
    state.camera_frame("door", lag_s=0.12, label="unicycle", score=0.61)
    server.stop()

Endpoints:

- ``/metrics``: Prometheus text (prometheus-client, the serve extra): per camera (label ``camera="NAME"``) the
  counters ``trtc_frames_received_total``, ``trtc_frames_classified_total``, ``trtc_frames_dropped_total`` (label
  ``reason``: lag, decode, stride), ``trtc_reconnects_total``, ``trtc_messages_published_total``,
  ``trtc_messages_spooled_total``, ``trtc_spool_dropped_total``; ``trtc_config_reloads_total`` (label ``result``:
  accepted, refused); the gauges ``trtc_lag_seconds``, ``trtc_seconds_since_last_frame``, ``trtc_camera_up`` and
  ``trtc_spool_bytes``; the histograms ``trtc_end_to_end_lag_seconds`` and ``trtc_batch_latency_seconds``; and the
  process's own (resident memory, CPU) from prometheus-client's process collector.
- ``/healthz``: 200 while the service's loop has turned within ``loop_timeout`` s (``state.beat()``), else 503.
- ``/readyz``: 200 once the engine is open and every enabled camera has delivered a frame within its read timeout;
  503 otherwise, with the reasons as JSON.
- ``/status``: JSON per camera: state, frames, fps, lag, last label and score, last event, seconds since its last
  frame.
- ``/``: a page a person can read, one row per camera, refreshing itself every 2 s; no external script or font.

It binds to 127.0.0.1 unless told otherwise: anyone who can reach the port reads camera names, labels and counts
(never a URL: cameras are named), and nothing on it changes the service. One lock owns the state.
"""

from __future__ import annotations

import html
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from engines._deps import require

PURPOSE = "Serving trtc serve's metrics"


@dataclass
class CameraState:
    name: str
    read_timeout: float = 10.0
    enabled: bool = True
    state: str = "starting"  # starting, up, down, gave_up, removed
    frames: int = 0
    last_frame_at: float | None = None  # monotonic
    lag_s: float | None = None
    label: str | None = None
    score: float | None = None
    last_event: str | None = None
    recent: list = field(default_factory=list)  # monotonic times of the last frames, for fps


class ServiceState:
    """What the service's loop reports and the HTTP side reads; one lock owns it."""

    def __init__(self, loop_timeout: float = 10.0):
        self._lock = threading.Lock()
        self.cameras: dict[str, CameraState] = {}
        self.engine_open = False
        self.loop_timeout = loop_timeout
        self._beat = time.monotonic()
        self.metrics = Metrics()

    def beat(self) -> None:
        """The service's loop turned (a watchdog ping)."""
        with self._lock:
            self._beat = time.monotonic()

    def add_camera(self, name: str, read_timeout: float = 10.0, enabled: bool = True) -> None:
        with self._lock:
            self.cameras[name] = CameraState(name, read_timeout, enabled)

    def remove_camera(self, name: str) -> None:
        with self._lock:
            self.cameras.pop(name, None)
        self.metrics.forget(name)

    def camera_frame(self, name: str, lag_s: float | None, label=None, score=None, received: bool = True) -> None:
        """A classified frame of ``name`` (its lag from capture to result, its top-1)."""
        now = time.monotonic()
        with self._lock:
            cam = self.cameras[name]
            cam.state, cam.frames, cam.last_frame_at, cam.lag_s = "up", cam.frames + 1, now, lag_s
            cam.label, cam.score = label, score
            cam.recent = [t for t in cam.recent if now - t < 5.0] + [now]
        self.metrics.frame(name, lag_s, received)

    def camera_event(self, name: str, event: str) -> None:
        with self._lock:
            cam = self.cameras[name]
            cam.last_event = event
            if event in ("disconnected", "gave_up", "auth_failed"):
                cam.state = "down" if event == "disconnected" else "gave_up"
            elif event == "reconnected":
                cam.state = "up"
        if event == "reconnected":
            self.metrics.count("reconnects", name)

    def healthy(self) -> bool:
        with self._lock:
            return time.monotonic() - self._beat <= self.loop_timeout

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, reasons it is not): the engine open, every enabled camera's last frame within its read timeout."""
        now, why = time.monotonic(), []
        with self._lock:
            if not self.engine_open:
                why.append("the engine is not open yet")
            for cam in self.cameras.values():
                if not cam.enabled:
                    continue
                if cam.last_frame_at is None:
                    why.append(f"{cam.name}: no frame yet")
                elif now - cam.last_frame_at > cam.read_timeout:
                    why.append(f"{cam.name}: no frame for {now - cam.last_frame_at:.1f} s (read timeout "
                               f"{cam.read_timeout:g} s)")
        return not why, why

    def status(self) -> dict:
        now = time.monotonic()
        with self._lock:
            out = {}
            for cam in self.cameras.values():
                span = cam.recent[-1] - cam.recent[0] if len(cam.recent) > 1 else 0.0
                out[cam.name] = {
                    "state": cam.state, "enabled": cam.enabled, "frames": cam.frames,
                    "fps": round((len(cam.recent) - 1) / span, 2) if span > 0 else 0.0,
                    "lag_s": None if cam.lag_s is None else round(cam.lag_s, 3), "label": cam.label,
                    "score": cam.score, "last_event": cam.last_event,
                    "since_last_frame_s": None if cam.last_frame_at is None else round(now - cam.last_frame_at, 3)}
            return {"engine_open": self.engine_open, "cameras": out}


class Metrics:
    """The Prometheus series, in a registry of their own (several services in one process do not collide)."""

    def __init__(self):
        pc = require("prometheus_client", PURPOSE, extra="serve", package="prometheus-client")
        self.registry = reg = pc.CollectorRegistry()
        pc.ProcessCollector(registry=reg)
        counter, cam = (lambda name, doc, labels=("camera",): pc.Counter(name, doc, labels, registry=reg)), ("camera",)
        self.counters = {
            "received": counter("trtc_frames_received", "frames decoded from the camera"),
            "classified": counter("trtc_frames_classified", "frames classified"),
            "dropped": counter("trtc_frames_dropped", "frames not classified, by reason", ("camera", "reason")),
            "reconnects": counter("trtc_reconnects", "connections made again after an outage"),
            "published": counter("trtc_messages_published", "messages a sink delivered", ("camera", "sink")),
            "spooled": counter("trtc_messages_spooled", "messages written to a sink's spool", ("camera", "sink")),
            "spool_dropped": counter("trtc_spool_dropped", "spooled messages lost to the spool's bound", ("sink",)),
            "reloads": pc.Counter("trtc_config_reloads", "cameras file reloads", ("result",), registry=reg),
        }
        self.lag = pc.Gauge("trtc_lag_seconds", "lag of the last result, capture to result", cam, registry=reg)
        self.up = pc.Gauge("trtc_camera_up", "1 while frames arrive", cam, registry=reg)
        self.spool_bytes = pc.Gauge("trtc_spool_bytes", "bytes in a sink's spool", ("sink",), registry=reg)
        self.lag_hist = pc.Histogram("trtc_end_to_end_lag_seconds", "capture to result", cam, registry=reg,
                                     buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10))
        self.batch_hist = pc.Histogram("trtc_batch_latency_seconds", "one inference batch", registry=reg,
                                       buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))
        self._generate = pc.generate_latest
        self._series: dict[str, set] = {}  # camera -> (metric, label values) it has, for forget(); under _lock
        self._lock = threading.Lock()

    def _child(self, metric, camera: str | None, **labels):
        if camera is None:
            return metric.labels(**labels)
        values = (camera, *labels.values())
        with self._lock:
            self._series.setdefault(camera, set()).add((metric, values))
        return metric.labels(*values)

    def count(self, what: str, camera: str | None = None, n: float = 1, **labels) -> None:
        self._child(self.counters[what], camera, **labels).inc(n)

    def frame(self, camera: str, lag_s: float | None, received: bool = True) -> None:
        if received:
            self.count("received", camera)
        self.count("classified", camera)
        self._child(self.up, camera).set(1)
        if lag_s is not None:
            self._child(self.lag, camera).set(lag_s)
            self._child(self.lag_hist, camera).observe(lag_s)

    def forget(self, camera: str) -> None:
        """A removed camera's series go (its counters would otherwise stand still forever)."""
        with self._lock:
            series = self._series.pop(camera, set())
        for metric, values in series:
            metric.remove(*values)

    def text(self, state: ServiceState) -> bytes:
        for name, cam in state.status()["cameras"].items():
            self._child(self.up, name).set(1 if cam["state"] == "up" else 0)
        return self._generate(self.registry)


def _row(name: str, c: dict) -> str:
    lag = "" if c["lag_s"] is None else f"{c['lag_s']:.2f} s"
    label = str(c["label"] or "") + ("" if c["score"] is None else f" ({c['score']:.2f})")
    cells = [name, c["state"], f"{c['fps']:.1f}", lag, label, c["last_event"] or "", str(c["frames"])]
    return f"<tr class='{html.escape(c['state'])}'>" + "".join(f"<td>{html.escape(v)}</td>" for v in cells) + "</tr>"


def _page(status: dict) -> str:
    rows = "".join(_row(name, c) for name, c in sorted(status["cameras"].items()))
    engine = "open" if status["engine_open"] else "not open yet"
    return ("<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='2'>"
            "<title>trtc serve</title><style>body{font:14px sans-serif;margin:1em}table{border-collapse:collapse}"
            "td,th{border:1px solid #bbb;padding:4px 10px;text-align:left}tr.up td:nth-child(2){color:#070}"
            "tr.down td:nth-child(2),tr.gave_up td:nth-child(2){color:#b00;font-weight:bold}</style></head><body>"
            f"<h1>trtc serve</h1><p>engine {engine}</p>"
            "<table id='cameras'><tr><th>camera</th><th>state</th><th>fps</th><th>lag</th><th>last label</th>"
            f"<th>last event</th><th>frames</th></tr>{rows}</table></body></html>")


class StatusServer:
    def __init__(self, state: ServiceState, host: str = "127.0.0.1", port: int = 9108):
        self.state = state
        routes = {"/metrics": self._metrics, "/healthz": self._healthz, "/readyz": self._readyz,
                  "/status": self._status, "/": self._root}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                route = routes.get(self.path.split("?")[0])
                code, kind, body = route() if route else (404, "text/plain", b"not found\n")
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.host, self.port = host, self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="trtc-http", daemon=True)

    def start(self) -> "StatusServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _metrics(self):
        return 200, "text/plain; version=0.0.4; charset=utf-8", self.state.metrics.text(self.state)

    def _healthz(self):
        ok = self.state.healthy()
        return (200 if ok else 503), "text/plain", b"ok\n" if ok else b"the service's loop is not turning\n"

    def _readyz(self):
        ready, why = self.state.readiness()
        return (200 if ready else 503), "application/json", json.dumps({"ready": ready, "reasons": why}).encode()

    def _status(self):
        return 200, "application/json", json.dumps(self.state.status()).encode()

    def _root(self):
        return 200, "text/html; charset=utf-8", _page(self.state.status()).encode()
