"""A soak of `trtc serve` against real components: N cameras (default 8, each its own gst-rtsp-server process) for
M minutes (default 10) on the CPU path, publishing every frame to a real Mosquitto broker that a subscriber reads.
Meanwhile: the broker restarts every 60 s (SIGTERM, 5 s down, start), the cameras file is edited every 60 s (a
camera added, a bad edit that must be refused, the camera removed, in turn), and a camera fault comes every 30 s,
over the cameras in turn (a reboot: its server killed, started again; a hang: its server stopped with SIGSTOP, then
continued).

Reported (a table on stdout, and JSON with --json-out), per camera: the frames serve classified (its /metrics)
against the result messages the broker delivered to the subscriber (distinct frames, repeats, any out of order, any
lost), and the faults against the events it published (each fault's disconnected and reconnected, events no fault
or edit explains); then the reloads accepted and refused against the edits, the spool over time, and the RSS of
serve over time (the last minute against the second).

    python examples/soak_serve.py --model lite0.onnx                           # 8 cameras, 10 minutes
    python examples/soak_serve.py --model lite0.onnx --minutes 2 --json-out soak.json

Needs Debian's mosquitto and gst-rtsp-server (examples/serve_rig.py says which packages) and the serve extra.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import serve_rig  # noqa: E402
from toolchain._env import checkout_env  # noqa: E402

PREFIX = "soak"
EXTRA = "extra"  # the camera the edits add and remove
SERVICE = "service"  # the topic level of serve's own events (started, reloaded, reload_refused, stopped)
FAULT_EVENTS = ("disconnected", "reconnected")
LABEL_EVENTS = ("label_start", "label_end")
EDITS = ("add", "bad", "remove")  # in turn, every --edit-every seconds


# the cameras file ---------------------------------------------------------------------------------------------------
def write_config(path: Path, a, broker_port: int, http_port: int, urls: dict[str, str], bad: bool = False) -> None:
    """The cameras file, replaced whole (a reader never sees half of it). ``bad``: a key the reader refuses."""
    cams = "\n".join(f"  {name}: {{url: \"{url}\"{', strid: 2' if bad and name == EXTRA else ''}}}"
                     for name, url in urls.items())
    text = (f"model: {a.model}\ndevice: {a.device}\ntop_k: 1\nread_timeout: {a.read_timeout}\n"
            f"mqtt: {{host: 127.0.0.1, port: {broker_port}, topic_prefix: {PREFIX}, publish: every_frame}}\n"
            f"http: {{port: {http_port}}}\nspool: {{dir: spool/, max_mb: {a.spool_mb}}}\ncameras:\n{cams}\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# what serve says over HTTP ------------------------------------------------------------------------------------------
def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


SERIES = re.compile(r'^(\w+)(?:\{([^}]*)\})?\s+(\S+)$')


def scrape(port: int) -> dict:
    """/metrics as :func:`parse_metrics` reads it ({} when it does not answer)."""
    code, text = http_get(port, "/metrics")
    return parse_metrics(text) if code == 200 else {}


def parse_metrics(text: str) -> dict:
    """Prometheus text as {(name, frozenset of (label, value)): value}."""
    out = {}
    for line in text.splitlines():
        m = SERIES.match(line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(series: dict, name: str, **labels) -> float:
    """The sum of ``name``'s series that carry ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in series.items() if n == name and want <= ls)


def rss_mb(pid: int) -> float | None:
    """The resident memory of ``pid`` and its child processes (decode workers, if any), in MB."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        todo += kids.get(p, [])
        try:
            total += next(int(x.split()[1]) for x in Path(f"/proc/{p}/status").read_text().splitlines()
                          if x.startswith("VmRSS:")) / 1024
        except (OSError, StopIteration):
            continue
    return total or None


# the run ------------------------------------------------------------------------------------------------------------
class Soak:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.workdir or tempfile.mkdtemp(prefix="soak-serve-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.broker = serve_rig.Broker(self.work / "broker")
        self.cameras = {f"cam{i}": serve_rig.Camera(fps=a.fps, size=a.size) for i in range(a.cameras)}
        self.extra = serve_rig.Camera(fps=a.fps, size=a.size)  # its own server: no fault of the others reaches it
        self.http_port = serve_rig.free_port()
        self.config = self.work / "cameras.yaml"
        self.faults: list[dict] = []
        self.edits: list[dict] = []
        self.restarts: list[dict] = []
        self.samples: list[dict] = []  # every --sample-s: t, rss, spool bytes, classified per camera
        self.proc: subprocess.Popen | None = None

    def urls(self, extra: bool) -> dict[str, str]:
        return {**{n: c.url for n, c in self.cameras.items()}, **({EXTRA: self.extra.url} if extra else {})}

    def start(self) -> None:
        self.broker.start()
        self.sub = serve_rig.Subscriber(self.broker.port, f"{PREFIX}/#")
        for cam in [*self.cameras.values(), self.extra]:
            cam.start()
        write_config(self.config, self.a, self.broker.port, self.http_port, self.urls(False))
        self.command = [sys.executable, "-m", "toolchain", "serve", str(self.config)]
        self.log = open(self.work / "serve.log", "w")
        self.proc = subprocess.Popen(self.command, cwd=self.work, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=checkout_env())
        deadline = time.monotonic() + self.a.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"trtc serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            if http_get(self.http_port, "/readyz")[0] == 200:
                return
            time.sleep(0.5)
        raise SystemExit(f"trtc serve was not ready within {self.a.start_timeout} s: /readyz says "
                         f"{http_get(self.http_port, '/readyz')[1]}\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        self.log.flush()
        return (self.work / "serve.log").read_text(errors="replace")[-n:]

    def schedule(self) -> list[tuple[float, str, object]]:
        """(seconds from the start, what, argument), in time order."""
        a, end, out = self.a, self.a.minutes * 60, []
        names = list(self.cameras)
        for k, t in enumerate(_every(a.fault_every, end - a.fault_s - 5)):
            # reboot and hang in turn, and each camera meets both over two rounds
            out += [(t, "fault", (names[k % len(names)], ("reboot", "hang")[(k + k // len(names)) % 2]))]
        out += [(t, "broker", None) for t in _every(a.broker_every, end - 10, first=a.broker_every / 3)]
        out += [(t, "edit", EDITS[k % len(EDITS)]) for k, t in enumerate(_every(a.edit_every, end - 10,
                                                                                 first=a.edit_every * 5 / 6))]
        return sorted(out, key=lambda x: x[0])

    def run(self) -> None:
        t0, plan, pending = time.monotonic(), self.schedule(), []  # pending: (when, undo)
        next_sample, end = 0.0, self.a.minutes * 60
        while (now := time.monotonic() - t0) < end and self.proc.poll() is None:
            while plan and plan[0][0] <= now:
                _, what, arg = plan.pop(0)
                undo = getattr(self, f"_{what}")(arg, now)
                if undo:
                    pending.append(undo)
            for item in [p for p in pending if p[0] <= now]:
                pending.remove(item)
                item[1]()
            if now >= next_sample:
                self.sample(now)
                next_sample += self.a.sample_s
            time.sleep(0.1)
        for _, undo in pending:
            undo()
        self.final = scrape(self.http_port)
        self.status = json.loads(http_get(self.http_port, "/status")[1] or "{}")

    def sample(self, now: float) -> None:
        series = scrape(self.http_port)
        self.samples.append({"t": round(now, 1), "rss_mb": rss_mb(self.proc.pid),
                             "spool_bytes": metric(series, "trtc_spool_bytes"),
                             "classified": {n: metric(series, "trtc_frames_classified_total", camera=n)
                                            for n in [*self.cameras, EXTRA]}})

    def _fault(self, arg, now):
        name, kind = arg
        cam = self.cameras[name]
        self.faults.append({"camera": name, "kind": kind, "t": round(now, 1), "wall": time.time(),
                            "seconds": self.a.fault_s})
        if kind == "reboot":
            cam.kill()
            return now + self.a.fault_s, cam.start
        cam.pause()
        return now + self.a.fault_s, cam.resume

    def _broker(self, _, now):
        self.restarts.append({"t": round(now, 1), "wall": time.time()})
        self.broker.stop()
        return now + self.a.broker_down_s, self.broker.start

    def _edit(self, kind, now):
        extra = kind in ("add", "bad")
        write_config(self.config, self.a, self.broker.port, self.http_port, self.urls(extra), bad=kind == "bad")
        self.edits.append({"kind": kind, "t": round(now, 1), "wall": time.time()})
        return None

    def stop(self) -> None:
        self.stop_wall = time.time()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.a.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if hasattr(self, "sub"):
            self.sub.settle(quiet=3, timeout=60)
            self.sub.close()
        for cam in [*self.cameras.values(), self.extra]:
            cam.kill()
        self.broker.stop()


def _every(period: float, until: float, first: float | None = None) -> list[float]:
    t, out = period if first is None else first, []
    while t <= until:
        out.append(t)
        t += period
    return out


# the report ---------------------------------------------------------------------------------------------------------
def delivered(messages, camera: str) -> dict:
    """What the subscriber holds of ``camera``'s results: distinct frames, repeats, frames first seen out of order."""
    frames = []
    for _, topic, payload in messages:
        if topic == f"{PREFIX}/{camera}/result":
            try:
                frames.append(int(json.loads(payload)["frame"]))
            except (ValueError, KeyError, TypeError):
                frames.append(None)
    first = list(dict.fromkeys(f for f in frames if f is not None))
    readable = len(frames) - frames.count(None)
    return {"messages": len(frames), "distinct": len(first), "repeats": readable - len(first),
            "unreadable": frames.count(None), "out_of_order": sum(1 for x, y in zip(first, first[1:]) if y <= x)}


def events_of(messages) -> list[dict]:
    out = []
    for arrived, topic, payload in messages:
        parts = topic.split("/")
        if len(parts) == 3 and parts[2] == "event":
            try:
                body = json.loads(payload)
            except ValueError:
                body = {}
            wall = next((body[k] for k in ("wall", "received") if isinstance(body.get(k), (int, float))), arrived)
            out.append({"camera": parts[1], "event": body.get("event"), "wall": wall, "arrived": arrived})
    return out


def explain(soak: Soak, events: list[dict]) -> tuple[list[dict], list[dict]]:
    """Each fault with the events of its camera it explains (those from its start to --explain-s after its end),
    and the events that no fault, edit, label change or the final stop explains (the service's own events, on
    ``{prefix}/service/event``, are the edits' and the start's and stop's)."""
    a, used = soak.a, set()
    for f in soak.faults:
        f["events"] = []
        for i, e in enumerate(events):
            if e["camera"] == f["camera"] and f["wall"] - 1 <= e["wall"] <= f["wall"] + f["seconds"] + a.explain_s:
                used.add(i)
                f["events"].append((e["event"], round(e["wall"] - f["wall"], 2)))
        kinds = [k for k, _ in f["events"]]
        f["detected"] = all(k in kinds for k in FAULT_EVENTS)
    for i, e in enumerate(events):
        by_edit = e["camera"] == EXTRA and any(abs(e["wall"] - x["wall"]) <= a.explain_s for x in soak.edits)
        if e["event"] in LABEL_EVENTS or by_edit or e["camera"] == SERVICE or e["wall"] >= soak.stop_wall - 1:
            used.add(i)
    return soak.faults, [e for i, e in enumerate(events) if i not in used]


def report(soak: Soak) -> dict:
    a, messages = soak.a, soak.sub.messages
    events = events_of(messages)
    faults, unexplained = explain(soak, events)
    rows = {}
    for name in soak.cameras:
        d = delivered(messages, name)
        classified = metric(soak.final, "trtc_frames_classified_total", camera=name)
        published = metric(soak.final, "trtc_messages_published_total", camera=name, sink="mqtt")
        rows[name] = {"classified": int(classified), "published": int(published), **d,
                      "lost": max(0, int(classified) - d["distinct"]),
                      "faults": sum(f["camera"] == name for f in faults),
                      "detected": sum(f["detected"] for f in faults if f["camera"] == name),
                      "events": sum(e["camera"] == name and e["event"] not in LABEL_EVENTS for e in events),
                      "label_events": sum(e["camera"] == name and e["event"] in LABEL_EVENTS for e in events)}
    from toolchain.serve.spool import Spool

    spool_left = sum(len(Spool(d)) for d in {p.parent for p in (soak.work / "spool").rglob("*.seg")})
    rss = _rss_by_minute(soak.samples)
    flat = None if len(rss) < 3 else abs(rss[-1] - rss[1]) <= 0.10 * rss[1]
    reloads = {r: int(metric(soak.final, "trtc_config_reloads_total", result=r)) for r in ("accepted", "refused")}
    expected = {"accepted": sum(e["kind"] != "bad" for e in soak.edits), "refused": sum(e["kind"] == "bad"
                                                                                       for e in soak.edits)}
    ok = (soak.proc.returncode == 0 and all(r["lost"] == 0 and r["out_of_order"] == 0 for r in rows.values())
          and all(f["detected"] for f in faults) and not unexplained and flat is not False
          and metric(soak.final, "trtc_spool_dropped_total") == 0 and reloads == expected)
    return {"ok": ok, "command": soak.command, "minutes": a.minutes, "cameras": rows, "faults": faults,
            "unexplained_events": unexplained, "broker_restarts": soak.restarts, "edits": soak.edits,
            "reloads": reloads, "reloads_expected": expected, "exit_code": soak.proc.returncode,
            "spool": {"max_bytes": max((s["spool_bytes"] for s in soak.samples), default=0),
                      "dropped": metric(soak.final, "trtc_spool_dropped_total"),
                      "spooled": metric(soak.final, "trtc_messages_spooled_total"), "left_on_disk": spool_left},
            "rss_mb_by_minute": rss, "rss_flat": flat, "samples": soak.samples, "status": soak.status,
            "subscriber_connects": soak.sub.connects, "work": str(soak.work)}


def _rss_by_minute(samples) -> list[float]:
    by: dict[int, list[float]] = {}
    for s in samples:
        if s["rss_mb"]:
            by.setdefault(int(s["t"] // 60), []).append(s["rss_mb"])
    return [round(statistics.median(by[m]), 1) for m in sorted(by)]


def print_report(rep: dict) -> None:
    cols = ("classified", "published", "distinct", "repeats", "out_of_order", "lost", "faults", "detected", "events",
            "label_events")
    print(f"{'camera':<8}" + "".join(f"{c:>13}" for c in cols))
    for name, row in rep["cameras"].items():
        print(f"{name:<8}" + "".join(f"{row[c]:>13}" for c in cols))
    print(f"faults: {len(rep['faults'])}, detected {sum(f['detected'] for f in rep['faults'])}; unexplained events: "
          f"{[(e['camera'], e['event']) for e in rep['unexplained_events']]}")
    print(f"broker restarts: {len(rep['broker_restarts'])}; edits: {[e['kind'] for e in rep['edits']]}; reloads "
          f"{rep['reloads']} (expected {rep['reloads_expected']})")
    s = rep["spool"]
    print(f"spool: max {s['max_bytes'] / 1e6:.2f} MB, {int(s['spooled'])} messages spooled, {int(s['dropped'])} "
          f"dropped, {s['left_on_disk']} messages left in it after the stop")
    print(f"RSS (MB) by minute: {rep['rss_mb_by_minute']} (last minute within 10% of the second: "
          f"{'n/a' if rep['rss_flat'] is None else rep['rss_flat']})")
    print(f"serve exit code: {rep['exit_code']}; {'OK' if rep['ok'] else 'NOT OK'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="an .onnx model (the CPU path: ONNX Runtime)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cameras", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--fps", type=int, default=5, help="each camera's frame rate")
    ap.add_argument("--size", default="320x240", help="each camera's picture")
    ap.add_argument("--fault-every", type=float, default=30)
    ap.add_argument("--fault-s", type=float, default=8, help="how long a camera stays rebooting or hung")
    ap.add_argument("--broker-every", type=float, default=60)
    ap.add_argument("--broker-down-s", type=float, default=5)
    ap.add_argument("--edit-every", type=float, default=60)
    ap.add_argument("--read-timeout", type=float, default=3)
    ap.add_argument("--explain-s", type=float, default=30, help="seconds after a fault (or edit) whose events it "
                                                                "explains")
    ap.add_argument("--spool-mb", type=float, default=256)
    ap.add_argument("--sample-s", type=float, default=5)
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--stop-timeout", type=float, default=60)
    ap.add_argument("--workdir", help="where the config, spool, broker and log go (default: a new temporary folder)")
    ap.add_argument("--json-out", help="write the report here as JSON")
    a = ap.parse_args()
    lacking = serve_rig.missing()
    if lacking:
        sys.exit("this soak needs: " + "; ".join(lacking))
    a.model = os.path.abspath(a.model) if os.path.exists(a.model) else a.model
    soak = Soak(a)
    try:
        soak.start()
        soak.run()
    finally:
        soak.stop()
    rep = report(soak)
    rep["serve_log_tail"] = soak.log_tail()
    if a.json_out:
        tmp = Path(a.json_out).with_suffix(".tmp")
        tmp.write_text(json.dumps(rep, indent=1))
        os.replace(tmp, a.json_out)
    print_report(rep)
    sys.exit(0 if rep["ok"] else 1)


if __name__ == "__main__":
    main()
