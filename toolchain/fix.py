"""`trtc validate --fix`: the fewest layers of a trtc-made FP16 or INT8 candidate to keep in higher precision so that
it passes validate's gate, written as a model with the `trtc quantize` command that makes it again.

    report = fix_candidate("lite0.onnx", "lite0.int8.onnx", ["bikes.mp4"], output="lite0.int8.fixed.onnx")

The candidate's manifest names its FP32 parent (the reference must be that file) and its recipe. The per-layer
comparison (toolchain.layers) ranks the layers that the recipe converted by the error each makes on the reference's
inputs; the accuracy-aware search's own routine (toolchain.quantize.fewest_kept) then keeps the top 1, 2, 4, ...
of that ranking until a variant passes the gate on validate's inputs, and bisects. Variants are made by the same
builders as `trtc quantize` (the INT8 builder with the same calibrated ranges; the FP16 pass), and the model written
is made by quantize itself with the printed options, then validated again.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engines._io import sha256_file
from engines.manifest import read_manifest_if_any

from . import parity
from ._ui import Reporter, model_label
from .errors import UsageProblem


@dataclass
class FixReport:
    candidate: str
    precision: str
    output: str | None  # None: the candidate passes as it is, nothing written
    kept: list[str]  # the layers kept in higher precision, most error first
    ranked: int  # layers the search could keep
    trail: list[dict]  # {"kept", "passed", "top1_agreement"} in the order tried
    command: str | None
    validate: dict  # the candidate's validate report (with its layers)
    fixed: dict | None  # validate's report of the written model
    seconds: float
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _recipe(candidate: Path, reference: Path):
    """The candidate's manifest, refused unless trtc made it as FP16 or INT8 from ``reference``."""
    m = read_manifest_if_any(candidate)
    mode = (m.precision or {}).get("mode") if m is not None else None
    if mode not in ("fp16", "int8"):
        raise UsageProblem(f"--fix remakes FP16 and INT8 models that trtc quantize made, and {candidate.name} "
                           f"{'has no manifest' if m is None else f'is {mode or m.kind}'}",
                           "make the candidate with trtc quantize, then validate it with --fix")
    if (m.parent or {}).get("sha256") != sha256_file(reference):
        raise UsageProblem(f"--fix remakes {candidate.name} from its FP32 parent, and the reference {reference.name} "
                           f"is not that file (the manifest names {m.parent.get('file')})",
                           f"give --reference {m.parent.get('file')} (the parent that trtc quantize read)")
    return m


def _calib_sources(m, candidate: Path) -> list[str]:
    """The calibration data the manifest names, found as given or beside the candidate."""
    cd = m.precision.get("calibration_data") or {}
    out = []
    for s in cd.get("sources", []):
        p = Path(s)
        if not p.exists() and (candidate.parent / s).exists():
            p = candidate.parent / s
        if not p.exists():
            raise UsageProblem(f"the calibration data {s} that made {candidate.name} is not found here (nor beside "
                               "it)", "run from the folder trtc quantize ran in, or put the data beside the model")
        out.append(str(p))
    if not out or cd.get("sources") == ["random"]:
        raise UsageProblem(f"{candidate.name} was calibrated on random data: a fix would mean nothing",
                           "quantize it again with real --calib data")
    return out


def quantize_args(m, candidate: Path) -> dict:
    """The options of `trtc quantize` (as quantize_onnx's arguments) that made the candidate, its kept layers
    included (the accuracy-aware search's, as node names)."""
    from .precision.fp16 import DEFAULT_KEEP_FP32

    p = m.precision
    keep = [k for k in p.get("keep_fp32", []) if k not in DEFAULT_KEEP_FP32]
    keep += [k for k in p.get("kept_layers", []) if k not in keep]
    args = {"precision": p["mode"], "keep_fp32": keep}
    if p["mode"] == "int8":
        cd = p.get("calibration_data") or {}
        args.update(calib=_calib_sources(m, candidate), calib_count=cd.get("samples"),
                    calib_method=p.get("calibration", "percentile"), high_precision=p.get("high_precision", "fp16"),
                    bias_correction=p.get("bias_correction", True), target=p.get("target", "any"))
        if p.get("percentile") is not None:
            args["percentile"] = p["percentile"]
    return args


def command_line(parent: str, output: str, args: dict) -> str:
    """The `trtc quantize` line for quantize_onnx's ``args``."""
    q = shlex.quote
    parts = ["trtc quantize", q(parent), "--precision", args["precision"]]
    parts += [f"--calib {q(c)}" for c in args.get("calib", [])]
    parts += [f"--check {q(c)}" for c in args.get("check", [])]
    for opt, key, default in (("--calib-count", "calib_count", None), ("--check-count", "check_count", None),
                              ("--calib-method", "calib_method", "percentile"),
                              ("--percentile", "percentile", 99.99), ("--high-precision", "high_precision", "fp16"),
                              ("--target", "target", "any")):
        if key in args and args[key] != default:
            parts.append(f"{opt} {args[key]}")
    if args.get("bias_correction") is False:
        parts.append("--no-bias-correction")
    parts += [f"--keep-fp32 {q(k)}" for k in args["keep_fp32"]]
    return " ".join(parts + ["-o", q(output)])


def _variants(reference: Path, args: dict, reporter: Reporter, warnings: list[str], calib_cache):
    """(the layers the search may keep, ``make(kept) -> onnx model``, Q/DQ fusion, batch) from quantize's own
    machinery for the candidate's recipe."""
    from . import quantize as q
    from .precision import fp16 as fp16_pass

    parent = q._read_parent(reference, None, None, None, None, None, [])
    keep_ops, keep_names = fp16_pass.resolve_keep(parent.model, args["keep_fp32"])
    if args["precision"] == "fp16":
        names = [n.name for n in parent.model.graph.node
                 if n.name and n.op_type not in keep_ops and n.name not in keep_names]

        def make(kept: set[str]):
            return q._convert_fp16(parent.model, keep_ops, keep_names | kept, {}, [], Reporter()).final

        return names, make, True, parent.run_batch
    data = q._load_data(parent, "int8", args["calib"], [], False, args["calib_count"], q.DEFAULT_CHECK_COUNT, None, 0,
                        False, warnings, reporter, force=True)  # the recipe of a model already made (and accepted)
    st = q.int8_setup(parent, data.calib, keep_ops, keep_names, {}, calib_method=args["calib_method"],
                      percentile=args.get("percentile", q.cal.DEFAULT_PERCENTILE), calib_cache=calib_cache,
                      random_calib=False, high_precision=args["high_precision"], target=args["target"],
                      bias_correction=args["bias_correction"], device="cpu", reporter=reporter)

    def make(kept: set[str]):
        return st.builder(keep_names | kept)(st.excluded | kept)[0]

    return [l.name for l in st.layers if l.name not in st.excluded], make, st.fusion, parent.run_batch


def _ranking(names: list[str], layers: dict) -> list[str]:
    """``names`` (layers that can be kept), the one that makes the most error on the reference's inputs first."""
    from .layer_stats import rank_key

    key = {r["node"]: rank_key(r) for r in layers["rows"]}  # the report's own order of the worst layers
    return sorted((n for n in names if n in key), key=lambda n: key[n], reverse=True)



def _search(order: list[str], make, fusion: bool, batch: int, x, ref_logits, thresholds: dict, device: str,
            reporter: Reporter) -> tuple[int | None, list[dict]]:
    """The fewest of ``order`` to keep for a variant that passes ``thresholds`` on ``x`` (the accuracy-aware search's
    routine), and the trail of what each try gave."""
    from .quantize import _logits, _session, fewest_kept
    from .validate import judge

    trail: list[dict] = []

    def passes(kept: set[str]) -> tuple[bool, float]:
        p = parity.compare(ref_logits, _logits(_session(make(kept), device, fusion), x, batch))
        ok = not judge({"top1_agreement": p.top1_agreement, "cosine": p.cosine}, thresholds)
        trail.append({"kept": len(kept), "passed": ok, "top1_agreement": p.top1_agreement, "cosine": p.cosine})
        return ok, p.top1_agreement

    with reporter.phase(f"searching for the fewest of {len(order)} layers to keep for validate's gate") as bar:
        k, _ = fewest_kept(order, passes, bar.advance)
    return k, trail


def default_fixed_output(candidate: Path) -> Path:
    return candidate.with_name(f"{candidate.stem}.fixed.onnx")


def fix_candidate(reference: str, candidate: str, data: list[str], *, output: str | None = None,
                  samples: int = 16, top: int = 10, threshold: float | None = None, device: str = "cpu",
                  count: int = 512, seed: int = 0, thresholds: dict | None = None, calib_cache=None,
                  force: bool = False, reporter: Reporter | None = None) -> FixReport:
    """Validate ``candidate`` with its layers; when it fails, find the fewest layers to keep in higher precision for
    it to pass, write that model (quantize_onnx with the recipe and the printed command's options) and validate it.
    See the module docstring."""
    from .export import check_output_path
    from .layers import validate_layers
    from .quantize import quantize_onnx
    from .validate import validate

    reporter = reporter or Reporter()
    t0 = time.perf_counter()
    ref_path, cand_path = Path(reference), Path(candidate)
    m = _recipe(cand_path, ref_path)
    args = quantize_args(m, cand_path)
    out = check_output_path(Path(output) if output else default_fixed_output(cand_path), force)
    seen: list = []
    vargs = {"device": device, "count": count, "seed": seed, "thresholds": thresholds}
    first = validate_layers(reference, [candidate], data, samples=samples, top=top, threshold=threshold,
                            reporter=reporter, seen=seen, **vargs)
    x, ref_logits, result = seen[0]
    warnings: list[str] = []
    report = FixReport(candidate=candidate, precision=args["precision"], output=None, kept=[], ranked=0, trail=[],
                       command=None, validate=first.to_dict(), fixed=None, seconds=0.0, warnings=warnings)
    if first.passed:
        report.seconds = round(time.perf_counter() - t0, 2)
        return report
    names, make, fusion, batch = _variants(ref_path, args, reporter, warnings, calib_cache)
    order = _ranking(names, result.layers)
    k, report.trail = _search(order, make, fusion, batch, x, ref_logits, result.thresholds, device, reporter)
    report.ranked = len(order)
    if k is None:
        raise UsageProblem(f"{model_label(candidate)} does not pass validate's gate on this data even with all "
                           f"{len(order)} of its converted layers kept in higher precision",
                           "use the FP32 model, or relax a threshold (--min-top1-agreement, --min-cosine)")
    report.kept = order[:k]
    args["keep_fp32"] = args["keep_fp32"] + report.kept
    if args["precision"] == "fp16":  # FP16 calibrates on nothing: its own check runs on validate's data
        args.update(check=list(data), check_count=count)
    quantize_onnx(reference, out, calib_cache=calib_cache, force=True, device=device, reporter=reporter, **args)
    report.output, report.command = str(out), command_line(reference, str(out), args)
    report.fixed = validate(reference, [str(out)], data, reporter=reporter, **vargs).to_dict()
    report.seconds = round(time.perf_counter() - t0, 2)
    return report


__all__ = ["fix_candidate", "FixReport", "quantize_args", "command_line"]
