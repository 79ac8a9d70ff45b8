"""Where a start of the compiled PyTorch engine goes: the first start of a model (empty caches) and the second (the
cache beside the model from the first), each in a fresh process, by phase.

    python examples/torch_start_cost.py MODEL.pt2 --device cuda:0 --batch 64 --precision fp16 --json starts.json
    python examples/torch_start_cost.py MODEL.pt2 --device cpu --batch 8          # the CPU: Inductor's C++ backend
    git worktree add /tmp/before REV && python examples/torch_start_cost.py MODEL.pt2 --device cuda:0 --starts 4 \
        --pycache /tmp/pyc --bytecode-first --against /tmp/before     # this tree's later starts against REV's

MODEL.pt2 is what ``trtc export SOURCE -o MODEL.onnx --program`` writes (no model: ``--export pretrained:
efficientnet-lite0`` exports one into ``--workdir`` first). The model's cache folder (MODEL.pt2.inductor/) is
emptied first; the first start gets an Inductor cache of its own, and so does the second, so it sees only what
trtc kept beside the model; further starts share the second's Inductor cache (as on a machine that keeps it).
Phases: import torch; load (the program, or its plain copy from the cache); compile (trace and Inductor, or the
precompiled function from the cache, with the first run); capture (CUDA graphs); first result (the first batch, from
the start of the process). ``--cudnn-benchmark`` opens the engine with cuDNN's algorithm search (off by default).
``--pycache DIR`` gives the starts a bytecode cache (PYTHONPYCACHEPREFIX, and PYTHONDONTWRITEBYTECODE unset) for
installs whose site-packages hold no bytecode: there every start compiles torch's Python source again (seconds;
``python -m compileall`` on the install fixes it). ``--profile N`` runs the starts after the first under cProfile
and prints the N functions with the most cumulative time in the second (the figures are then cProfile's: slower;
with ``--json F`` the profile is kept as F.prof). "of it: aot" and "1st run" split a precompiled start's compile:
loading the precompiled function, and its first run; "eager" is the engine's eager warm-up on the calling thread
while the function loads on another (``warm_beside_load``, on by default on a GPU; ``--warm-beside-load
off|alternate`` compares), "wait" what the calling thread then waited for the load; "held" how long the load
waited for the first eager batch (the quick start holds it back until then, engines.torch_engine.LOAD_HOLD_S at
most). "preloaded": the load started at open (the most recently used function of the model had the key the first
batch needed). With the engine's quick start (``--quick-start``, on by default as on a GPU), a first batch that
comes while the function loads runs eagerly: "first result" is then that batch's, and "compiled" the time at which
the compiled function served its first batch (the JSON also has the eager batches' count and the largest logit
difference and top-1 agreement between the eager first result and the compiled function's result for the same
input).

``--against DIR`` compares two trees on one machine (start times drift between machines and over a session): after
this tree's first start, the later starts alternate between this tree ("this N") and DIR ("against N"), the order
swapped each round, all sharing the cache beside the model; the medians of each are printed and kept in the JSON.
``--bytecode-first`` runs one untimed cold start before the timed first start, so that with an empty ``--pycache``
the first start does not also compile torch's bytecode (it did on a fresh GPU machine: 28.6 s against 17.7 s).
"""

from __future__ import annotations

import argparse
import io
import json
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from toolchain._env import checkout_env  # noqa: E402

START = """
import importlib.util, json, os, sys, time
t0 = time.perf_counter()
import numpy as np
import engines
path, device, batch, precision = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
warm = {"on": True, "off": False}[sys.argv[6]]
quick = {"on": True, "off": False}[sys.argv[7]]
e = engines.open_engine(path, device=device, precision=precision, compile=True, cudnn_benchmark=sys.argv[5] == "1",
                        warm_beside_load=warm, quick_start=quick)
t1 = time.perf_counter()
x = np.random.default_rng(0).standard_normal((batch, *e.inputs[0].shape[1:])).astype(
    np.float16 if precision == "fp16" else np.float32)
if device.startswith("cuda"):
    import cupy as cp
    x = cp.asarray(x)
    run = lambda: cp.asnumpy(e.infer(x)[0])
else:
    run = lambda: e.infer(x)[0]
out = first = run()
t2 = time.perf_counter()
while not e.compile_stats:  # quick start: batches ran eagerly until the precompiled function had loaded
    out = run()
t3 = time.perf_counter()
out = run()  # the compiled function's (its graphs'), on the same input as the first result
st = list(e.compile_stats.values())[0]
print(json.dumps({"total_s": t2 - t0, "open_s": t1 - t0, "first_batch_s": t2 - t1, "program_from": e.program_from,
                  "compiled_s": t3 - t0, "eager_batches": st.get("eager_batches", 0), "quick_start": quick,
                  "first_vs_compiled_max_abs": float(np.abs(first.astype(np.float64) - out).max()),
                  "top1_equal": float((first.argmax(1) == out.argmax(1)).mean()),
                  "start": st["start"], "cache_file": st["cache_file"], "logit0": float(out.ravel()[0]),
                  "warm_beside_load": warm, "loaded_on": st.get("loaded_on"), "preloaded": st.get("preloaded"),
                  "torch_bytecode_cached": os.path.exists(importlib.util.cache_from_source(
                      importlib.util.find_spec("torch").origin)), "writes_bytecode": not sys.dont_write_bytecode,
                  **e.timings}))
"""
PHASES = (("import torch", "import_torch_s"), ("load", "load_program_s"), ("compile", "compile_s"),
          ("of it: aot", "precompiled_load_s"), ("held", "precompiled_held_s"), ("eager", "warm_eager_s"),
          ("wait", "precompiled_wait_s"),
          ("1st run", "first_run_s"), ("capture", "capture_s"),
          ("first result", "total_s"), ("compiled", "compiled_s"))


def start(pt2: Path, args, inductor_dir: str, profile: str | None = None, warm: str = "on",
          quick: str = "on", tree: Path = ROOT) -> dict:
    """One start in a fresh process with its own Inductor and Triton caches (under cProfile into ``profile``),
    ``warm`` and ``quick`` (on/off): the engine's warm_beside_load and quick_start; ``tree``: the trtc checkout whose
    engines package it imports."""
    env = checkout_env(tree, TORCHINDUCTOR_CACHE_DIR=inductor_dir, TRITON_CACHE_DIR=f"{inductor_dir}/triton")
    if args.pycache:
        env["PYTHONPYCACHEPREFIX"] = str(Path(args.pycache).resolve())
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    script = Path(inductor_dir).with_suffix(".start.py")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(START)
    runner = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else [])
    out = subprocess.run([*runner, str(script), str(pt2), args.device, str(args.batch), args.precision,
                          "1" if args.cudnn_benchmark else "0", warm, quick],
                         capture_output=True, text=True, env=env, check=False, timeout=args.timeout)
    if out.returncode:
        sys.exit(f"a start failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def export(source: str, workdir: Path, batch: int) -> Path:
    name = source.split(":")[-1].replace("/", "_")
    pt2 = workdir / f"{name}.pt2"
    if not pt2.exists():
        subprocess.run([sys.executable, "-m", "toolchain", "-q", "export", source, "-o", str(workdir / f"{name}.onnx"),
                        "--batch", f"1:{batch}:{batch}", "--program", "--force"], check=True, cwd=ROOT)
    return pt2


def top_functions(profile: str, n: int) -> str:
    """The ``n`` functions with the most cumulative time in a cProfile file, as pstats prints them."""
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(n)
    return text.getvalue()


def table(rows: list[tuple[str, dict]]) -> str:
    lines = [f"{'start':10} {'how':44} " + " ".join(f"{p:>12}" for p, _ in PHASES)]
    for name, r in rows:
        how = f"program {r['program_from']}, {r['start']}"
        if r["start"] == "precompiled":
            how += (f", warm {'on' if r.get('warm_beside_load') else 'off'}" +
                    (", preloaded" if r.get("preloaded") else "") +
                    (f", {r['eager_batches']} eager" if r.get("eager_batches") else ""))
        lines.append(f"{name:10} {how:44} " + " ".join(f"{r.get(k, 0.0):11.2f}s" for _, k in PHASES))
    if len(rows) > 1:
        first, second = rows[0][1]["total_s"], rows[1][1]["total_s"]
        lines.append(f"second / first: {second / first:.0%} ({second:.1f} s / {first:.1f} s)")
    if not rows[-1][1]["torch_bytecode_cached"]:
        lines.append("torch's modules have no cached bytecode here: every start compiles their Python source "
                     "(seconds); see --pycache")
    return "\n".join(lines)


def empty_cache(pt2: Path) -> None:
    """Remove what trtc keeps beside the model (MODEL.pt2.inductor/*), so that the next start is a cold first."""
    for old in pt2.parent.glob(f"{pt2.name}.inductor/*"):
        old.unlink()


def compare(rows: list[tuple[str, dict]], against: Path) -> dict:
    """With --against: per tree, the medians of its later starts' first results and compiled times, and the first
    result's median over the first start."""
    first = rows[0][1]["total_s"]
    out = {}
    for name, tree in (("this", str(ROOT)), ("against", str(against))):
        mine = [r for n, r in rows[1:] if n.split()[0] == name]
        if not mine:
            continue
        totals = [r["total_s"] for r in mine]
        median = statistics.median(totals)
        out[name] = {"tree": tree, "first_result_s": median, "first_results_s": totals, "of_first": median / first,
                     "compiled_s": statistics.median(r["compiled_s"] for r in mine)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="MODEL.pt2 (trtc export --program)")
    ap.add_argument("--export", default=None, help="a source to export first, e.g. pretrained:efficientnet-lite0")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precision", default="fp16", choices=("fp32", "fp16"))
    ap.add_argument("--starts", type=int, default=2, help="starts after the first (each with the cache beside the model)")
    ap.add_argument("--pycache", default=None, help="a bytecode cache folder for the starts (PYTHONPYCACHEPREFIX)")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="open the engine with cudnn_benchmark=True")
    ap.add_argument("--warm-beside-load", choices=("on", "off", "alternate"), default="on",
                    help="the engine's warm_beside_load in the later starts (alternate: on, off, on, ...); the "
                         "first start compiles, so it does not apply there")
    ap.add_argument("--quick-start", choices=("on", "off", "alternate"), default="on",
                    help="the engine's quick_start in the later starts (on: batches that come while the precompiled "
                         "function loads run eagerly; 'first result' is then the first eager batch's, 'compiled' when "
                         "the compiled function served its first batch); alternate: on, off, on, ...")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile the later starts; print the N functions with the most cumulative time in the second")
    ap.add_argument("--against", default=None, metavar="DIR",
                    help="another trtc checkout (e.g. git worktree add /tmp/before REV): the later starts alternate "
                         "between this tree and it, the order swapped each round, after this tree's first start "
                         "(and one untimed start of DIR, for its bytecode); the medians of both are printed")
    ap.add_argument("--bytecode-first", action="store_true",
                    help="one untimed cold start first, so that the timed first start does not compile torch's "
                         "bytecode (with --pycache on a fresh install)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--json", default=None, help="write the measurements here")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="trtc-start-"))
    workdir.mkdir(parents=True, exist_ok=True)
    against = Path(args.against).resolve() if args.against else None
    if against is not None and not (against / "engines" / "torch_engine.py").is_file():
        ap.error(f"--against {args.against}: not a trtc checkout (no engines/torch_engine.py there)")
    if against is not None and args.profile:
        ap.error("--profile profiles one tree's second start: leave out --against")
    pt2 = Path(args.model).resolve() if args.model else export(args.export or "pretrained:efficientnet-lite0", workdir, args.batch)
    empty_cache(pt2)  # a cold first start
    rows = []
    with tempfile.TemporaryDirectory() as caches:
        if args.bytecode_first:  # a cold start whose only purpose is torch's bytecode in --pycache
            start(pt2, args, f"{caches}/bytecode", warm="on")
            empty_cache(pt2)
        rows.append(("first", start(pt2, args, f"{caches}/first", warm="on")))
        profile = f"{caches}/second.prof" if args.profile else None
        if against is not None:
            start(pt2, args, f"{caches}/second", tree=against)  # its bytecode, and nothing else: not counted
        for i in range(args.starts):  # the second: only trtc's cache; again: Inductor's local caches warm too
            warm = args.warm_beside_load if args.warm_beside_load != "alternate" else ("on", "off")[i % 2]
            quick = args.quick_start if args.quick_start != "alternate" else ("on", "off")[i % 2]
            if against is None:
                rows.append(("second" if i == 0 else f"again {i}",
                             start(pt2, args, f"{caches}/second", profile if i == 0 else None, warm, quick)))
                continue
            trees = [("this", ROOT), ("against", against)]
            for name, tree in (trees if i % 2 == 0 else trees[::-1]):  # the order swapped each round
                rows.append((f"{name} {i + 1}", start(pt2, args, f"{caches}/second", None, warm, quick, tree)))
        top = top_functions(profile, args.profile) if profile and args.starts else ""
        if top and args.json:
            shutil.copyfile(profile, f"{args.json}.prof")  # for pstats: the callers and callees of what is slow
    print(f"{pt2.name}, {args.precision}, batch {args.batch}, {args.device}; each start a fresh process, from its "
          f"first line to the first batch's logits")
    print(table(rows))
    medians = compare(rows, against) if against is not None else {}
    for name, m in medians.items():
        print(f"{name:8} {m['tree']}: first result median {m['first_result_s']:.2f} s "
              f"({m['of_first']:.0%} of the first start; {min(m['first_results_s']):.2f}-"
              f"{max(m['first_results_s']):.2f} s over {len(m['first_results_s'])}), compiled median "
              f"{m['compiled_s']:.2f} s")
    if top:
        print(f"the second start under cProfile, the {args.profile} functions with the most cumulative time:")
        print(top)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": str(pt2), "device": args.device, "batch": args.batch,
                                               "precision": args.precision, "starts": dict(rows),
                                               "against": str(against) if against else None,
                                               "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
