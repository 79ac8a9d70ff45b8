"""PyTorch classifier -> one self-contained ONNX file + its manifest, checked against PyTorch.

    report = export_onnx("pretrained:efficientnet-lite0", "model.onnx", check_data="photos/")

The ONNX is written to a temporary file beside the target, checked (onnx.checker with full shape inference,
then ONNX Runtime on the CPU against PyTorch on the same inputs), and only then moved into place together with
``model.onnx.json``. A failure at any step leaves no file behind.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engines import __version__
from engines._deps import dist_version, require
from engines._io import atomic_path, sha256_file
from engines.manifest import CLASSIFIER_FIX, BatchProfile, Manifest, manifest_path, not_a_classifier, write_manifest
from engines.preprocess import PreprocessSpec, list_images

from ._ui import Reporter
from .errors import ExportError, TrtcError, UsageProblem
from .resources import check_input_fits
from .model_source import LoadedModel, load_model, parse_source
from .errors import said_as
from .outputs import check_output_path  # noqa: F401 - quantize and build import it from here

log = logging.getLogger("trtc")
INPUT_NAME, OUTPUT_NAME = "input", "logits"
MAX_CHECK_IMAGES = 64


@dataclass
class ParityCheck:
    data: str  # "random" or the data path
    samples: int
    max_abs_diff: float
    mean_abs_diff: float
    top1_agreement: float
    flips: int  # top-1 disagreements larger than the tolerance can explain
    atol: float
    passed: bool
    batch_sizes: list[int] = field(default_factory=list)


@dataclass
class ExportReport:
    output: str
    manifest: str
    source: str
    exporter: str
    opset: int
    bytes: int
    sha256: str
    input_shape: list
    num_classes: int
    batch: dict
    preprocess: dict
    check: ParityCheck
    timings: dict
    predictions: list[dict] = field(default_factory=list)  # per check image: file and top-5 (label, prob)
    warnings: list[str] = field(default_factory=list)
    weights: str = ""  # where the weights came from: file, random, pretrained or source (see weights_origin)
    program: dict | None = None  # --program: the torch.export program written beside the ONNX (file, manifest, check)
    assumed: list[str] = field(default_factory=list)  # preprocessing settings no option gave (defaults taken)

    def to_dict(self) -> dict:
        return asdict(self)


def read_labels(path: str | Path) -> list[str]:
    p = Path(path)
    fix = "give a text file with one class name a line, or a JSON list of strings"
    if p.is_dir():
        raise UsageProblem(f"--labels {p} is a folder, not a labels file", fix)
    if not p.is_file():
        raise UsageProblem(f"labels file not found: {p}", fix)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageProblem(f"labels file {p} is not text (UTF-8)", fix) from None
    if p.suffix.lower() == ".json":
        try:
            labels = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageProblem(f"labels file {p} is not valid JSON: {exc}", fix) from exc
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise UsageProblem(f"labels file {p} must hold a JSON list of strings", fix)
        return labels
    return [line.strip() for line in text.splitlines() if line.strip()]


# ONNX metadata keys that model zoos and exporters use for class names (PaddleClas/RapidOCR: "character";
# others: "labels", "classes", "class_names", "names" (Ultralytics: a dict {0: "person", ...}))
LABEL_METADATA_KEYS = ("labels", "classes", "class_names", "names", "character")


def parse_label_metadata(value: str) -> list[str] | None:
    """Class names from one metadata value: a JSON list, a dict {index: name} (JSON or Python literal), or text
    with one name a line (or comma-separated). None when it holds no list of names."""
    import ast

    text = value.strip()
    if not text:
        return None
    parsed = None
    for parse in (json.loads, ast.literal_eval):
        try:
            parsed = parse(text)
            break
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    if isinstance(parsed, dict):
        try:
            keys = sorted(parsed, key=int)
        except (TypeError, ValueError):
            return None
        if [int(k) for k in keys] != list(range(len(keys))):
            return None
        return [str(parsed[k]) for k in keys]
    if isinstance(parsed, (list, tuple)) and len(parsed) > 1:
        return [str(x) for x in parsed]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        return lines
    parts = [x.strip() for x in text.split(",") if x.strip()]
    return parts if len(parts) > 1 else None


def onnx_labels(path: str | Path, classes: int | None = None) -> tuple[list[str] | None, str | None]:
    """(class names, the metadata key they came from) of an ONNX file made elsewhere, or (None, None). With
    ``classes``, a list of another length is not taken."""
    onnx = require("onnx", "Reading ONNX models")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not an ONNX file: no labels; opening it says why
        return None, None
    props = {p.key.lower(): p.value for p in model.metadata_props}
    for key in LABEL_METADATA_KEYS:
        if key in props:
            labels = parse_label_metadata(props[key])
            if labels and (classes is None or len(labels) == classes):
                return labels, next(p.key for p in model.metadata_props if p.key.lower() == key)
    return None, None


def build_spec(loaded: LoadedModel, input_size=None, resize=None, mean=None, std=None, color=None,
               channels: int | None = None) -> tuple[PreprocessSpec, list[str]]:
    """The preprocessing contract of an exported model, from the options and the source's defaults, and the list
    of what no option gave (``assumed``: recorded in the manifest and warned about, as adopting an ONNX does),
    except for ``pretrained:`` sources, whose package documents its preprocessing."""
    d = loaded.defaults
    said = _defaults_origin(loaded)
    resize_given = resize is not None
    size = input_size if input_size is not None else d.get("size", 224)
    size = (size, size) if isinstance(size, int) else tuple(size)
    if resize is None:
        resize = d.get("resize", 256) if input_size is None else int(round(min(size) / 0.875))
    channels, channels_assumed = _channels(loaded, channels)
    grey = channels == 1
    mean_d, std_d = d.get("mean"), d.get("std")
    if grey and len(mean_d or ()) != 1:  # a colour default does not fit a greyscale model: the greyscale one
        mean_d, std_d = None, None
    spec = PreprocessSpec(size=size, resize=resize or None, color=color or d.get("color", "RGB"),
                          mean=tuple(mean) if mean else mean_d, std=tuple(std) if std else std_d, input=INPUT_NAME,
                          channels=channels)
    if said is None:
        return spec, []
    assumed = [what for what, given in (
        (f"input size {size[0]}x{size[1]} ({said})", input_size is not None),
        (f"resize {spec.resize or 0} ({said if input_size is None else 'the input size / 0.875'})", resize_given),
        (f"colour {spec.color}", color is not None or grey),
        (f"mean {','.join(f'{v:g}' for v in spec.mean)} ({said if mean_d else 'greyscale default'})", bool(mean)),
        (f"std {','.join(f'{v:g}' for v in spec.std)} ({said if std_d else 'greyscale default'})", bool(std)),
    ) if not given]
    if channels_assumed:
        assumed.insert(0, "3 input channels (no Conv2d taking 1 or 3 found to read them from)")
    return spec, assumed


def _defaults_origin(loaded: LoadedModel) -> str | None:
    """Where a source's preprocessing defaults come from, as the assumed list says it; None where they are the
    model's own, documented ones (pretrained:NAME)."""
    if loaded.source.startswith("pretrained:"):
        return None
    if loaded.source.startswith("timm:"):
        return f"timm's data config for {loaded.name}"
    if loaded.source.startswith("torchvision:"):
        return f"torchvision's defaults for {loaded.name}"
    return "ImageNet default"


def _channels(loaded: LoadedModel, channels: int | None) -> tuple[int, bool]:
    """(the model's input channels, whether they were assumed): ``channels`` (--channels), which must be what the
    model's first convolution takes where one is found; else that convolution's; else 3, assumed."""
    from .model_source import input_channels

    found = input_channels(loaded)
    if found not in (1, 3):  # none, or a convolution inside the network registered before the stem's
        found = None
    if channels is not None:
        if found is not None and found != channels:
            raise UsageProblem(f"--channels {channels}, but the model's first convolution takes {found} channels",
                               f"use --channels {found} (or leave it out: it is read from the model)")
        return channels, False
    return (found, False) if found is not None else (3, True)


@contextlib.contextmanager
def _quiet_torch():
    """The exporters print progress and graph dumps to stdout/stderr, partly from C++ (file descriptors 1 and 2),
    and emit many warnings: capture all of it and log it at debug level, keeping stdout for results."""
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as sink:
        saved = [os.dup(1), os.dup(2)]
        buf = io.StringIO()
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(buf), \
                    contextlib.redirect_stderr(buf):
                warnings.simplefilter("always")
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            captured = buf.getvalue() + sink.read().decode("utf-8", "replace")
            for line in captured.splitlines():
                log.debug("exporter: %s", line)
            for w in caught:
                log.debug("exporter warning: %s", w.message)


def explain_failure(exc: BaseException) -> tuple[str | None, str | None]:
    """(operator, module path) behind an exporter failure, from the message and the fx node being translated."""
    op = module = None
    seen, chain = set(), exc
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        text = str(chain)
        m = (re.search(r"No ONNX function found for <OpOverload\(op='([\w.]+)'", text)
             or re.search(r"operator '([\w:.]+)'", text)
             or re.search(r"target=torch\.ops\.([\w.]+?)(?:\.default)?\]", text))
        if m and op is None:
            op = m.group(1)
        tb = chain.__traceback__
        while tb is not None:
            node = tb.tb_frame.f_locals.get("node")
            stack = getattr(node, "meta", {}).get("nn_module_stack") if node is not None else None
            if stack:
                path, typ = list(stack.values())[-1]
                module = f"{path or '<root>'} ({typ if isinstance(typ, str) else getattr(typ, '__name__', typ)})"
                if op is None:
                    op = str(getattr(node, "target", ""))
            tb = tb.tb_next
        chain = chain.__cause__ or chain.__context__
    return op, module


def _export_dynamo(loaded: LoadedModel, example, batch: BatchProfile, path: Path, opset: int | None,
                   keep: dict | None = None):
    """torch.export, then the dynamo ONNX exporter; ``keep["program"]`` gets the ExportedProgram (--program)."""
    import torch

    with _quiet_torch():
        if loaded.kind == "exported":
            program = loaded.module
        else:
            dynamic = ({0: torch.export.Dim("batch", min=batch.min, max=batch.max)},) if batch.dynamic else None
            try:
                program = torch.export.export(loaded.module, (example,), dynamic_shapes=dynamic, strict=False)
            except Exception as exc:
                raise _ExporterFailed("torch.export", exc) from exc
        if keep is not None:
            keep["program"] = program
        try:
            torch.onnx.export(program, (example,), str(path), dynamo=True, external_data=False,
                              input_names=[INPUT_NAME], output_names=[OUTPUT_NAME], opset_version=opset)
        except Exception as exc:
            raise _ExporterFailed("onnx", exc) from exc
    _name_batch_dim(path)


def _name_batch_dim(path: Path) -> None:
    """torch.export names the dynamic batch dimension after an internal symbol (s85); call it "batch"."""
    import onnx

    model = onnx.load(str(path))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    old = dims[0].dim_param if dims else ""
    if not old or old == "batch":
        return
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param == old:
                d.dim_param = "batch"
    onnx.save(model, str(path))


def _export_torchscript(loaded: LoadedModel, example, batch: BatchProfile, path: Path, opset: int | None):
    import torch

    axes = {INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}} if batch.dynamic else None
    with _quiet_torch():
        try:
            torch.onnx.export(loaded.module, (example,), str(path), dynamo=False, input_names=[INPUT_NAME],
                              output_names=[OUTPUT_NAME], dynamic_axes=axes, opset_version=min(opset or 17, 20))
        except Exception as exc:
            raise _ExporterFailed("torchscript", exc) from exc


class _ExporterFailed(Exception):
    def __init__(self, stage: str, exc: BaseException):
        super().__init__(f"{stage}: {exc}")
        self.stage, self.exc = stage, exc


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    m = re.search(r"## Exception summary\s+(.*?)(?:\n\n|$)", text, re.S)
    if m:
        text = re.sub(r"<class '[\w.]+'>: ", "", m.group(1))
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__


def _run_exporters(loaded: LoadedModel, exporter: str, example, batch, path: Path, opset,
                   keep: dict | None = None) -> str:
    if loaded.kind == "script" and exporter == "dynamo":
        raise UsageProblem("a TorchScript model can only be exported with the TorchScript exporter",
                           "use --exporter torchscript (or auto)")
    if loaded.kind == "exported" and exporter == "torchscript":
        raise UsageProblem("a .pt2 ExportedProgram can only be exported with the dynamo exporter",
                           "use --exporter dynamo (or auto)")
    order = {"dynamo": ["dynamo"], "torchscript": ["torchscript"], "auto": ["dynamo", "torchscript"]}[exporter]
    if loaded.kind == "script":
        order = ["torchscript"]
    elif loaded.kind == "exported":
        order = ["dynamo"]
    failures = []
    for name in order:
        try:
            if name == "dynamo":
                _export_dynamo(loaded, example, batch, path, opset, keep)
            else:
                _export_torchscript(loaded, example, batch, path, opset)
            if failures:
                log.warning("dynamo exporter failed (%s); used the TorchScript exporter instead",
                            _first_line(failures[0][1].exc))
            return name
        except _ExporterFailed as failed:
            log.debug("exporter %s failed", name, exc_info=failed.exc)
            failures.append((name, failed))
    op = module = None
    for _, failed in failures:
        o, m = explain_failure(failed.exc)
        op, module = op or o, module or m
    detail = "; ".join(f"{name} exporter: {_first_line(f.exc)}" for name, f in failures)
    if op:
        where = f" in module {module}" if module else ""
        raise ExportError(f"the ONNX exporter cannot handle operator {op}{where} ({detail})",
                          "replace that operation in the model with supported ones (or, for torch.export failures, "
                          "make the model code export-friendly); --debug shows the full trace")
    raise ExportError(f"export failed: {detail}", "run with --debug for the full trace")


def _check(tmp: Path, loaded: LoadedModel, spec: PreprocessSpec, batch: BatchProfile, images: np.ndarray | None,
           data_name: str, samples: int, atol: float, reporter: Reporter):
    import torch

    onnx = require("onnx", "Checking ONNX models")
    from engines.onnxruntime_engine import OnnxRuntimeEngine

    try:
        onnx.checker.check_model(str(tmp), full_check=True)
    except Exception as exc:
        raise ExportError(f"the exported ONNX fails onnx.checker: {_first_line(exc)}", "report this model") from exc
    if images is not None:
        x = images
    else:
        x = np.random.default_rng(0).standard_normal((samples, spec.channels, *spec.size), dtype=np.float32)
    fn = loaded.module.module() if loaded.kind == "exported" else loaded.module
    chunk = max(1, batch.max)
    engine = OnnxRuntimeEngine(tmp, device="cpu")
    out_spec = engine.outputs
    if len(out_spec) != 1:
        raise ExportError(f"the model has {len(out_spec)} outputs; trtc expects a classifier returning one logits "
                          "tensor", "wrap the model so that forward() returns only the logits")
    ref, got, sizes = [], [], []
    with reporter.phase("checking ONNX Runtime against PyTorch", total=len(x)) as bar:
        with torch.no_grad():
            for i in range(0, len(x), chunk):
                xb = x[i:i + chunk]
                if len(xb) < batch.min:  # a fixed-batch model: pad the last chunk
                    xb = np.concatenate([xb, np.repeat(xb[-1:], batch.min - len(xb), 0)])
                r = fn(torch.from_numpy(xb))
                if isinstance(r, (tuple, list)) or getattr(r, "ndim", 2) != 2:
                    raise ExportError("the model's forward() does not return a (batch, classes) logits tensor",
                                      "wrap the model so that forward() returns only the logits")
                n = min(chunk, len(x) - i)
                ref.append(r.numpy()[:n])
                got.append(engine.infer(xb)[0][:n])
                sizes.append(len(xb))
                bar.advance(n)
            extra_diff = 0.0
            if batch.dynamic and batch.min not in sizes:  # exercise the smallest batch of the profile too
                xb = x[:batch.min] if len(x) >= batch.min else np.repeat(x[:1], batch.min, 0)
                extra_diff = float(np.abs(fn(torch.from_numpy(xb)).numpy().astype(np.float64)
                                          - engine.infer(xb)[0]).max())
                sizes.append(batch.min)
    engine.close()
    ref_all, got_all = np.concatenate(ref), np.concatenate(got)
    diff = np.abs(ref_all.astype(np.float64) - got_all)
    max_diff = max(float(diff.max()), extra_diff)
    r1, g1 = ref_all.argmax(1), got_all.argmax(1)
    rows = np.arange(len(ref_all))
    margin = ref_all[rows, r1] - ref_all[rows, g1]  # how far apart the two choices are in the reference
    flips = int(np.sum((r1 != g1) & (margin > 2 * atol)))
    check = ParityCheck(data=data_name, samples=len(ref_all),
                        max_abs_diff=max_diff, mean_abs_diff=float(diff.mean()),
                        top1_agreement=float(np.mean(r1 == g1)), flips=flips, atol=atol,
                        passed=bool(max_diff <= atol and flips == 0), batch_sizes=sorted(set(sizes)))
    return check, got_all[:0 if images is None else len(images)], out_spec[0], engine.inputs[0]


def _read_check_images(files: list[Path], spec: PreprocessSpec, data_name: str):
    """The --check-data images as model inputs, read before the export (it takes the longest), by the rule every
    image folder follows: one that cannot be decoded is skipped with a warning, none readable is an error.
    Returns (inputs or None, the files kept, warnings)."""
    from .precision.calibration import image_or_skip, none_readable

    if not files:
        return None, [], []
    skipped: list = []
    xs, kept = [], []
    for f in files:
        x = image_or_skip(f, spec, skipped)
        if x is not None:
            xs.append(x)
            kept.append(f)
    if not kept:
        raise ExportError(*none_readable(len(files), "the files listed" if "listed images" in data_name else data_name,
                                        skipped))
    warnings_ = [f"skipped {len(skipped)} unreadable check image(s): "
                 + ", ".join(Path(s["file"]).name for s in skipped[:5])] if skipped else []
    return np.stack(xs), kept, warnings_


def _check_files(check_data) -> tuple[list[Path], str]:
    """The images the export is checked on (a list of files, one file or a folder) and how to name them; an
    empty list means seeded random inputs. Resolved before any model is loaded, so a bad path fails fast."""
    if not check_data:
        return [], "random"
    listed = isinstance(check_data, (list, tuple))
    for item in (check_data if listed else [check_data]):
        if not Path(item).exists():
            raise UsageProblem(f"check data not found: {item}", "give an image file or a folder of images")
    files = [Path(f) for f in check_data] if listed else list_images(check_data)
    if not files:
        raise UsageProblem(f"no images (jpg/png/bmp/webp/gif/tiff) in {check_data}", "point --check-data at photos")
    return files[:MAX_CHECK_IMAGES], (f"{len(files)} listed images" if listed else str(check_data))


def top_k(logits: np.ndarray, labels: list[str] | None, k: int = 5) -> list[tuple[str, float]]:
    z = logits.astype(np.float64) - logits.max()
    p = np.exp(z) / np.exp(z).sum()
    idx = np.argsort(-p)[:k]
    return [((labels[i] if labels and i < len(labels) else str(int(i))), float(p[i])) for i in idx]


def weights_origin(ref, weights: str | None, random_weights: bool) -> str:
    """Where the exported weights come from, as the manifest records it (``model.weights``): "file" (--weights),
    "random" (--random-weights: an untrained network, for tests), "pretrained" (pretrained:NAME's package) or
    "source" (a TorchScript or .pt2 file, or a file.py factory, carries or builds its own). An architecture
    (torchvision:, timm:) without either flag is refused: it would be exported untrained without a word."""
    check_weights_flags(ref, weights, random_weights)
    if weights is not None:
        return "file"
    if ref.kind in ("torchvision", "timm"):
        if random_weights:
            return "random"
        raise UsageProblem(f"{ref.text} has no trained weights without --weights: the export would be an untrained "
                           "network", f"give them: --weights FILE (a state_dict or checkpoint of {ref.value}); for a "
                           "test export of the untrained network add --random-weights")
    return "pretrained" if ref.kind == "pretrained" else "source"


def check_weights_flags(ref, weights: str | None, random_weights: bool) -> None:
    """--random-weights with --weights, or with a source that has weights of its own, is a usage error (checked
    before the model is loaded)."""
    if weights is not None and random_weights:
        raise UsageProblem("--weights and --random-weights contradict each other", "give one of them")
    if random_weights and ref.kind not in ("torchvision", "timm"):
        own = "pretrained:NAME brings its own" if ref.kind == "pretrained" else "the source carries or builds its own"
        raise UsageProblem(f"--random-weights applies to torchvision:ARCH and timm:NAME only ({own} weights)",
                           "drop --random-weights")


def export_onnx(source: str, output: str | Path, *, weights: str | None = None, num_classes: int | None = None,
                input_size: int | tuple[int, int] | None = None, batch: str | BatchProfile = "1:8:32",
                opset: int | None = None, exporter: str = "auto", labels: str | list[str] | None = None,
                mean=None, std=None, color: str | None = None, resize: int | None = None,
                check_data: str | Path | list | None = None, check_samples: int = 8, atol: float = 1e-3,
                force: bool = False, name: str | None = None, reporter: Reporter | None = None,
                random_weights: bool = False, program: bool = False, channels: int | None = None) -> ExportReport:
    """Export a PyTorch classifier to ONNX with its manifest; see the module docstring.

    ``torchvision:``/``timm:`` sources need ``weights`` (a state_dict or checkpoint file), or ``random_weights=True``
    to export the untrained network on purpose (tests, speed measurements); the manifest records which
    (``model.weights``: file, random, pretrained or source). ``program=True`` also writes the torch.export
    program beside the ONNX (``model.pt2`` with ``model.pt2.json``, for the compiled PyTorch engine). ``channels``:
    1 (greyscale: one plane, one mean/std value) or 3, by default read from the model's first convolution. What no
    option gave is listed in ``producer.assumed`` and warned about, except for ``pretrained:`` sources. The steps:
    check the options, load the model, read the check images, make the example batch, export, check ONNX Runtime
    against PyTorch, then write the manifest and move the file into place."""
    reporter = reporter or Reporter()
    out = check_output_path(output, force)
    ref = parse_source(source)
    program_out = _program_output(out, ref, force) if program else None
    check_weights_flags(ref, weights, random_weights)
    profile = batch if isinstance(batch, BatchProfile) else BatchProfile.parse(batch)
    _check_exporter_options(exporter, opset)
    check_files, data_name = _check_files(check_data)
    label_list = read_labels(labels) if isinstance(labels, (str, Path)) else labels
    timings, keep = {}, {}

    # before the load (seconds of importing PyTorch): an architecture without weights is refused at once
    origin = weights_origin(ref, weights, random_weights)
    loaded = _load(ref, weights, num_classes, reporter, timings)
    spec, assumed = build_spec(loaded, input_size, resize, mean, std, color, channels)
    check_x, check_files, warnings_ = _read_check_images(check_files, spec, data_name)  # before the slow work
    warnings_ += [assumed_warning(assumed)] if assumed else []
    example = _example_input(ref, profile, spec, batch)
    with atomic_path(out) as tmp:
        t0 = time.perf_counter()
        with reporter.phase(f"exporting to ONNX ({exporter} exporter)"):
            used = _run_exporters(loaded, exporter, example, profile, tmp, opset, keep)
        timings["export_s"] = time.perf_counter() - t0
        size = tmp.stat().st_size
        t0 = time.perf_counter()
        check, logits, out_t, in_t = _check(tmp, loaded, spec, profile, check_x, data_name, check_samples, atol,
                                            reporter)
        timings["check_s"] = time.perf_counter() - t0
        num = out_t.shape[-1] if isinstance(out_t.shape[-1], int) else None
        _require_parity(check, atol)
        labels_final = _final_labels(label_list, loaded, num)
        manifest = _export_manifest(tmp, loaded, name, num, origin, spec, in_t, out_t, profile, labels_final, used,
                                    check, weights, assumed)
        mpath = write_manifest(out, manifest, hashed_as=tmp)
        keep["report"] = program_out and _write_program(program_out, keep.get("program"), loaded, example, profile,
                                                        manifest, check_x, atol, reporter)  # placed before the ONNX
    predictions = [{"file": str(f), "top5": top_k(lg, labels_final)} for f, lg in zip(check_files, logits)]
    return ExportReport(output=str(out), manifest=str(mpath), source=loaded.source, exporter=used,
                        opset=manifest.producer["opset"], bytes=size, sha256=manifest.artifact["sha256"],
                        input_shape=list(in_t.shape), num_classes=num, batch=profile.to_dict(),
                        preprocess=spec.to_dict(), check=check, timings={k: round(v, 3) for k, v in timings.items()},
                        predictions=predictions, weights=origin, warnings=warnings_, program=keep.get("report"),
                        assumed=assumed)


def _load(ref, weights, num_classes, reporter: Reporter, timings: dict) -> LoadedModel:
    t0 = time.perf_counter()
    with reporter.phase(f"loading {ref.text}"):
        loaded = load_model(ref, weights=weights, num_classes=num_classes)
    timings["load_s"] = time.perf_counter() - t0
    return loaded


def _check_exporter_options(exporter: str, opset: int | None) -> None:
    if exporter not in ("auto", "dynamo", "torchscript"):
        raise UsageProblem(f"unknown exporter {exporter!r}", "use auto, dynamo or torchscript")
    if opset is not None and not 13 <= opset <= 25:
        raise UsageProblem(f"opset {opset} is outside 13..25", "omit --opset for the exporter's default")


def _example_input(ref, profile: BatchProfile, spec: PreprocessSpec, batch):
    """The random batch the exporter traces, once the largest batch the export runs is known to fit in memory."""
    import torch

    example_batch = profile.min if not profile.dynamic else max(2, min(profile.opt, profile.max))
    # the largest batch the export runs (the trace's example, the check's smallest batch), before it is made
    check_input_fits(max(example_batch, profile.min), (spec.channels, *spec.size), 4, f"exporting {ref.text}",
                     f"--batch 1:8:{profile.max} keeps {profile.max} as the largest batch but traces and checks at 8"
                     if profile.max > 8 else "give a smaller --batch", given=f"--batch {batch}")
    return torch.from_numpy(np.random.default_rng(1).standard_normal((example_batch, spec.channels, *spec.size),
                                                                      dtype=np.float32))


def _require_parity(check: ParityCheck, atol: float) -> None:
    if not check.passed:
        raise ExportError(f"ONNX Runtime disagrees with PyTorch on {check.samples} {check.data} inputs: "
                          f"max abs logit diff {check.max_abs_diff:.2e} (tolerance {atol:g}), "
                          f"{check.flips} top-1 flips beyond noise", "try --exporter torchscript; --debug for details")


def _final_labels(label_list: list[str] | None, loaded: LoadedModel, num: int | None):
    """The given labels (one per output) or else the model's own."""
    labels_final = label_list if label_list is not None else loaded.labels
    if label_list is not None and num is not None and len(label_list) != num:
        raise UsageProblem(f"labels file has {len(label_list)} entries but the model has {num} outputs",
                           "give one label per class, in output order")
    return labels_final


def _export_manifest(tmp: Path, loaded: LoadedModel, name, num, origin, spec, in_t, out_t, profile, labels_final,
                     used: str, check: ParityCheck, weights, assumed: list[str] | None = None) -> Manifest:
    """The manifest of the exported file (``tmp``, before it is moved into place)."""
    onnx = require("onnx", "Reading ONNX models")
    opset_used = next((o.version for o in onnx.load(str(tmp), load_external_data=False).opset_import
                       if o.domain in ("", "ai.onnx")), 0)
    parent = None
    if weights:
        parent = {"file": Path(weights).name, "sha256": sha256_file(weights), "role": "weights"}
    return Manifest(
        kind="onnx",
        model={"name": name or loaded.name, "source": loaded.source, "num_classes": num, "weights": origin},
        preprocess=spec, inputs=[in_t], outputs=[out_t], batch=profile, labels=labels_final,
        precision={"mode": "fp32"},
        producer={"tool": "trtc export", "trtc": __version__, "exporter": used, "opset": opset_used,
                  "torch": dist_version("torch"), "onnx": dist_version("onnx"),
                  "onnxruntime": dist_version("onnxruntime", "onnxruntime-gpu"),
                  "check": asdict(check), **({"assumed": list(assumed)} if assumed else {})},
        parent=parent)


# ------------------------------------------------------------------------------------------- --program (.pt2)
def program_path(onnx_out: str | Path) -> Path:
    """Where --program writes the torch.export program of ``model.onnx``: ``model.pt2`` beside it."""
    return Path(onnx_out).with_suffix(".pt2")


def _program_output(out: Path, ref, force: bool) -> Path:
    """The .pt2 path, checked like -o before any work (exists without --force, folder not writable)."""
    if ref.kind == "torchscript":
        raise UsageProblem("--program writes a torch.export program, and a TorchScript model cannot be exported "
                           "with torch.export", "drop --program, or export from the model's code or weights")
    return check_output_path(program_path(out), force, suffix=".pt2")


def _torch_export(loaded: LoadedModel, example, profile: BatchProfile):
    import torch

    if loaded.kind == "exported":
        return loaded.module
    dynamic = ({0: torch.export.Dim("batch", min=profile.min, max=profile.max)},) if profile.dynamic else None
    try:
        with _quiet_torch():
            return torch.export.export(loaded.module, (example,), dynamic_shapes=dynamic, strict=False)
    except Exception as exc:  # noqa: BLE001 - torch.export raises many kinds
        raise ExportError(f"torch.export cannot export this model, so --program cannot be written: "
                          f"{_first_line(exc)}", "drop --program (the ONNX runs in ONNX Runtime and TensorRT)") from exc


def _check_program(path: Path, loaded: LoadedModel, x: np.ndarray) -> float:
    """The saved program, loaded back from ``path``, against the PyTorch model on ``x``: max abs logit diff."""
    import torch

    ref_fn = loaded.module.module() if loaded.kind == "exported" else loaded.module
    with _quiet_torch():
        got_fn = torch.export.load(str(path)).module()
    with torch.no_grad():
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        return float((ref_fn(xt).double() - got_fn(xt).double()).abs().max())


def _write_program(target: Path, program, loaded: LoadedModel, example, profile: BatchProfile, onnx_manifest,
                   check_x, atol: float, reporter: Reporter) -> dict:
    """torch.export.save the program (the one the ONNX was made from, else exported again with the same batch
    range) to ``target`` with its manifest (kind "program": the ONNX's contract, labels and batch range), after it
    was loaded back and checked against PyTorch; atomically, as every artifact."""
    import dataclasses

    import torch

    t0 = time.perf_counter()
    program = program if program is not None else _torch_export(loaded, example, profile)
    n = max(profile.min, min(len(check_x), profile.max)) if check_x is not None else max(profile.min, 2)
    x = check_x[:n] if check_x is not None and len(check_x) >= n else \
        np.random.default_rng(2).standard_normal((n, *example.shape[1:]), dtype=np.float32)
    with atomic_path(target) as tmp:
        with reporter.phase(f"writing the torch.export program {target.name}"):
            torch.export.save(program, str(tmp))
            diff = _check_program(tmp, loaded, x)
        if not diff <= atol:
            raise ExportError(f"the saved torch.export program disagrees with PyTorch: max abs logit diff {diff:.2e} "
                              f"(tolerance {atol:g})", "drop --program, and report the model")
        check = {"max_abs_diff": diff, "samples": int(len(x)), "atol": atol, "loaded_back": True}
        manifest = dataclasses.replace(
            onnx_manifest, kind="program", artifact={}, created="",
            producer={"tool": "trtc export --program", "trtc": __version__, "format": "torch.export",
                      "torch": dist_version("torch"), "onnx_sibling": onnx_manifest.artifact.get("file"),
                      "check": check})
        mpath = write_manifest(target, manifest, hashed_as=tmp)
        size = tmp.stat().st_size
    return {"file": str(target), "manifest": str(mpath), "bytes": size, "check": check,
            "seconds": round(time.perf_counter() - t0, 3)}


@dataclass
class AdoptReport:
    """``trtc export model.onnx``: an ONNX file made elsewhere, given its manifest (the file is not touched)."""
    output: str  # the adopted model (unchanged)
    manifest: str
    sha256: str
    input_shape: list
    num_classes: int | None
    batch: dict
    preprocess: dict
    labels: int  # how many class names the manifest carries (0: none)
    labels_from: str  # "--labels FILE", "ONNX metadata 'character'" or "none"
    assumed: list[str] = field(default_factory=list)  # preprocessing settings no option gave (defaults taken)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def describe_contract(spec: PreprocessSpec) -> str:
    """One line for a preprocessing contract (what a model without a manifest is assumed to take)."""
    resize = f"resize short side {spec.resize}, centre crop" if spec.resize else "stretch to"
    colour = "greyscale (1 channel, BT.601 grey of RGB)" if spec.channels == 1 else spec.color
    return (f"{colour}, {resize} {spec.size[0]}x{spec.size[1]} ({spec.interpolation}), "
            f"mean {','.join(f'{v:g}' for v in spec.mean)}, std {','.join(f'{v:g}' for v in spec.std)}")


def assumed_warning(assumed: list[str]) -> str:
    """The warning for preprocessing no option gave, the same words for an exported and an adopted model."""
    return (f"assumed (no option gave them): {', '.join(assumed)}; check them against how the model was trained, "
            "and give --color/--mean/--std/--resize where they differ")


def no_manifest_note(model: str | Path, spec: PreprocessSpec, labels: bool = False) -> str:
    """What every command says, once, of an ONNX model without a manifest that it runs anyway (trtc run and
    quantize; trtc validate refuses such a model unless another model's manifest gives the contract): what it
    assumes, and how to stop assuming."""
    name = Path(model).name
    return (f"{name} has no manifest: assumed {describe_contract(spec)}" + ("" if labels else ", no class names")
            + f"; adopt it once to set them: trtc export {model} --color ... --mean ... --std ... --resize ... "
            "(docs/BRING-YOUR-OWN-ONNX.md)")


def is_adoptable(source: str) -> bool:
    """An existing .onnx file given to ``trtc export``: adopted, not exported."""
    p = Path(source)
    return p.suffix.lower() == ".onnx" and p.is_file()


def adopt_onnx(model: str | Path, *, labels: str | list[str] | None = None, input_size=None,
               resize: int | None = None, mean=None, std=None, color: str | None = None, batch: str | None = None,
               name: str | None = None, force: bool = False, reporter: Reporter | None = None,
               channels: int | None = None) -> AdoptReport:
    """Adopt an ONNX classifier that trtc did not export: check it, take its labels (``labels``, else its ONNX
    metadata: ``labels``/``classes``/``class_names``/``names``/``character``) and its preprocessing contract
    (the options; what no option gives is the ImageNet default, or for a greyscale (1-channel) input the greyscale
    one, listed in ``assumed``; the channels are read from the input, ``channels`` must agree), and write
    ``model.onnx.json`` beside it. The model file itself is never written. Afterwards every command treats it as trtc's own.

    The steps: check the paths, read and check the graph, settle the preprocessing and the batch profile, run the
    model once, take its labels, then write the manifest."""
    reporter = reporter or Reporter()
    src = Path(model)
    if not src.is_file():
        raise UsageProblem(f"model not found: {src}", "give the path of an existing .onnx file")
    mpath = manifest_path(src)
    if mpath.exists() and not force:
        raise UsageProblem(f"{src.name} has a manifest already ({mpath.name})",
                           said_as("add --force to replace it with one made from these options",
                                   "pass force=True to replace it with one made from these options"))
    proto, feeds, dims = _read_classifier(src)
    spec, assumed = _adopted_spec(dims, feeds[0].name, input_size, resize, mean, std, color, channels)
    profile = _adopted_batch(dims, batch)
    y, ins, outs = _run_once(src, profile, (spec.channels, *spec.size), reporter)
    declared = tuple(outs[0].shape)
    problem = not_a_classifier(src.name, declared if len(declared) == y.ndim else y.shape)
    if problem is not None:
        raise ExportError(*problem)
    num = int(y.shape[1])
    warnings_ = []
    label_list, labels_from = _adopted_labels(src, labels, num, warnings_)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    manifest = Manifest(
        kind="onnx",
        model={"name": name or src.stem, "source": str(src), "num_classes": num, "weights": "source"},
        preprocess=spec, inputs=[ins[0]], outputs=[outs[0]], batch=profile, labels=label_list,
        precision={"mode": "fp32"},
        producer={"tool": "trtc export", "trtc": __version__, "adopted": True, "labels_from": labels_from,
                  "assumed": assumed, "opset": opset, "producer_name": proto.producer_name,
                  "onnx": dist_version("onnx"), "onnxruntime": dist_version("onnxruntime", "onnxruntime-gpu")})
    if assumed:
        warnings_.append(assumed_warning(assumed))
    written = write_manifest(src, manifest)
    return AdoptReport(output=str(src), manifest=str(written), sha256=manifest.artifact["sha256"],
                       input_shape=list(ins[0].shape), num_classes=num, batch=profile.to_dict(),
                       preprocess=spec.to_dict(), labels=len(label_list or []), labels_from=labels_from,
                       assumed=assumed, warnings=warnings_)


_FIX_MODEL = CLASSIFIER_FIX


def _read_classifier(src: Path):
    """The checked ONNX graph, its single input and that input's dims (NCHW with 1 or 3 channels)."""
    onnx = require("onnx", "Reading ONNX models")
    from .precision import graph as G

    try:
        proto = onnx.load(str(src))
        onnx.checker.check_model(proto, full_check=True)
    except Exception as exc:  # noqa: BLE001 - onnx raises many kinds
        raise ExportError(f"{src.name} is not a valid ONNX model: {_first_line(exc)}", _FIX_MODEL) from exc
    feeds = G.graph_inputs(proto)
    if len(feeds) != 1:
        raise ExportError(f"{src.name} has {len(feeds)} inputs; trtc adopts single-input image classifiers",
                          _FIX_MODEL)
    dims = G.input_dims(feeds[0])
    if len(dims) != 4 or dims[1] not in (1, 3):
        raise ExportError(f"{src.name} takes {G.tensor_spec(feeds[0]).shape} inputs, not NCHW images with 1 "
                          "(greyscale) or 3 (colour) channels", _FIX_MODEL)
    return proto, feeds, dims


def _adopted_spec(dims: list, input_name: str, input_size, resize, mean, std, color, channels=None):
    """The preprocessing contract from the options, the model's fixed size and channels and the defaults (ImageNet's;
    a greyscale model's: engines.preprocess.GREY_MEAN/GREY_STD), and the list of what was assumed (no option gave
    it)."""
    assumed = []
    fixed_c = dims[1] if isinstance(dims[1], int) and dims[1] > 0 else None
    if channels is not None and fixed_c is not None and channels != fixed_c:
        raise UsageProblem(f"--channels {channels} is not the {fixed_c} channels the model takes",
                           f"use --channels {fixed_c} (or leave it out)")
    if channels is None and fixed_c is None:
        assumed.append("3 input channels")
    channels = channels or fixed_c or 3
    grey = channels == 1
    hw = tuple(dims[2:4])
    fixed_hw = all(isinstance(d, int) and d > 0 for d in hw)
    if input_size is not None:
        size = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
        if fixed_hw and size != hw:
            raise UsageProblem(f"--input-size {size[0]}x{size[1]} is not the {hw[0]}x{hw[1]} the model takes",
                               f"use --input-size {hw[0]}x{hw[1]} (or leave it out)")
    elif fixed_hw:
        size = hw
    else:
        size = (224, 224)
        assumed.append("input size 224x224")
    if resize is None:
        resize = int(round(min(size) / 0.875))
        assumed.append(f"resize {resize}")
    if color is None and not grey:
        assumed.append("colour RGB")
    if mean is None:
        assumed.append("greyscale mean 0.449" if grey else "ImageNet mean")
    if std is None:
        assumed.append("greyscale std 0.226" if grey else "ImageNet std")
    spec = PreprocessSpec(size=size, resize=resize or None, color=color or "RGB", mean=tuple(mean) if mean else None,
                          std=tuple(std) if std else None, input=input_name, channels=channels)
    return spec, assumed


def _adopted_batch(dims: list, batch: str | None) -> BatchProfile:
    """--batch where given (it must match a fixed batch), else the model's fixed batch, else 1:8:32."""
    if batch is not None:
        profile = BatchProfile.parse(batch)
        if isinstance(dims[0], int) and dims[0] > 0 and (profile.min, profile.max) != (dims[0], dims[0]):
            raise UsageProblem(f"--batch {batch}: the model's batch is fixed at {dims[0]}",
                               f"use --batch {dims[0]} (or leave it out)")
        return profile
    if isinstance(dims[0], int) and dims[0] > 0:
        return BatchProfile(dims[0], dims[0], dims[0])
    return BatchProfile(1, 8, 32)


def _run_once(src: Path, profile: BatchProfile, shape, reporter: Reporter):
    """One random batch of the smallest size (``shape``: C, H, W) through ONNX Runtime on the CPU: its first
    output, and the model's inputs and outputs as the engine reads them."""
    from engines.onnxruntime_engine import OnnxRuntimeEngine

    with reporter.phase(f"checking {src.name} in ONNX Runtime"):
        engine = OnnxRuntimeEngine(src, device="cpu")
        try:
            x = np.random.default_rng(0).standard_normal((profile.min, *shape), dtype=np.float32)
            y = np.asarray(engine.infer(x)[0])
            ins, outs = engine.inputs, engine.outputs
        except Exception as exc:  # noqa: BLE001 - the runtime's own errors, said in one line
            if isinstance(exc, TrtcError):
                raise
            dims = "x".join(map(str, (profile.min, *shape)))
            raise ExportError(f"ONNX Runtime cannot run {src.name} on {dims} inputs: {_first_line(exc)}",
                              "give the --input-size and --batch the model takes") from exc
        finally:
            engine.close()
    return y, ins, outs


def _adopted_labels(src: Path, labels, num: int, warnings_: list[str]):
    """The class names (``labels``, else the ONNX metadata's, else none) and where they came from; one per
    output, each once."""
    if isinstance(labels, (str, Path)):
        label_list, labels_from = read_labels(labels), f"--labels {labels}"
    elif labels is not None:
        label_list, labels_from = list(labels), "the labels argument"
    else:
        label_list, key = onnx_labels(src)
        labels_from = f"ONNX metadata {key!r}" if label_list else "none"
    if label_list is not None and len(label_list) != num:
        where = "labels file" if labels is not None else f"ONNX metadata {key!r}"
        raise UsageProblem(f"the {where} has {len(label_list)} entries but the model has {num} outputs",
                           "give one label per class, in output order (--labels FILE)")
    if label_list is None:
        warnings_.append(f"{src.name} carries no class names: predictions show class indices; give --labels FILE")
    if len(set(label_list or [])) != len(label_list or []):
        raise UsageProblem("the labels hold the same name twice", "give each class its own name")
    return label_list, labels_from


__all__ = ["export_onnx", "adopt_onnx", "AdoptReport", "onnx_labels", "ExportReport", "ParityCheck", "check_output_path", "read_labels", "top_k",
           "manifest_path"]
