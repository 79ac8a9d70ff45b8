"""ONNX -> TensorRT plan (TensorRT 10.x, 11.x or TensorRT-RTX), strongly typed, with its manifest.

    report = build_engine("lite0.onnx", "lite0.int8.plan", precision="int8", quantize={"calib": ["bikes.mp4"]})

Precision lives in the ONNX graph (TensorRT 11 has no FP16/INT8 builder flags and no calibrators): for fp16/int8
this first makes the FP16 or Q/DQ ONNX with :func:`toolchain.quantize.quantize_onnx` (same options, same
calibration cache) and builds that, strongly typed. After the build the plan's layers are checked: an engine is
not called FP16 or INT8 when its compute layers did not end up in that precision.

The plan is written untouched, atomically, with ``model.plan.json`` beside it (builder flavour and version, GPU,
compute capability, CUDA, driver, flags, profiles, I/O tensors, the precision recipe, the parent's sha256,
preprocessing and labels).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engines import __version__
from engines._gpu import device as gpu_device
from engines._io import atomic_path, atomic_write_bytes, sha256_file
from engines._trt import (EDGE_LEAN_VERSION, Backend, load_backend, make_logger, rtx_targets, runtime_pip_line,
                          sm_name, version_tuple)
from engines.base import TensorSpec
from engines.manifest import BatchProfile, Manifest, read_manifest_if_any, write_manifest

from ._ui import Reporter
from .errors import BuildError, UsageProblem
from .export import check_output_path

log = logging.getLogger("trtc")
PRECISIONS = ("fp32", "fp16", "int8")
HW_LEVELS = {"none": "NONE", "ampere+": "AMPERE_PLUS", "same-cc": "SAME_COMPUTE_CAPABILITY"}
COMPUTE_TYPES = ("CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY", "FULLY_CONNECTED")
_DTYPE_NAMES = {"FLOAT": "fp32", "HALF": "fp16", "INT8": "int8", "BF16": "bf16", "FP8": "fp8", "INT32": "int32"}


@dataclass
class BuildReport:
    output: str
    manifest: str
    onnx: str  # what was built (the quantized ONNX for fp16/int8)
    backend: str
    precision: str
    bytes: int
    sha256: str
    profiles: dict
    layers: dict  # counts of compute layers per precision, and how that was determined
    flags: dict
    timings: dict
    quantize: dict | None = None  # the quantize report when this build made the ONNX
    warnings: list[str] = field(default_factory=list)
    lean_runtime: dict | None = None  # version-compatible plans: which lean runtime runs it (see _lean_runtime)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_size(text: str | int | None) -> int | None:
    """'4G', '512M', '1073741824' -> bytes."""
    if text is None or isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise UsageProblem(f"workspace size {text!r} is not a size", "e.g. --workspace 4G or --workspace 512M")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def _progress_monitor(trt, bar):
    """TensorRT's build phases shown on our progress bar (IProgressMonitor, TensorRT 10+/RTX)."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class Monitor(base):
        def __init__(self):
            base.__init__(self)

        def phase_start(self, phase_name, parent_phase, num_steps):
            if parent_phase is None:  # top-level phases name the bar; nested ones would only flicker
                bar.describe(str(phase_name))

        def step_complete(self, phase_name, step):
            return True  # False would cancel the build

        def phase_finish(self, phase_name):
            pass

    return Monitor()


def _parse(trt, backend: Backend, onnx_path: Path, logger):
    builder = trt.Builder(logger)
    if builder is None:
        raise BuildError("TensorRT could not create a builder: " + "; ".join(logger.errors[-2:]),
                         "check the GPU and driver with trtc doctor")
    flags = 0
    if not backend.rtx and backend.major == 10:  # opt in to strong typing; 11.x is always strongly typed
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = []
        for i in range(parser.num_errors):
            e = parser.get_error(i)
            name = e.node_name() if hasattr(e, "node_name") else f"node {e.node()}"
            op = e.node_operator() if hasattr(e, "node_operator") else "?"
            errors.append(f"node {name!r} ({op}): {e.desc()}")
        raise BuildError(f"the ONNX parser of {backend.describe()} rejected {onnx_path.name}: "
                         + ("; ".join(errors[:3]) or "no reason given"),
                         "see which operator it names; re-export with another --opset, or report the model")
    return builder, network, parser


def strongly_typed(trt, backend: Backend, network) -> bool:
    """Whether the network really is strongly typed: TensorRT 11 and TensorRT-RTX always are; 10.x when the
    STRONGLY_TYPED creation flag took (read back from the network)."""
    if backend.rtx or backend.major >= 11:
        return True
    return bool(network.get_flag(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))


def _profile_shapes(network, profile: BatchProfile, hw: tuple[int, int] | None) -> dict:
    shapes = {}
    for i in range(network.num_inputs):
        t = network.get_input(i)
        dims = list(t.shape)
        mins, opts, maxs = [], [], []
        for axis, d in enumerate(dims):
            if d >= 0:
                mins.append(d)
                opts.append(d)
                maxs.append(d)
            elif axis == 0:
                mins.append(profile.min)
                opts.append(profile.opt)
                maxs.append(profile.max)
            elif hw is not None and len(dims) == 4 and axis in (2, 3):
                v = hw[axis - 2]
                mins.append(v)
                opts.append(v)
                maxs.append(v)
            else:
                raise BuildError(f"input {t.name!r} has dynamic dimension {axis} ({dims}) and no profile gives it "
                                 "a size", "give --input-size, or export the model with a fixed input size")
        if dims and dims[0] >= 0 and (profile.min, profile.max) != (dims[0], dims[0]):
            log.info("input %s has a fixed batch of %d; the batch range %s does not apply", t.name, dims[0], profile)
        shapes[t.name] = {"min": mins, "opt": opts, "max": maxs}
    return shapes


def network_precisions(trt, network) -> dict:
    """Compute layers of the strongly typed network by the type they compute in: a layer fed by a
    DequantizeLinear of INT8 (directly, or through the Cast to FP16 of trtc's default INT8 graph form) counts as
    int8, else the type of its first input."""
    producers = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for j in range(layer.num_outputs):
            producers[layer.get_output(j).name] = layer
    rows = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        kind = getattr(layer.type, "name", str(layer.type)).split(".")[-1]
        if kind not in COMPUTE_TYPES:
            continue
        src = producers.get(layer.get_input(0).name) if layer.num_inputs else None
        src_kind = getattr(src.type, "name", str(src.type)).split(".")[-1] if src is not None else ""
        if src_kind == "CAST" and src.num_inputs:  # DQ (FP32) -> Cast (FP16) -> Conv: TensorRT fuses all three
            src = producers.get(src.get_input(0).name)
            src_kind = getattr(src.type, "name", str(src.type)).split(".")[-1] if src is not None else ""
        if src_kind == "DEQUANTIZE":
            precision = "int8"
        else:
            dtype = getattr(layer.get_input(0).dtype, "name", str(layer.get_input(0).dtype)).split(".")[-1]
            precision = _DTYPE_NAMES.get(dtype, dtype.lower())
        rows.append({"layer": layer.name, "type": kind, "precision": precision})
    return {"source": "network (strongly typed: TensorRT computes these types)", "layers": rows}


class InspectorUnreadable(BuildError):
    """The engine inspector answered, but no precision could be read from it: never a pass."""


# the type words TensorRT's inspector writes: 10.x "Format/Datatype": "Row major linear FP32", "Channel major FP16
# format where channel % 16 == 0", "Thirty-two wide channel vectorized row major Int8 format"; 11.x splits the
# field ("Format" + "Datatype"/"Data Type") and may write the enum name ("HALF", "kHALF", "Half")
_TYPE_WORDS = (("int8", r"int8|kint8"), ("fp8", r"fp8|kfp8"), ("bf16", r"bf16|kbf16"),
               ("fp16", r"fp16|half|khalf|float16"), ("fp32", r"fp32|float|kfloat|float32"))
_TYPE_KEYS = ("Format/Datatype", "Datatype", "DataType", "Data Type", "Data type", "Type")


def inspector_precision(tensor: dict) -> str | None:
    """'int8' / 'fp16' / 'fp32' / ... from one inspector I/O tensor entry (10.x or 11.x form), None if unreadable."""
    for key in _TYPE_KEYS:
        text = tensor.get(key)
        if not isinstance(text, str):
            continue
        for name, pattern in _TYPE_WORDS:
            if re.search(rf"(?<![a-z0-9])(?:{pattern})(?![a-z0-9])", text, re.IGNORECASE):
                return name
    return None


def parse_inspector(info: dict, version: str = "?") -> dict:
    """Compute layers and the precision each computes in, from ``get_engine_information(JSON)``. A compute layer
    whose precision cannot be read, or no compute layer at all, raises :class:`InspectorUnreadable`."""
    rows, unread = [], []
    for layer in info.get("Layers", []):
        if isinstance(layer, str):
            continue
        kind = str(layer.get("LayerType", ""))
        if not any(k in kind.lower() for k in ("conv", "gemm", "matrix", "fully")):
            continue
        found = [p for p in (inspector_precision(t) for t in layer.get("Inputs", []) if isinstance(t, dict)) if p]
        precision = next((p for p in ("int8", "fp8", "fp16", "bf16", "fp32") if p in found), None)
        if precision is None:
            unread.append(layer)
            continue
        rows.append({"layer": layer.get("Name", "?"), "type": kind, "precision": precision})
    if unread or not rows:
        sample = json.dumps((unread or [{}])[0].get("Inputs", [])[:1])[:200]
        what = (f"{len(unread)} compute layer(s) with no type trtc can read (first: "
                f"{unread[0].get('Name', '?')!r}, inputs {sample})") if unread else "no compute layer"
        raise InspectorUnreadable(f"could not read the layer precisions of the built engine from TensorRT {version}'s "
                                  f"inspector: {what}; the plan's precision is unverified, so it is not written",
                                  "run with --debug and report the TensorRT version and the inspector output")
    return {"source": "engine inspector", "layers": rows}


def engine_precisions(trt, runtime, plan, version: str = "?", version_compatible: bool = False) -> dict | None:
    """Layer precisions from the built engine's inspector (needs a GPU this TensorRT can run on)."""
    if version_compatible:
        runtime.engine_host_code_allowed = True  # a version-compatible plan carries host code (its lean runtime)
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        return None
    inspector = engine.create_engine_inspector()
    return parse_inspector(json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON)), version)


def judge(precision: str, precisions: dict, recipe: dict) -> list[str]:
    """Compute layers not in the precision the plan is called; empty when the name is earned.

    FP16: no compute layer may be FP32 unless the recipe kept it FP32 on purpose. INT8: at least as many compute
    layers must be INT8 as the recipe quantized (all of them but its kept layers)."""
    rows = precisions["layers"]
    if precision == "fp32" or not rows:
        return []

    def kept(name: str, keys) -> bool:
        return any(k and k in name for k in keys)

    if precision == "fp16":
        keys = set(recipe.get("keep_fp32", []))
        return [r["layer"] for r in rows if r["precision"] == "fp32" and not kept(r["layer"], keys)]
    kept_layers = recipe.get("kept_layers", [])
    expected = len(rows) - len(kept_layers)
    if sum(r["precision"] == "int8" for r in rows) >= expected:
        return []
    return [r["layer"] for r in rows if r["precision"] != "int8" and not kept(r["layer"], kept_layers)] or \
        [r["layer"] for r in rows if r["precision"] != "int8"]


def _onnx_to_build(model: Path, out: Path, precision: str, quantize: dict | None, force: bool, reporter):
    """The ONNX file to build and, if this call made it, the quantize report."""
    manifest = read_manifest_if_any(model)
    mode = (manifest.precision or {}).get("mode", "fp32") if manifest else "fp32"
    if precision == "fp32" or mode == precision:
        if quantize:
            raise UsageProblem("quantize options were given but nothing is quantized",
                               f"add --precision fp16/int8 (the model is {mode})")
        return model, None
    if mode != "fp32":
        raise UsageProblem(f"{model.name} is already {mode}; it cannot be made {precision}",
                           "build the FP32 parent with --precision, or this model without it")
    from .quantize import quantize_onnx

    target = out.parent / f"{model.stem}.{precision}.onnx"
    opts = dict(quantize or {})
    report = quantize_onnx(model, target, precision=precision, force=force or _reusable(target, model),
                           reporter=reporter, **opts)
    return Path(report.output), report


def _reusable(target: Path, parent: Path) -> bool:
    """An existing quantized ONNX made from this very parent may be replaced without --force (it is ours)."""
    m = read_manifest_if_any(target)
    return bool(m and (m.parent or {}).get("sha256") == sha256_file(parent))


def build_engine(model: str | Path, output: str | Path | None = None, *, precision: str = "fp32",
                 backend: str = "auto", batch: str | BatchProfile | None = None, input_size=None,
                 workspace: str | int | None = None, opt_level: int = 3, timing_cache: str | Path | None = None,
                 version_compatible: bool = False, exclude_lean_runtime: bool = False,
                 hardware_compatibility: str = "none",
                 compute_capability: list[str] | tuple[str, ...] | None = None, quantize: dict | None = None,
                 force: bool = False, reporter: Reporter | None = None) -> BuildReport:
    """Build a TensorRT plan from an ONNX model; see the module docstring.

    The steps: check the request, load the backend (before a long quantize), make the ONNX to build, parse it with
    its profile, configure the builder (flags, timing cache), build, check the layers' precisions, write the plan
    and its manifest."""
    reporter = reporter or Reporter()
    warnings: list[str] = []
    timings: dict[str, float] = {}
    src, out, ws, profile_arg = _check_request(model, output, precision, batch, workspace, opt_level,
                                               hardware_compatibility, force)
    be, gpu, targets = _load_checked_backend(backend, version_compatible, exclude_lean_runtime,
                                             hardware_compatibility, compute_capability)
    trt = be.module
    onnx_path, qreport, manifest = _onnx_and_manifest(src, out, precision, quantize, force, reporter, warnings)
    profile = profile_arg or (manifest.batch if manifest else None)
    hw = tuple(input_size) if input_size else (tuple(manifest.preprocess.size) if manifest else None)

    t0 = time.perf_counter()
    logger = make_logger(trt)
    builder, network, shapes = _parse_with_profile(trt, be, onnx_path, logger, profile, hw, reporter)
    config = _builder_config(trt, builder, shapes, ws, opt_level)
    flags = _set_flags(trt, be, network, config, targets, warnings, version_compatible=version_compatible,
                       exclude_lean_runtime=exclude_lean_runtime, hardware_compatibility=hardware_compatibility,
                       opt_level=opt_level, ws=ws)
    cache_path = _use_timing_cache(config, be, timing_cache, warnings)
    lean = _lean_runtime(be, version_compatible, exclude_lean_runtime, warnings)
    timings["parse_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    data = _build_plan(trt, be, builder, network, config, logger, precision, reporter)
    timings["build_s"] = time.perf_counter() - t0

    recipe = (manifest.precision if manifest else {"mode": "fp32"}) or {"mode": "fp32"}
    precisions = _layer_precisions(trt, be, gpu, targets, logger, data, network, version_compatible,
                                   exclude_lean_runtime)
    counts = _check_precisions(precision, precisions, recipe)

    m, mpath = _write_plan(out, data, manifest, network, shapes, be, gpu, flags, recipe, onnx_path, precisions, counts,
                           lean)
    if cache_path is not None:
        atomic_write_bytes(cache_path, bytes(config.get_timing_cache().serialize()))
    return BuildReport(output=str(out), manifest=str(mpath), onnx=str(onnx_path), backend=be.describe(),
                       precision=recipe.get("mode", precision), bytes=len(data), sha256=m.artifact["sha256"],
                       profiles=shapes, layers={"counts": counts, "source": precisions["source"],
                                                "note": precisions.get("note")},
                       flags=flags, timings={k: round(v, 2) for k, v in timings.items()},
                       quantize=qreport.to_dict() if qreport else None, warnings=warnings, lean_runtime=lean)


def _check_request(model, output, precision: str, batch, workspace, opt_level: int, hardware_compatibility: str,
                   force: bool) -> tuple[Path, Path, int | None, BatchProfile | None]:
    """The options that need no backend checked: the model, the output path, the workspace size and the batch
    range, as (model, output, workspace bytes, batch profile or None)."""
    src = Path(model)
    if not src.is_file():
        raise UsageProblem(f"model not found: {src}", "give an .onnx file (make one with trtc export)")
    if precision not in PRECISIONS:
        raise UsageProblem(f"unknown precision {precision!r}", "use fp32, fp16 or int8")
    if not 0 <= opt_level <= 5:
        raise UsageProblem(f"--opt-level {opt_level} is outside 0..5", "3 is TensorRT's default")
    if hardware_compatibility not in HW_LEVELS:
        raise UsageProblem(f"unknown hardware compatibility {hardware_compatibility!r}",
                           f"use one of {', '.join(HW_LEVELS)}")
    ws = parse_size(workspace)
    profile_arg = batch if isinstance(batch, BatchProfile) or batch is None else BatchProfile.parse(batch)
    suffix = "" if precision == "fp32" else f".{precision}"
    out = Path(output) if output is not None else src.with_name(f"{src.stem}{suffix}.plan")
    out = check_output_path(out, force, suffix=".plan")
    return src, out, ws, profile_arg


def _load_checked_backend(backend: str, version_compatible: bool, exclude_lean_runtime: bool,
                          hardware_compatibility: str, compute_capability) -> tuple[Backend, dict | None, list | None]:
    """The backend, the GPU here (None if none) and the TensorRT-RTX targets (None for TensorRT), with the options
    that depend on the backend checked: this fails fast, before a long quantize."""
    be = load_backend(backend)
    if be.rtx and (version_compatible or hardware_compatibility != "none"):
        raise UsageProblem("TensorRT-RTX has no version- or hardware-compatible plans",
                           "drop --version-compatible/--hardware-compatibility; use --compute-capability")
    if exclude_lean_runtime and not version_compatible:
        raise UsageProblem("--exclude-lean-runtime only applies to --version-compatible plans",
                           "add --version-compatible")
    if compute_capability and not be.rtx:
        raise UsageProblem("--compute-capability is for TensorRT-RTX (ahead-of-time builds)",
                           "use --hardware-compatibility ampere+ with TensorRT")
    gpu = gpu_device(0)
    if not be.rtx and gpu is None:
        raise BuildError("TensorRT builds on the GPU it targets, and this machine has no NVIDIA GPU",
                         "build on the target machine, or --backend tensorrt-rtx --compute-capability SM89 "
                         "(ahead of time, no GPU needed)")
    targets = _rtx_targets(be, compute_capability, gpu) if be.rtx else None
    return be, gpu, targets


def _onnx_and_manifest(src: Path, out: Path, precision: str, quantize: dict | None, force: bool, reporter,
                       warnings: list[str]):
    """The ONNX to build (quantized first for fp16/int8), the quantize report if this call made it, and its
    manifest (None, with a warning, when it has none)."""
    onnx_path, qreport = _onnx_to_build(src, out, precision, quantize, force, reporter)
    manifest = read_manifest_if_any(onnx_path)
    if manifest is None:
        warnings.append(f"{onnx_path.name} has no manifest: no preprocessing or labels to carry into the plan's")
    return onnx_path, qreport, manifest


def _parse_with_profile(trt, be: Backend, onnx_path: Path, logger, profile: BatchProfile | None, hw, reporter):
    """The builder, the parsed network and the min/opt/max shape of each input."""
    with reporter.phase(f"parsing {onnx_path.name} with {be.describe()}"):
        builder, network, _parser = _parse(trt, be, onnx_path, logger)
    dynamic_batch = any(len(network.get_input(i).shape) and network.get_input(i).shape[0] < 0
                        for i in range(network.num_inputs))
    if profile is None and dynamic_batch:
        raise BuildError("the model has a dynamic batch and no batch range (no manifest, no --batch)",
                         "give --batch MIN:OPT:MAX, e.g. 1:8:32")
    shapes = _profile_shapes(network, profile or BatchProfile(1, 1, 1), hw)
    return builder, network, shapes


def _builder_config(trt, builder, shapes: dict, ws: int | None, opt_level: int):
    """A builder config with the workspace limit, the optimization level, detailed profiling and the profile."""
    config = builder.create_builder_config()
    if ws:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, ws)
    config.builder_optimization_level = opt_level
    if hasattr(trt, "ProfilingVerbosity"):
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    opt_profile = builder.create_optimization_profile()
    for name, s in shapes.items():
        opt_profile.set_shape(name, tuple(s["min"]), tuple(s["opt"]), tuple(s["max"]))
    if config.add_optimization_profile(opt_profile) < 0:
        raise BuildError(f"TensorRT rejected the optimization profile {shapes}", "check --batch and --input-size")
    return config


def _set_flags(trt, be: Backend, network, config, targets, warnings: list[str], *, version_compatible: bool,
               exclude_lean_runtime: bool, hardware_compatibility: str, opt_level: int, ws: int | None) -> dict:
    """The compatibility flags and TensorRT-RTX targets set on the config; returns the flags for the manifest."""
    flags = {"strongly_typed": strongly_typed(trt, be, network), "version_compatible": version_compatible,
             "exclude_lean_runtime": exclude_lean_runtime,
             "hardware_compatibility": hardware_compatibility, "opt_level": opt_level, "workspace": ws}
    if not flags["strongly_typed"]:
        warnings.append(f"{be.describe()} did not make the network strongly typed: the layer types are TensorRT's "
                        "choice, not the ONNX graph's")
    if version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    if exclude_lean_runtime:
        config.set_flag(trt.BuilderFlag.EXCLUDE_LEAN_RUNTIME)
    if hardware_compatibility != "none":
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, HW_LEVELS[hardware_compatibility])
    if targets is not None:
        config.num_compute_capabilities = len(targets)
        for i, t in enumerate(targets):
            config.set_compute_capability(getattr(trt.ComputeCapability, t), i)
        flags["compute_capabilities"] = targets
    return flags


def _lean_runtime(be: Backend, version_compatible: bool, exclude_lean_runtime: bool,
                  warnings: list[str]) -> dict | None:
    """Which lean runtime will run a version-compatible plan (None for other plans): TensorRT's lean runtime of the
    builder's version or newer, and whether the one the edge extra pins (EDGE_LEAN_VERSION) is such a runtime. When
    it is not, a warning with the fix: the edge boxes need a newer lean runtime, or the plan an older TensorRT."""
    if not version_compatible or be.rtx:
        return None
    edge_runs = version_tuple(EDGE_LEAN_VERSION) >= version_tuple(be.version)
    if not edge_runs:
        cap = ".".join(EDGE_LEAN_VERSION.split(".")[:2])
        warnings.append(f"the edge extra (trtc[edge]) cannot run this plan: its lean runtime {EDGE_LEAN_VERSION} is "
                        f"older than {be.describe()}, and only the same or a newer runtime loads a version-compatible "
                        f"plan (fix: on the edge box, {runtime_pip_line('tensorrt-lean', be.version)}; or build "
                        f"with TensorRT <= {cap})")
    return {"needs": f"TensorRT lean runtime {be.version} or newer"
                     + ("" if exclude_lean_runtime else " (or the dispatch runtime of that version or newer: the plan "
                                                        "carries its lean runtime)"),
            "min_version": be.version, "edge_extra": EDGE_LEAN_VERSION, "edge_extra_runs_it": edge_runs}


def _use_timing_cache(config, be: Backend, timing_cache, warnings: list[str]) -> Path | None:
    """The timing cache file loaded into the config (a new cache when it does not fit); the path to write it back
    to after the build, or None (none given, or TensorRT-RTX)."""
    cache_path = Path(timing_cache) if timing_cache else None
    if cache_path is not None:
        if be.rtx:
            warnings.append("TensorRT-RTX ignores timing caches (its timing-cache calls are no-ops); none was used")
            cache_path = None
        else:
            old = cache_path.read_bytes() if cache_path.is_file() else b""
            cache = config.create_timing_cache(old)
            if not config.set_timing_cache(cache, False):
                warnings.append(f"timing cache {cache_path} is from another GPU or version; starting a new one")
                config.set_timing_cache(config.create_timing_cache(b""), True)
    return cache_path


def _build_plan(trt, be: Backend, builder, network, config, logger, precision: str, reporter) -> bytes:
    """The serialized plan, TensorRT's build phases shown on the progress bar."""
    with reporter.phase(f"building the {precision.upper()} engine (TensorRT phases follow)") as bar:
        monitor = _progress_monitor(trt, bar)
        if monitor is not None:
            config.progress_monitor = monitor
        plan = builder.build_serialized_network(network, config)
    if plan is None:
        reason = "; ".join(logger.errors[-3:]) or "no reason given"
        fix = "raise --workspace" if re.search(r"memory|workspace", reason, re.IGNORECASE) else \
            "run with -vv for TensorRT's log"
        raise BuildError(f"{be.describe()} could not build the engine: {reason}", fix)
    return bytes(plan)


def _layer_precisions(trt, be: Backend, gpu, targets, logger, data: bytes, network, version_compatible: bool,
                      exclude_lean_runtime: bool) -> dict:
    """What precision the compute layers ended up in: from the engine inspector where the plan runs here, else from
    the strongly typed network (with a note saying why)."""
    precisions = None
    inspected_note = runnable_reason(be, gpu, targets)
    if inspected_note is None and exclude_lean_runtime:
        inspected_note = "the plan excludes its lean runtime (only the lean runtime, tensorrt_lean, loads it)"
    if inspected_note is None:
        try:
            precisions = engine_precisions(trt, trt.Runtime(logger), data, be.version, version_compatible)
        except InspectorUnreadable:
            raise
        except Exception as exc:  # inspector missing or deserialization failing: fall back to the network
            inspected_note = f"engine inspector failed: {exc}"
    if precisions is None:
        precisions = network_precisions(trt, network)
        if inspected_note:
            precisions["note"] = f"engine not inspected here: {inspected_note}"
    return precisions


def _check_precisions(precision: str, precisions: dict, recipe: dict) -> dict[str, int]:
    """Raises when the plan has not earned its precision's name (see :func:`judge`); else the count of compute
    layers per precision."""
    wrong = judge(recipe.get("mode", precision), precisions, recipe)
    if wrong:
        raise BuildError(f"the engine is not {precision.upper()}: {len(wrong)} compute layer(s) ended up in another "
                         f"precision ({', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''}; per "
                         f"{precisions['source']})", "check the quantized ONNX with trtc inspect; --debug for more")
    counts: dict[str, int] = {}
    for r in precisions["layers"]:
        counts[r["precision"]] = counts.get(r["precision"], 0) + 1
    return counts


def _write_plan(out: Path, data: bytes, manifest, network, shapes, be: Backend, gpu, flags, recipe, onnx_path: Path,
                precisions, counts, lean: dict | None = None) -> tuple[Manifest, Path]:
    """The plan written untouched and atomically, with its manifest beside it; returns (manifest, manifest path)."""
    with atomic_path(out) as tmp:
        tmp.write_bytes(data)
        m = _plan_manifest(manifest, network, shapes, be, gpu, flags, recipe, onnx_path, precisions, counts)
        if lean is not None:
            m.builder["lean_runtime"] = lean
        mpath = write_manifest(out, m, hashed_as=tmp)
    return m, mpath


def _rtx_targets(be: Backend, wanted, gpu) -> list[str]:
    supported = rtx_targets(be.module)
    if wanted:
        out = []
        for w in wanted:
            name = w.upper() if w.upper().startswith("SM") or w.upper() == "CURRENT" else sm_name(w)
            if name != "CURRENT" and name not in supported:
                raise UsageProblem(f"TensorRT-RTX {be.version} cannot build for {w}",
                                   f"choose from {', '.join(supported)}")
            out.append(name)
        return out
    if gpu is None:
        raise UsageProblem("no GPU here to build for", f"give --compute-capability (one of {', '.join(supported)})")
    here = sm_name(gpu["compute_capability"])
    if here not in supported:
        raise BuildError(f"TensorRT-RTX {be.version} cannot build for this GPU ({gpu['name']}, compute capability "
                         f"{gpu['compute_capability']}); it supports {', '.join(supported)}",
                         "build ahead of time for the target with --compute-capability, e.g. SM89")
    return ["CURRENT"]


def runnable_reason(be: Backend, gpu, targets) -> str | None:
    if gpu is None:
        return "no NVIDIA GPU here"
    if be.rtx:
        here = sm_name(gpu["compute_capability"])
        if here not in rtx_targets(be.module):
            return f"TensorRT-RTX {be.version} does not run on compute capability {gpu['compute_capability']}"
        if targets and "CURRENT" not in targets and here not in targets:
            return f"built for {', '.join(targets)}, this GPU is {here}"
    return None


def _plan_manifest(parent_m: Manifest | None, network, shapes, be: Backend, gpu, flags, recipe, onnx_path: Path,
                   precisions, counts) -> Manifest:
    def spec(t):
        dtype = getattr(t.dtype, "name", str(t.dtype)).split(".")[-1]
        np_name = {"FLOAT": "float32", "HALF": "float16", "INT8": "int8", "INT32": "int32", "INT64": "int64",
                   "BOOL": "bool", "UINT8": "uint8"}.get(dtype, dtype.lower())
        return TensorSpec(t.name, np_name, tuple(d if d >= 0 else "?" for d in t.shape))

    inputs = [spec(network.get_input(i)) for i in range(network.num_inputs)]
    outputs = [spec(network.get_output(i)) for i in range(network.num_outputs)]
    first = next(iter(shapes.values()))
    batch = BatchProfile(first["min"][0], first["opt"][0], first["max"][0])
    if parent_m is not None:
        model, preprocess, labels = dict(parent_m.model), parent_m.preprocess, parent_m.labels
    else:
        from engines.preprocess import PreprocessSpec

        c = first["min"][1] if len(first["min"]) == 4 and first["min"][1] in (1, 3) else 3  # a greyscale input: 1
        model, preprocess, labels = {"name": onnx_path.stem, "source": str(onnx_path)}, PreprocessSpec(channels=c), None
    builder = {"flavor": be.flavor, "version": be.version, "import": be.import_name,
               "gpu": {k: gpu.get(k) for k in ("name", "compute_capability")} if gpu else None,
               "cuda": gpu.get("cuda") if gpu else None, "driver": gpu.get("driver") if gpu else None,
               "flags": flags, "profiles": [shapes],
               "compute_capabilities": flags.get("compute_capabilities", []),
               "layer_precisions": {"counts": counts, "source": precisions["source"], "note": precisions.get("note")}}
    return Manifest(kind="plan", model=model, preprocess=preprocess, inputs=inputs, outputs=outputs, batch=batch,
                    labels=labels, precision=recipe, producer={"tool": "trtc build", "trtc": __version__},
                    builder=builder, parent={"file": onnx_path.name, "sha256": sha256_file(onnx_path),
                                             "role": "onnx"})


__all__ = ["BuildReport", "build_engine", "judge", "network_precisions", "parse_size"]
