"""Scale-out as users run it (issue 31): the same long sources through `trtc run` four ways, each a command of its own.

    python examples/bench_scaleout.py --model r50.fp16.onnx --clip long1080.mp4 --copies 32 \\
        --devices cuda:0,cuda:1 --batch 64 --json docs/data/scaleout.json            # [2 GPUs]
    python examples/bench_scaleout.py --model lite0.onnx --clip bikes.mp4 --copies 2 --devices cpu,cpu \\
        --stride 25 --json out.json                                                   # CPU, small

Rows (every one writes its lines to a file, as `trtc run ... > file` does):
  one          one process on the first device, every source
  pool         one process, a worker per device (`--device D0,D1`)
  independent  one `trtc run` per device with its share of the sources, all started at once
  ray          `--ray` on a local Ray instance, one actor per device (`--ray-actors N`); left out with --no-ray
  ray-cluster  a cluster started here first (`ray start --head --block`, its own temporary folder and port), then
               `--ray HOST:PORT --ray-keep NAME`: actors made and engines opened by the job (cold), kept after it
  half         (--half) one process on the first device with the share of the sources one device gets in the
               pool (every other source with two devices), alone: set beside `one` and `independent`, it tells
               whether each GPU's share runs slower beside the other GPU's (something the two share) or as slowly
               alone (fewer streams per GPU)
  ray-warm     the same command again: the kept actors, warm (no engine open); then `--ray-stop NAME` and the head
               is stopped. Both left out with --no-ray or --no-cluster. The head and these jobs run with
               RAY_AUTH_MODE=disabled (a head started where ~/.ray/auth_token exists would otherwise ask for a token
               that a driver given an address does not send)

Per row also: the CPU seconds its processes used (user + system, all of them, from the kernel's accounting of
children) per 1,000 frames, and with --dmon (NVIDIA GPUs) each GPU's mean SM and decoder utilisation and PCIe
traffic over the row, sampled once a second by `nvidia-smi dmon`.

Per row: trtc's frames/s (the pipeline's span: start-up excluded, summed over the independent processes), the
time to first result and the wall time (from starting the command(s) to their exit), frames/s over the wall time,
the ratio to the one-device row (``x_one``) and to the independent processes (``vs_independent``; None without
them), and against the pool: first result and wall time minus the pool's (``first_minus_pool_s``,
``wall_minus_pool_s``). Every row's lines are checked against the
one-device row's: every frame once, in order per source, and the share of frames whose top-1 agrees.
Prints a table; --json writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.ray_head import ray_cli  # noqa: E402
from toolchain._env import checkout_env  # noqa: E402


def copies_of(clip: Path, n: int, folder: Path) -> list[str]:
    """``n`` names for ``clip`` (symbolic links; results are keyed by source, so each copy needs a name)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        p = folder / f"copy{i:03d}{clip.suffix}"
        if not p.exists():
            p.symlink_to(clip.resolve())
        out.append(str(p))
    return out


def _command(args, sources, device, summary: Path, extra=()) -> list[str]:
    cmd = [sys.executable, "-m", "toolchain", "-q", "run", *sources, "--model", args.model, "--device", device,
           "--top-k", str(args.top_k), "--stride", str(args.stride), "--summary", str(summary), "--force"]
    return cmd + (["--batch", str(args.batch)] if args.batch else []) + list(extra)


def run_commands(commands: list[tuple[list[str], Path]], env: dict | None = None) -> tuple[float, float]:
    """Start every (command, stdout file) at once; (wall seconds until the last exits, start as Unix time)."""
    env = env or checkout_env()
    began, t0 = time.time(), time.perf_counter()
    procs = []
    for cmd, out in commands:
        with out.open("w") as sink:
            procs.append((subprocess.Popen(cmd, stdout=sink, stderr=subprocess.PIPE, text=True, env=env), cmd))
    for p, cmd in procs:
        _out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err}")
    return time.perf_counter() - t0, began


class Dmon:
    """`nvidia-smi dmon -s ut -d 1` running while a row runs; :meth:`stop` gives each GPU's mean SM and decoder
    utilisation (%) and PCIe receive/transmit (MB/s) over the samples where the GPU was busy (SM or decoder > 0)."""

    def __init__(self, path: Path):
        self.path = path
        self.sink = path.open("w")
        self.proc = subprocess.Popen(["nvidia-smi", "dmon", "-s", "ut", "-d", "1"], stdout=self.sink,
                                     stderr=subprocess.DEVNULL)

    def stop(self) -> dict:
        self.proc.terminate()
        self.proc.wait(10)
        self.sink.close()
        head, by_gpu = None, {}
        for line in self.path.read_text().splitlines():
            if line.startswith("#"):
                head = head or line.lstrip("# ").split()
                continue
            cols = line.split()
            if head is None or len(cols) != len(head):
                continue
            row = dict(zip(head, cols, strict=True))
            try:
                sm, dec = float(row["sm"]), float(row["dec"])
            except ValueError:
                continue
            if sm > 0 or dec > 0:
                by_gpu.setdefault(row["gpu"], []).append((sm, dec, _num(row.get("rxpci")), _num(row.get("txpci"))))
        return {g: {k: round(sum(v[i] for v in vals) / len(vals), 1) for i, k in
                    enumerate(("sm_pct", "dec_pct", "pcie_rx_mb_s", "pcie_tx_mb_s"))} | {"samples": len(vals)}
                for g, vals in by_gpu.items()}


def _num(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return 0.0


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(name: str, commands, work: Path, env: dict | None = None, dmon: bool = False) -> dict:
    """One row: its commands started at once, their summaries read back."""
    monitor = Dmon(work / f"{name}.dmon.txt") if dmon else None
    cpu0 = _children_cpu_s()
    try:
        wall, began = run_commands([(cmd, out) for cmd, out, _summary in commands], env)
    finally:
        gpus = monitor.stop() if monitor else None
    cpu = _children_cpu_s() - cpu0
    sums = [json.loads(summary.read_text()) for _cmd, _out, summary in commands]
    firsts = [s["timing"]["started_at"] + s["timing"]["first_result_s"] for s in sums
              if s["timing"].get("first_result_s") is not None]
    frames = sum(s["frames"] for s in sums)
    return {"row": name, "processes": len(commands), "frames": frames, "fps": round(sum(s["fps"] for s in sums), 1),
            "first_result_s": round(min(firsts) - began, 2) if firsts else None, "wall_s": round(wall, 2),
            "wall_fps": round(frames / wall, 1), "ready_s": [s["timing"]["ready_s"] for s in sums],
            "ray_startup": sums[0].get("ray", {}).get("startup"), "lines": [str(out) for _c, out, _s in commands],
            "cpu_s": round(cpu, 1), "cpu_s_per_kframe": round(1000 * cpu / frames, 2) if frames else None,
            "gpus": gpus}


def read_lines(files) -> dict:
    """{source: [(frame, top-1 index), ...]} in the order written."""
    out: dict = {}
    for f in files:
        with open(f) as lines:
            for raw in lines:
                d = json.loads(raw)
                if "frame" in d:
                    out.setdefault(d["source"], []).append((d["frame"], d["top_k"][0]["index"]))
    return out


def compare(row: dict, reference: dict) -> None:
    """Adds to ``row``: every frame once and in order per source (as the reference), and top-1 agreement."""
    got = read_lines(row.pop("lines"))
    ordered = set(got) == set(reference) and all([f for f, _ in got[s]] == [f for f, _ in reference[s]] for s in got)
    pairs = [(a, b) for s in reference for a, b in zip(reference[s], got.get(s, []), strict=False)]
    row["every_frame_once_in_order"] = ordered
    row["top1_agreement"] = round(sum(a == b for a, b in pairs) / max(1, len(pairs)), 4)


class RayHead:
    """A running Ray cluster of this host, as users start one (`ray start --head --block`), in a process of its own
    with its own temporary folder and a free port; :meth:`stop` ends it by its process id (SIGTERM: the head stops
    every process it started). ``env``: the environment its drivers run with."""

    def __init__(self, timeout: float = 120.0):
        import signal
        import tempfile

        self._signal = signal
        self.temp = tempfile.mkdtemp(prefix="trtc-ray-")
        self.env = checkout_env(RAY_AUTH_MODE="disabled")
        self.env.pop("RAY_ADDRESS", None)
        cmd = [*ray_cli(), "start", "--head", "--block", "--port", "0",
               "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", self.temp]
        self.log = open(os.path.join(self.temp, "head.log"), "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                        start_new_session=True)
        found = Path(self.temp, "ray_current_cluster")
        deadline = time.monotonic() + timeout
        while not found.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop(keep_log=True)
                raise SystemExit(f"ray start --head did not come up (see {self.temp}/head.log)")
            time.sleep(0.2)
        self.address = found.read_text().strip()

    def stop(self, keep_log: bool = False) -> None:
        """End the head; its temporary folder goes too, unless ``keep_log`` (its head.log says why it failed)."""
        import shutil

        if self.process.poll() is None:
            self.process.send_signal(self._signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, self._signal.SIGKILL)  # its own session: only what this head started
                self.process.wait(10)
        self.log.close()
        if not keep_log:
            shutil.rmtree(self.temp, ignore_errors=True)


def cluster_rows(args, job, kind: str, n: int, work: Path) -> list[dict]:
    """The two rows on a running cluster: the first job makes the kept actors (cold), the second finds them warm."""
    head = RayHead()
    try:
        extra = ["--ray", head.address, "--ray-actors", str(n), "--ray-keep", "bench"] + (
            ["--ray-streams", str(args.ray_streams)] if args.ray_streams else [])
        out = [measure("ray-cluster", [job("ray-cluster", kind, extra)], work, head.env),
               measure("ray-warm", [job("ray-warm", kind, extra)], work, head.env)]
        subprocess.run([sys.executable, "-m", "toolchain", "-q", "run", "--ray", head.address, "--ray-stop", "bench"],
                       env=head.env, check=True, stdout=subprocess.DEVNULL)
        return out
    finally:
        head.stop()


def rows(args, sources: list[str], devices: list[str], work: Path) -> list[dict]:
    def job(tag, srcs, device, extra=()):
        summary = work / f"{tag}.summary.json"
        return _command(args, srcs, device, summary, extra), work / f"{tag}.jsonl", summary

    dm = args.dmon
    out = [measure("one", [job("one", sources, devices[0])], work, dmon=dm)]
    if len(devices) > 1:
        out.append(measure("pool", [job("pool", sources, ",".join(devices))], work, dmon=dm))
        shares = [sources[i::len(devices)] for i in range(len(devices))]
        out.append(measure("independent", [job(f"independent{i}", share, d)
                                           for i, (share, d) in enumerate(zip(shares, devices, strict=True)) if share],
                           work, dmon=dm))
        if args.half:
            out.append(measure("half", [job("half", shares[0], devices[0])], work, dmon=dm))
    if args.ray:
        kind = "cpu" if devices[0] == "cpu" else "cuda"
        extra = ["--ray", "--ray-actors", str(len(devices))] + (["--ray-streams", str(args.ray_streams)]
                                                                  if args.ray_streams else [])
        out.append(measure("ray", [job("ray", sources, kind, extra)], work))
        if args.cluster:
            out += cluster_rows(args, lambda tag, kind, extra: job(tag, sources, kind, extra), kind, len(devices),
                                work)
    return out


def finish(table: list[dict]) -> None:
    reference = read_lines(table[0]["lines"])
    base = table[0]["fps"]
    for row in table:
        if row["row"] == "half":  # its sources are a subset: compared on those
            compare(row, {k: v for k, v in reference.items() if k in read_lines(row["lines"])})
        else:
            compare(row, reference)
        row["x_one"] = round(row["fps"] / base, 3) if base else None
    by = {r["row"]: r for r in table}
    independent = by.get("independent", {}).get("fps")
    for row in table:
        row["vs_independent"] = round(row["fps"] / independent, 3) if independent else None
    if "pool" in by and "independent" in by:
        by["pool"]["pool_over_independent"] = by["pool"]["vs_independent"]
    pool = by.get("pool")
    for name in ("ray", "ray-cluster", "ray-warm"):
        if pool is not None and name in by:
            row = by[name]
            row["ray_over_pool"] = round(row["fps"] / pool["fps"], 3)
            row["wall_minus_pool_s"] = round(row["wall_s"] - pool["wall_s"], 2)
            if row["first_result_s"] is not None and pool["first_result_s"] is not None:
                row["first_minus_pool_s"] = round(row["first_result_s"] - pool["first_result_s"], 2)


def show(table: list[dict]) -> None:
    print(f"{'row':<12} {'procs':>5} {'frames':>8} {'fps':>9} {'x one':>6} {'vs ind':>6} {'first s':>8} "
          f"{'wall s':>7} {'wall fps':>9} {'in order':>8} {'top-1':>6}")
    for r in table:
        vs = f"{r['vs_independent']:.3f}" if r.get("vs_independent") is not None else "-"
        print(f"{r['row']:<12} {r['processes']:>5} {r['frames']:>8} {r['fps']:>9.1f} {r['x_one'] or 0:>6.3f} "
              f"{vs:>6} {r['first_result_s'] if r['first_result_s'] is not None else '-':>8} {r['wall_s']:>7.2f} "
              f"{r['wall_fps']:>9.1f} {'yes' if r['every_frame_once_in_order'] else 'NO':>8} "
              f"{r['top1_agreement']:>6.2%}")
    for r in table:
        gpus = ", ".join(f"GPU{g} sm {v['sm_pct']}% dec {v['dec_pct']}% pcie rx {v['pcie_rx_mb_s']} tx "
                         f"{v['pcie_tx_mb_s']} MB/s" for g, v in (r.get("gpus") or {}).items())
        print(f"{r['row']}: {r['cpu_s']} CPU s ({r['cpu_s_per_kframe']} per 1,000 frames)" + (f"; {gpus}" if gpus
                                                                                               else ""))
    for r in table:
        phases = (r.get("ray_startup") or {}).get("phases")
        if phases:
            print(f"{r['row']}: start-up phases (s from the process's start): "
                  + ", ".join(f"{k} {v}" for k, v in phases.items()))
        for key in ("pool_over_independent", "ray_over_pool", "wall_minus_pool_s", "first_minus_pool_s"):
            if key in r:
                print(f"{r['row']}: {key} = {r[key]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--clip", required=True, type=Path)
    ap.add_argument("--copies", type=int, default=32)
    ap.add_argument("--devices", default="cuda:0,cuda:1", help="comma-separated, e.g. cuda:0,cuda:1 or cpu,cpu")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--no-ray", dest="ray", action="store_false", help="leave out the Ray row")
    ap.add_argument("--ray-streams", type=int)
    ap.add_argument("--no-cluster", dest="cluster", action="store_false",
                    help="leave out the rows on a running cluster (ray-cluster, ray-warm)")
    ap.add_argument("--half", action="store_true",
                    help="add a row: the first device alone with the share of the sources it gets in the pool")
    ap.add_argument("--dmon", action="store_true", help="sample GPU utilisation and PCIe with nvidia-smi dmon per row")
    ap.add_argument("--workdir", type=Path, default=Path("scaleout-work"))
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    sources = copies_of(args.clip, args.copies, args.workdir / "sources")
    table = rows(args, sources, devices, args.workdir)
    finish(table)
    show(table)
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "clip": str(args.clip), "copies": args.copies,
                                         "devices": devices, "batch": args.batch, "stride": args.stride,
                                         "rows": table}, indent=2) + "\n")
    return 0 if all(r["every_frame_once_in_order"] and r["top1_agreement"] == 1.0 for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
