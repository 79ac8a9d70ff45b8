"""Progress reporting between the library and whoever drives it.

Library functions take a ``reporter`` and announce their phases through it; they never print. The CLI passes a
:class:`RichReporter` (spinner/progress bars on stderr); Python callers get :class:`Reporter`, which only logs.
"""

from __future__ import annotations

import contextlib
import logging
import time

log = logging.getLogger("trtc")


class Reporter:
    """Silent reporter: phases go to the ``trtc`` logger at debug level."""

    @contextlib.contextmanager
    def phase(self, description: str, total: int | None = None):
        t0 = time.perf_counter()
        log.debug("%s ...", description)
        bar = _Bar()
        yield bar
        log.debug("%s done in %.2f s", description, time.perf_counter() - t0)


class _Bar:
    failed: str | None = None  # set by the caller when the phase's work failed: the done line says so

    def advance(self, n: int = 1) -> None:
        pass

    def describe(self, text: str) -> None:
        log.debug("%s", text)


class RichReporter(Reporter):
    """Transient progress bars on stderr, one per phase; a done line per phase stays visible."""

    def __init__(self, console, quiet: bool = False):
        self.console = console
        self.quiet = quiet

    @contextlib.contextmanager
    def phase(self, description: str, total: int | None = None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        t0 = time.perf_counter()
        if self.quiet:
            yield _Bar()
            return
        columns = [SpinnerColumn(), TextColumn("{task.description}")]
        if total:
            columns += [BarColumn(), MofNCompleteColumn()]
        columns.append(TimeElapsedColumn())
        # bars only on a terminal; piped or captured stderr gets just the done lines
        with Progress(*columns, console=self.console, transient=True,
                      disable=not self.console.is_terminal) as progress:
            task = progress.add_task(description, total=total)

            class Bar(_Bar):
                def advance(self, n: int = 1) -> None:
                    progress.advance(task, n)

                def describe(self, text: str) -> None:
                    progress.update(task, description=f"{description}: {text}")

            bar = Bar()
            yield bar
        if bar.failed:
            self.console.print(f"[red]✗[/] {description}: {bar.failed} [dim]({time.perf_counter() - t0:.1f} s)[/]",
                               markup=True, highlight=False)
        else:
            self.console.print(f"[green]✓[/] {description} [dim]({time.perf_counter() - t0:.1f} s)[/]")


class _PlainFormatter(logging.Formatter):
    """``warning: message``; logging.Formatter adds a traceback after it as usual."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.message}"


def _no_user_info(record: logging.LogRecord) -> bool:
    """Every log line without a URL's user info (``rtsp://***@host``): a camera's password never reaches a log, even
    where a message quotes a library's text that names the URL it was given."""
    from engines.video.credentials import redact

    message = record.getMessage()
    clean = redact(message)
    if clean != message:
        record.msg, record.args = clean, None
    return True


def setup_logging(console, verbosity: int) -> None:
    """-q: errors only; default: warnings; -v: info; -vv: debug. Everything on stderr.

    A terminal gets Rich's coloured columns; anything else (a log file, journald, a pipe) gets one unwrapped line per
    message, ``warning: ...``, so that a long path is never split across lines for whoever greps it."""
    level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logger = logging.getLogger("trtc")
    if console.is_terminal:
        from rich.logging import RichHandler

        handler = RichHandler(console=console, show_time=False, show_path=False, markup=False)
    else:
        handler = logging.StreamHandler(console.file)
        handler.setFormatter(_PlainFormatter())
    handler.addFilter(_no_user_info)
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False


def model_label(spec) -> str:
    """A model as tables name it: the file name, keeping an engine prefix (``opencv:lite0.onnx``), or the PyTorch
    source as given."""
    from pathlib import Path

    from engines import split_engine

    engine, path, _ = split_engine(str(spec))
    name = Path(path).name or str(path)
    return f"{engine}:{name}" if engine else name
