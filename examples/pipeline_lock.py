"""How much of the interpreter lock the GPU pipeline's own work takes, and what its two session-17 changes do:
16 streams of a clip at batch 64 with a null engine (an ``infer`` that computes nothing), in one process, rounds of
five variants interleaved:

    dec16      decode-only (trtc bench VIDEO's SimpleDecoder row, 16 frames a call)
    null_old   the pipeline as before 3ba2c35/4a42e65: 8 frames a decoder call, the kernel launched through CuPy
    null_b16   16 frames a call, CuPy's launch
    null_drv8  8 frames a call, the launch through the CUDA driver (engines/_launch.py)
    null_new   16 frames a call and the driver launch (as committed, for frames under 960x540)

Prints each variant's median fps, its ratio to decode-only, the process's CPU cores, and the decoder threads' stage
clocks (summed over threads) of the second run: time in the decoder, waiting for input slots, and handing frames on.
With a READY_FILE it then writes its pid there, waits a second and runs null_new for 7 s, for a sampler such as
``py-spy record --gil --pid PID`` to watch.

    python3 examples/pipeline_lock.py bikes8.mp4 lite0.fp16.onnx 3 [READY_FILE]     # from the project root, on a GPU

This ran on an H100 (docs/data/video-before-issue30-h100-2026-11-26.json): no variant slowed there, and the lock was held 34%
of the time with both changes against 55-61% before them on another machine. It is that script with unused imports
removed and this text added; it needs the gpu extra (CuPy, PyNvVideoCodec) and an NVIDIA GPU.
"""
import contextlib, json, os, resource, statistics, sys, time
import cupy as cp
import engines
import engines._launch as L
import engines.video.gpu_pipeline as gp
from engines.video import classify
from toolchain.bench_video import _decode_only_batched

video, model, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
ready = sys.argv[4] if len(sys.argv) > 4 else None
real = engines.open_engine(model, device="cuda:0")


class Null:
    def __init__(self, e):
        self._e, self._out = e, {}
    def __getattr__(self, k):
        if k in ("binds_inputs", "warms_itself"):
            return False
        return getattr(self._e, k)
    def infer(self, x, outputs=None, stream=None):
        b = x.shape[0]
        if b not in self._out:
            self._out[b] = cp.zeros((b, 1000), cp.float16)
        return [self._out[b]]


null = Null(real)


@contextlib.contextmanager
def patched(name):
    old_fpc = gp.frames_per_call
    try:
        if name in ("null_old", "null_drv8"):
            gp.frames_per_call = lambda info: 8
        if name in ("null_old", "null_b16"):
            os.environ["TRTC_KERNEL_LAUNCH"] = "cupy"
        yield
    finally:
        gp.frames_per_call = old_fpc
        os.environ.pop("TRTC_KERNEL_LAUNCH", None)


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pipe(name):
    with patched(name):
        c0, t = cpu(), time.perf_counter()
        run = classify([video] * 16, null, batch=64, top_k=5)
        n = sum(1 for _ in run)
        s = time.perf_counter() - t
        c = cpu() - c0
    st = run.stats
    ds = {k: round(v, 3) for k, v in st.decode_stage.items()}
    inf = {k: round(v, 3) for k, v in st.infer_stage.items()}
    return {"fps": n / s, "s": s, "cores": c / s, "decode_stage": ds, "infer_stage": inf}


def dec(batch):
    c0 = cpu()
    n, s = _decode_only_batched(video, 16, 0, batch=batch)
    return {"fps": n / s, "s": s, "cores": (cpu() - c0) / s}


variants = {"dec16": lambda: dec(16), "null_old": lambda: pipe("null_old"), "null_b16": lambda: pipe("null_b16"),
            "null_drv8": lambda: pipe("null_drv8"), "null_new": lambda: pipe("null_new")}
for f in variants.values():  # warm: decoders, kernels
    f()
rows = {k: [] for k in variants}
for _ in range(rounds):
    for k, f in variants.items():
        rows[k].append(f())
out = {"rounds": rows}
_orig_call, calls = L.DriverLaunch.__call__, []
def _counting(self, *a):
    r = _orig_call(self, *a)
    calls.append(r)
    return r
L.DriverLaunch.__call__ = _counting
pipe("null_new")
L.DriverLaunch.__call__ = _orig_call
out["driver_launches_in_a_new_run"] = [len(calls), sum(1 for c in calls if c)]
print("driver launches (all, accepted):", out["driver_launches_in_a_new_run"], file=sys.stderr)
if ready:  # the GIL window: null runs in a row while py-spy samples
    open(ready, "w").write(str(os.getpid()))
    time.sleep(1.0)
    t = time.perf_counter()
    g = []
    while time.perf_counter() - t < 7.0:
        g.append(pipe("null_new")["fps"])
    out["gil_window_null_fps"] = g
base = statistics.median(r["fps"] for r in rows["dec16"])
for k, v in rows.items():
    m = statistics.median(r["fps"] for r in v)
    extra = ""
    if "decode_stage" in v[0]:
        ds = v[len(v) // 2]["decode_stage"]
        extra = (f" dec {ds.get('waiting_for_decoder_s')} slots {ds.get('waiting_for_slots_s')} "
                 f"launch {ds.get('preprocess_call_s')}")
    print(f"{k:14} {m:8.0f} ({m / base:.3f})  cores {statistics.median(r['cores'] for r in v):.2f} "
          f"runs {[round(r['fps']) for r in v]}{extra}", file=sys.stderr)
print(json.dumps(out))
