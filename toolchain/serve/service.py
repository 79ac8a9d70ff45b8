"""`trtc serve CONFIG.yaml`: the cameras of a file, classified until stopped, their results sent where programs read
them (MQTT, a webhook, rotating files), their health on HTTP.

    service = Service("cameras.yaml")
    service.start()                   # sinks, the status server, an engine per model and device, every camera
    while not stopping:
        service.tick()                # the watchdog's beat; a changed file is reloaded
    service.stop()                    # cameras stop, queues go to the consumer or the spool

The cameras run on the same stages as `trtc run` (:mod:`engines.video.fleet`: its live sources, then on the CPU
the decode stage, the frame hub, inference and top-k; on a GPU, NVDEC and the GPU path's preprocessing kernel,
slots, inference and top-k), one fleet per model and device, so cameras that share a model share its engine and
its batches. A reload (:meth:`Service.reload`, on SIGHUP or when the file's
mtime changes) starts added cameras, stops removed ones (a ``removed`` event) and restarts changed ones alone; the
others keep every frame. A file that does not check is refused whole: the running set stays.

Threads: the caller's (start, tick, reload, stop: the only one that adds or removes cameras), one consumer per
fleet (results and events of its cameras, in order: it owns their label events), one sender per sink, the status
server's. :class:`~toolchain.serve.http.ServiceState` is the lock-owned state the HTTP side reads.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engines.errors import TrtcError, UsageProblem

from .config import Camera, ConfigError, ServeConfig, load_config
from .events import LabelEvents
from .http import ServiceState

log = logging.getLogger("trtc")
SERVICE = "service"  # the topic level of the service's own events (reloads, refusals)


@dataclass
class _Group:
    """One engine and the fleet of the cameras that use it (one model on one device)."""

    engine: object
    fleet: object
    cameras: set = field(default_factory=set)


class Service:
    def __init__(self, config: str | os.PathLike | ServeConfig, *, poll_s: float = 1.0):
        self.config = load_config(config) if not isinstance(config, ServeConfig) else config
        self.path = Path(self.config.path)
        self._mtime = _mtime(self.path)
        self._poll_s, self._polled = poll_s, 0.0
        self.publish_mode = self.config.sections.get("mqtt", {}).get("publish", "on_change")
        self.state = ServiceState()
        self.metrics = self.state.metrics
        self.groups: dict[tuple, _Group] = {}
        self.sinks: list = []
        self.files = None
        self.http = None
        # (group key, camera) -> its label events; fed by a fleet's consumer, closed at a camera's removal event
        # (on the GPU path from another thread): the lock owns them
        self._labels: dict[tuple, LabelEvents] = {}
        self._labels_lock = threading.Lock()
        self._seen: dict[str, dict] = {}  # camera -> source counters already in the metrics (the caller's thread)
        self.notify = _notifier()

    # the caller's thread -------------------------------------------------------------------------------------
    def start(self) -> None:
        from .sinks import open_sinks

        self.sinks, self.files = open_sinks(self.config, self._delivered, self._spooled)
        self._start_http()
        for cam in self.config.cameras.values():
            self._start_camera(cam)
        self.state.engine_open = True
        self.notify.ready(f"{len(self.config.cameras)} camera(s)")
        self._service_event("started", cameras=sorted(self.config.cameras))

    def tick(self) -> None:
        """One turn of the main loop: the beat (healthz, the watchdog), a dead fleet raised, the file polled, the
        source counters into the metrics."""
        for key, group in self.groups.items():
            if group.fleet.error is not None:
                raise group.fleet.error
        self.state.beat()
        self.notify.watchdog()
        now = time.monotonic()
        if now - self._polled >= self._poll_s:
            self._polled = now
            if _mtime(self.path) != self._mtime:
                self.reload("the file changed")
            self._refresh_counts()

    def reload(self, why: str = "SIGHUP") -> bool:
        """Read the file again and apply it; False (the running set kept) when it does not check."""
        self._mtime = _mtime(self.path)
        try:
            new = load_config(self.path)
        except ConfigError as exc:
            log.warning("reload refused (%s): %s; the running cameras are kept", why, exc)
            self.metrics.count("reloads", result="refused")
            self._service_event("reload_refused", reason=str(exc))
            return False
        added, removed, changed = new.diff(self.config)
        if new.sections != self.config.sections or new.device != self.config.device:
            log.warning("reload: the mqtt/http/files/webhook/spool/events sections and the device are read at start; "
                        "restart trtc serve for their changes to take effect")
        old, self.config = self.config, new
        for name in removed + changed:
            self._stop_camera(old.cameras[name], "removed" if name in removed else "changed")
        for name in changed + added:
            try:
                self._start_camera(new.cameras[name])
            except TrtcError as exc:  # this camera cannot start (its model, say): the others run on
                log.warning("%s: not started: %s", name, exc)
                self._service_event("camera_failed", reason=str(exc), camera_name=name)
        self.metrics.count("reloads", result="accepted")
        self._service_event("reloaded", reason=why, added=added, removed=removed, changed=changed)
        log.warning("reloaded (%s): %d added, %d removed, %d changed", why, len(added), len(removed), len(changed))
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Every camera stops (its last results delivered to the sinks' queues), then each sink delivers or spools
        what it holds, then the status server stops."""
        self.notify.stopping()
        for key in list(self.groups):
            group = self.groups.pop(key)
            group.fleet.close(timeout)
            group.engine.close()
        self._service_event("stopped")
        for sink in self.sinks:
            sink.stop(timeout)
        if self.files is not None:
            self.files.close()
        if self.http is not None:
            self.http.stop()

    def _start_http(self) -> None:
        http = self.config.sections.get("http")
        if http is None:
            return
        from .http import StatusServer

        host, port = http.get("host", "127.0.0.1"), http.get("port", 9108)
        try:
            self.http = StatusServer(self.state, host, port).start()
        except OSError as exc:
            raise UsageProblem(f"http: cannot listen on {host}:{port}: {exc.strerror or exc}",
                               "give http.port a free port (or stop what holds it)") from exc

    def _start_camera(self, cam: Camera) -> None:
        if not cam.enabled:
            self.state.add_camera(cam.name, cam.read_timeout, enabled=False)
            return
        from engines.video.credentials import source_address
        from engines.video.live import LiveOptions

        group = self._group(cam)
        options = LiveOptions(transport=cam.rtsp_transport, open_timeout=cam.open_timeout,
                              read_timeout=cam.read_timeout, reconnect_for=cam.reconnect_for,
                              policy=cam.on_lag, max_lag=cam.max_lag or None)
        self.state.add_camera(cam.name, cam.read_timeout)
        self._seen.pop(cam.name, None)
        group.fleet.add(cam.name, source_address(cam.url), stride=cam.stride, top_k=cam.top_k, options=options,
                        rotate=str(cam.rotate).strip().lower())
        group.cameras.add(cam.name)

    def _stop_camera(self, cam: Camera, reason: str) -> None:
        key = self._key(cam)
        group = self.groups.get(key)
        if group is not None and cam.name in group.cameras:
            group.fleet.remove(cam.name, reason=reason)
            group.cameras.discard(cam.name)
            if not group.cameras:  # the consumer has delivered the removal: the engine may go
                self.groups.pop(key)
                group.fleet.close()
                group.engine.close()
        self.state.remove_camera(cam.name)
        self._seen.pop(cam.name, None)

    def _key(self, cam: Camera) -> tuple:
        from ..run import pick_device
        from .sinks import beside

        return (str(beside(self.config, cam.model)), pick_device(self.config.device))

    def _group(self, cam: Camera) -> _Group:
        key = self._key(cam)
        group = self.groups.get(key)
        if group is None:
            import engines
            from engines.video.fleet import open_fleet

            engine = engines.open_engine(key[0], device=key[1])
            fleet = open_fleet(engine, top_k=_most_classes(self.config, engine),
                                on_prediction=lambda p, k=key: self._on_prediction(k, p),
                                on_event=lambda e, k=key: self._on_event(k, e),
                                on_problem=self._on_problem, on_batch=self._on_batch)
            group = self.groups[key] = _Group(engine, fleet)
        return group

    def _refresh_counts(self) -> None:
        """Each camera's source counters (decoded, skipped for lag, damaged, dropped in the queue) added to the
        metrics as the change since the last refresh."""
        for key, group in list(self.groups.items()):
            for name in list(group.cameras):
                src = group.fleet.source(name)
                if src is None:
                    continue
                now = {"received": src.decoded, "lag": src.lagged, "decode": src.damaged,
                       "queue": group.fleet.dropped_of(name)}
                seen = self._seen.setdefault(name, dict.fromkeys(now, 0))
                for what, n in now.items():
                    if n > seen[what]:
                        if what == "received":
                            self.metrics.count("received", name, n - seen[what])
                        else:
                            self.metrics.count("dropped", name, n - seen[what], reason=what)
                        seen[what] = n
        self._gpu_memory()
        for sink in self.sinks:
            self.metrics.spool_bytes.labels(sink.name).set(sink.spool.waiting_bytes)
            lost, seen = sink.spool.dropped, self._seen.setdefault(f"spool:{sink.name}", {"dropped": 0})
            if lost > seen["dropped"]:
                self.metrics.count("spool_dropped", None, lost - seen["dropped"], sink=sink.name)
                self._service_event("spool_dropped", sink=sink.name, dropped=lost - seen["dropped"], total=lost)
                seen["dropped"] = lost

    def _gpu_memory(self) -> None:
        """GPU memory in use on each device an engine runs on (the whole device's, all processes: CUDA's view)."""
        for device in {key[1] for key in self.groups if str(key[1]).startswith("cuda")}:
            try:
                import cupy as cp

                with cp.cuda.Device(int(device.partition(":")[2] or 0)):
                    free, total = cp.cuda.runtime.memGetInfo()
            except Exception:  # noqa: BLE001 - no CuPy, or the device is gone: the gauge stays as it was
                continue
            self.metrics.gpu_memory.labels(device).set(total - free)

    # the fleets' consumer threads ----------------------------------------------------------------------------
    def _on_prediction(self, key: tuple, pred) -> None:
        name = pred.source
        top = pred.to_dict()
        best = top["top_k"][0] if top["top_k"] else {"label": None, "index": None, "score": None}
        message = {"camera": name, "frame": pred.frame, "wall": round(time.time(), 3), **top}
        lag = None if pred.received is None else max(0.0, time.time() - pred.received)
        try:
            self.state.camera_frame(name, lag, best["label"] or best["index"], best["score"], received=False)
        except KeyError:  # a frame of a camera removed meanwhile (delivered before its removal event)
            pass
        if self.publish_mode == "every_frame":
            self._publish(name, "result", message)
        if self.files is not None:
            self.files.write(name, json.dumps(message, separators=(",", ":")))
        if best["score"] is None:
            return
        with self._labels_lock:
            events = self._labels_of(key, name)
            said = events.push(pred.frame, pred.time, best["label"] or best["index"], best["score"]) if events else []
        for ev in said:
            self._label_event(name, pred.frame, ev)

    def _on_event(self, key: tuple, ev) -> None:
        name = ev.source
        message = {"camera": name, "frame": ev.frames, "wall": round(ev.received, 3), **ev.to_dict()}
        if ev.event in ("removed", "changed", "stopped"):
            with self._labels_lock:
                events = self._labels.pop((key, name), None)
                ends = events.close(ev.event) if events is not None else []
            for end in ends:
                self._label_event(name, end.get("last_frame"), end)
        else:
            try:
                self.state.camera_event(name, ev.event)
            except KeyError:
                pass
        self._publish(name, "event", message)
        if self.files is not None:
            self.files.write(name, json.dumps(message, separators=(",", ":")))

    def _on_batch(self, seconds: float, frames: int) -> None:
        self.metrics.batch_hist.observe(seconds)

    def _on_problem(self, name: str, reason: str) -> None:
        log.warning("%s: %s", name, reason)

    def _labels_of(self, key: tuple, name: str) -> LabelEvents | None:
        events = self._labels.get((key, name))
        if events is None:
            cam = self.config.cameras.get(name)
            if cam is None:
                return None
            events = self._labels[(key, name)] = LabelEvents(cam.hold, cam.min_score)
        return events

    def _label_event(self, name: str, frame, ev: dict) -> None:
        message = {"camera": name, "frame": frame, "wall": round(time.time(), 3), **ev}
        self._publish(name, "event", message)
        if self.files is not None:
            self.files.write(name, json.dumps(message, separators=(",", ":")))

    # every thread ------------------------------------------------------------------------------------------
    def _publish(self, camera: str, kind: str, message: dict) -> None:
        for sink in self.sinks:
            sink.publish(f"{camera}/{kind}", message)

    def _service_event(self, event: str, **extra) -> None:
        self._publish(SERVICE, "event", {"camera": None, "frame": None, "wall": round(time.time(), 3),
                                         "event": event, **extra})

    def _spooled(self, sink: str, doc: dict) -> None:
        camera = doc.get("payload", {}).get("camera")
        if camera:
            self.metrics.count("spooled", camera, sink=sink)

    def _delivered(self, sink: str, docs: list[dict]) -> None:
        for doc in docs:
            camera = doc.get("payload", {}).get("camera")
            if camera:
                self.metrics.count("published", camera, sink=sink)


def _most_classes(config: ServeConfig, engine) -> int | None:
    """The largest top_k any camera of the file asks for, within the model's classes (each camera is cut to its own)."""
    from engines.video.pipeline import _manifest_of, model_classes

    classes = model_classes(engine, _manifest_of(engine))
    want = max((c.top_k for c in config.cameras.values()), default=5)
    return min(want, classes) if classes else want


def _mtime(path: Path):
    try:
        st = path.stat()
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return None


def _notifier():
    """systemd's notify protocol where the service runs under systemd (Type=notify), else a no-op."""
    try:
        from .notify import Notifier
    except ImportError:  # pragma: no cover - the module ships with the package
        return _Quiet()
    return Notifier.from_env()


class _Quiet:
    def ready(self, status: str = "") -> None:
        pass

    def watchdog(self) -> None:
        pass

    def stopping(self) -> None:
        pass


def serve_forever(service: Service, stop: threading.Event, hup: threading.Event, turn_s: float = 0.5) -> None:
    """Turn ``service``'s loop until ``stop`` is set; ``hup`` set means reload (SIGHUP)."""
    while not stop.is_set():
        if hup.is_set():
            hup.clear()
            service.reload("SIGHUP")
        service.tick()
        stop.wait(turn_s)


def describe(config: ServeConfig) -> dict:
    """What `trtc serve --check` reports: the cameras as they will run (no URL: it may hold a password)."""
    from engines.video.credentials import redact

    return {"config": config.path, "device": config.device, "sections": sorted(config.sections),
            "cameras": {name: {**{k: v for k, v in vars(cam).items() if k not in ("name", "url")},
                               "url": redact(cam.url)} for name, cam in config.cameras.items()}}


def run_service(path: str, poll_s: float = 1.0) -> str:
    """Run the cameras file at ``path`` until SIGTERM or Ctrl-C (then stop cleanly and return which one: "SIGTERM"
    or "SIGINT"); SIGHUP reloads the file. The main thread's signal handlers are this function's while it runs."""
    import signal

    stop, hup, got = threading.Event(), threading.Event(), []

    def on_signal(signum, frame):  # noqa: ARG001 - the signal module's signature
        if signum == signal.SIGHUP:
            hup.set()
        else:
            got.append("SIGTERM" if signum == signal.SIGTERM else "SIGINT")
            stop.set()

    before = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    service = Service(path, poll_s=poll_s)
    try:
        service.start()
        log.warning("serving %d camera(s) from %s%s", len(service.config.cameras), path,
                    f"; status on http://{service.http.host}:{service.http.port}/" if service.http else "")
        serve_forever(service, stop, hup)
    finally:
        service.stop()
        for s, handler in before.items():
            signal.signal(s, handler)
    return got[0] if got else "SIGINT"
