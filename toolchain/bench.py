"""Engine speed side by side: `trtc bench`.

    report = bench(["lite0.onnx", "lite0.fp16.onnx", "pretrained:efficientnet-lite0"], batches=[1, 8, 32])
    report = bench(["r50.fp16.onnx"], [64], device="cuda:0")  # device-resident input, torch.compile reference row

Each model runs on the same random input of each batch size: warm-up first, then a fixed number of iterations or
a fixed duration. Reported per (model, batch): latency p50/p90/p99 and mean in ms, throughput in samples/s, and
the coefficient of variation of the latencies (a high CV means the machine was busy: do not trust the ratios).
Speed-ups are ratios of throughput against the first model at the same batch, measured in the same run.

Input (``input``): "host" gives numpy batches and takes host outputs, so host<->device copies are INCLUDED on a
GPU. "device" (the default on CUDA when CuPy is installed) makes the batch once on the GPU (CuPy) and times
``engine.infer(x, stream=s)`` with CUDA events recorded after each call; the host waits only at the end of each
span of :data:`SPAN` calls, so no copy and no per-call synchronisation is timed. Engines that take host arrays
only (OpenCV dnn, a PyTorch source) are timed on host input even then, and their rows say so.

Reference (``reference``): a plain user's PyTorch model (:mod:`toolchain.bench_reference`, which shares no code
with trtc's engines) timed the same way at the same batches; every engine row carries ``ratio_to_reference``, its
throughput over that row's. ONNX Runtime models open tuned (``ort_tuning`` "auto": the engine's default) or
with ``tuning="off"`` (the options of before), or both: an "onnxruntime (untuned)" row beside the tuned one, whose
``vs_untuned`` divides by it.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from engines._gpu import device as gpu_device
from engines.base import input_layout
from engines.manifest import BatchProfile

from ._ui import Reporter, model_label
from .bench_clocks import CupyClock, HostClock
from .errors import TrtcError, UsageProblem
from .resources import check_input_fits
from .validate import Runner, _classify


SPAN = 20  # device input: calls between two host waits (the CUDA events give each call's own time)
UNTUNED = "onnxruntime (untuned)"
BACKENDS = {"onnx": "onnxruntime", "opencv": "opencv", "plan": "tensorrt", "pytorch": "pytorch eager",
            "torch": "torch (trtc compiled engine)"}


@dataclass
class BenchRow:
    model: str
    kind: str
    precision: str
    batch: int
    iterations: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    cv: float
    throughput: float  # samples per second
    speedup: float | None = None  # throughput vs the first model at this batch
    backend: str = ""  # onnxruntime, onnxruntime (untuned), tensorrt, opencv, pytorch eager, torch.compile (...)
    input: str = "host"  # host (numpy, copies timed) or device (made once on the GPU, no copies timed)
    layout: str = "NCHW"  # the device input's memory order: NHWC (channels_last) for an engine that prefers it
    role: str = "engine"  # engine, or reference (the yardstick the engine rows divide by)
    reference: str | None = None  # the reference row's model name (engine rows: the one they divide by)
    img_s: float = 0.0  # = throughput, rounded (the name the side-by-side tables use)
    ratio_to_reference: float | None = None  # throughput / the reference row's, same batch, same run
    vs_untuned: float | None = None  # a tuned ONNX Runtime row: throughput / its untuned row's (--ort-tuning both)


@dataclass
class BenchReport:
    rows: list[BenchRow]
    device: str
    machine: dict
    transfers: str
    cuda_graphs: str
    versions: dict
    warnings: list[str] = field(default_factory=list)
    input: str = "host"
    reference: str | None = None  # torch-compile, torch-eager, or None (no reference rows)

    def to_dict(self) -> dict:
        return asdict(self)


def time_spans(call, clock, warmup: int, iterations: int | None, duration: float | None) -> list[float]:
    """Seconds of each timed ``call()``: ``warmup`` calls, then spans of up to :data:`SPAN` calls with a mark after
    each, the host waiting only for a span's last mark; ``iterations`` calls, or spans until ``duration`` seconds."""
    for _ in range(warmup):
        call()
    clock.wait(clock.mark())
    times: list[float] = []
    start = time.perf_counter()
    while True:
        n = SPAN if iterations is None else min(SPAN, iterations - len(times))
        marks = [clock.mark()]
        for _ in range(n):
            call()
            marks.append(clock.mark())
        clock.wait(marks[-1])
        times += [clock.seconds(a, b) for a, b in zip(marks, marks[1:])]
        if iterations is not None and len(times) >= iterations:
            break
        if iterations is None and time.perf_counter() - start >= duration:
            break
    return times


def ratios(rows: list[BenchRow]) -> None:
    """Fill each row's ``ratio_to_reference`` (its throughput over its reference row's at the same batch; None
    without one) and a tuned ONNX Runtime row's ``vs_untuned`` (over its model's untuned row at that batch)."""
    refs = {(r.reference, r.batch): r.throughput for r in rows if r.role == "reference"}
    untuned = {(r.model, r.batch): r.throughput for r in rows if r.backend == UNTUNED}
    for r in rows:
        base = refs.get((r.reference, r.batch))
        r.ratio_to_reference = round(r.throughput / base, 3) if base else None
        plain = untuned.get((r.model, r.batch)) if r.backend == "onnxruntime" else None
        r.vs_untuned = round(r.throughput / plain, 3) if plain else None


def _manifest_range(ref) -> tuple[int, int] | None:
    """(min, max) of the batch range the model's manifest gives (an export's --batch, a plan's profile), or None
    (no manifest, or a fixed batch: the graph says that one)."""
    m = ref.manifest
    if m is None or m.batch is None or m.batch.min == m.batch.max:
        return None
    return m.batch.min, m.batch.max


def _check_given_batches(ref, batches: list[int]) -> None:
    """A --batch size outside the model's batch range is a usage error, said before anything is timed."""
    span = _manifest_range(ref)
    if span is None:
        return
    lo, hi = span
    outside = [b for b in batches if not lo <= b <= hi]
    if not outside:
        return
    remake = "build it again" if ref.kind == "plan" else "export it again"
    b = max(outside, key=lambda n: n > hi)  # one above the range first, else one below
    where = "above" if b > hi else "below"
    wider = BatchProfile(min(lo, *outside), min(max(lo, ref.manifest.batch.opt), max(hi, *outside)), max(hi, *outside))
    raise UsageProblem(f"--batch {b} is {where} the batch range of {model_label(ref.spec)}, {lo}..{hi} (its "
                       f"manifest's {ref.manifest.batch})",
                       f"give --batch sizes from {lo} to {hi}, or {remake} with --batch {wider}")


def _random_input(rng, shape: tuple, dtype) -> np.ndarray:
    """Random normal input made in the model's dtype (float64 first took twice the memory of a float32 model's)."""
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        return rng.standard_normal(shape, dtype=dtype)
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _input_dtype(runner) -> np.dtype:
    inputs = getattr(runner.engine, "inputs", None)
    return inputs[0].numpy_dtype if inputs else np.dtype(np.float32)


@dataclass
class _Plan:
    """What every row of one run shares: the device, the input mode, the timing options, and what the rows
    accumulate (the first model's throughput per batch for the speed-ups, the warnings)."""
    device: str
    input: str  # host or device
    warmup: int
    iterations: int | None
    duration: float | None
    reporter: Reporter
    rng: object = None
    base: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    def times(self, call, clock) -> np.ndarray:
        """Milliseconds of each timed call."""
        return np.asarray(time_spans(call, clock, self.warmup, self.iterations, self.duration)) * 1000.0


def bench(models: list[str], batches: list[int] | None = None, *, device: str = "cpu", warmup: int = 5,
          iterations: int | None = None, duration: float | None = 3.0, input: str = "host", reference: str = "none",
          ort_tuning: str = "auto", reporter: Reporter | None = None) -> BenchReport:
    """``batches`` None: 1, 8 and 32, each model timed at those its batch range holds (a warning names the others);
    given ``batches`` outside a model's range are refused before anything runs. ``input``: "host", "device" or
    "auto" (device on CUDA with CuPy, else host). ``reference``: "none", "torch-compile", "torch-eager" or "auto"
    (torch-compile on CUDA with torch installed, else none). ``ort_tuning``: a key of ORT_TUNINGS. (The Python
    defaults keep the rows of before; the CLI's are auto.)

    The steps: check the options, read every model (refusing given batches outside its range), then for each model
    (each ONNX Runtime tuning asked for) the batch sizes it takes and a row per size, its reference rows, the
    ratios, then the report."""
    reporter = reporter or Reporter()
    given, batches = _check_options(models, batches, iterations, duration)
    tunings = _tunings(ort_tuning)
    plan = _Plan(device, input_mode(input, device), warmup, iterations, duration, reporter, np.random.default_rng(0))
    reference = reference_mode(reference, device)
    refs = [_classify(spec) for spec in models]  # each manifest read (and its hash checked) before any timing
    if given:
        for ref in refs:
            _check_given_batches(ref, batches)
    yardstick = None
    if reference is not None:
        from .bench_reference import Yardstick

        yardstick = Yardstick(reference, device)
    rows: list[BenchRow] = []
    for spec, ref in zip(models, refs):
        mine: list[BenchRow] = []
        for tuning in (tunings if ref.kind == "onnx" else [None]):
            timed, sizes, shape = _model_rows(spec, ref, tuning, batches, plan)
            mine += timed
        rows += mine
        if yardstick is not None and sizes:
            rows += _reference_rows(yardstick, spec, ref, sizes, shape, mine, plan)
    ratios(rows)
    return _report(rows, plan, reference)


ORT_TUNINGS = {"auto": ["auto"], "off": ["off"], "both": ["auto", "off"]}


def _tunings(ort_tuning: str) -> list[str]:
    if ort_tuning not in ORT_TUNINGS:
        raise UsageProblem(f"--ort-tuning {ort_tuning!r} is not one of {', '.join(ORT_TUNINGS)}",
                           "e.g. --ort-tuning both")
    return ORT_TUNINGS[ort_tuning]


def input_mode(mode: str, device: str) -> str:
    """"device" or "host" for ``--input`` ``mode`` (auto: device on CUDA where CuPy is installed); "device" where it
    cannot be is refused with the fix."""
    from engines._deps import is_installed

    on_gpu = device.startswith("cuda")
    if mode == "auto":
        return "device" if on_gpu and is_installed("cupy") else "host"
    if mode == "host":
        return "host"
    if mode != "device":
        raise UsageProblem(f"--input {mode!r} is not auto, device or host", "e.g. --input device")
    if not on_gpu:
        raise UsageProblem(f"--input device keeps the batch in GPU memory, and --device {device} is not a GPU",
                           "give --device cuda:0 (or --input host)")
    from engines._gpu import gpus

    if not gpus()["devices"]:
        raise UsageProblem("--input device keeps the batch in GPU memory, and this machine has no NVIDIA GPU",
                           "run it on a machine with one, or give --input host")
    if not is_installed("cupy"):
        raise UsageProblem("--input device makes the batch on the GPU with CuPy, which is not installed",
                           'pip install "trtc[gpu]", or give --input host')
    return "device"


def reference_mode(mode: str, device: str) -> str | None:
    """The reference row's kind for ``--reference`` ``mode`` (auto: torch-compile on CUDA where torch is
    installed, else none), or None."""
    from engines._deps import is_installed

    if mode == "auto":
        return "torch-compile" if device.startswith("cuda") and is_installed("torch") else None
    if mode == "none":
        return None
    if mode not in ("torch-compile", "torch-eager"):
        raise UsageProblem(f"--reference {mode!r} is not auto, torch-compile, torch-eager or none",
                           "e.g. --reference torch-compile")
    return mode


def ort_options(tuning: str) -> dict:
    """The options of ``engines.open_engine`` for an ONNX Runtime model at ``tuning``: "auto" is the engine's
    default (tuned); "off" passes ``tuning="off"`` (the session options of before: only the device). Timed rows
    run the tuned session only: no quick start (its first batches on a second session are what time to first
    result measures, in a fresh process with the engine's defaults)."""
    return {"quick_start": False} if tuning == "auto" else {"tuning": tuning, "quick_start": False}


class _OrtRunner:
    """An ONNX model opened through ``engines.open_engine`` with ``options`` (ONNX Runtime's ``tuning``), shaped
    like validate.Runner (which opens the engine itself, without options)."""

    batch_range = None

    def __init__(self, ref, device: str, options: dict):
        import engines

        self.ref = ref
        self.engine = engines.open_engine(ref.spec, device=device, **options)
        first = self.engine.inputs[0].shape
        self.fixed = isinstance(first[0], int)
        self.batch = first[0] if self.fixed else 32
        self.shape = tuple(first[1:])
        self.fn = lambda x: self.engine.infer(x)[0]


def _model_rows(spec: str, ref, tuning: str | None, batches: list[int], plan: _Plan):
    """One model's rows (ONNX Runtime: opened with ``tuning``): (rows, the batch sizes timed, the input shape)."""
    runner = _OrtRunner(ref, plan.device, ort_options(tuning)) if tuning is not None else Runner(ref, plan.device)
    try:
        sizes, dtype = _batch_sizes(spec, ref, runner, batches, plan.warnings)
        backend = UNTUNED if tuning == "off" else BACKENDS.get(ref.kind, ref.kind)
        rows = _timed_rows(spec, ref, runner, sizes, dtype, backend, plan)
    finally:
        close = getattr(runner.engine, "close", None)
        if close is not None:
            close()
    return rows, sizes, runner.shape


def _takes_device_input(ref, runner) -> bool:
    """Whether the engine runs on device arrays: a plan, trtc's compiled PyTorch engine on a GPU, or an ONNX model
    opened with device buffers."""
    if ref.kind in ("plan", "torch"):
        return str(getattr(runner.engine, "device", "")).startswith("cuda")
    return ref.kind == "onnx" and getattr(runner.engine, "stream", None) is not None


def _call(runner, ref, x: np.ndarray, plan: _Plan):
    """(call, clock, input, layout) for timing ``runner`` on ``x``: on the GPU's copy of ``x`` with CUDA events in
    device mode (where the engine takes device arrays), else on ``x`` itself with the wall clock. The copy is laid
    out as the engine prefers (``preferred_layout``: the compiled PyTorch engine reads NHWC memory without a
    transpose), as a pipeline that writes its input for that engine would give it."""
    if plan.input != "device" or not _takes_device_input(ref, runner):
        fn = runner.fn
        return (lambda: fn(x)), HostClock(), "host", "NCHW"
    from engines._deps import require

    cp = require("cupy", "Device-resident input (trtc bench --input device)", extra="gpu")
    engine, dev = runner.engine, cp.cuda.Device(getattr(runner.engine, "device_id", 0))
    with dev:
        xd, layout = in_preferred_layout(cp, cp.asarray(x), engine)
        stream = cp.cuda.Stream(non_blocking=True)

    def call():
        with dev:
            engine.infer(xd, stream=stream)

    return call, CupyClock(cp, stream, dev), "device", layout


def in_preferred_layout(cp, xd, engine) -> tuple:
    """(``xd`` laid out as ``engine`` reads best, that layout): for an engine whose ``preferred_layout`` is NHWC (the
    compiled PyTorch engine) an (N, C, H, W) view of channels_last memory holding the same values, as the GPU
    pipeline's slots are for it; else ``xd`` as it is (NCHW)."""
    if input_layout(engine) == "NHWC" and xd.ndim == 4:
        return cp.ascontiguousarray(xd.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2), "NHWC"
    return xd, "NCHW"


def _check_options(models: list[str], batches: list[int] | None, iterations: int | None,
                   duration: float | None) -> tuple[bool, list[int]]:
    """(whether batch sizes were given, the batch sizes: 1, 8 and 32 when not), the options checked."""
    if not models:
        raise UsageProblem("no model to benchmark", "give one or more .onnx files or PyTorch sources")
    given = batches is not None
    batches = batches or [1, 8, 32]
    if any(b < 1 for b in batches):
        raise UsageProblem(f"batch sizes must be at least 1, got {batches}", "e.g. --batch 1,8,32")
    if iterations is not None and iterations < 1:
        raise UsageProblem("--iterations must be at least 1")
    if iterations is None and (duration is None or duration <= 0):
        raise UsageProblem("give --iterations N or a positive --duration")
    return given, batches


def _batch_sizes(spec: str, ref, runner, batches: list[int], warnings: list[str]) -> tuple[list[int], np.dtype]:
    """The batch sizes to time one model at (its fixed batch only, or those its batch range holds; a warning names
    the others) and its input dtype; each size checked to fit in memory before any input is made."""
    shape = runner.shape
    fixed = runner.batch if runner.fixed else None
    if any(not isinstance(d, int) for d in shape):
        raise UsageProblem(f"{spec}: input shape {shape} is not fixed", "export with a fixed input size")
    sizes = batches
    if fixed is not None:
        if set(batches) != {fixed}:
            warnings.append(f"{model_label(spec)} has a fixed batch of {fixed}: timed at that batch only")
        sizes = [fixed]
    span = runner.batch_range or (_manifest_range(ref) if fixed is None else None)
    if span is not None:
        lo, hi = span
        if [b for b in sizes if not lo <= b <= hi]:
            warnings.append(f"{model_label(spec)} takes batches {lo}..{hi} (its manifest): "
                            f"{', '.join(str(b) for b in sizes if not lo <= b <= hi)} not timed")
        sizes = [b for b in sizes if lo <= b <= hi]
    dtype = _input_dtype(runner)
    for b in sizes:  # before the input of the largest batch is made
        check_input_fits(b, shape, dtype.itemsize, f"timing {model_label(spec)}",
                         "give --batch {most} or less (its input then stays under 1/16 of the available memory)")
    return sizes, dtype


def _timed_rows(spec: str, ref, runner, sizes: list[int], dtype: np.dtype, backend: str,
                plan: _Plan) -> list[BenchRow]:
    """A row per batch size of one model, on random input (made on the GPU once in device mode)."""
    rows = []
    for b in sizes:
        try:
            x = _random_input(plan.rng, (b, *runner.shape), dtype)
            call, clock, where, layout = _call(runner, ref, x, plan)
            with plan.reporter.phase(f"timing {model_label(spec)} ({backend}) at batch {b}"):
                t = plan.times(call, clock)
        except MemoryError:
            raise TrtcError(f"ran out of memory timing {model_label(spec)} at batch {b}",
                            "give a smaller --batch") from None
        del x, call
        if where == "host" and plan.input == "device":
            plan.warnings.append(f"{model_label(spec)} takes host arrays: timed on host input (copies included)")
        rows.append(_row(spec, ref.kind, ref.precision, b, t, backend, where, plan))
        rows[-1].layout = layout
    return rows


def _row(model: str, kind: str, precision: str, b: int, t: np.ndarray, backend: str, where: str,
         plan: _Plan) -> BenchRow:
    """The row of ``t`` (milliseconds per call of batch ``b``), with its speed-up against the first row at ``b``
    and a warning when its latencies vary too much to trust."""
    base = plan.base
    mean = float(t.mean())
    row = BenchRow(model=model, kind=kind, precision=precision, batch=b, iterations=len(t),
                   p50_ms=float(np.percentile(t, 50)), p90_ms=float(np.percentile(t, 90)),
                   p99_ms=float(np.percentile(t, 99)), mean_ms=mean,
                   cv=float(t.std() / mean) if mean > 0 else 0.0, throughput=b / (mean / 1000.0),
                   backend=backend, input=where)
    row.img_s = round(row.throughput, 1)
    if b not in base:
        base[b] = row.throughput
    row.speedup = row.throughput / base[b]
    if row.cv > 0.25:
        plan.warnings.append(f"{model_label(model)} ({backend}) batch {b}: latency CV {row.cv:.0%}; the machine was "
                             "busy, ratios are unreliable")
    return row


def _reference_rows(yardstick, spec: str, ref, sizes: list[int], shape: tuple, engine_rows: list[BenchRow],
                    plan: _Plan) -> list[BenchRow]:
    """The reference rows of one model at the batch sizes it was timed at (those its reference was not timed at
    yet: models of one source and precision share them); its engine rows are given the reference's name. Where no
    reference can be made, one warning says why and there are no rows."""
    try:
        name = yardstick.prepare(spec, ref)
    except TrtcError as exc:
        fix = f" ({exc.fix})" if exc.fix else ""
        plan.warnings.append(f"no {yardstick.label} reference row for {model_label(spec)}: {exc.reason}{fix}")
        return []
    for r in engine_rows:
        r.reference = name
    rows = []
    for b in sizes:
        if (name, b) in yardstick.timed:
            continue
        with plan.reporter.phase(f"reference: {yardstick.label} of {name} at batch {b}"):
            call, clock, where = yardstick.timer(name, b, shape)
            t = plan.times(call, clock)
        yardstick.timed.add((name, b))
        row = _row(name, "reference", yardstick.precision(name), b, t, yardstick.label, where, plan)
        row.role, row.reference = "reference", name
        row.layout = "NHWC"  # the reference's input is channels_last, as a PyTorch user's is (bench_reference)
        rows.append(row)
    return rows


def _report(rows: list[BenchRow], plan: _Plan, reference: str | None) -> BenchReport:
    """The report, with the machine, what a latency includes and the versions of the runtimes timed."""
    device = plan.device
    gpu = gpu_device(0) if device.startswith("cuda") else None
    machine = {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
               "gpu": gpu["name"] if gpu else None}
    import sys

    # the imported module's own version, and only for a runtime this process imported: with both ONNX Runtime
    # packages installed, metadata can name the wrong one (a torch-only bench on the GPU image listed the CPU build's)
    versions = {k: getattr(sys.modules[k], "__version__", None) for k in ("onnxruntime", "torch") if k in sys.modules}
    if any(r.kind == "opencv" for r in rows):
        versions["opencv"] = getattr(sys.modules.get("cv2"), "__version__", None)
    if plan.input == "device":
        transfers = "none timed (device-resident input made once with CuPy; CUDA events, no host copies)"
        graphs = "as each engine keeps them (the compiled PyTorch engine and TensorRT plans; ONNX Runtime none)"
    else:
        transfers = "included (host numpy inputs and outputs)" if device.startswith("cuda") else "none (CPU)"
        graphs = "off (not available on the host-input path)"
    return BenchReport(rows=rows, device=device, machine=machine, transfers=transfers, cuda_graphs=graphs,
                       versions=versions, warnings=list(dict.fromkeys(plan.warnings)), input=plan.input,
                       reference=reference)


__all__ = ["BenchReport", "BenchRow", "bench", "ratios", "time_spans"]
