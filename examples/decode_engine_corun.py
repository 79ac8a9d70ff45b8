"""Do NVDEC decoding and the engine share the GPU? Decode-only (16 streams of a clip, trtc bench VIDEO's loop) and
engine-only (a model at batch 64 on device-resident input, opened as trtc bench VIDEO opens it), each alone for 8 s,
then both at once in one process (two threads). Prints each rate alone and together, and the fractions of the
alone rates kept together: if they sum to 2 the two share nothing; if to 1, everything.

    python3 examples/decode_engine_corun.py bikes8.mp4 lite0.fp16.onnx      # from the project root, on a GPU

On an H100 (2026-11-26, docs/data/push-queues-video-lite0-h100-2026-11-26.json), Lite0 FP16 (ONNX Runtime) and bikes8.mp4 kept 0.80
(decode) and 0.71 (engine) together: a sum of 1.51. trtc's pipeline, which needs both, ran at 0.81x of the lower of
the two alone in the same process: the two share the GPU, and 0.9x of that lower figure asks for more than these
two loops got at once. Each stage starts at a wall-clock time 40 s ahead (the engine's open and warm-up fit in it),
so the timed windows overlap. This is the script that ran then, unchanged but for this text.
"""
import json, subprocess, sys, time

MODE, VIDEO, MODEL, SECS, START = sys.argv[1:6] if len(sys.argv) > 5 else (None,) * 5


def decode(video, secs, start):
    from toolchain.bench_video import _decode_only
    while time.time() < start:
        time.sleep(0.001)
    n, t, t0 = 0, 0.0, time.perf_counter()
    while time.perf_counter() - t0 < secs:
        k, s = _decode_only(video, 16, 0)
        n += k; t += s
    return n / t


def engine(model, secs, start):
    import cupy as cp, numpy as np
    import engines
    from toolchain.bench_video import engine_options
    e = engines.open_engine(model, device="cuda:0", **engine_options(model, "auto"))
    x = cp.asarray(np.random.default_rng(0).standard_normal((64, 3, 224, 224), dtype=np.float32).astype(e.inputs[0].numpy_dtype))
    s = cp.cuda.Stream(non_blocking=True)
    for _ in range(20):
        e.infer(x, stream=s)
    s.synchronize()
    while time.time() < start:
        time.sleep(0.001)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < secs:
        for _ in range(10):
            e.infer(x, stream=s)
        n += 640
        s.synchronize()
    return n / (time.perf_counter() - t0)


if MODE == "decode":
    print(json.dumps(decode(VIDEO, float(SECS), float(START))))
elif MODE == "both":
    import threading
    r = {}
    t = threading.Thread(target=lambda: r.__setitem__("decode", decode(VIDEO, float(SECS), float(START))))
    t.start()
    r["engine"] = engine(MODEL, float(SECS), float(START))
    t.join()
    print(json.dumps(r))
elif MODE == "engine":
    print(json.dumps(engine(MODEL, float(SECS), float(START))))
else:
    video, model = sys.argv[1:3]
    def go(modes, secs=8):
        start = time.time() + 40
        ps = {m: subprocess.Popen([sys.executable, __file__, m, video, model, str(secs), str(start)], stdout=subprocess.PIPE, text=True) for m in modes}
        return {m: round(float(p.communicate()[0].strip().splitlines()[-1])) for m, p in ps.items()}
    a = go(["decode"]); b = go(["engine"])
    start = time.time() + 40
    p = subprocess.Popen([sys.executable, __file__, "both", video, model, "8", str(start)], stdout=subprocess.PIPE, text=True)
    c = {k: round(v) for k, v in json.loads(p.communicate()[0].strip().splitlines()[-1]).items()}
    print("alone", a, b, "together in one process", c)
    print("fractions together: decode %.3f engine %.3f sum %.3f" % (c["decode"] / a["decode"], c["engine"] / b["engine"], c["decode"] / a["decode"] + c["engine"] / b["engine"]))
