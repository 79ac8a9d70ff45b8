"""Quick start for ONNX Runtime's tuned CUDA session: the first batches of a new input shape run on a session with
cuDNN's default algorithms while the tuned session prepares that shape on a thread of its own.

Why: the tuned session (NHWC kernels, heuristic algorithm choice, convolutions fused with their bias) prepares its
convolutions at the first run of each input shape, and cuDNN 9 compiles some of their kernels then (NVRTC;
``libcudnn_engines_runtime_compiled`` and ``libnvrtc`` are loaded by that run). On an H100 (ORT 1.31.1, cuDNN 9.14,
FP16, batch 64) that first run took 2.3-4.6 s for EfficientNet-Lite0, 4.5 s of it in its convolutions, and again
2.1-2.7 s at every other batch size; 0.75 s for ResNet-50. A session with cuDNN's default algorithms runs its first
batch of 64 in 0.26 s (ResNet-50) and 0.90 s (Lite0), though at 2,833 and 191 img/s afterwards. Both sessions gave
the same top-1 on those batches (largest logit difference 0.006 for Lite0). So a caller gets its first results from
the quick session and the tuned speed once the tuned session is ready; the quick session is let go when no shape is
being prepared. Those figures are from before the fusion; with it (2026-11-27) Lite0 FP16's first run took ~2.8 s
longer (cuDNN builds a plan per fused convolution).

With default algorithms ONNX Runtime asks cuDNN's frontend for the engines of its FALLBACK heuristic mode
for every convolution (it logs "running in Fallback mode" for each). For depthwise convolutions those are generic
implicit-GEMM kernels: Lite0's quick session ran at 154-234 img/s in every variant tried (FP16 or FP32, NCHW or
NHWC, any graph optimisation level), 0.3 s a batch of 64. So the quick session runs a copy of the model with each
depthwise convolution as shifted multiply-adds (engines._quick_model): on an H100 (2026-11-25) Lite0's quick
session then ran at 1,913-1,925 img/s, its first run took 0.37-0.43 s instead of 0.84-1.25 s, and the first
result of `trtc run` came at 1.48-1.60 s instead of 1.75-2.14 s (same machine, alternating). A model without
depthwise convolutions (ResNet-50) runs as it is. Tried and not kept (2026-11-25): ONNX
Runtime's CPU EP as a second stand-in, measured at open against this one (0.07-0.09 s a batch alone, 0.28-0.43 s
beside the tuned session's preparation and the decoder: first results got later, ResNet-50's by 0.5 s), and a
warm-up at batch 1 (a first run there costs as much as at 64).

The tuned session never runs beside its own preparation: while a shape prepares, every batch goes to the quick
session, even one of a shape already prepared (route). With the fast quick session, a GPU test that runs the tuned
session right after a change of batch size (its preparation still running) failed in 6 of 12 runs on an H100 with
illegal memory accesses or illegal instructions in cuDNN's convolutions (0 of 8 runs at 504beb1,
whose slow quick session made that test slower). With this rule: 12 of 13 runs passed, the other failed without an
illegal access (its log was lost). Likewise one run of the quick session is enqueued at a time, and a quick
session is let go only with its stream idle. The same illegal instruction came later with one caller: a graph
captured at one batch size replayable after the tuned session ran at another; at every change of shape of the
tuned session the engine now waits for its last run if still on the GPU, and lets its graphs go
(OnnxRuntimeEngine._at_shapes).

The quick session is opened outside the lock (QuickStart._open_warm): the engine's open queues its batch without
waiting for that creation, so the video source opens beside it. On an H100 (2026-11-26, fresh processes,
alternating in one call, 8 runs each) Lite0's first result came at 1.23-1.36 s against 1.35-1.70 s; ResNet-50's at
1.03-1.16 s against 1.09-1.21 s (4 each). Tried there and not kept: the tuned preparation waiting for the quick
warm-up (Lite0 1.13-1.56 s, no better; ResNet-50 1.14-1.32 s, later) and the copy's 1x1 convolutions as MatMul
(Lite0 1.16-1.41 s: no gain; cuBLAS's first call costs what cuDNN's did).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref

from .errors import first_line

log = logging.getLogger("trtc")
_at_exit: "weakref.WeakSet" = weakref.WeakSet()  # every QuickStart alive (a running thread keeps its own)


@atexit.register
def _join_at_exit() -> None:
    """Before the interpreter tears down, cancel every QuickStart and wait for its threads: a daemon thread still inside ONNX Runtime while the process exits could meet CUDA and ONNX
    Runtime being torn down under it."""
    for q in list(_at_exit):
        q.cancel()
        for t in (q._thread, q._warming):
            if t is not None:
                t.join(60)


class QuickStart:
    """Which session runs an input shape: ``route(key)`` gives the quick session while the tuned one prepares
    ``key`` (queueing that preparation if it is not queued), or None once the tuned session has run ``key``.

    ``prepare(key)`` runs the tuned session once at that shape; one daemon thread prepares the queued shapes one
    at a time, in the order they were asked for (the shape asked for at open first; two preparations at once would
    only share the GPU's compiler). ``open_quick()`` opens the quick session (called under the lock, at most once
    per period of preparation).

    The quick session is kept only while a preparation is queued or running, and by warm() until the first is
    asked for: whoever ends the last preparation (the preparing thread) or finds none queued (warm() with no shape
    to run) lets it go, and only a caller that has just queued a preparation, or seen one queued, under the lock it
    still holds, opens or keeps one. So once a preparation has ended, none is queued and the warm-up returned,
    none is open."""

    def __init__(self, prepare, open_quick, name: str = "model", retire=None, interrupt=None):
        self._prepare, self._open_quick, self.name = prepare, open_quick, name
        self._retire = retire  # retire(session): called before the quick session is let go (waits for its work)
        self._interrupt = interrupt  # interrupt(): stop the preparation running now (cancel)
        self._cancelled = False
        _at_exit.add(self)
        self._lock = threading.Condition()
        self._ready: set = set()  # shapes the tuned session has run
        self._queue: list = []  # shapes waiting for (or in) preparation, in order; the first is being prepared
        self._thread = None
        self._warming = None  # the thread opening and warming the quick session at open (warm())
        self._opening = False  # warm()'s thread is opening the quick session (outside the lock)
        self._quick = None
        self.quick_runs = 0  # batches the quick session ran (reported in tests and benchmarks)
        self.failed: dict = {}  # shape -> the exception its preparation raised (the tuned run then raises it itself)
        self.unavailable = None  # why the quick session could not open: every batch then waits for the tuned one

    def start(self, key) -> None:
        """Prepare ``key`` in the background unless it is ready or queued."""
        with self._lock:
            self._start(key)

    def _start(self, key) -> None:
        if key in self._ready or key in self._queue or self._cancelled:
            return
        self._queue.append(key)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trtc-ort-prepare", daemon=True)
            self._thread.start()

    def warm(self, run_once) -> None:
        """Open the quick session now, on a thread of its own, and call ``run_once(session)`` on it (one run at the
        shape the caller expects first): the session's creation and its first run (loading cuDNN's kernels) then
        overlap the tuned session's creation and whatever the caller does before its first batch. Errors are
        left to the tuned session's own open and runs (the same model, the same provider)."""
        def go():
            try:
                session = self._open_warm()
                if session is not None and not run_once(session):
                    self._let_go_if_idle()  # no shape to prepare is known: nothing for it to cover yet
            except Exception as exc:  # noqa: BLE001 - the tuned session meets the same problem in the caller
                log.debug("%s: warming the quick session failed: %s", self.name, exc)
        self._opening = True  # before the thread starts: a route() meanwhile waits for this creation
        self._warming = threading.Thread(target=go, name="trtc-ort-quick-warm", daemon=True)
        try:
            self._warming.start()
        except BaseException:  # e.g. no thread left to start: route() must not wait for it
            with self._lock:
                self._opening = False
            raise

    def _open_warm(self):
        """The quick session for warm(), opened outside the lock: start() and route() need not wait the 0.3 s its
        creation takes (on an H100 the engine's open waited for it in start(), so the video
        source opened only after it). A route() that needs the quick session meanwhile waits for this one."""
        session = None
        try:
            with self._lock:
                wanted = self._still_wanted()
            if wanted:
                session = self._open_quick()
        finally:
            with self._lock:
                self._opening = False
                # kept unless the preparations ended meanwhile (nothing left to cover)
                if session is not None and self._still_wanted():
                    self._quick = session
                kept = self._quick
                self._lock.notify_all()
        return kept

    def _let_go_if_idle(self) -> None:
        """Let the quick session go when no shape is being prepared (its stream idle first, as in _run)."""
        with self._lock:
            if self._queue:
                return
            retired, self._quick = self._quick, None
        if retired is not None and self._retire is not None:
            self._retire(retired)

    def _still_wanted(self) -> bool:
        """Whether warm() should open (or keep) a quick session: none is kept yet, and preparations are queued or
        none has ended (else there is nothing left to cover). Under the lock: warm() asks before and after its
        unlocked creation, since the preparations may end meanwhile."""
        return self._quick is None and not self._cancelled and bool(self._queue or not self._ready)

    def route(self, key):
        """None (run the tuned session) when the tuned session has prepared ``key`` and prepares nothing else now;
        else the quick session, queueing ``key``'s preparation if it needs one. Never the tuned session while it
        prepares a shape on its thread: the caller's run would wait for the preparation (the engine's lock).
        When the quick session cannot open, None: the caller runs the tuned session, waiting for its preparation,
        and the failure is said once. A quick session is opened here only while a preparation is queued or running,
        checked under the lock held until the session is kept: the preparing thread, which lets it go when the
        queue empties, then sees it (a session opened after that thread ended would be kept for the engine's
        life)."""
        with self._lock:
            while True:
                if self._cancelled or (key in self._ready and not self._queue):
                    return None
                self._start(key)
                if self._quick is not None or not self._opening:
                    break
                # warm() is opening it: wait rather than open a second. The lock is let go meanwhile, so every
                # preparation may end (and warm() then drops its session): ask again, as a new call would
                self._lock.wait_for(lambda: not self._opening)
            # here a preparation is queued or running (its thread lets the session opened below go), and the lock
            # was held since that was seen
            if self._quick is None and self.unavailable is None:
                try:
                    self._quick = self._open_quick()
                except Exception as exc:  # noqa: BLE001 - the tuned session still runs every batch
                    self.unavailable = exc
                    log.warning("%s: quick start off, the first batches wait for the tuned session: its quick "
                                "session did not open (%s)", self.name, first_line(exc))
            if self._quick is None:  # no quick session: the tuned session runs it once this shape is prepared
                self._lock.wait_for(lambda: key in self._ready)
                return None
            self.quick_runs += 1
            return self._quick

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._thread = None
                    retired, self._quick = self._quick, None  # nothing is being prepared: let it go
                    self._lock.notify_all()
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
                self._lock.notify_all()  # a route() without a quick session waits for this shape
        if retired is not None and self._retire is not None:
            try:  # a caller still running it keeps its own reference and waits itself (holds)
                self._retire(retired)
            except Exception as exc:  # noqa: BLE001 - a failed wait shows again at the caller's next CUDA call
                log.debug("%s: waiting for the quick session's last work failed: %s", self.name, exc)

    def cancel(self) -> None:
        """Prepare nothing more: the queued shapes are dropped, the one being prepared is interrupted, and the
        threads end by themselves (letting the quick session go); nothing here waits for them. A process that exits
        meanwhile waits at exit for each thread's current ONNX Runtime node (see _join_at_exit)."""
        with self._lock:
            self._cancelled = True
            del self._queue[1:]
            self._lock.notify_all()
        if self._interrupt is not None:
            self._interrupt()

    def holds(self, session) -> bool:
        """Whether ``session`` is still the quick session (False once it was let go)."""
        with self._lock:
            return self._quick is session

    def ready(self, key) -> bool:
        with self._lock:
            return key in self._ready

    def forget(self) -> None:
        """The tuned session was replaced (OnnxRuntimeEngine._unfuse): the shapes the old one prepared are prepared
        again before the new one runs them, each when next asked for (the shape being prepared now, if any, is
        marked ready when its preparation ends, as before)."""
        with self._lock:
            self._ready.clear()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every shape queued so far is prepared and the quick session's warm-up ended; False when
        ``timeout`` seconds passed first."""
        warming = self._warming
        if warming is not None:
            warming.join(timeout)
            if warming.is_alive():
                return False
        with self._lock:
            return self._lock.wait_for(lambda: self._thread is None, timeout)
