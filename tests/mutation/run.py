"""Plant defects one at a time in a temporary copy of the tree and see whether the tests catch them (issue 32).

    .venv/bin/python tests/mutation/run.py                 # every mutant, a copy of HEAD (a clean clone)
    .venv/bin/python tests/mutation/run.py --worktree      # the working tree as it is (uncommitted tests included)
    .venv/bin/python tests/mutation/run.py --only uv_swap,bt709_kb --list

Each mutant replaces one exact piece of source text (which must occur exactly once, so a refactor that moves it
makes the script say so instead of silently testing nothing) and runs the tests named for it, stopping at the first
failure (-x). A mutant is *killed* when those tests fail, *survives* when they pass. Before any mutant the same
tests run on the unmutated copy and must pass, or nothing is reported. The result is printed as a Markdown table
(docs/TESTING.md records the last run). Not part of the default test run: it takes several minutes.

The copy gets PYTHONPATH pointing at itself, so ``import engines`` in the tests, in their subprocesses and in the
``trtc`` console script loads the mutated code, never the editable install's; the script checks that.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COLOUR = ["tests/cpu/test_colour_reference.py", "tests/unit/test_video_maths.py", "tests/unit/test_preprocess.py"]
VIDEO_CPU = ["tests/cpu/test_video_cpu.py"]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    what: str
    tests: tuple[str, ...]


MUTANTS = [
    # --- the three defects of issue 32, none of which the suite caught before
    Mutant("uv_swap", "engines/video/sources.py", "    return YuvPlanes(*planes)\n",
           "    return YuvPlanes(planes[0], planes[2], planes[1])\n",
           "U and V planes swapped where CPU frames become planes (host_planes)", (*COLOUR, *VIDEO_CPU)),
    Mutant("bt709_kb", "engines/preprocess.py", '"bt709": (0.2126, 0.0722)', '"bt709": (0.2126, 0.0822)',
           "BT.709 Kb 0.0722 -> 0.0822", tuple(COLOUR)),
    Mutant("bench_speedup_inverted", "toolchain/bench.py", "row.speedup = row.throughput / base[b]",
           "row.speedup = base[b] / row.throughput", "bench speed-up inverted (base / throughput)",
           ("tests/cli/test_bench.py",)),
    # --- colour maths
    Mutant("bt601_kr", "engines/preprocess.py", '"bt601": (0.299, 0.114)', '"bt601": (0.309, 0.114)',
           "BT.601 Kr 0.299 -> 0.309", tuple(COLOUR)),
    Mutant("bt2020_kb", "engines/preprocess.py", '"bt2020": (0.2627, 0.0593)', '"bt2020": (0.2627, 0.0693)',
           "BT.2020 Kb 0.0593 -> 0.0693", tuple(COLOUR)),
    Mutant("limited_chroma_gain", "engines/preprocess.py",
           "y_off, y_gain, c_gain = 16.0, 255.0 / 219.0, 255.0 / 224.0",
           "y_off, y_gain, c_gain = 16.0, 255.0 / 219.0, 255.0 / 219.0",
           "limited range: chroma scaled by 255/219 (the luma gain) instead of 255/224", tuple(COLOUR)),
    Mutant("green_cb_cr_swapped", "engines/preprocess.py", "yy + g_cb * cb + g_cr * cr",
           "yy + g_cb * cr + g_cr * cb", "G takes the Cb coefficient for Cr and back (numpy maths)", tuple(COLOUR)),
    Mutant("full_range_tag_ignored", "engines/video/sources.py", "_AV_FULL_RANGE = 2", "_AV_FULL_RANGE = 1",
           "the stream's full-range tag read as limited (and limited as full)", tuple(COLOUR)),
    Mutant("bt2020_tag_as_bt709", "engines/video/sources.py", '9: "bt2020"', '9: "bt709"',
           "a stream tagged BT.2020 read as BT.709", tuple(COLOUR)),
    Mutant("ten_bit_shift", "engines/video/sources.py", "(a.astype(np.uint16) << (16 - bits))",
           "(a.astype(np.uint16) << (15 - bits))", "10/12-bit samples shifted one bit short of MSB-aligned",
           tuple(COLOUR)),
    # --- plane handling and geometry
    Mutant("chroma_row_not_subsampled", "engines/preprocess.py",
           "planes.u[r >> sy, c >> sx], planes.v[r >> sy, c >> sx]",
           "planes.u[(r >> sy) // 2, c >> sx], planes.v[(r >> sy) // 2, c >> sx]",
           "preprocess_yuv reads chroma from the wrong rows (half the row index)", (*COLOUR, *VIDEO_CPU)),
    Mutant("nv12_uv_swapped", "engines/preprocess.py", "return YuvPlanes(y, uv[:, 0::2], uv[:, 1::2])",
           "return YuvPlanes(y, uv[:, 1::2], uv[:, 0::2])", "NV12 surfaces split with V before U (GPU oracle)",
           tuple(COLOUR)),
    Mutant("half_pixel_centres_dropped", "engines/preprocess.py",
           "c = (np.arange(n_out, dtype=np.float64) + offset + 0.5) * scale - 0.5",
           "c = (np.arange(n_out, dtype=np.float64) + offset) * scale",
           "sampling grid without half-pixel centres (align-corners style)", (*COLOUR, *VIDEO_CPU)),
    Mutant("yuv_bgr_ignored", "engines/preprocess.py",
           '    if spec.color == "BGR":\n        out = out[:, :, ::-1]\n    mean = np.asarray(spec.mean, np.float64)',
           '    mean = np.asarray(spec.mean, np.float64)', "preprocess_yuv ignores a BGR model's channel order",
           tuple(COLOUR)),
    Mutant("yuv_std_multiplied", "engines/preprocess.py",
           "out = (out / 255.0 - mean) / std\n    return np.ascontiguousarray(out.transpose(2, 0, 1)).astype(dtype or",
           "out = (out / 255.0 - mean) * std\n    return np.ascontiguousarray(out.transpose(2, 0, 1)).astype(dtype or",
           "preprocess_yuv multiplies by std instead of dividing", (*COLOUR, *VIDEO_CPU)),
    # --- batching and ordering
    Mutant("batch_results_reversed", "engines/video/cpu_pipeline.py",
           "rows = list(zip(chunk, idx.tolist(), sc.tolist(), strict=True))",
           "rows = list(zip(chunk, idx.tolist()[::-1], sc.tolist()[::-1], strict=True))",
           "CPU pipeline gives each batch's results to its frames in reverse order", VIDEO_CPU),
    Mutant("resume_repeats_last_frame", "engines/video/cpu_pipeline.py", "if index % stride or index <= skip_to:",
           "if index % stride or index < skip_to:", "--resume classifies the last kept frame again",
           ("tests/cpu/test_run_interrupt.py",)),
    Mutant("topk_ties_unstable", "engines/topk.py",
           'return np.argsort(-np.asarray(logits, np.float64), axis=1, kind="stable")[:, :k]',
           'return np.argsort(np.asarray(logits, np.float64), axis=1, kind="stable")[:, ::-1][:, :k]',
           "top-k ties put the higher class index first", ("tests/unit/test_video_maths.py",
                                                           "tests/unit/test_parity.py")),
    # --- parity metrics
    Mutant("parity_top1_vs_itself", "toolchain/parity.py", "r1, c1 = ref.argmax(1), cand.argmax(1)",
           "r1, c1 = ref.argmax(1), ref.argmax(1)", "top-1 agreement compares the reference with itself",
           ("tests/unit/test_parity.py", "tests/cpu/test_validate_real.py")),
    Mutant("parity_max_is_mean", "toolchain/parity.py", "max_abs_diff=float(diff.max())",
           "max_abs_diff=float(diff.mean())", "max |diff| reported as the mean",
           ("tests/unit/test_parity.py", "tests/cpu/test_validate_real.py")),
    Mutant("parity_kl_reversed", "toolchain/parity.py",
           "kl = np.sum(p * (np.log(np.clip(p, 1e-300, None)) - np.log(np.clip(q, 1e-300, None))), axis=1)",
           "kl = np.sum(q * (np.log(np.clip(q, 1e-300, None)) - np.log(np.clip(p, 1e-300, None))), axis=1)",
           "KL(candidate || reference) instead of KL(reference || candidate)",
           ("tests/unit/test_parity.py", "tests/cpu/test_validate_real.py")),
    # --- speed figures
    Mutant("video_vs_decode_inverted", "toolchain/bench_video.py", "multi.vs_decode = round(multi.fps / dec.fps, 3)",
           "multi.vs_decode = round(dec.fps / multi.fps, 3)", "multi-GPU bench's ratio to decode-only inverted",
           ("tests/unit/test_bench_video_rows.py",)),
    Mutant("video_vs_baseline_inverted", "toolchain/bench_video.py",
           "ours.vs_baseline = round(ours.fps / base.fps, 3)", "ours.vs_baseline = round(base.fps / ours.fps, 3)",
           "the video bench's ratio to its --baseline inverted", ("tests/unit/test_bench_video_rows.py",)),
    Mutant("ort_unfused_keeps_fusion", "engines/onnxruntime_engine.py",
           "plain = [(providers[0][0], {k: v for k, v in providers[0][1].items() if k != FUSION}), *providers[1:]]",
           "plain = providers", "a session cuDNN refused fused is reopened with the fusion still on",
           ("tests/unit/test_ort_tuning.py",)),
    # --- inputs read as shown, only classifiers, defaults that fit the model
    Mutant("exif_ignored", "engines/images.py", "upright = ImageOps.exif_transpose(im)", "upright = None",
           "images read as stored, their EXIF orientation ignored",
           ("tests/unit/test_image_reader.py", "tests/cpu/test_image_inputs_real.py")),
    Mutant("sixteen_bit_clipped", "engines/images.py", "    if mode in _SIXTEEN_BIT:", "    if mode in ():",
           "16-bit greyscale converted by Pillow's convert('RGB') (clipped to white)",
           ("tests/unit/test_image_reader.py", "tests/cpu/test_image_inputs_real.py")),
    Mutant("display_matrix_ignored", "engines/video/sources.py",
           "yield index, pts, t, self.turn.apply(host_planes(frame)), time.time()",
           "yield index, pts, t, host_planes(frame), time.time()", "a video's frames classified as stored, sideways",
           ("tests/cpu/test_video_rotation.py",)),
    Mutant("display_matrix_flips_swapped", "engines/video/orientation.py",
           'return cls(True, b < 0, c < 0, "metadata")', 'return cls(True, c < 0, b < 0, "metadata")',
           "a 90-degree display matrix turned the other way", ("tests/unit/test_video_orientation.py",
                                                               "tests/cpu/test_video_rotation.py")),
    Mutant("detector_runs", "engines/video/pipeline.py", "    rotate = check_rotate(rotate)\n    check_classifier(engine)",
           "    rotate = check_rotate(rotate)", "classify() runs a model whose first output is not (batch, classes)",
           ("tests/cpu/test_only_classifiers.py",)),
    Mutant("top_k_default_5", "toolchain/cli.py",
           '@click.option("--top-k", type=click.IntRange(1), help=',
           '@click.option("--top-k", type=click.IntRange(1), default=5, help=',
           "trtc run's --top-k defaults to 5 whatever the model's classes", ("tests/cpu/test_top_k_default.py",)),
    Mutant("grey_pushed_as_nv12", "engines/video/push.py", "        if len(shape) == 2:\n            raise",
           "        if len(shape) == 2 and False:\n            raise",
           "a 2-D frame pushed without format= read as NV12", ("tests/unit/test_push.py",)),
]


def copy_tree(dest: Path, worktree: bool) -> None:
    if worktree:  # tracked and untracked-but-not-ignored files, as they are now
        names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
        for name in filter(None, names):
            src = ROOT / name
            if src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
    else:  # HEAD: what a clean clone holds
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def run_tests(tree: Path, tests, timeout: float) -> tuple[bool, str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("TRTC_REQUIRE_GPU", None)
    # a basetemp of its own: pytest sessions of the same user share /tmp/pytest-of-USER and a new one deletes all
    # but the three newest, which removed a running test's files when other sessions ran at the same time
    basetemp = tree.parent / "t"
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "--basetemp", str(basetemp), *tests]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "timed out (counted as killed: the tests did not pass)", time.monotonic() - t0
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    failed = [x for x in lines if x.startswith(("FAILED", "ERROR"))]
    summary = (failed[0] if failed else lines[-1] if lines else r.stderr.strip()[-200:])
    why = next((x[1:].strip() for x in lines if x.startswith("E ")), "")  # the first assertion line: a real kill
    if failed and why:
        summary = f"{failed[0]} - {why[:150]}"
    if r.returncode != 0 and os.environ.get("TRTC_MUTATION_VERBOSE"):
        print("\n".join(lines[-40:]), file=sys.stderr)
    return r.returncode == 0, summary, time.monotonic() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--worktree", action="store_true", help="copy the working tree instead of HEAD")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per test run (default 900)")
    args = ap.parse_args(argv)
    # started in the background by a non-interactive shell (`... &`), this process ignores SIGINT, and so would every
    # test process it starts: tests/cpu/test_run_interrupt.py's real Ctrl-C would then do nothing
    signal.signal(signal.SIGINT, signal.default_int_handler)
    mutants = MUTANTS
    if args.only:
        want = set(args.only.split(","))
        unknown = want - {m.name for m in MUTANTS}
        if unknown:
            ap.error(f"unknown mutants: {', '.join(sorted(unknown))}")
        mutants = [m for m in MUTANTS if m.name in want]
    if args.list:
        for m in mutants:
            print(f"{m.name:28} {m.path:32} {m.what}")
        return 0

    with tempfile.TemporaryDirectory(prefix="tm") as tmp:  # short: some tests' messages wrap around the paths
        tree = Path(tmp) / "tree"
        tree.mkdir()
        copy_tree(tree, args.worktree)
        check = subprocess.run([sys.executable, "-c", "import engines; print(engines.__file__)"], cwd=tree,
                               env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
        if not check.stdout.strip().startswith(str(tree)):
            print(f"the copy's engines is not the one imported: {check.stdout or check.stderr}", file=sys.stderr)
            return 2
        for m in mutants:  # every planted text must be there exactly once, before any test runs
            n = (tree / m.path).read_text().count(m.old)
            if n != 1:
                print(f"{m.name}: the text to replace occurs {n} times in {m.path} (source changed?)", file=sys.stderr)
                return 2
        suites = sorted({t for m in mutants for t in m.tests})
        os.environ["TRTC_MUTATION_VERBOSE"] = "1"  # the baseline's failure in full
        ok, summary, secs = run_tests(tree, suites, args.timeout)
        if not ok:  # one retry: tests/cpu/test_run_interrupt.py times a SIGINT and can lose the race on a busy machine
            print(f"baseline failed ({summary}); once more", file=sys.stderr)
            ok, summary, secs = run_tests(tree, suites, args.timeout)
        os.environ.pop("TRTC_MUTATION_VERBOSE")
        print(f"baseline (no defect), {len(suites)} test files: {'pass' if ok else 'FAIL'} in {secs:.0f} s",
              file=sys.stderr)
        if not ok:
            print(f"the unmutated tests fail, nothing to learn: {summary}", file=sys.stderr)
            return 2
        rows = []
        for m in mutants:
            f = tree / m.path
            original = f.read_text()
            f.write_text(original.replace(m.old, m.new))
            try:
                ok, summary, secs = run_tests(tree, m.tests, args.timeout)
            finally:
                f.write_text(original)
            verdict = "SURVIVED" if ok else "killed"
            print(f"{m.name}: {verdict} ({secs:.0f} s) {summary}", file=sys.stderr)
            rows.append((m, verdict, summary if not ok else "all passed", secs))
    print(f"| mutant | where | defect | result | first failing test | s |\n|---|---|---|---|---|---|")
    for m, verdict, summary, secs in rows:
        first = summary.replace("FAILED ", "").replace("ERROR ", "").replace("|", "\\|")
        what = m.what.replace("|", "\\|")
        print(f"| {m.name} | {m.path} | {what} | **{verdict}** | {first} | {secs:.0f} |")
    survivors = [m.name for m, v, *_ in rows if v == "SURVIVED"]
    print(f"\n{len(rows) - len(survivors)} of {len(rows)} killed" + (f"; survivors: {', '.join(survivors)}"
                                                                     if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
