"""The compiled program of the compiled PyTorch engine (:mod:`engines.torch_engine`) and its cache: the callable that
runs one (batch size, dtype, layout) of the program (the module eagerly, a precompiled function from the cache, or
``torch.compile(dynamic=False)`` run once), and the files beside the model that let a second start skip the trace
and the compile.

The files (``m.pt2.inductor/``; a user cache folder where the model's folder is read-only) are a plain copy of the
program (:func:`~engines.torch_program.plain_program`), Inductor's compiled artifacts and the precompiled function
(Dynamo's AOT precompile), keyed by everything their code depends on (:func:`cache_key`, :func:`program_key`) and
written atomically with their key inside; a cut, corrupt or mismatched file is ignored with a log line and compiled
again. On a GPU a second start loads the precompiled function on a thread of its own (:class:`_PrecompiledLoader`
says why the eager warm-up stays on the engine's thread).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import platform
import re
import threading
import time
from pathlib import Path

from .errors import EngineError, first_line
from .torch_program import (_call, _model_class, file_sha, load_program, module_from_plain, plain_program,
                            require_torch)

log = logging.getLogger("trtc")
CACHE_MAGIC = b"TRTC-INDUCTOR-CACHE 1\n"


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def device_label(device_id: int | None) -> str:
    """``H100-80GB-HBM3-sm90`` style: the GPU's whole name (without the leading NVIDIA) and compute capability, so
    that two GPUs of one architecture (an RTX 4080 and an RTX 4090: Inductor tunes for each) never share compiled
    code; ``cpu-x86_64``."""
    if device_id is None:
        return f"cpu-{platform.machine()}"
    torch = require_torch()
    name = torch.cuda.get_device_name(device_id)
    major, minor = torch.cuda.get_device_capability(device_id)
    return f"{_clean(re.sub(r'^NVIDIA[ ]+', '', name))}-sm{major}{minor}"


def math_label(torch) -> str:
    """``tf32c1m0`` style: whether torch lets cuDNN's convolutions (c) and CUDA matrix products (m) compute FP32 in
    TF32, read now. Inductor compiles what these settings say, and they are process-wide: code compiled under one
    setting is not loaded under the other."""
    conv = int(bool(torch.backends.cudnn.allow_tf32))
    mm = int(bool(torch.backends.cuda.matmul.allow_tf32))
    return f"tf32c{conv}m{mm}"


def cache_key(device: str, torch_version: str, batch: int, precision: str, layout: str, dtype: str,
              model_sha: str, math: str) -> str:
    """One compiled artifact's key: GPU (name and compute capability), torch and Python versions, the TF32 settings
    (``math``, :func:`math_label`), batch size, precision, input layout and dtype, and the model's hash (a replaced
    model never loads another's code)."""
    py = f"py{platform.python_version_tuple()[0]}{platform.python_version_tuple()[1]}"
    return (f"{_clean(device)}-torch{_clean(torch_version)}-{py}-{_clean(math)}-b{batch}-{precision}-{layout}-"
            f"{dtype}-{model_sha[:12]}")


def program_key(torch_version: str, precision: str, model_sha: str) -> str:
    """The key of a program's plain copy (:func:`plain_program`): torch and Python versions (the aten code it holds),
    precision (FP16 casts and weights) and the model's hash; not the GPU or batch size (it holds no compiled code)."""
    py = f"py{platform.python_version_tuple()[0]}{platform.python_version_tuple()[1]}"
    return f"program-torch{_clean(torch_version)}-{py}-{precision}-{model_sha[:12]}"


def plain_bytes(plain: dict) -> bytes:
    buf = io.BytesIO()
    require_torch().save(plain, buf)
    return buf.getvalue()


def read_plain(path: Path, key: str) -> dict | None:
    """The plain program kept in ``path`` for ``key``; None (with a log line) for a missing, damaged or foreign one."""
    payload = read_cache(path, key)
    if payload is None:
        return None
    try:
        plain = require_torch().load(io.BytesIO(payload), weights_only=True)
        if not isinstance(plain, dict) or {"code", "tensors", "kinds", "kept"} - set(plain):
            raise ValueError("not a plain program")
    except Exception as exc:  # noqa: BLE001 - torch.load raises many kinds for damaged bytes
        log.warning("ignored the plain program %s (%s); loading the program itself", path.name, first_line(exc))
        return None
    return plain


_CUDNN_LOCK = threading.Lock()

_CUDNN_STATE = {"depth": 0, "saved": None}


@contextlib.contextmanager
def cudnn_benchmark_on(torch, enabled: bool = True):
    """cuDNN's benchmark mode on inside the block (cuDNN times its convolution algorithms for each new shape and keeps
    the fastest), the caller's setting back after it. The setting is process-wide: other threads' convolutions meanwhile
    are timed too. Nested and concurrent blocks (engines warming up in several threads) share one count: the setting
    the first one found comes back when the last one ends."""
    if not enabled:
        yield
        return
    cudnn = torch.backends.cudnn
    with _CUDNN_LOCK:
        if _CUDNN_STATE["depth"] == 0:
            _CUDNN_STATE["saved"] = bool(cudnn.benchmark)
        _CUDNN_STATE["depth"] += 1
        cudnn.benchmark = True
    try:
        yield
    finally:
        with _CUDNN_LOCK:
            _CUDNN_STATE["depth"] -= 1
            if _CUDNN_STATE["depth"] == 0:
                cudnn.benchmark = _CUDNN_STATE["saved"]


def user_cache_dir() -> Path:
    from ._io import user_cache_dir as cache_of
    return cache_of("inductor")


def cache_dirs(model: Path, model_sha: str) -> list[Path]:
    """Where a model's compiled artifacts are looked for and written: beside the model, then the user's cache."""
    return [model.with_name(model.name + ".inductor"), user_cache_dir() / model_sha[:16]]


def read_cache(path: Path, key: str) -> bytes | None:
    """The payload of a cache file written for ``key``; None (with a log line) for a missing, corrupt or
    mismatched one."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.info("ignored the compile cache %s: %s", path, exc)
        return None
    try:
        if not raw.startswith(CACHE_MAGIC):
            raise ValueError("not a trtc compile cache")
        head, _, payload = raw[len(CACHE_MAGIC):].partition(b"\n")
        meta = json.loads(head)
        if meta.get("key") != key or meta.get("bytes") != len(payload):
            raise ValueError(f"written for {meta.get('key')} ({meta.get('bytes')} bytes), not {key} "
                             f"({len(payload)} bytes)")
    except (ValueError, UnicodeDecodeError) as exc:
        log.warning("ignored the compile cache %s: %s; compiling again", path.name, exc)
        return None
    return payload


def cached_payloads(dirs: list[Path], key: str, suffix: str):
    """(path, payload) of each cache file ``key + suffix`` in ``dirs``, in order, that is whole and written for
    ``key`` (:func:`read_cache`); the caller stops at the first it can use."""
    for folder in dirs:
        path = folder / f"{key}{suffix}"
        payload = read_cache(path, key)
        if payload is not None:
            yield path, payload


def write_cache(dirs: list[Path], key: str, payload: bytes, suffix: str = ".bin") -> Path | None:
    """Write the cache file ``key + suffix`` atomically in the first folder that takes it; None (a log line) where none
    does."""
    from ._io import atomic_write_bytes
    from .errors import TrtcError

    data = CACHE_MAGIC + json.dumps({"key": key, "bytes": len(payload)}).encode() + b"\n" + payload
    for folder in dirs:
        target = folder / f"{key}{suffix}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, data)
            return target
        except (OSError, TrtcError) as exc:
            log.info("cannot keep the compile cache in %s (%s)", folder, getattr(exc, "reason", exc))
    log.warning("could not keep Inductor's compiled code (tried %s): the next start compiles again",
                ", ".join(str(d) for d in dirs))
    return None


def load_cache_artifacts(dirs: list[Path], key: str, add_time) -> Path | None:
    """Load Inductor's artifacts from the first cache file of ``key`` that is whole and meant for it (its seconds to
    ``add_time("cache_load_s", s)``); the file, or None where there is none."""
    torch = require_torch()
    for path, payload in cached_payloads(dirs, key, ".bin"):
        try:
            t0 = time.perf_counter()
            torch.compiler.load_cache_artifacts(payload)
            add_time("cache_load_s", time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - a payload torch cannot read: compile afresh
            log.warning("ignored the compile cache %s: torch cannot load it (%s); compiling again", path.name,
                        first_line(exc))
            continue
        log.info("loaded Inductor's compiled code from %s", path)
        return path
    return None


def save_cache(torch, dirs: list[Path], key: str, aot_suffix: str, aot=None) -> None:
    """Keep Inductor's artifacts (``.bin``) and the precompiled function (``.aot``, where there is one)."""
    try:
        saved = torch.compiler.save_cache_artifacts()
    except Exception as exc:  # noqa: BLE001 - never fail a run for a cache
        log.info("torch could not serialise its compiled code: %s", exc)
        saved = None
    if saved is not None and saved[0]:
        written = write_cache(dirs, key, bytes(saved[0]))
        if written is not None:
            log.info("kept Inductor's compiled code in %s (%d bytes)", written, len(saved[0]))
    data = precompiled_bytes(aot) if aot is not None else None
    if data:
        written = write_cache(dirs, key, data, suffix=aot_suffix)
        if written is not None:
            log.info("kept the precompiled function in %s (%d bytes)", written, len(data))


def newest_whole(dirs: list[Path], pattern: str, suffix: str):
    """(key, its whole payloads) of the most recently used cache file matching ``pattern`` (a glob ending in
    ``suffix``) in ``dirs``, skipping cut or damaged ones; None where there is none."""
    found = []
    for folder in dirs:
        for path in folder.glob(pattern):
            with contextlib.suppress(OSError):
                found.append((path.stat().st_mtime, path))
    for _mtime, path in sorted(found, reverse=True):  # the newest whole one
        key = path.name[:-len(suffix)]
        payloads = list(cached_payloads(dirs, key, suffix))
        if payloads:
            return key, payloads
    return None


# ------------------------------------------------------------------------------------------ precompiled functions
class _Loading:
    """What :meth:`CompiledProgram.compiled` returns for a shape whose precompiled function is still loading, where the
    engine starts quickly (``quick_start``): the module serves its batches eagerly meanwhile."""

    def __init__(self, loader):
        self.loader = loader


# quick start: how long a load begun at open waits for the first eager batch before it goes ahead anyway (a source
# that is slow to give its first frames, e.g. a camera still connecting); see _PrecompiledLoader's ``go``
LOAD_HOLD_S = 5.0

# one load of a precompiled function, or one compile, at a time in a process: Dynamo and Inductor do not say that two
# at once are safe, and a load begun at open for another shape may still run while the first batch loads or compiles
_TORCH_LOCK = threading.RLock()


class _PrecompiledLoader(threading.Thread):
    """Loads a precompiled function (``torch.compiler.load_compiled_function``, which also imports Dynamo and
    Inductor: seconds of Python) from the first of ``payloads`` that loads, on a thread of its own (``start()``) or
    on the caller's (``run()``).

    Why the load goes to another thread and the eager warm-up stays on the caller's, and not the other way round:
    torch keeps cuDNN's execution plans
    in a cache per thread (``thread_local`` in ``aten/src/ATen/native/cudnn/Conv_v8.cpp``; cuDNN's plans are not
    guaranteed thread-safe), so plans that another thread built are built again by the thread that runs the
    compiled function, on its first run. The warm-up must run on the thread that will run the compiled function.

    ``go`` (an event; the engine's quick start): the load waits for it, or for LOAD_HOLD_S seconds, before it begins.
    The engine sets it once its first eager batch has run. The load is seconds of Python (imports, unpickling) that
    holds the interpreter lock; begun at open, it ran beside everything up to that first result (the program's load,
    the caller's first batch, the eager warm-up and batch, each operator of which waits for the lock again after its
    kernel launch) and delayed it. Eager batches serve meanwhile, so the load is not needed before then."""

    def __init__(self, torch, key: str, payloads: list, device_id: int | None, go: threading.Event | None = None):
        # not a daemon: the interpreter waits for a load in progress before it finalises. A daemon thread still in
        # torch's C++ code then is ended by pthread_exit through noexcept frames, which aborts the process
        # ("terminate called without an active exception": once in CI, a start whose load begun at open was for
        # another batch size and still ran when the script ended)
        super().__init__(name="trtc-torch-load", daemon=False)
        self.torch, self.key, self.payloads, self.device_id = torch, key, payloads, device_id
        self.loaded: list = []  # per payload, in order: the loaded function, or the exception loading it raised
        self.supported = True  # False: this torch has no precompiled functions (nothing is loaded)
        self.seconds = 0.0
        self.thread_name = None
        self.at_open = False  # started at open (the model's most recently used function), not at a first batch
        self.served_eager = False  # the calling thread ran batches of this shape eagerly while it loaded
        self.go, self.held_s = go, 0.0  # held_s: how long the load waited for ``go``

    def run(self) -> None:
        if self.go is not None:
            t0 = time.perf_counter()
            self.go.wait(LOAD_HOLD_S)
            self.held_s = time.perf_counter() - t0
        torch, t0 = self.torch, time.perf_counter()
        self.thread_name = threading.current_thread().name
        try:
            with _TORCH_LOCK:
                self._load_all(torch)
        finally:
            self.seconds = time.perf_counter() - t0

    def _load_all(self, torch) -> None:
        try:
            on_gpu = torch.cuda.device(self.device_id) if self.device_id is not None else contextlib.nullcontext()
            with on_gpu:
                self.supported = precompile_supported(torch)
                if not self.supported:
                    return
                _raise_recompile_limit(torch)
                for _path, payload in self.payloads:
                    try:
                        self.loaded.append(self.load_one(payload))
                        break  # the rest are loaded only where this one does not run
                    except Exception as exc:  # noqa: BLE001 - reported, and tried again, by the engine
                        self.loaded.append(exc)
        except Exception as exc:  # noqa: BLE001 - e.g. Dynamo's import failing on this thread: the engine retries
            self.loaded.append(exc)

    def load_one(self, payload: bytes):
        torch = self.torch
        with _TORCH_LOCK, torch._dynamo.config.patch(enable_aot_compile=True):
            return torch.compiler.load_compiled_function(io.BytesIO(payload))


def precompile_supported(torch) -> bool:
    """Whether this torch has Dynamo's AOT precompile (``torch.compile(...).aot_compile``, 2.10 and later; behind
    ``torch._dynamo.config.enable_aot_compile``, off by default in 2.11) and its loader."""
    return hasattr(torch.compiler, "load_compiled_function") and hasattr(torch._dynamo.config, "enable_aot_compile")


def precompiled_bytes(aot) -> bytes | None:
    """The saved form of a precompiled function (``AOTCompiledFunction.serialize``); None (a log line) where torch
    cannot save it."""
    try:
        data = type(aot).serialize(aot)
        data = getattr(data, "serialized_data", data)
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"serialize gave {type(data).__name__}")
        return bytes(data)
    except Exception as exc:  # noqa: BLE001 - never fail a run for a cache
        log.info("torch could not save the precompiled function: %s", first_line(exc))
        return None


def _counter(torch, name: str) -> int:
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"][name])
    except Exception:  # noqa: BLE001 - a torch without the counter: no hit known
        return 0


def _raise_recompile_limit(torch, at_least: int = 64) -> None:
    """One compiled entry per batch size and layout: Dynamo's default of 8 recompiles would run the ninth eagerly."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), at_least * (4 if "accumulated" in name else 1)))


# ---------------------------------------------------------------------------------------------- the compiled program
class CompiledProgram:
    """One engine's program and the callables compiled from it, one per (batch size, dtype, layout), with the loads of
    precompiled functions begun at open or by a quick start. The engine calls :meth:`compiled` from the one thread
    that runs the model's function (on the CPU: the caller's, under the engine's lock); :meth:`wait_ready` and
    :meth:`end_loads` only let the loads go and wait for them."""

    def __init__(self, torch, path: Path, manifest, precision: str, device_id: int | None, tstream, timings: dict, *,
                 compile: bool, cache: bool, progress, precompile: bool, cudnn_benchmark: bool,
                 warm_beside_load: bool, quick_start: bool):
        """Hashes the program, begins the load of its most recently used precompiled function (where the engine
        warms beside the load) and loads its module; ``timings`` (the engine's) gets the seconds of each step.
        ``tstream``: the engine's torch stream on a GPU (a first run is waited for there), None on the CPU."""
        self.path, self.manifest, self.precision, self.device_id = path, manifest, precision, device_id
        self._tstream, self.timings = tstream, timings
        self.compile, self.cache, self.progress, self.precompile = compile, cache, progress, precompile
        self.cudnn_benchmark, self.warm_beside_load, self.quick_start = cudnn_benchmark, warm_beside_load, quick_start
        self._loaders: dict = {}  # key -> a _PrecompiledLoader started at open and not used yet
        # quick start: set when the first eager batch has run; until then a load on its thread waits (LOAD_HOLD_S at
        # most), so that it does not hold the interpreter lock while that first result is made
        self._go = threading.Event() if self.quick_start and self.warm_beside_load else None
        self.compile_stats: dict = {}
        self.program_from = "export"  # or "cache": the plain copy of the program kept beside the model
        self._sha = manifest.artifact.get("sha256", "") if manifest else file_sha(path)
        self._start_preload(torch)
        t1 = time.perf_counter()
        self.module, self.kept_fp32 = self._load_module(torch)
        self.timings["load_program_s"] = time.perf_counter() - t1

    def _load_module(self, torch):
        """The program's module and the nodes kept in FP32: from the plain copy in the cache where there is one
        (no ``torch.export.load``: milliseconds instead of seconds), else loaded from the program, then kept as a plain
        copy for the next start (when compiling). Both compile the same module, so Inductor's caches hit."""
        dtype = torch.float16 if self.precision == "fp16" else torch.float32
        key = program_key(torch.__version__, self.precision, self._sha)
        dirs = cache_dirs(self.path, self._sha) if self.cache and self.manifest is not None else []
        for folder in dirs:
            plain = read_plain(folder / f"{key}.program", key)
            if plain is not None:
                self.program_from = "cache"
                log.info("loaded %s (%s) from its plain copy %s", self.path.name, self.precision, folder)
                return _model_class(torch)(module_from_plain(plain), dtype), plain["kept"]
        module, kept = load_program(self.path, self.precision)
        plain = plain_program(module.gm, kept) if dirs else None
        if plain is None:
            return module, kept
        if self.compile:
            written = write_cache(dirs, key, plain_bytes(plain), suffix=".program")
            if written is not None:
                log.info("kept a plain copy of %s (%s) in %s", self.path.name, self.precision, written)
        return _model_class(torch)(module_from_plain(plain), dtype), kept

    def compiled(self, xt, layout: str):
        """The callable for ``xt``'s shape: the module itself (eager), a precompiled function from the cache (no trace,
        no compile), or ``torch.compile(dynamic=False)`` run once here (Inductor compiles at the first call), Inductor's
        artifacts and the precompiled function loaded from and saved to the cache; or, with ``quick_start`` while the
        precompiled function still loads, a :class:`_Loading` (the caller runs the module meanwhile)."""
        if not self.compile:
            return self.module
        torch = require_torch()
        b, dtype = int(xt.shape[0]), str(xt.dtype).replace("torch.", "")
        key = cache_key(self._device_label(), torch.__version__, b, self.precision, layout, dtype, self._sha,
                        math_label(torch))
        dirs = cache_dirs(self.path, self._sha) if self.cache else []
        what = f"{self.path.name} ({self.precision}) for batch {b} on {self._device_name()}"
        t0 = time.perf_counter()
        # the precompiled function holds Inductor's compiled code for its graph (a bundled entry): Inductor's own
        # artifacts are loaded only to compile. Dynamo is imported by the loader (on its thread where it warms beside
        # the load), not before it.
        self._loaded_on, self._preloaded = None, False
        fn, aot, loaded = self._load_precompiled(torch, dirs, key, xt), None, None
        if isinstance(fn, _Loading):
            self._say(f"running {what} eagerly while its precompiled function loads", loud=False)
            self.add_time("compile_s", time.perf_counter() - t0)
            return fn
        _raise_recompile_limit(torch)
        start, hits = ("precompiled", 0) if fn is not None else (None, _counter(torch, "fxgraph_cache_hit"))
        if fn is not None:
            self._say(f"started {what} from its compile cache (precompiled: no trace, no compile)", loud=False)
        else:
            with _TORCH_LOCK:  # Inductor's artifacts, the trace and the compile: no load beside them
                loaded = load_cache_artifacts(dirs, key, self.add_time)
                where = "from its cache" if loaded else "about 20 s the first time for ResNet-50 on an H100; " + \
                    ("cached beside the model" if self.cache else "not cached")
                self._say(f"compiling {what} ({where})", loud=not loaded)
                fn, aot = self._compile_now(torch, xt, b)
        seconds = time.perf_counter() - t0
        hit = start is None and _counter(torch, "fxgraph_cache_hit") > hits
        start = start or ("inductor cache" if hit else "cold")
        precompiled = start == "precompiled"
        self.compile_stats[(b, dtype, layout)] = {"seconds": seconds, "start": start,
                                                  "cache_file": bool(loaded) or precompiled,
                                                  "inductor_cache_hit": hit, "precompiled": precompiled,
                                                  "loaded_on": self._loaded_on,
                                                  "preloaded": self._preloaded and precompiled, "key": key,
                                                  "eager_batches": 0}
        self.add_time("compile_s", seconds)
        log.info("started %s in %.1f s (%s)", what, seconds, {"precompiled": "precompiled function from the cache",
                 "inductor cache": "traced, Inductor cache hit", "cold": "traced and compiled"}[start])
        if dirs and start != "precompiled":
            with _TORCH_LOCK:
                save_cache(torch, dirs, key, self._aot_suffix(), aot)
        return fn

    def _compile_now(self, torch, xt, b: int):
        """``torch.compile`` run once on ``xt``: precompiled (a function that can be saved, Dynamo's AOT precompile)
        where torch has it and the cache is on, else (or where that fails) plainly. Returns (callable, the precompiled
        function or None)."""
        aot = None
        if self.cache and self.precompile and precompile_supported(torch):
            try:
                with torch._dynamo.config.patch(enable_aot_compile=True):
                    aot = torch.compile(_call, fullgraph=True, dynamic=False).aot_compile(((self.module, xt), {}))
            except Exception as exc:  # noqa: BLE001 - an experimental API: compile as before
                log.info("Dynamo's AOT precompile failed on %s (%s); compiling without it", self.path.name,
                         first_line(exc))
        fn = functools.partial(aot, self.module) if aot is not None else torch.compile(self.module, dynamic=False)
        try:
            self._first_run(torch, fn, xt)
        except Exception as exc:  # noqa: BLE001 - Inductor and Dynamo raise many kinds
            raise EngineError(f"torch.compile failed on {self.path.name} at batch {b}: {first_line(exc)}",
                              "run it eagerly (open_engine(..., compile=False)) and report the model") from exc
        return fn, aot

    def _first_run(self, torch, fn, xt) -> None:
        """Run ``fn`` once (Inductor compiles or loads its kernels, cuDNN times its algorithms) and wait for it."""
        with cudnn_benchmark_on(torch, self.cudnn_benchmark):
            fn(xt)
            if self._tstream is not None:
                self._tstream.synchronize()

    def _start_preload(self, torch):
        """At open, where the engine warms beside the load: a loader of this model's most recently used precompiled
        function (the newest whole ``.aot`` for this GPU, torch and precision, whatever its batch size), started now
        so that it loads while the program loads and the caller prepares its first batch. It waits in
        ``self._loaders`` for the batch size, layout and dtype of its key (a first batch of another shape loads its
        own function, and this one serves a later batch of its shape, or is waited for at close)."""
        if not (self.warm_beside_load and self.compile and self.cache and self.precompile
                and hasattr(torch.compiler, "load_compiled_function")):
            return
        suffix = self._aot_suffix()
        pattern = cache_key(self._device_label(), torch.__version__, "*", self.precision, "*", "*", self._sha,
                            math_label(torch)) + suffix
        dirs = cache_dirs(self.path, self._sha)
        newest = newest_whole(dirs, pattern, suffix)
        if newest is not None:
            key, payloads = newest
            loader = self._loaders[key] = _PrecompiledLoader(torch, key, payloads, self.device_id, self._go)
            loader.at_open = True
            loader.start()

    def _load_precompiled(self, torch, dirs: list[Path], key: str, xt):
        """The precompiled function of ``key`` from the cache, run once on ``xt``; None where there is none, or it does
        not load or run here (a log line; compiled again). With ``warm_beside_load`` it loads on a thread of its own
        (started at open where the key was guessed right) while this thread runs the module once eagerly; with
        ``quick_start``, a :class:`_Loading` instead of waiting while the load goes on (the loader waits in
        ``self._loaders`` for the next batch of this shape, which skips the eager warm-up: the eager batches built
        the plans)."""
        if not (self.precompile and dirs and hasattr(torch.compiler, "load_compiled_function")):
            return None
        loader = self._loaders.pop(key, None)
        if loader is None:
            payloads = list(cached_payloads(dirs, key, self._aot_suffix()))
            if not payloads:
                return None
            loader = _PrecompiledLoader(torch, key, payloads, self.device_id, self._go)
            if self.warm_beside_load:
                loader.start()
        self._preloaded = loader.at_open
        if self.warm_beside_load:
            if not loader.served_eager:  # eager batches on this thread have built cuDNN's plans already
                self._warm_eager(torch, xt)
            if self.quick_start and loader.is_alive():
                loader.served_eager = True
                self._loaders[key] = loader  # looked at again by the next batch of this shape
                return _Loading(loader)
            t0 = time.perf_counter()
            loader.join()
            self.add_time("precompiled_wait_s", time.perf_counter() - t0)
        else:
            loader.run()  # here, on the calling thread
        if not loader.supported:
            return None
        self.add_time("precompiled_load_s", loader.seconds)
        self.add_time("precompiled_held_s", loader.held_s)
        return self._first_that_runs(torch, loader, xt)

    def _first_that_runs(self, torch, loader: _PrecompiledLoader, xt):
        """The first function ``loader`` loaded (or, where it failed, that loads on this thread) that runs on ``xt``;
        None where none does (each failure a log line: the caller compiles)."""
        for i, (path, payload) in enumerate(loader.payloads):
            got = loader.loaded[i] if i < len(loader.loaded) else None
            where = loader.thread_name
            if not callable(got):
                if got is not None:
                    log.info("loading %s on %s failed (%s); loading it on this thread", path.name, where,
                             first_line(got))
                try:
                    t0 = time.perf_counter()
                    got, where = loader.load_one(payload), threading.current_thread().name
                    self.add_time("precompiled_load_s", time.perf_counter() - t0)
                except Exception as exc:  # noqa: BLE001 - a function torch cannot load: compile
                    log.warning("ignored the precompiled function %s (%s); compiling again", path.name,
                                first_line(exc))
                    continue
            fn = functools.partial(got, self.module)
            try:
                t1 = time.perf_counter()
                self._first_run(torch, fn, xt)
                self.add_time("first_run_s", time.perf_counter() - t1)
            except Exception as exc:  # noqa: BLE001 - guards that fail here, or a function that does not run: compile
                log.warning("ignored the precompiled function %s (%s); compiling again", path.name, first_line(exc))
                continue
            log.info("loaded the precompiled function %s on %s", path, where)
            self._loaded_on = where
            with contextlib.suppress(OSError):
                os.utime(path)  # the most recently used: the one a later start loads at open
            return fn
        return None

    def _warm_eager(self, torch, xt) -> None:
        """Run the module once eagerly on ``xt`` (this thread, the engine's stream) while the loader loads the
        precompiled function: cuDNN's execution plans for these convolutions are then built, on this thread, when
        the compiled function first runs here. The interpreter's switch interval is left as it is: a shorter one
        slows the loader, the longer of the two (docs/TORCH.md)."""
        t0 = time.perf_counter()
        try:
            self._first_run(torch, self.module, xt)
        except Exception as exc:  # noqa: BLE001 - the compiled function's own first run says what is wrong
            log.info("the eager warm-up of %s failed: %s", self.path.name, first_line(exc))
        self.add_time("warm_eager_s", time.perf_counter() - t0)

    def served_eagerly(self, xt, layout: str, earlier) -> None:
        """After the switch from eager batches to the loaded function: the count in ``compile_stats`` and its seconds
        from the first batch of the shape (the wait the quick start kept off the batches), said once."""
        stats = self.compile_stats.get((int(xt.shape[0]), str(xt.dtype).replace("torch.", ""), layout))
        if stats is None:
            return
        stats["eager_batches"] = earlier.eager_batches
        stats["seconds"] = time.perf_counter() - earlier.since
        log.info("%s: %d batch(es) of %d ran eagerly while the precompiled function loaded (%.1f s)", self.path.name,
                 earlier.eager_batches, int(xt.shape[0]), stats["seconds"])

    def add_time(self, name: str, seconds: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + seconds

    def _aot_suffix(self) -> str:
        """The precompiled function's guards hold the GPU's index: one file per index (Inductor's are portable)."""
        return ".aot" if self.device_id is None else f".cuda{self.device_id}.aot"

    def _device_label(self) -> str:
        return device_label(self.device_id)

    def _device_name(self) -> str:
        if self.device_id is None:
            return "the CPU"
        return require_torch().cuda.get_device_name(self.device_id)

    def _say(self, text: str, loud: bool = True) -> None:
        """A compilation announced: to ``progress``, else the log (a warning, so the CLI shows it, when it is the
        slow one)."""
        if self.progress is not None:
            self.progress(text)
        else:
            log.log(logging.WARNING if loud else logging.INFO, "%s", text)

    def let_loads_go(self) -> None:
        """The first eager batch has run (quick start): loads waiting for it begin now, and later ones at once."""
        if self._go is not None and not self._go.is_set():
            self._go.set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the precompiled functions loading on their thread (begun at open, or by a quick start) have
        loaded; False when ``timeout`` seconds passed first. The next batch of their shape runs the compiled
        function. (As :meth:`OnnxRuntimeEngine.wait_ready` for its quick start.)"""
        deadline = None if timeout is None else time.perf_counter() + timeout
        self.let_loads_go()  # a caller who waits for them wants them now
        for loader in list(self._loaders.values()):
            loader.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
            if loader.is_alive():
                return False
        return True

    def end_loads(self) -> None:
        """Let every load go and wait for it to end (a load begun at open and not used): the interpreter must not
        finalise while one runs in torch's C++ code (:class:`_PrecompiledLoader`)."""
        self.let_loads_go()
        for loader in self._loaders.values():  # loads begun at open and not used: let them end first
            loader.join()
        self._loaders.clear()
