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

Per row: trtc's frames/s (the pipeline's span: start-up excluded, summed over the independent processes), the
time to first result and the wall time (from starting the command(s) to their exit), frames/s over the wall time,
the ratio to the one-device row, and (pool) pool / independent. Every row's lines are checked against the
one-device row's: every frame once, in order per source, and the share of frames whose top-1 agrees.
Prints a table; --json writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


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


def run_commands(commands: list[tuple[list[str], Path]]) -> tuple[float, float]:
    """Start every (command, stdout file) at once; (wall seconds until the last exits, start as Unix time)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent),
                                                                     os.environ.get("PYTHONPATH")])))
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


def measure(name: str, commands, work: Path) -> dict:
    """One row: its commands started at once, their summaries read back."""
    wall, began = run_commands([(cmd, out) for cmd, out, _summary in commands])
    sums = [json.loads(summary.read_text()) for _cmd, _out, summary in commands]
    firsts = [s["timing"]["started_at"] + s["timing"]["first_result_s"] for s in sums
              if s["timing"].get("first_result_s") is not None]
    frames = sum(s["frames"] for s in sums)
    return {"row": name, "processes": len(commands), "frames": frames, "fps": round(sum(s["fps"] for s in sums), 1),
            "first_result_s": round(min(firsts) - began, 2) if firsts else None, "wall_s": round(wall, 2),
            "wall_fps": round(frames / wall, 1), "ready_s": [s["timing"]["ready_s"] for s in sums],
            "ray_startup": sums[0].get("ray", {}).get("startup"), "lines": [str(out) for _c, out, _s in commands]}


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


def rows(args, sources: list[str], devices: list[str], work: Path) -> list[dict]:
    def job(tag, srcs, device, extra=()):
        summary = work / f"{tag}.summary.json"
        return _command(args, srcs, device, summary, extra), work / f"{tag}.jsonl", summary

    out = [measure("one", [job("one", sources, devices[0])], work)]
    if len(devices) > 1:
        out.append(measure("pool", [job("pool", sources, ",".join(devices))], work))
        shares = [sources[i::len(devices)] for i in range(len(devices))]
        out.append(measure("independent", [job(f"independent{i}", share, d)
                                           for i, (share, d) in enumerate(zip(shares, devices, strict=True)) if share],
                           work))
    if args.ray:
        kind = "cpu" if devices[0] == "cpu" else "cuda"
        extra = ["--ray", "--ray-actors", str(len(devices))] + (["--ray-streams", str(args.ray_streams)]
                                                                  if args.ray_streams else [])
        out.append(measure("ray", [job("ray", sources, kind, extra)], work))
    return out


def finish(table: list[dict]) -> None:
    reference = read_lines(table[0]["lines"])
    base = table[0]["fps"]
    for row in table:
        compare(row, reference)
        row["x_one"] = round(row["fps"] / base, 3) if base else None
    by = {r["row"]: r for r in table}
    if "pool" in by and "independent" in by:
        by["pool"]["pool_over_independent"] = round(by["pool"]["fps"] / by["independent"]["fps"], 3)
    if "pool" in by and "ray" in by:
        by["ray"]["ray_over_pool"] = round(by["ray"]["fps"] / by["pool"]["fps"], 3)
        by["ray"]["wall_minus_pool_s"] = round(by["ray"]["wall_s"] - by["pool"]["wall_s"], 2)


def show(table: list[dict]) -> None:
    print(f"{'row':<12} {'procs':>5} {'frames':>8} {'fps':>9} {'x one':>6} {'first s':>8} {'wall s':>7} "
          f"{'wall fps':>9} {'in order':>8} {'top-1':>6}")
    for r in table:
        print(f"{r['row']:<12} {r['processes']:>5} {r['frames']:>8} {r['fps']:>9.1f} {r['x_one'] or 0:>6.3f} "
              f"{r['first_result_s'] if r['first_result_s'] is not None else '-':>8} {r['wall_s']:>7.2f} "
              f"{r['wall_fps']:>9.1f} {'yes' if r['every_frame_once_in_order'] else 'NO':>8} "
              f"{r['top1_agreement']:>6.2%}")
    for r in table:
        for key in ("pool_over_independent", "ray_over_pool", "wall_minus_pool_s"):
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
