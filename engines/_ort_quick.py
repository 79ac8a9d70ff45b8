"""Quick start for ONNX Runtime's tuned CUDA session (docs/INTERNALS.md says why; figures in docs/BENCHMARKS.md).

The tuned session's first run of an input shape prepares it (cuDNN compiles kernels then: seconds). Its preparations
run on one thread, one shape at a time, in the order the caller announced or ran them; the device batches that come
meanwhile run on a quick session (cuDNN's default algorithms, engines._quick_model's copy of the model). Rules kept:
the tuned session never runs beside its own preparation (route); one run of the quick session is enqueued at a time,
and it is let go only with its stream idle; a quick session is open only while a preparation is queued or running,
or while its warm-up waits for the first shape the caller will run."""

from __future__ import annotations

import atexit
import logging
import threading
import weakref

from .errors import first_line

log = logging.getLogger("trtc")
_alive: "weakref.WeakSet" = weakref.WeakSet()  # every QuickStart (a running thread holds its own reference)


@atexit.register
def _join_at_exit() -> None:
    """Before the interpreter tears down, cancel every QuickStart and wait for its threads (each within its current
    ONNX Runtime node): a daemon thread still inside ONNX Runtime could meet CUDA being torn down under it."""
    for q in list(_alive):
        q.cancel()
        for t in (q._thread, q._warming):
            if t is not None:
                t.join(60)


class QuickStart:
    """Which session runs an input shape (``route``), and the tuned session's preparations.

    ``prepare(key)`` runs the tuned session once at that shape (on this object's daemon thread); ``open_quick()``
    opens a quick session; ``retire(session)`` waits for a quick session's work before it goes; ``interrupt()``
    stops the preparation running now (cancel)."""

    def __init__(self, prepare, open_quick, name: str = "model", retire=None, interrupt=None):
        self._prepare, self._open_quick, self.name = prepare, open_quick, name
        self._retire, self._interrupt = retire, interrupt
        self._lock = threading.Condition()
        self._ready: set = set()  # shapes the tuned session has run
        self._queue: list = []  # shapes waiting for (or in) preparation, in order; the first is being prepared
        self._thread = self._warming = self._quick = None
        self._opening = False  # warm()'s thread is opening the quick session (outside the lock)
        self._warm_running = False  # warm()'s thread is running the quick session once
        self._cancelled = False
        self._wanted = True  # False once the caller said it runs host arrays: no quick session
        self.quick_runs = 0  # batches the quick session ran
        self.failed: dict = {}  # shape -> what its preparation raised (the caller's tuned run meets it itself)
        self.unavailable = None  # why the quick session could not open: batches then wait for the tuned one
        _alive.add(self)

    def start(self, key) -> None:
        """Prepare ``key`` in the background unless it is ready or queued."""
        self.expect([key])

    def expect(self, keys, device: bool = True) -> None:
        """Queue the preparation of each of ``keys`` in order; ``device=False``: the caller runs host arrays, so no
        quick session is kept or opened for it."""
        with self._lock:
            for key in keys:
                self._start(key)
            if not device:
                self._wanted = False
            self._lock.notify_all()  # the warm-up waits for a shape to run
        if not device:
            self.let_go_if_idle(always=True)

    def _start(self, key) -> None:
        if key in self._ready or key in self._queue or self._cancelled:
            return
        self._queue.append(key)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trtc-ort-prepare", daemon=True)
            self._thread.start()

    def warm(self, run_once) -> None:
        """Open the quick session now, on a thread of its own (its creation overlaps the tuned session's), then call
        ``run_once(session, key)`` at the first shape queued (waiting for one to be announced): the kernels it loads
        are loaded before the caller's first batch. Errors are left to the tuned session (the same model)."""
        def go():
            try:
                session = self._open_warm()
                with self._lock:
                    if session is not None:
                        self._lock.wait_for(lambda: self._queue or self._ready or not self._still_wanted(session))
                    key = self._queue[0] if session is not None and self._queue and self._quick is session else None
                    self._warm_running = key is not None
                if key is not None:
                    run_once(session, key)
            except Exception as exc:  # noqa: BLE001 - the tuned session meets the same problem in the caller
                log.debug("%s: warming the quick session failed: %s", self.name, exc)
            finally:
                with self._lock:  # nothing queued: nothing for it to cover
                    self._warm_running = False
                    retired = self._take(always=False)
                self._retire_quietly(retired)
        self._opening = True  # before the thread starts: a route() meanwhile waits for this creation
        self._warming = threading.Thread(target=go, name="trtc-ort-quick-warm", daemon=True)
        try:
            self._warming.start()
        except BaseException:  # e.g. no thread left to start: route() must not wait for it
            with self._lock:
                self._opening = False
            raise

    def _open_warm(self):
        """warm()'s quick session, opened outside the lock (start() and route() need not wait for its creation; a
        route() that needs it waits for this one), kept only if still wanted then."""
        session = None
        try:
            with self._lock:
                wanted = self._still_wanted()
            if wanted:
                session = self._open_quick()
        finally:
            with self._lock:
                self._opening = False
                if session is not None and self._still_wanted():
                    self._quick = session
                self._lock.notify_all()
        return self._quick

    def _still_wanted(self, held=None) -> bool:
        """Whether a quick session (``held``, or a new one when None) has something to cover: not cancelled, no host
        caller, and preparations queued or none ended yet. Under the lock."""
        return (self._quick is held and not self._cancelled and self._wanted
                and bool(self._queue or not self._ready))

    def let_go_if_idle(self, always: bool = False) -> None:
        """Let the quick session go when nothing is queued (``always``: even then), its stream idle first."""
        with self._lock:
            retired = self._take(always)
        self._retire_quietly(retired)

    def _take(self, always: bool):
        """The quick session, no longer kept, when nothing is queued or ``always`` (under the lock), else None."""
        if self._queue and not always:
            return None
        retired, self._quick = self._quick, None
        self._lock.notify_all()  # a warm-up waiting with it gives up
        return retired

    def _retire_quietly(self, retired) -> None:
        if retired is not None and self._retire is not None:
            try:  # a caller still running it keeps its own reference and waits itself (holds)
                self._retire(retired)
            except Exception as exc:  # noqa: BLE001 - a failed wait shows again at the caller's next CUDA call
                log.debug("%s: waiting for the quick session's last work failed: %s", self.name, exc)

    def route(self, key):
        """None (run the tuned session) when it has prepared ``key`` and prepares nothing now; else the quick
        session, queueing ``key``'s preparation if needed. Never the tuned session while it prepares. Without a
        quick session (it cannot open, or a host caller), None once ``key`` is prepared (the caller waits here). A
        quick session is opened only while a preparation is queued, under the lock held until it is kept, so the
        preparing thread that lets it go sees it."""
        with self._lock:
            while True:
                if self._cancelled or (key in self._ready and not self._queue):
                    return None
                self._start(key)
                if self._quick is not None or not self._opening:
                    break
                # warm() is opening one: wait for it, then ask again (the preparations may have ended meanwhile)
                self._lock.wait_for(lambda: not self._opening)
            if self._quick is None and self.unavailable is None and self._wanted:
                try:
                    self._quick = self._open_quick()
                except Exception as exc:  # noqa: BLE001 - the tuned session still runs every batch
                    self.unavailable = exc
                    log.warning("%s: quick start off, the first batches wait for the tuned session: its quick "
                                "session did not open (%s)", self.name, first_line(exc))
            if self._quick is None:
                self._lock.wait_for(lambda: key in self._ready or self._cancelled)
                return None
            self.quick_runs += 1
            return self._quick

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._thread, retired = None, self._take(always=False)
                    break
                key = self._queue[0]
            try:
                self._prepare(key)
            except Exception as exc:  # noqa: BLE001 - the caller's own tuned run at this shape raises it again
                self.failed[key] = exc
                log.debug("%s: preparing the tuned session at %s failed: %s", self.name, key, exc)
            with self._lock:
                self._queue.pop(0)
                self._ready.add(key)
                self._lock.notify_all()
        self._retire_quietly(retired)

    def cancel(self) -> None:
        """Prepare nothing more: queued shapes are dropped and the running preparation interrupted; the threads end
        by themselves, letting the quick session go. Nothing here waits for them."""
        with self._lock:
            self._cancelled = True
            del self._queue[1:]
            self._lock.notify_all()
        if self._interrupt is not None:
            self._interrupt()

    def holds(self, session) -> bool:
        """Whether ``session`` is still the quick session (False once let go)."""
        with self._lock:
            return self._quick is session

    def ready(self, key) -> bool:
        with self._lock:
            return key in self._ready

    def forget(self) -> None:
        """The tuned session was replaced: the shapes the old one prepared are prepared again when next asked for."""
        with self._lock:
            self._ready.clear()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every queued shape is prepared and the warm-up's run (if any) ended; False when ``timeout``
        seconds passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: not (self._opening or self._warm_running or self._thread), timeout)
