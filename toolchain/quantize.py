"""FP32 ONNX -> FP16 or INT8 (Q/DQ) ONNX with its manifest, checked against the parent on held-out data.

    report = quantize_onnx("model.onnx", "model.int8.onnx", precision="int8", calib=["bikes.mp4"])

FP16 casts the graph (:mod:`toolchain.precision.fp16`). INT8 calibrates activation ranges on real data,
inserts symmetric Q/DQ where TensorRT fuses it (:mod:`toolchain.precision.int8`), and computes the rest in FP16
(``high_precision="fp32"`` keeps it FP32). With ``target_agreement`` it measures how much each quantized layer
costs and keeps the most sensitive ones out of INT8 until the top-1 agreement with the parent reaches the target
on tuning data; the agreement printed at the end is measured on other held-out data.

INT8 keeps Q/DQ and their scales in FP32 with Casts to and from the FP16 rest, the one form that is right both in
a default ONNX Runtime session and in TensorRT; ``target="tensorrt"`` keeps the FP16-scale form that ONNX
Runtime's QDQ fusion gets wrong (README: The INT8 graph form).

The output is written to a temporary file beside the target and moved into place, with ``X.json``, only after
it loaded and ran in ONNX Runtime and gave trtc's answers in a default session too: a failure or Ctrl-C leaves
nothing behind.
"""

from __future__ import annotations

import copy
import logging
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engines import __version__
from engines._deps import dist_version, require
from engines._io import atomic_path, sha256_file
from engines.manifest import BatchProfile, Manifest, read_manifest_if_any, write_manifest
from engines.manifest import qdq_fusion_ok
from engines.preprocess import PreprocessSpec

from . import parity
from ._ui import Reporter
from .errors import QuantizeError, UsageProblem, first_line
from .export import check_output_path
from .precision import calibration as cal
from .precision import fp16 as fp16_pass
from .precision import graph as G
from .precision import int8 as int8_pass
from .precision import suffix
from .validate import default_session, default_session_failures

log = logging.getLogger("trtc")
PRECISIONS = ("fp16", "int8")
TARGETS = ("any", "onnxruntime", "tensorrt")
QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
RUNTIMES_ALL = ("onnxruntime", "tensorrt", "tensorrt-rtx")
RUNTIMES_TENSORRT = ("tensorrt", "tensorrt-rtx")  # ONNX Runtime only op by op (session.disable_quant_qdq)
DEFAULT_CALIB_COUNT = 128
DEFAULT_CHECK_COUNT = 256
# the fewest samples INT8 ranges are calibrated on without --force (asked for by --calib-count, or all the data gave);
# below it, with --force, the report says so
MIN_CALIB_COUNT = 32
RUN_BATCH = 16


@dataclass
class QuantizeReport:
    output: str
    manifest: str
    precision: str
    bytes: int
    sha256: str
    parent: dict
    recipe: dict
    layers: dict  # int8: total, int8, kept; fp16: converted, kept
    kept: list[dict]  # what stayed in higher precision and why
    calibration: dict | None
    search: dict | None
    check: dict  # parity vs the parent on held-out data, and what data
    timings: dict
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def default_output(model: str | Path, precision: str) -> Path:
    p = Path(model)
    return p.with_name(f"{p.stem}.{precision}.onnx")


def _spec_for(manifest: Manifest | None, dims: list, input_name: str, input_size, resize, mean, std, color):
    """Preprocessing for images and frames: the manifest's, or assembled from options for foreign ONNX files."""
    if manifest is not None and not any(v is not None for v in (input_size, resize, mean, std, color)):
        return manifest.preprocess
    base = manifest.preprocess if manifest is not None else None
    hw = dims[2:4] if len(dims) == 4 else []
    if input_size is not None:
        size = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    elif base is not None:
        size = base.size
    elif len(hw) == 2 and all(isinstance(d, int) for d in hw):
        size = tuple(hw)
    else:
        size = (224, 224)
    if resize is None:
        resize = base.resize if base is not None and input_size is None else int(round(min(size) / 0.875))
    channels = base.channels if base is not None else (dims[1] if len(dims) == 4 and dims[1] in (1, 3) else 3)
    return PreprocessSpec(size=size, resize=resize or None,
                          color=color or (base.color if base else "RGB"),
                          mean=tuple(mean) if mean else (base.mean if base else None),
                          std=tuple(std) if std else (base.std if base else None),
                          input=input_name, channels=channels)


def _session(model, device: str, qdq_fusion: bool = True):
    ort = require("onnxruntime", "Running ONNX models", extra="cpu")
    from engines.ort_session import providers_for, session_options

    data = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    try:
        return ort.InferenceSession(data, sess_options=session_options(ort, qdq_fusion=qdq_fusion),
                                    providers=providers_for(device))
    except Exception as exc:
        if type(exc).__module__.startswith("engines"):
            raise
        raise QuantizeError(f"ONNX Runtime cannot load the new model: {first_line(exc)}",
                            "run with --debug and report the model") from exc


def _logits(session, x: np.ndarray, batch: int) -> np.ndarray:
    name = session.get_inputs()[0].name
    chunks = cal.run_batches(lambda xb: session.run(None, {name: xb})[0], x, batch, cal.fixed_batch(session))
    return np.concatenate([y[:n] for _, n, y in chunks])


def _labelled_parity(ref, got, labels, data: cal.DataSet, what: str) -> dict:
    p = parity.compare(ref, got)
    d = p.to_dict()
    d["flips"] = [data.origins[i] for i in p.flips]
    d["data"] = what
    d["rotated"] = data.rotated  # videos whose frames were turned upright (calibration.DataSet.rotated)
    if labels is not None:
        d["accuracy_parent"] = parity.accuracy(ref, labels)
        d["accuracy"] = parity.accuracy(got, labels)
        d["accuracy_delta"] = d["accuracy"] - d["accuracy_parent"]
    return d


def quantize_onnx(model: str | Path, output: str | Path | None = None, *, precision: str,
                  calib: list | tuple | str | None = None, calib_count: int = DEFAULT_CALIB_COUNT,
                  calib_method: str = cal.DEFAULT_METHOD, percentile: float = cal.DEFAULT_PERCENTILE,
                  keep_fp32: list[str] | tuple[str, ...] = (), high_precision: str = "fp16",
                  target_agreement: float | None = None, check: list | tuple | str | None = None,
                  check_count: int = DEFAULT_CHECK_COUNT, calib_cache: str | Path | bool | None = None,
                  seed: int = 0, device: str = "cpu", bias_correction: bool = True, input_size=None,
                  resize: int | None = None, mean=None, std=None, color: str | None = None, target: str = "any",
                  force: bool = False, allow_random_check: bool = False,
                  reporter: Reporter | None = None) -> QuantizeReport:
    """Make an FP16 or INT8 model from an FP32 ONNX file; see the module docstring.

    The steps: check every option (before any slow work), read the parent, load the data (calibration, tuning
    and check, never overlapping), convert (FP16 cast, or INT8 calibration, search and Q/DQ), then write, run and
    compare the new model and move it into place."""
    reporter = reporter or Reporter()
    warnings: list[str] = []
    timings: dict[str, float] = {}
    calib, check, random_calib = _checked_options(precision, calib_method, percentile, target, high_precision,
                                                  target_agreement, calib_count, check_count, calib, check, force)
    src = Path(model)
    _refuse_program(src, precision)
    from .model_source import refuse_non_onnx

    refuse_non_onnx(src, "quantize")  # a text file is said to be one, not "Wire format was corrupt"
    out = _output_path(src, output, precision, force)

    t0 = time.perf_counter()
    parent = _read_parent(src, input_size, resize, mean, std, color, warnings)
    data = _load_data(parent, precision, calib, check, random_calib, calib_count, check_count, target_agreement,
                      seed, allow_random_check, warnings, reporter, force=force)
    timings["data_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    parent_session = _session(str(src), device)
    ref_check = _logits(parent_session, data.check.x, parent.run_batch)
    keep_ops, keep_names = fp16_pass.resolve_keep(parent.model, list(keep_fp32))
    recipe: dict = {"precision": precision, "keep_fp32": sorted(keep_ops | keep_names)}
    if precision == "fp16":
        conv = _convert_fp16(parent.model, keep_ops, keep_names, recipe, warnings, reporter)
    else:
        conv = _convert_int8(parent, data, parent_session, keep_ops, keep_names, recipe, calib_method=calib_method,
                             percentile=percentile, calib_cache=calib_cache, random_calib=random_calib,
                             high_precision=high_precision, target=target, bias_correction=bias_correction,
                             target_agreement=target_agreement, device=device, warnings=warnings,
                             timings=timings, reporter=reporter)
    G.check_model(conv.final, precision)
    timings["convert_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    size, m, mpath, check_report = _write_checked(out, conv, parent, data, ref_check, precision, recipe,
                                                  high_precision, device, warnings, reporter)
    timings["check_s"] = time.perf_counter() - t0
    _warn_below_validate(check_report, precision, src, out, calib, target_agreement, conv.layers, warnings)
    return QuantizeReport(output=str(out), manifest=str(mpath), precision=precision, bytes=size,
                          sha256=m.artifact["sha256"],
                          parent={"file": str(src), "sha256": parent.sha, "bytes": src.stat().st_size},
                          recipe=recipe, layers=conv.layers, kept=conv.kept, calibration=conv.calibration,
                          search=conv.search, check=check_report,
                          timings={k: round(v, 2) for k, v in timings.items()}, warnings=warnings)


def _warn_below_validate(check_report: dict, precision: str, src: Path, out: Path, calib, target_agreement,
                         layers: dict, warnings: list[str]) -> None:
    """A model whose own check falls below what `trtc validate` requires by default would pass here and fail
    there: said, with what to do (accuracy-aware quantization, more or other calibration data)."""
    from .validate import DEFAULT_THRESHOLDS

    need = DEFAULT_THRESHOLDS[precision]["min_top1_agreement"]
    got = check_report.get("top1_agreement")
    if got is None or got >= need:
        return
    what = (f"top-1 agreement with the parent is {got:.1%} on the check data, below the {need:.0%} that trtc "
            f"validate requires of an {precision.upper()} model by default: validate will FAIL {out.name}")
    if precision != "int8":
        warnings.append(f"{what}; keep the layers that differ in FP32 (--keep-fp32 OP_OR_NODE) or use the FP32 "
                        "model")
        return
    data = " ".join(f"--calib {shlex.quote(str(c))}" for c in (calib or [])) or "--calib VIDEO_OR_IMAGES"
    if target_agreement is None:
        fix = (f"quantize accuracy-aware, which keeps the layers that cost most out of INT8: trtc quantize "
               f"{shlex.quote(str(src))} --precision int8 {data} --calib-count 64 --target-agreement "
               f"{min(0.99, need + 0.02):.2f} "
               f"-o {shlex.quote(str(out))} --force; or calibrate on more data, or data closer to what the model "
               "will see (--calib-count, another --calib)")
    else:
        fix = (f"--target-agreement {target_agreement} was met on the tuning data ({layers.get('kept', 0)} layer(s) "
               "kept out of INT8) but not on the check data: calibrate on more data, or data closer to what the "
               "model will see (--calib-count, another --calib), or raise --target-agreement")
    warnings.append(f"{what}. To fix: {fix}")


def _refuse_program(src: Path, precision: str) -> None:
    """A torch.export program (.pt2) is not quantized here: FP16 is an option of the compiled PyTorch engine, INT8
    needs TensorRT or ONNX Runtime (its ONNX sibling)."""
    if src.suffix.lower() != ".pt2":
        return
    onnx = src.with_suffix(".onnx").name
    if precision == "int8":
        raise UsageProblem("INT8 needs TensorRT or ONNX Runtime: the compiled PyTorch engine runs FP32 and FP16",
                           f"quantize the ONNX exported beside the program: trtc quantize {onnx} --precision int8")
    raise UsageProblem(f"{src.name} is a torch.export program: the compiled PyTorch engine makes it FP16 when it "
                       "opens it (trtc quantize's keep-list in FP32)", f"run it as torch-fp16:{src.name} "
                       f"(e.g. trtc run --model torch-fp16:{src.name}), or quantize {onnx} for the other engines")


@dataclass
class _Parent:
    """The FP32 model and what quantize reads from it."""
    src: Path
    model: object  # onnx.ModelProto
    manifest: Manifest | None
    sha: str
    input_name: str
    dims: list
    run_batch: int
    spec: PreprocessSpec


@dataclass
class _Data:
    """Calibration, tuning (for the search) and check samples, never overlapping."""
    calib: cal.DataSet | None
    tune: cal.DataSet | None
    check: cal.DataSet
    check_name: str


@dataclass
class _Converted:
    """The new graph and what the conversion says about it."""
    final: object  # onnx.ModelProto
    kept: list[dict]
    layers: dict
    calibration: dict | None = None
    search: dict | None = None


def _checked_options(precision, calib_method, percentile, target, high_precision, target_agreement, calib_count,
                     check_count, calib, check, force: bool = False) -> tuple[list, list, bool]:
    """Every option checked before any slow work; returns ``calib`` and ``check`` as lists, and whether the
    calibration data is ``random``. ``force``: a --calib-count below :data:`MIN_CALIB_COUNT` is accepted."""
    if precision not in PRECISIONS:
        raise UsageProblem(f"unknown precision {precision!r}", "use --precision fp16 or --precision int8")
    if calib_method not in cal.METHODS:
        raise UsageProblem(f"unknown calibration method {calib_method!r}",
                           f"use one of {', '.join(cal.METHODS)}")
    if not 50.0 < percentile <= 100.0:
        raise UsageProblem(f"--percentile {percentile} is outside (50, 100]", "e.g. --percentile 99.99")
    if target not in TARGETS:
        raise UsageProblem(f"unknown target {target!r}", f"use one of {', '.join(TARGETS)}")
    if high_precision not in ("fp16", "fp32"):
        raise UsageProblem(f"--high-precision {high_precision!r} is not fp16 or fp32", "use fp16 (default) or fp32")
    if target_agreement is not None and not 0.0 < target_agreement <= 1.0:
        raise UsageProblem(f"--target-agreement {target_agreement} is not a fraction in (0, 1]",
                           "e.g. --target-agreement 0.97 for 97% top-1 agreement")
    if calib_count < 1 or check_count < 1:
        raise UsageProblem("--calib-count and --check-count must be at least 1")
    calib = [calib] if isinstance(calib, (str, Path)) else list(calib or [])
    check = [check] if isinstance(check, (str, Path)) else list(check or [])
    random_calib = [str(c) for c in calib] == ["random"]
    if precision == "int8" and not calib:
        raise UsageProblem("INT8 needs calibration data, and none was given",
                           "add --calib FOLDER_OR_VIDEO (images or frames like those the model will see); "
                           "--calib random only for a smoke test")
    if random_calib and target_agreement is not None:
        raise UsageProblem("--target-agreement cannot be met on random calibration data", "give real --calib data")
    if precision == "int8" and not random_calib and calib_count < MIN_CALIB_COUNT and not force:
        raise UsageProblem(_too_few(f"--calib-count {calib_count} is"), _too_few_fix(calib_count))
    if not random_calib:
        cal.check_sources(calib)
    cal.check_sources(check)
    return calib, check, random_calib


def _too_few(what: str) -> str:
    return (f"{what} below the minimum of {MIN_CALIB_COUNT} calibration samples: INT8 ranges from so few inputs "
            "do not hold for the inputs the model will see, and a check on the few held out says little")


def _too_few_fix(n: int) -> str:
    return (f"give --calib-count {MIN_CALIB_COUNT} or more (the default is {DEFAULT_CALIB_COUNT}) with enough --calib "
            f"data, or add --force to calibrate on {n} anyway (the report then says so)")


def _calibration_minimum(n: int, calib_count: int, force: bool, warnings: list[str]) -> None:
    """The one rule for the fewest calibration samples, whether --calib-count asked for fewer than
    :data:`MIN_CALIB_COUNT` or the data gave fewer: refused without ``force``, said in the report with it."""
    if n >= MIN_CALIB_COUNT:
        return
    if not force:
        raise QuantizeError(_too_few(f"the calibration data gave {n} sample(s), which is"), _too_few_fix(n))
    asked = f" (--calib-count {calib_count})" if calib_count < MIN_CALIB_COUNT else ""
    warnings.append(f"CALIBRATED ON {n} SAMPLE(S){asked}, below the minimum of {MIN_CALIB_COUNT} (accepted by "
                    "--force): the INT8 ranges may not hold for other inputs; check the model with trtc validate on "
                    "data it has not seen")


def _overlap_warning(calib_set, check_set, check_name: str, warnings: list[str]) -> None:
    """Check samples that are calibration samples too (the same content: the same file, a copy of it, or the same
    frame) flatter the INT8 model's agreement: said in the report, with how many."""
    if calib_set is None or check_set is None or not len(calib_set) or not len(check_set):
        return
    import hashlib

    seen = {hashlib.sha1(np.ascontiguousarray(x).tobytes()).digest() for x in calib_set.x}
    same = [o for x, o in zip(check_set.x, check_set.origins)
            if hashlib.sha1(np.ascontiguousarray(x).tobytes()).digest() in seen]
    if same:
        warnings.append(f"{len(same)} of the {len(check_set)} check samples ({check_name}) are calibration samples "
                        f"too (the same content, e.g. {same[0]}): the agreement on them flatters the INT8 model; give "
                        "--check data the calibration did not see")


def _output_path(src: Path, output, precision: str, force: bool) -> Path:
    out = Path(output) if output is not None else default_output(src, precision)
    out = check_output_path(out, force)
    if out.resolve() == src.resolve():
        raise UsageProblem("the output would overwrite the input model", "choose another -o")
    return out


def _read_parent(src: Path, input_size, resize, mean, std, color, warnings: list[str]) -> _Parent:
    """The parent model, its manifest if any, its single input and the preprocessing its data gets."""
    try:
        parent = G.load(src)
    except QuantizeError as exc:
        if "not a readable ONNX model" not in exc.reason:
            raise
        why = exc.reason.split(": ", 1)[-1]
        raise QuantizeError(f"{src} is not a readable ONNX model ({why}): it may be cut short (a copy or a "
                            "download that stopped) or damaged", f"copy {src} again from where it came from, or make "
                            "it again with the trtc export command that made it") from exc
    G.refuse_reduced(parent, src.name)
    manifest = read_manifest_if_any(src)
    parent_sha = sha256_file(src)
    feeds = G.graph_inputs(parent)
    if len(feeds) != 1:
        raise QuantizeError(f"the model has {len(feeds)} inputs; trtc quantize handles single-input classifiers",
                            "export the classifier with one image input")
    input_name = feeds[0].name
    dims = G.input_dims(feeds[0])
    fixed_batch = dims[0] if dims and isinstance(dims[0], int) else None
    run_batch = fixed_batch or RUN_BATCH
    spec = _spec_for(manifest, dims, input_name, input_size, resize, mean, std, color)
    if manifest is None:  # said once, in the words of trtc run: what is assumed, and how to adopt the model
        from .export import no_manifest_note, onnx_labels

        warnings.append(no_manifest_note(src, spec, labels=onnx_labels(src)[0] is not None))
    return _Parent(src=src, model=parent, manifest=manifest, sha=parent_sha, input_name=input_name, dims=dims,
                   run_batch=run_batch, spec=spec)


def _load_data(parent: _Parent, precision, calib, check, random_calib, calib_count, check_count, target_agreement,
               seed, allow_random_check, warnings, reporter, force: bool = False) -> _Data:
    """Calibration data (INT8), then the check data and the tuning data the search needs. ``force``: fewer
    calibration samples than :data:`MIN_CALIB_COUNT` are accepted (and said)."""
    calib_set = held = None
    if precision == "int8":
        calib_set, held = _calibration_data(parent, calib, check, random_calib, calib_count, check_count,
                                            target_agreement, seed, allow_random_check, warnings, reporter)
        if not random_calib:
            _calibration_minimum(len(calib_set), calib_count, force, warnings)
    tune_set, check_set, check_name = _check_data(parent, precision, calib, check, held, check_count,
                                                  target_agreement, seed, warnings, reporter)
    if check:
        _overlap_warning(calib_set, check_set, check_name, warnings)
    if target_agreement is not None and (tune_set is None or len(tune_set) == 0):
        # the search tunes on calibration-source samples that calibration did not use (--check only reports)
        have = len(calib_set) if calib_set is not None else 0
        raise UsageProblem(f"--target-agreement tunes on held-out calibration samples, and none is left: the "
                           f"calibration data gave {have} and --calib-count {calib_count} uses all of them "
                           "(--check data only reports)",
                           f"give a --calib-count below {have} or more calibration data (at least "
                           f"{min_tune_samples(target_agreement)} samples beyond --calib-count let the search see a "
                           f"{100 * (1 - target_agreement):.2g}-point loss)" if have > 1 else
                           "give more calibration data than --calib-count")
    return _Data(calib=calib_set, tune=tune_set, check=check_set, check_name=check_name)


def _calibration_data(parent: _Parent, calib, check, random_calib, calib_count, check_count, target_agreement, seed,
                      allow_random_check, warnings, reporter):
    """The calibration samples, and those of the same sources held out of calibration (None where none is)."""
    if random_calib:
        calib_set = cal.random_data(parent.dims, calib_count, seed)
        warnings.append("CALIBRATED ON RANDOM DATA: the INT8 ranges mean nothing for real inputs; use this model "
                        "only to test a pipeline")
        return calib_set, None
    extra = check_count if (not check or target_agreement is not None) else 0  # held out: check/tune
    if target_agreement is not None:  # a tuning set that can see the loss the target allows, where data has it
        extra = max(extra, min_tune_samples(target_agreement) * (1 if check else 2))
    pool = cal.load_data(calib, parent.spec, parent.dims, parent.input_name, want=calib_count + extra, seed=seed,
                         reporter=reporter)
    calib_set, held = cal.split(pool, calib_count, seed)
    if held is None and not check and not allow_random_check:
        # the check would fall back to random inputs, and its "100% agreement" would mean nothing
        raise QuantizeError(
            f"the calibration data gave {len(pool)} sample(s) and --calib-count {calib_count} uses all of "
            f"them, so none is left to check the INT8 model on (it would be checked on random inputs)",
            f"give more data (at least {calib_count + 1} samples; {calib_count + check_count} for the full "
            f"check), a lower --calib-count, --check DATA, or --allow-random-check to accept a check on "
            f"random inputs")
    if pool.skipped:
        warnings.append(f"skipped {len(pool.skipped)} unreadable calibration file(s): "
                        + ", ".join(Path(s['file']).name for s in pool.skipped[:5]))
    return calib_set, held


def _check_data(parent: _Parent, precision, calib, check, held, check_count, target_agreement, seed, warnings,
                reporter):
    """The tuning set (None without held-out samples), the check set and the words that name the check data:
    --check data, else the held-out calibration samples (halved with the search), else FP16's calibration data,
    else random inputs."""
    tune_set = None
    if check:
        check_set = cal.load_data(check, parent.spec, parent.dims, parent.input_name, want=check_count,
                                  seed=seed + 1, reporter=reporter, what="check")
        check_name = ", ".join(str(c) for c in check)
        tune_set = held
    elif held is not None:
        if target_agreement is not None:  # tune on half of the held-out samples, report on the other half
            tune_set, check_set = held.subset(range(0, len(held), 2)), held.subset(range(1, len(held), 2))
            check_name = "held-out calibration-source samples (every other one; the rest tuned the search)"
        else:
            check_set, check_name = held, "held-out samples of the calibration data (not used to calibrate)"
    elif precision == "fp16" and calib:
        check_set = cal.load_data(calib, parent.spec, parent.dims, parent.input_name, want=check_count, seed=seed,
                                  reporter=reporter, what="check")
        check_name = ", ".join(str(c) for c in calib)
    else:
        check_set, check_name = cal.random_data(parent.dims, min(check_count, 32), seed + 1), "random inputs"
        warnings.append("checked on random inputs: give --check IMAGES_OR_VIDEO for an agreement figure that means "
                        "something" if precision == "fp16" else
                        "no held-out data: all calibration samples were used; give --check or more data")
    return tune_set, check_set, check_name


def _convert_fp16(parent, keep_ops, keep_names, recipe: dict, warnings, reporter) -> _Converted:
    """The parent with folded constants, cast to FP16 but for the keep-list."""
    work = copy.deepcopy(parent)
    G.fold_constants(work)
    with reporter.phase("converting to FP16"):
        res = fp16_pass.convert_fp16(work, keep_ops, keep_names)
    if res.underflow_values:
        warnings.append(f"{res.underflow_values} tiny nonzero weights became 0 in FP16")
    recipe["runtimes"] = list(RUNTIMES_ALL)
    return _Converted(final=work, kept=res.kept,
                      layers={"converted": res.converted_nodes, "kept": len(res.kept), "casts": res.casts_added})


@dataclass
class Int8Setup:
    """What the INT8 pass works with: the prepared parent, its quantizable layers, the calibrated ranges, the layers
    kept out of INT8 by the keep-list, and ``builder(keep_names)``, whose ``build(exclude)`` makes a variant."""
    prepared: object  # onnx.ModelProto
    layers: list
    stats: object  # calibration.Stats
    calibration: dict
    excluded: set
    fusion: bool
    fp16_scales: bool
    builder: object


def int8_setup(parent: _Parent, calib_set, keep_ops, keep_names, recipe: dict, *, calib_method, percentile,
               calib_cache, random_calib, high_precision, target, bias_correction, device, reporter) -> Int8Setup:
    """Calibrate the activation ranges (or read them from the cache) and prepare the builder of Q/DQ variants."""
    # the graph form (README, "The INT8 graph form"): Q/DQ in FP32 with FP32 scales and Casts to the FP16 rest
    # runs right everywhere; FP16 scales (Q/DQ inside the FP16 graph) only where ONNX Runtime's QDQ fusion is
    # off, so only for --target tensorrt
    fp16_scales = high_precision == "fp16" and target == "tensorrt"
    prepared, layers = _int8_layers(parent.model, fp16_scales)
    tensors = int8_pass.activation_tensors(layers)
    stats, calibration = _ranges(prepared, parent.src, parent.sha, tensors, calib_set, calib_method, percentile,
                                 parent.run_batch, device, calib_cache, random_calib, reporter)
    recipe.update(_int8_recipe(high_precision, calib_method, percentile, bias_correction, target, fp16_scales))
    # nodes on the FP32 keep-list are not quantized either
    excluded = {l.name for l in layers if prepared.graph.node[l.index].op_type in keep_ops
                or prepared.graph.node[l.index].name in keep_names}

    def builder(names: set[str]):
        return _qdq_builder(prepared, layers, stats, keep_ops, names, fp16_scales, bias_correction, high_precision)

    return Int8Setup(prepared=prepared, layers=layers, stats=stats, calibration=calibration, excluded=excluded,
                     fusion=qdq_fusion_ok(recipe | {"mode": "int8"}), fp16_scales=fp16_scales, builder=builder)


def _convert_int8(parent: _Parent, data: _Data, parent_session, keep_ops, keep_names, recipe: dict, *, calib_method,
                  percentile, calib_cache, random_calib, high_precision, target, bias_correction, target_agreement,
                  device, warnings, timings, reporter) -> _Converted:
    """Calibrate the activation ranges, choose the layers kept out of INT8 (the FP32 keep-list, and with a
    target agreement the search's), insert Q/DQ and compute the rest in FP16 (or FP32)."""
    st = int8_setup(parent, data.calib, keep_ops, keep_names, recipe, calib_method=calib_method,
                    percentile=percentile, calib_cache=calib_cache, random_calib=random_calib,
                    high_precision=high_precision, target=target, bias_correction=bias_correction, device=device,
                    reporter=reporter)
    layers, calibration, excluded = st.layers, st.calibration, st.excluded
    build = st.builder(keep_names)
    search = None
    if target_agreement is not None:
        t1 = time.perf_counter()
        excluded, search = _search(st.prepared, layers, st.stats, build, excluded, data.tune, parent_session,
                                   target_agreement, parent.run_batch, device, st.fusion, reporter)
        _warn_if_coarse(search, len(data.tune), target_agreement, len(excluded), warnings)
        timings["search_s"] = time.perf_counter() - t1
    with reporter.phase("inserting Q/DQ"):
        final, qres, fres = build(excluded)
    kept = [{"node": name, "op": next(l.op for l in layers if l.name == name),
             "reason": (search or {}).get("reasons", {}).get(name, "--keep-fp32")}
            for name in qres.excluded]
    if fres is not None:
        kept += fres.kept
    recipe["kept_layers"] = list(qres.excluded)
    # how much of the model is INT8, for inspect and the reports ("INT8 on 4 of 50 layers")
    recipe["layers"] = {"int8": len(qres.quantized), "total": len(layers)}
    return _Converted(final=final, kept=kept, calibration=calibration, search=search,
                      layers={"total": len(layers), "int8": len(qres.quantized), "kept": len(qres.excluded),
                              "activation_qdq": qres.activations, "weight_dq": qres.weights,
                              "bias_corrected": qres.bias_corrected})


def _int8_layers(parent, fp16_scales: bool):
    """A copy of the parent at the opset its Q/DQ form needs, constants folded, and its quantizable layers."""
    prepared = G.upgrade_opset(parent, 19 if fp16_scales else 13)
    if prepared is parent:
        prepared = copy.deepcopy(parent)
    G.fold_constants(prepared)
    layers = int8_pass.find_layers(prepared)
    if not layers:
        raise QuantizeError("the model has no Conv, Gemm or MatMul layers to quantize",
                            "use --precision fp16 for this model")
    return prepared, layers


def _int8_recipe(high_precision, calib_method, percentile, bias_correction, target, fp16_scales) -> dict:
    """The INT8 part of the recipe, in the manifest's order."""
    return {"high_precision": high_precision, "calibration": calib_method,
            "percentile": percentile if calib_method == "percentile" else None,
            "weights": "int8 symmetric per-channel", "activations": "int8 symmetric per-tensor",
            "bias_correction": bias_correction, "target": target,
            "qdq": "fp16 scales, Q/DQ in FP16" if fp16_scales else
            ("fp32 scales, Q/DQ in FP32, Cast to FP16 after each DequantizeLinear"
             if high_precision == "fp16" else "fp32 scales"),
            "scales": "fp16" if fp16_scales else "fp32",
            # who computes this graph right; engines and trtc validate read it
            "runtimes": list(RUNTIMES_ALL if not fp16_scales else RUNTIMES_TENSORRT)}


def _qdq_builder(prepared, layers, stats, keep_ops, keep_names, fp16_scales, bias_correction, high_precision):
    """``build(exclude) -> (model, Q/DQ result, FP16 result or None)``: a fresh copy of ``prepared`` with Q/DQ
    on every layer but ``exclude``, the rest in FP16 unless ``high_precision`` is fp32."""
    def build(exclude: set[str]):
        m = copy.deepcopy(prepared)
        q = int8_pass.insert_qdq(m, layers, stats.ranges, exclude, fp16_scales=fp16_scales,
                                 means=stats.means if bias_correction else None)
        r = None
        if high_precision == "fp16":
            r = fp16_pass.convert_fp16(m, keep_ops if fp16_scales else keep_ops | QDQ_OPS, keep_names)
            r.kept = [k for k in r.kept if k["op"] not in QDQ_OPS]  # FP32 by design, not kept out of FP16
        return m, q, r

    return build


def _warn_if_coarse(search: dict, tune_samples: int, target_agreement: float, kept: int, warnings) -> None:
    """A warning when the tuning set was too small for the search to see the loss the target allows."""
    res = search["resolution"]
    if not res["enough"]:
        warnings.append(
            f"the accuracy-aware search tuned on {tune_samples} samples: one disagreement is "
            f"{res['one_disagreement']:.1%}, so it cannot see a loss as small as the "
            f"{1 - target_agreement:.1%} that --target-agreement {target_agreement:g} allows (reached "
            f"{search['reached']:.1%} with {kept} layer(s) kept); give at least {res['needed']} "
            "held-out calibration samples (more calibration data than --calib-count, or a larger "
            "--check-count)")


def _write_checked(out: Path, conv: _Converted, parent: _Parent, data: _Data, ref_check, precision, recipe,
                   high_precision, device, warnings, reporter):
    """Write the new model to a temporary file beside ``out``, run it against the parent on the check data (in
    trtc's session and in a default one) and move it into place with its manifest only if all of that passed.
    Returns its size, manifest, manifest path and check report."""
    with atomic_path(out) as tmp:
        G.save_model(conv.final, tmp)
        fusion = qdq_fusion_ok(recipe | {"mode": precision})
        session = _session(str(tmp), device, qdq_fusion=fusion)
        with reporter.phase(f"checking against the parent on {len(data.check)} samples"):
            got = _logits(session, data.check.x, parent.run_batch)
        check_report = _labelled_parity(ref_check, got, data.check.labels, data.check, data.check_name)
        check_report["device"] = device
        check_report["default_session"] = _default_session_check(tmp, device, data.check, ref_check, got, recipe,
                                                                 fusion, parent.run_batch, warnings, reporter)
        size = tmp.stat().st_size
        m = _manifest(parent.manifest, conv.final, parent.src, parent.sha, parent.spec, parent.dims, precision,
                      recipe, conv.calibration, check_report, high_precision)
        mpath = write_manifest(out, m, hashed_as=tmp)
    return size, m, mpath, check_report


def _default_session_check(path, device, check_set, ref, got, recipe, fusion, batch, warnings, reporter) -> dict:
    """The new model in a default ONNX Runtime session (what users, Triton's ORT backend and other tools run)
    must give the answers trtc measured. Where trtc's own session used no special option it *is* a default
    session, and its logits are reused."""
    if fusion:
        default = got
    else:
        with reporter.phase(f"checking in a default ONNX Runtime session on {len(check_set)} samples"):
            default = _logits(default_session(path, device), check_set.x, batch)
    fails = default_session_failures(recipe["precision"], got, default)
    p = parity.compare(ref, default)
    info = {"same_as_check": fusion, "top1_agreement": p.top1_agreement, "cosine": p.cosine, "passed": not fails,
            "failures": fails}
    if fails:
        f = fails[0]
        what = (f"in a default ONNX Runtime session ({device}, no trtc session options) the new model agrees with "
                f"the parent on {p.top1_agreement:.1%} top-1 of {len(check_set)} samples, and with trtc's own run of "
                f"it on {f['metric'].replace('_', ' ')} {f['value']:.4g} (threshold {f['threshold']})")
        if "onnxruntime" not in recipe.get("runtimes", RUNTIMES_ALL):
            warnings.append(what + f"; the model is for --target {recipe.get('target')} only (manifest: runtimes)")
        else:
            raise QuantizeError(what, "use the default graph form (--target any); if it is the default, report it "
                                "with the model")
    return info


def _ranges(prepared, src, parent_sha, tensors, calib_set, method, percentile, batch, device, calib_cache,
            random_calib, reporter):
    digest = cal.data_digest(calib_set.x)
    key = cal.cache_key(parent_sha, digest, method, percentile, tensors)
    if calib_cache is False or random_calib:
        path = None
    elif calib_cache in (None, True):
        path = cal.cache_dir() / f"{key}.json"
    else:
        path = Path(calib_cache)
        if path.exists() and not cal.is_cache_file(path):  # another file: a stale cache is replaced, this is not
            raise UsageProblem(f"--calib-cache {path} is not a trtc calibration cache, and recalibrating would "
                               "write over it", "give a new file name (or an earlier cache), or move that file away")
    stats = cal.read_cache(path, key, tensors) if path is not None and path.exists() else None
    cached = stats is not None
    if stats is None:
        stats = cal.collect_stats(prepared, tensors, calib_set.x, method, percentile, batch, device, reporter)
        if path is not None:
            cal.write_cache(path, key, stats, {"model": src.name, "method": method, "percentile": percentile,
                                               "samples": len(calib_set)})
    else:
        log.info("calibration ranges from cache %s", path)
    info = {"method": method, "percentile": percentile if method == "percentile" else None,
            "samples": len(calib_set), "sources": calib_set.sources, "data_sha256": digest,
            "skipped": calib_set.skipped, "rotated": calib_set.rotated, "cache": str(path) if path else None,
            "from_cache": cached, "activations": len(tensors), "random": random_calib}
    return stats, info


def _search(prepared, layers, stats, build, excluded, tune_set, parent_session, target, batch, device, fusion,
            reporter):
    """Keep the layers whose INT8 costs most out of INT8 until top-1 agreement on the tuning data reaches the
    target. Cost of a layer = KL divergence from the parent's softmax when only that layer is quantized."""
    ref = _logits(parent_session, tune_set.x, batch)
    names = [l.name for l in layers if l.name not in excluded]

    def agreement(exclude: set[str]) -> float:
        m, _, _ = build(exclude)
        return parity.compare(ref, _logits(_session(m, device, fusion), tune_set.x, batch)).top1_agreement

    base = agreement(set(excluded))
    trail = [{"kept": len(excluded), "agreement": base}]
    if base >= target:
        return excluded, {"target": target, "tune_samples": len(tune_set), "reached": base, "trail": trail,
                          "ranking": [], "reasons": {}, "resolution": tuning_resolution(len(tune_set), target)}
    cost = _int8_costs(prepared, layers, stats, names, ref, tune_set, batch, device, reporter)
    order = [n for _, n in cost]

    def with_top(k: int) -> set[str]:
        return set(excluded) | set(order[:k])

    def passes(kept: set[str]) -> tuple[bool, float]:
        got = agreement(set(excluded) | kept)
        trail.append({"kept": len(set(excluded) | kept), "agreement": got})
        return got >= target, got

    with reporter.phase(f"searching for the fewest layers to keep for {target:.1%} agreement") as bar:
        hi, tried = fewest_kept(order, passes, bar.advance)
    results = {0: base, **{k: v for k, (_, v) in tried.items()}}
    if hi is None:
        best = max(results, key=results.get)
        raise QuantizeError(f"top-1 agreement {results[best]:.1%} on {len(tune_set)} tuning samples does not "
                            f"reach --target-agreement {target:.1%} even with {len(with_top(best))} of "
                            f"{len(layers)} layers kept out of INT8",
                            "lower --target-agreement, or use --precision fp16")
    chosen = with_top(hi)
    reasons = {n: f"INT8 cost (KL {c:.2e}) among the top {hi}" for c, n in cost[:hi]}
    return chosen, {"target": target, "tune_samples": len(tune_set), "reached": results[hi], "trail": trail,
                    "ranking": [{"layer": n, "kl": c} for c, n in cost[:max(hi, 10)]], "reasons": reasons,
                    "resolution": tuning_resolution(len(tune_set), target)}


def fewest_kept(order: list[str], passes, advance=lambda: None) -> tuple[int | None, dict[int, tuple[bool, float]]]:
    """The smallest k for which ``passes(set(order[:k]))`` holds, for an ``order`` whose first layers matter most
    (more kept layers pass more): k doubles until it holds, then bisects between the last miss and the first hit.
    ``passes(kept) -> (ok, figure)``. Returns k (None when all of ``order`` kept still fails) and what each k tried
    gave, in the order tried. The accuracy-aware search and ``trtc validate --fix`` both search with it."""
    tried: dict[int, tuple[bool, float]] = {}

    def ok(k: int) -> bool:
        tried[k] = passes(set(order[:k]))
        advance()
        return tried[k][0]

    lo, hi, k = 0, None, 1
    while k <= len(order):  # grow until it holds ...
        if ok(k):
            hi = k
            break
        lo = k
        k = min(len(order), k * 2) if k < len(order) else len(order) + 1
    if hi is None:
        return None, tried
    while hi - lo > 1:  # ... then bisect between the last miss and the first hit
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi, tried


COST_GROUP = 8  # layers whose boundary tensors one run of the parent gives (memory: 8 tensors x the tuning set)


def _int8_costs(prepared, layers, stats, names, ref, tune_set, batch, device, reporter) -> list[tuple[float, str]]:
    """(cost, layer) for each of ``names``, costliest first: the KL divergence from the parent's softmax
    (``ref``) when only that layer is quantized. Each variant runs from that layer on, fed the parent's tensors
    there (toolchain.precision.suffix), about half the work of running it whole."""
    everything = {l.name for l in layers}
    index = {l.name: l.index for l in layers}
    parent_tensors = {t for node in prepared.graph.node for t in node.output}
    x_name = prepared.graph.input[0].name
    cost = []
    with reporter.phase(f"measuring the cost of INT8 per layer ({len(names)} layers)", total=len(names)) as bar:
        todo = sorted(names, key=index.get)
        for group in (todo[i:i + COST_GROUP] for i in range(0, len(todo), COST_GROUP)):
            variants = {}
            for name in group:
                m = copy.deepcopy(prepared)
                int8_pass.insert_qdq(m, layers, stats.ranges, everything - {name}, means=stats.means)
                nodes = suffix.suffix_nodes(m, prepared.graph.node[index[name]].output[0], parent_tensors)
                variants[name] = (m, nodes, suffix.boundary(m, nodes))
            wanted = sorted({t for _, _, b in variants.values() for t in b} - {x_name})
            parent = _session(suffix.with_outputs(prepared, wanted), device)  # run as far as those tensors only
            runs = [(n, {x_name: xb, **dict(zip(wanted, parent.run(wanted, {x_name: xb}) if wanted else []))})
                    for _, n, xb in cal.run_batches(lambda xb: xb, tune_set.x, batch, cal.fixed_batch(parent))]
            for name in group:
                m, nodes, feeds = variants[name]
                try:
                    session = _session(suffix.suffix_model(m, nodes, {t: runs[0][1][t] for t in feeds}), device)
                    out = np.concatenate([session.run(None, {t: v[t] for t in feeds})[0][:n] for n, v in runs])
                except Exception as exc:  # noqa: BLE001 - a graph the cut does not fit (e.g. subgraphs): run it whole
                    log.debug("%s: cost measured on the whole model (%s)", name, first_line(exc))
                    out = _logits(_session(m, device), tune_set.x, batch)
                cost.append((parity.compare(ref, out).kl, name))
                bar.advance()
    cost.sort(key=lambda c: -c[0])
    return cost


# the search sees a loss of (1 - target) only when the target allows this many disagreements on its tuning set
SEARCH_MIN_DISAGREEMENTS = 3


def min_tune_samples(target: float) -> int:
    """Tuning samples for a search to tell agreement ``target`` from 100%: the target allows
    SEARCH_MIN_DISAGREEMENTS disagreements (300 for 0.99)."""
    return int(np.ceil(SEARCH_MIN_DISAGREEMENTS / max(1e-9, 1.0 - target) - 1e-9))


def tuning_resolution(samples: int, target: float) -> dict:
    """How finely ``samples`` tuning samples resolve agreement: one disagreement's share, and whether the
    target's allowed loss can be seen at all."""
    need = min_tune_samples(target)
    return {"one_disagreement": 1.0 / samples if samples else None, "enough": samples >= need,
            "needed": need}


def _manifest(parent_m: Manifest | None, final, src: Path, parent_sha: str, spec, dims, precision, recipe,
              calibration, check_report, high_precision) -> Manifest:
    inputs = [G.tensor_spec(v) for v in G.graph_inputs(final)]
    outputs = [G.tensor_spec(v) for v in final.graph.output]
    if parent_m is not None:
        batch, labels, model_info = parent_m.batch, parent_m.labels, dict(parent_m.model)
    else:
        b = dims[0] if dims and isinstance(dims[0], int) else None
        batch = BatchProfile(b, b, b) if b else BatchProfile(1, 8, 32)
        num = outputs[0].shape[-1] if outputs and outputs[0].shape and isinstance(outputs[0].shape[-1], int) \
            else None
        from .export import onnx_labels

        labels = onnx_labels(src, num)[0]  # an ONNX from elsewhere may name its classes in its metadata
        model_info = {"name": src.stem, "source": str(src), "num_classes": num}
    precision_info = {"mode": precision, **{k: v for k, v in recipe.items() if k != "precision"}}
    if precision == "int8":
        precision_info["high_precision"] = high_precision
    if calibration:
        precision_info["calibration_data"] = {k: calibration[k] for k in
                                              ("method", "percentile", "samples", "sources", "data_sha256")}
    check_small = {k: v for k, v in check_report.items() if k != "flips"}
    check_small["flips"] = len(check_report["flips"])
    return Manifest(kind="onnx", model=model_info, preprocess=spec, inputs=inputs, outputs=outputs, batch=batch,
                    labels=labels, precision=precision_info,
                    producer={"tool": "trtc quantize", "trtc": __version__, "onnx": dist_version("onnx"),
                              "onnxruntime": dist_version("onnxruntime", "onnxruntime-gpu"),
                              "opset": G.opset_of(final), "check": check_small},
                    parent={"file": src.name, "sha256": parent_sha, "role": "fp32 parent"})


__all__ = ["quantize_onnx", "QuantizeReport", "default_output", "PRECISIONS"]
