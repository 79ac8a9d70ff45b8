"""What `trtc serve` costs against `trtc run` on the same cameras, measured side by side in one run.

    python examples/bench_serve.py --model lite0.onnx --cameras 4 --seconds 20
    python examples/bench_serve.py --model lite0.fp16.onnx --device cuda:0 --cameras 8 32 --json-out serve.json

For each number of cameras, the same live RTSP cameras (tests/rtsp_server.py: gst-rtsp-server's live test pattern,
640x360 at 30 fps; aio-rtsp-toolkit's looped clip where GStreamer does not run) are read for ``--seconds`` by:

- ``run``: `trtc run URL... -o run.jsonl` (each result a line of -o);
- ``serve/every_frame`` and ``serve/on_change``: `trtc serve` with those cameras, every result a line of its
  rotating files, and, where Debian's mosquitto is installed, published to a broker on 127.0.0.1 (every result
  with ``every_frame``, the label events with ``on_change``).

Each process gets SIGTERM at the end of its window. Per row: frames classified (counted in what it wrote), the rate
over the window from its first result to its last, and the CPU seconds the process used per 1000 frames (its
rusage: every thread, start-up included). The ratios are against ``run`` of the same cameras. A table is printed
last; ``--json-out`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "rtsp_server.py"
MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_camera(aio: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = ([sys.executable, str(SERVER), "--aio"] if aio else ["/usr/bin/python3", str(SERVER)]) + \
        ["--port", str(port), "--pattern"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    while (line := proc.stdout.readline()) and line.strip() != "ready":
        pass
    if proc.poll() is not None:
        raise SystemExit(f"the camera server did not start: {' '.join(cmd)}")
    path = "/cam.mp4?play_count=0" if aio else "/cam"
    return proc, f"rtsp://127.0.0.1:{port}{path}"


def start_broker(folder: Path) -> tuple[subprocess.Popen, int] | None:
    if not MOSQUITTO:
        return None
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nlog_dest none\n"
                    + ("user root\n" if os.geteuid() == 0 else ""))
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    return None


def timed(cmd: list[str], seconds: float, cwd: Path) -> tuple[float, int]:
    """Run ``cmd`` for ``seconds``, then SIGTERM; (CPU seconds it used, its exit code)."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(seconds)
    proc.send_signal(signal.SIGTERM)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read()
    if proc.returncode not in (0, 143):
        print(err[-2000:], file=sys.stderr)
    return usage.ru_utime + usage.ru_stime, proc.returncode


def results_of(paths) -> tuple[int, float]:
    """(results, seconds from the first to the last) in JSON-lines files (event lines left out)."""
    n, first, last = 0, None, None
    for path in paths:
        for line in Path(path).read_text().splitlines():
            d = json.loads(line)
            if "top_k" not in d:
                continue
            n += 1
            t = d.get("received")
            if t is not None:
                first = t if first is None else min(first, t)
                last = t if last is None else max(last, t)
    return n, (last - first) if n > 1 else 0.0


def bench_run(model, device, urls, seconds, folder: Path) -> dict:
    out = folder / "run.jsonl"
    cpu, code = timed([sys.executable, "-m", "toolchain", "run", *urls, "--model", str(model), "--device", device,
                       "-o", str(out)], seconds, folder)
    n, span = results_of([out]) if out.exists() else (0, 0.0)
    return {"mode": "run", "frames": n, "span_s": span, "cpu_s": cpu, "exit": code}


def bench_serve(model, device, urls, seconds, folder: Path, publish: str, broker_port: int | None) -> dict:
    cams = "\n".join(f"  cam{i}: {{url: \"{u}\"}}" for i, u in enumerate(urls))
    mqtt = f"mqtt: {{host: 127.0.0.1, port: {broker_port}, publish: {publish}}}\n" if broker_port else ""
    (folder / "cameras.yaml").write_text(f"model: {model}\ndevice: {device}\n{mqtt}files: {{dir: results}}\n"
                                         f"spool: {{dir: spool}}\ncameras:\n{cams}\n")
    cpu, code = timed([sys.executable, "-m", "toolchain", "serve", "cameras.yaml"], seconds, folder)
    n, span = results_of(sorted((folder / "results").glob("*.jsonl")))
    return {"mode": f"serve/{publish}" + ("+mqtt" if broker_port else ""), "frames": n, "span_s": span, "cpu_s": cpu,
            "exit": code}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cameras", type=int, nargs="+", default=[4])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--aio", action="store_true", help="aio-rtsp-toolkit's cameras (where GStreamer does not run)")
    ap.add_argument("--work", type=Path, default=Path("bench-serve"))
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    model = a.model.resolve()
    rows = []
    broker = start_broker(a.work / "broker")
    try:
        for n in a.cameras:
            cams = [start_camera(a.aio) for _ in range(n)]
            urls = [u for _, u in cams]
            try:
                for mode in ("run", "every_frame", "on_change"):
                    folder = a.work / f"{n}-{mode}"
                    shutil.rmtree(folder, ignore_errors=True)
                    folder.mkdir(parents=True)
                    row = (bench_run(model, a.device, urls, a.seconds, folder) if mode == "run" else
                           bench_serve(model, a.device, urls, a.seconds, folder, mode, broker and broker[1]))
                    row.update(cameras=n, device=a.device, seconds=a.seconds,
                               fps=round(row["frames"] / row["span_s"], 1) if row["span_s"] else 0.0,
                               cpu_ms_per_frame=round(1000 * row["cpu_s"] / row["frames"], 2) if row["frames"]
                               else None)
                    rows.append(row)
            finally:
                for proc, _ in cams:
                    os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if broker:
            broker[0].kill()
    for row in rows:
        base = next(r for r in rows if r["cameras"] == row["cameras"] and r["mode"] == "run")
        row["fps_vs_run"] = round(row["fps"] / base["fps"], 3) if base["fps"] else None
        row["cpu_vs_run"] = (round(row["cpu_ms_per_frame"] / base["cpu_ms_per_frame"], 3)
                             if row["cpu_ms_per_frame"] and base["cpu_ms_per_frame"] else None)
    if a.json_out:
        a.json_out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print(f"{'cameras':>7} {'mode':<22} {'frames':>7} {'fps':>7} {'x run':>6} {'CPU ms/frame':>12} {'x run':>6}")
    for r in rows:
        print(f"{r['cameras']:>7} {r['mode']:<22} {r['frames']:>7} {r['fps']:>7} {r['fps_vs_run'] or '-':>6} "
              f"{r['cpu_ms_per_frame'] or '-':>12} {r['cpu_vs_run'] or '-':>6}")


if __name__ == "__main__":
    main()
