"""Engine speed side by side: `trtc bench`.

    report = bench(["lite0.onnx", "lite0.fp16.onnx", "pretrained:efficientnet-lite0"], batches=[1, 8, 32])

Each model runs on the same random input of each batch size: warm-up first, then a fixed number of iterations or
a fixed duration. Reported per (model, batch): latency p50/p90/p99 and mean in ms, throughput in samples/s, and
the coefficient of variation of the latencies (a high CV means the machine was busy: do not trust the ratios).
Speed-ups are ratios of throughput against the first model at the same batch, measured in the same run.

What a latency includes is stated in the report: ONNX Runtime, OpenCV dnn (``opencv:model.onnx``), PyTorch and TensorRT plans (engines.TensorRTEngine,
batches outside the plan's profile skipped with a warning) here take host (numpy) inputs and return host outputs, so
host<->device copies are INCLUDED on a GPU. The zero-copy device-buffer path (IOBinding, CUDA
graphs) comes with the runtime (issue 5); until then CUDA graphs are reported as off.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from engines._deps import dist_version
from engines._gpu import device as gpu_device
from engines.manifest import BatchProfile

from ._ui import Reporter, model_label
from .errors import TrtcError, UsageProblem
from .resources import check_input_fits
from .validate import Runner, _classify


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


@dataclass
class BenchReport:
    rows: list[BenchRow]
    device: str
    machine: dict
    transfers: str
    cuda_graphs: str
    versions: dict
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _time(fn, x, warmup: int, iterations: int | None, duration: float | None) -> list[float]:
    for _ in range(warmup):
        fn(x)
    times = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
        if iterations is not None and len(times) >= iterations:
            break
        if iterations is None and time.perf_counter() - start >= duration:
            break
    return times


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


def bench(models: list[str], batches: list[int] | None = None, *, device: str = "cpu", warmup: int = 5,
          iterations: int | None = None, duration: float | None = 3.0, reporter: Reporter | None = None) -> BenchReport:
    """``batches`` None: 1, 8 and 32, each model timed at those its batch range holds (a warning names the others);
    given ``batches`` outside a model's range are refused before anything runs.

    The steps: check the options, read every model (refusing given batches outside its range), then for each model
    the batch sizes it takes and a row per size, then the report."""
    reporter = reporter or Reporter()
    given, batches = _check_options(models, batches, iterations, duration)
    rows: list[BenchRow] = []
    warnings: list[str] = []
    base: dict[int, float] = {}
    rng = np.random.default_rng(0)
    refs = [_classify(spec) for spec in models]  # each manifest read (and its hash checked) before any timing
    if given:
        for ref in refs:
            _check_given_batches(ref, batches)
    for spec, ref in zip(models, refs):
        runner = Runner(ref, device)
        sizes, dtype = _batch_sizes(spec, ref, runner, batches, warnings)
        rows += _timed_rows(spec, ref, runner, sizes, dtype, rng, base, warnings, reporter, warmup=warmup,
                            iterations=iterations, duration=duration)
    return _report(rows, device, warnings)


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


def _timed_rows(spec: str, ref, runner, sizes: list[int], dtype: np.dtype, rng, base: dict[int, float],
                warnings: list[str], reporter, *, warmup: int, iterations: int | None,
                duration: float | None) -> list[BenchRow]:
    """A row per batch size of one model, on random input; ``base`` holds the first model's throughput per batch,
    which the speed-ups divide by."""
    fn, shape = runner.fn, runner.shape
    rows = []
    for b in sizes:
        try:
            x = _random_input(rng, (b, *shape), dtype)
            with reporter.phase(f"timing {model_label(spec)} at batch {b}"):
                t = np.asarray(_time(fn, x, warmup, iterations, duration)) * 1000.0
        except MemoryError:
            raise TrtcError(f"ran out of memory timing {model_label(spec)} at batch {b}",
                            "give a smaller --batch") from None
        del x
        mean = float(t.mean())
        row = BenchRow(model=spec, kind=ref.kind, precision=ref.precision, batch=b, iterations=len(t),
                       p50_ms=float(np.percentile(t, 50)), p90_ms=float(np.percentile(t, 90)),
                       p99_ms=float(np.percentile(t, 99)), mean_ms=mean,
                       cv=float(t.std() / mean) if mean > 0 else 0.0, throughput=b / (mean / 1000.0))
        if b not in base:
            base[b] = row.throughput
        row.speedup = row.throughput / base[b]
        if row.cv > 0.25:
            warnings.append(f"{model_label(spec)} batch {b}: latency CV {row.cv:.0%}; the machine was busy, "
                            "ratios are unreliable")
        rows.append(row)
    return rows


def _report(rows: list[BenchRow], device: str, warnings: list[str]) -> BenchReport:
    """The report, with the machine, what a latency includes and the versions of the runtimes timed."""
    gpu = gpu_device(0) if device.startswith("cuda") else None
    machine = {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
               "gpu": gpu["name"] if gpu else None}
    import sys

    # the imported module's own version: with both ONNX Runtime packages installed, metadata can name the wrong one
    versions = {k: getattr(sys.modules.get(k), "__version__", None) or dist_version(*v)
                for k, v in {"onnxruntime": ("onnxruntime", "onnxruntime-gpu"), "torch": ("torch",)}.items()}
    if any(r.kind == "opencv" for r in rows):
        versions["opencv"] = getattr(sys.modules.get("cv2"), "__version__", None)
    return BenchReport(rows=rows, device=device, machine=machine,
                       transfers="included (host numpy inputs and outputs)" if device.startswith("cuda")
                       else "none (CPU)", cuda_graphs="off (not available on the host-input path)",
                       versions=versions, warnings=warnings)


__all__ = ["BenchReport", "BenchRow", "bench"]
