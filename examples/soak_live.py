"""A fault soak of `trtc run` on live cameras: N cameras (one real RTSP server's test pattern, tests/rtsp_server.py:
gst-rtsp-server, or aio-rtsp-toolkit's server where GStreamer does not run; each camera behind its own fault proxy, tests/faultproxy.py) for D minutes, a fault every E seconds rotating over
stall, mute, cut, refuse, throttle and corrupt, one camera at a time in turn.

Reported (a table on stdout and a JSON file): each fault injected against the events trtc wrote for that camera
(the first one within read-timeout + 1 s of the fault?), events that no fault explains (false events), lag p99 per
camera (from --summary), the RSS of the trtc process (sampled every second: first and last minute), and whether
every -o line is whole JSON.

    python examples/soak_live.py --model lite0.onnx --device cpu                                   # 8 cameras, 10 min
    python examples/soak_live.py --model lite0.onnx --device cpu --cameras 2 --minutes 1 --every 10  # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import rtsp_server  # noqa: E402
from tests.faultproxy import FaultProxy  # noqa: E402
from toolchain._env import checkout_env  # noqa: E402

KINDS = ("stall", "mute", "cut", "refuse", "throttle", "corrupt")
# events a fault should bring for its camera (the first of them timed against read-timeout + 1 s)
EXPECTED = {"stall": "disconnected", "mute": "disconnected", "cut": "disconnected"}


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _lines(out: Path) -> list[str]:
    path = out if out.exists() else next(iter(out.parent.glob(f".{out.name}.*.tmp")), None)
    return path.read_text().splitlines() if path else []


def soak(a) -> dict:
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    out, summary = work / "live.jsonl", work / "summary.json"
    server = rtsp_server.start(pattern=True)
    proxies = [FaultProxy(("127.0.0.1", server.port), lifetime=a.minutes * 60 + 120, path=server.path).start()
               for _ in range(a.cameras)]
    urls = [p.url() for p in proxies]
    cmd = [sys.executable, "-m", "toolchain", "run", *urls, "--model", a.model, "--device", a.device, "--batch",
           str(a.batch), "--top-k", "1", "-o", str(out), "--summary", str(summary), "--read-timeout",
           str(a.read_timeout), *a.trtc_args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=checkout_env())
    # stderr read as it comes, as journald or a terminal would: a pipe left unread fills and stops the writer
    err_lines: list[str] = []
    drain = threading.Thread(target=lambda: err_lines.extend(proc.stderr), daemon=True)
    drain.start()
    seen: dict[int, float] = {}  # line index of an event -> when it was first read
    rss: list[tuple[float, float]] = []
    faults: list[dict] = []
    try:
        deadline = time.monotonic() + 120  # every camera streaming first
        while time.monotonic() < deadline and proc.poll() is None:
            got = {json.loads(x).get("source") for x in _lines(out) if x.endswith("}")}
            if set(urls) <= got:
                break
            time.sleep(0.5)
        else:
            proc.wait(60)
            drain.join(10)
            raise SystemExit(f"the cameras did not all stream within 120 s: {''.join(err_lines)[-2000:]}")
        t0 = time.monotonic()
        next_fault, k = a.every, 0
        while time.monotonic() - t0 < a.minutes * 60 and proc.poll() is None:
            now = time.monotonic()
            if now - t0 >= next_fault:
                kind, cam = KINDS[k % len(KINDS)], k % a.cameras
                kw = {"rate": a.throttle_rate} if kind == "throttle" else {}
                duration = 0.0 if kind == "cut" else a.fault_s
                proxies[cam].add(kind, duration, **kw)
                faults.append(dict(kind=kind, camera=cam, source=urls[cam], at=now - t0, duration=duration,
                                   wall=time.time()))
                next_fault += a.every
                k += 1
            for n, line in enumerate(_lines(out)):
                if '"event"' in line and n not in seen:
                    seen[n] = now - t0
            r = _rss_mb(proc.pid)
            if r:
                rss.append((now - t0, r))
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drain.join(timeout=10)
        stderr = "".join(err_lines)
        for p in proxies:
            p.stop()
        server.kill()
    lines = out.read_text().splitlines() if out.exists() else []
    whole, records = 0, []
    for line in lines:
        try:
            records.append(json.loads(line))
            whole += 1
        except ValueError:
            records.append({})
    events = [dict(records[n], seen_s=t) for n, t in sorted(seen.items()) if n < len(records)]
    explained = set()
    for f in faults:
        mine = [(i, e) for i, e in enumerate(events) if e.get("source") == f["source"]
                and f["at"] - 0.5 <= e["seen_s"] <= f["at"] + f["duration"] + a.read_timeout + a.settle]
        explained.update(i for i, _ in mine)
        # timed by the event's own wall-clock time (trtc's "received"), not by when this loop read it
        f["events"] = [(e["event"], round(e["received"] - f["wall"], 2)) for _, e in mine]
        want = EXPECTED.get(f["kind"])
        first = next((e["received"] - f["wall"] for _, e in mine if e["event"] == want), None) if want else None
        f["reported_s"] = None if first is None else round(first, 2)
        f["in_time"] = (first is not None and first <= a.read_timeout + 1) if want else None
    # a lag spell (lagging, caught_up) is the machine falling behind, reported as such, not a camera fault: counted
    # on its own; any other event no fault explains is false
    lag_events = [e for e in events if e.get("event") in ("lagging", "caught_up")]
    false_events = [e for i, e in enumerate(events) if i not in explained and e.get("event") not in
                    ("lagging", "caught_up")]
    by_source = json.loads(summary.read_text()).get("by_source", {}) if summary.exists() else {}
    lag_p99 = {u: (by_source.get(u, {}).get("lag_s") or {}).get("p99") for u in urls}
    first_min = [r for t, r in rss if t < 60] or [r for _, r in rss[:5]]
    last_min = [r for t, r in rss if t >= rss[-1][0] - 60] if rss else []
    return dict(command=cmd, server=rtsp_server.backend(), exit_code=proc.returncode, minutes=a.minutes,
                cameras=a.cameras, faults=faults,
                false_events=false_events, lag_events=len(lag_events), lag_p99_s=lag_p99,
                rss_mb=dict(first_minute=statistics.median(first_min) if first_min else None,
                            last_minute=statistics.median(last_min) if last_min else None,
                            max=max((r for _, r in rss), default=None)),
                lines=len(lines), whole_json_lines=whole, injected=[p.report() for p in proxies],
                stderr_tail=stderr[-3000:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cameras", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--every", type=float, default=30, help="seconds between faults")
    ap.add_argument("--fault-s", type=float, default=8, help="how long a stall, mute, refuse, throttle or corrupt lasts")
    ap.add_argument("--read-timeout", type=float, default=5)
    ap.add_argument("--throttle-rate", type=float, default=12_000, help="bytes/s under throttle")
    ap.add_argument("--settle", type=float, default=15, help="seconds after a fault whose events it explains")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json", default="soak_live.json", help="where the report goes")
    ap.add_argument("trtc_args", nargs="*", help="more `trtc run` options, after --")
    a = ap.parse_args()
    why = rtsp_server.available()
    if why:
        sys.exit(why)
    if not a.model.startswith(("torch", "opencv:")) and os.path.exists(a.model):
        a.model = os.path.abspath(a.model)  # trtc runs from the checkout's root
    rep = soak(a)
    tmp = Path(a.json).with_suffix(".tmp")
    tmp.write_text(json.dumps(rep, indent=1))
    os.replace(tmp, a.json)
    print(f"{'t (s)':>7} {'camera':>6} {'fault':<9} {'reported (s)':>12} {'in time':>7}  events")
    for f in rep["faults"]:
        rs = "-" if f["reported_s"] is None else f"{f['reported_s']:.2f}"
        it = "-" if f["in_time"] is None else ("yes" if f["in_time"] else "NO")
        print(f"{f['at']:7.1f} {f['camera']:6d} {f['kind']:<9} {rs:>12} {it:>7}  {f['events']}")
    print(f"false events: {len(rep['false_events'])} {[(e['source'], e['event']) for e in rep['false_events']]}")
    print(f"lag events (lagging, caught_up): {rep['lag_events']}")
    print("lag p99 (s): " + ", ".join(f"cam{i} {v}" for i, v in enumerate(rep["lag_p99_s"].values())))
    m = rep["rss_mb"]
    print(f"RSS MB: first minute {m['first_minute']}, last minute {m['last_minute']}, max {m['max']}")
    print(f"-o lines: {rep['lines']}, whole JSON: {rep['whole_json_lines']}; exit {rep['exit_code']}; "
          f"report: {a.json}")


if __name__ == "__main__":
    main()
