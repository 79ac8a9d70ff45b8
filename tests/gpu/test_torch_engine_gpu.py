"""The compiled PyTorch engine on a real GPU: device arrays in and out without host copies, read where they lie,
ordered with the caller's stream through events; FP32 and FP16 (trtc validate against the FP32 ONNX); a batch change
mid-stream; memory flat over passes; a second start loading Inductor's artifacts from beside the model (times
printed); and the video pipeline classifying a clip with it. Skipped without an NVIDIA GPU, CuPy or a CUDA torch."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from toolchain._env import checkout_env

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("cupy", "torch")),
                                 reason="needs the torch and gpu extras (torch with CUDA, cupy)")]
ROOT = Path(__file__).parents[2]
# FP32 on the GPU against ONNX Runtime on the CPU: cuDNN computes FP32 convolutions in TF32 by default (as ONNX
# Runtime's CUDA EP does), about 1e-2 on Lite0's logits
TF32_ATOL = 5e-2


@pytest.fixture(scope="module")
def lite0_pt2(lite0_onnx, tmp_path_factory):
    """Lite0's torch.export program, written by the code of trtc export --program, with the session export's
    manifest (batch 1..32)."""
    import torch

    from engines.manifest import read_manifest
    from toolchain._ui import Reporter
    from toolchain.export import _write_program
    from toolchain.model_source import load_model, parse_source

    loaded = load_model(parse_source("pretrained:efficientnet-lite0"))
    manifest = read_manifest(lite0_onnx[0])
    target = tmp_path_factory.mktemp("lite0pt2") / "lite0.pt2"
    _write_program(target, None, loaded, torch.zeros(2, 3, 224, 224), manifest.batch, manifest, None, 1e-3,
                   Reporter())
    return target


@pytest.fixture(scope="module")
def cuda_program(lite0_pt2):
    import engines

    with engines.open_engine(lite0_pt2, device="cuda:0") as eng:
        yield eng


@pytest.fixture(scope="module")
def photo_batch(photos, lite0_onnx):
    """The photos as Lite0 inputs, repeated to 16 (float32, NCHW)."""
    from engines.manifest import read_manifest
    from toolchain.precision.calibration import image_or_skip

    spec = read_manifest(lite0_onnx[0]).preprocess
    x = np.stack([image_or_skip(p, spec, []) for p in photos])
    return np.concatenate([x] * (16 // len(x) + 1))[:16]


def test_device_arrays_in_and_out_without_host_copies(cuda_program, cpu_lite0, photo_batch, monkeypatch):
    import cupy as cp
    import torch

    from engines.torch_engine import TorchEngine

    assert isinstance(cuda_program, TorchEngine) and cuda_program.compile and cuda_program.cuda_graph
    s = cp.cuda.Stream(non_blocking=True)
    x = cp.asarray(photo_batch)
    cuda_program.infer(x, stream=s)  # compiles and captures
    s.synchronize()
    moved = []
    for owner, name in ((cp, "asnumpy"), (cp.ndarray, "get"), (cp.ndarray, "set"), (torch.Tensor, "cpu"),
                        (torch.Tensor, "numpy"), (torch, "from_numpy")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _r=real, _n=name, **k: (moved.append(_n), _r(*a, **k))[1])
    out = cuda_program.infer(x, stream=s)[0]
    monkeypatch.undo()
    assert moved == [], f"host transfers on the device path: {moved}"
    assert isinstance(out, cp.ndarray) and out.dtype == np.float32 and out.shape == (16, 1000)
    run = next(iter(cuda_program._runs.values()))
    assert x.data.ptr in run.slots, "no graph reads the input where it lies"
    got = cp.asnumpy(out, stream=s)
    ref = cpu_lite0.infer(photo_batch)[0]
    diff = float(np.abs(got - ref).max())
    print(f"Lite0 compiled FP32 (cuda:0) vs ONNX Runtime CPU: max abs logit diff {diff:.2e}; start: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in cuda_program.timings.items()))
    assert (got.argmax(1) == ref.argmax(1)).all() and diff < TF32_ATOL


def test_orders_with_the_callers_stream(cuda_program, photo_batch):
    """The caller's stream is busy (a spinning kernel), then writes the input, then asks for the logits and reads
    them, all without a host synchronisation: the engine must wait for the write (its graph reads the slot in
    place) and the caller's read must wait for the engine."""
    import cupy as cp

    spin = cp.RawKernel(r'''
    extern "C" __global__ void spin(long long cycles) {
        long long start = clock64();
        while (clock64() - start < cycles) {}
    }''', "spin")
    s = cp.cuda.Stream(non_blocking=True)
    x = cp.zeros(photo_batch.shape, cp.float32)
    with s:
        cuda_program.infer(x, stream=s)  # the slot gets its graph (zeros in)
        zeros = cp.asnumpy(cuda_program.infer(x, stream=s)[0], stream=s)
        data = cp.asarray(photo_batch)
    s.synchronize()
    expected = cp.asnumpy(cuda_program.infer(data, stream=s)[0], stream=s)
    s.synchronize()
    spin((1,), (1,), (np.int64(300_000_000),), stream=s)  # ~0.2 s of the caller's stream
    with s:
        x[...] = data
    out = cuda_program.infer(x, stream=s)[0]
    got = cp.asnumpy(out, stream=s)
    s.synchronize()
    assert np.abs(got - zeros).max() > 1.0, "the engine read the input before the caller's stream wrote it"
    assert np.abs(got - expected).max() < 1e-3


def test_nhwc_input_and_a_batch_change_mid_stream(cuda_program, photo_batch):
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    x16 = cp.asarray(photo_batch)
    nhwc = cp.ascontiguousarray(x16.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # channels_last strides
    results = []
    for x in (x16, x16[:5].copy(), x16, nhwc, x16[:1].copy(), x16):
        results.append(cp.asnumpy(cuda_program.infer(x, stream=s)[0], stream=s))
    s.synchronize()
    full = results[0]
    assert np.abs(results[1] - full[:5]).max() < 1e-2 and np.abs(results[4] - full[:1]).max() < 1e-2
    assert np.abs(results[2] - full).max() < 1e-5 and np.abs(results[5] - full).max() < 1e-5  # the same graph
    assert np.abs(results[3] - full).max() < 1e-2 and (results[3].argmax(1) == full.argmax(1)).all()
    assert {k[0] for k in cuda_program._runs} >= {16, 5, 1}


def test_memory_flat_over_ten_passes(cuda_program, photo_batch):
    import cupy as cp
    import torch

    from engines._gpu import memory_used_mib

    s = cp.cuda.Stream(non_blocking=True)
    x = cp.asarray(photo_batch)
    for _ in range(3):
        cuda_program.infer(x, stream=s)
    s.synchronize()
    torch_before, pool_before, smi_before = torch.cuda.memory_allocated(0), cp.get_default_memory_pool().used_bytes(), \
        memory_used_mib(0)
    for _ in range(10):
        out = cuda_program.infer(x, stream=s)[0]
        s.synchronize()
        del out
    torch_after, pool_after, smi_after = torch.cuda.memory_allocated(0), cp.get_default_memory_pool().used_bytes(), \
        memory_used_mib(0)
    print(f"10 passes: torch {torch_before} -> {torch_after} B, CuPy pool {pool_before} -> {pool_after} B, "
          f"nvidia-smi {smi_before} -> {smi_after} MiB")
    assert torch_after == torch_before and pool_after <= pool_before + (1 << 20)
    if smi_before is not None and smi_after is not None:
        assert smi_after - smi_before < 64


def test_the_model_s_function_runs_on_the_engine_s_own_thread(cuda_program, photo_batch, monkeypatch):
    """torch caches cuDNN's plans per thread: the model's function (here, the captures for new input slots) runs on
    the engine's own thread whichever thread calls, so that a new video pipeline's inference thread does not build
    them again (engines._one_thread; 2 s a new thread for Lite0 on an H100); replays stay on the
    caller's. Batches from other threads give the logits the first thread got."""
    import threading

    import cupy as cp

    from engines.torch_engine import TorchEngine

    ran = []
    real = TorchEngine._capture
    monkeypatch.setattr(TorchEngine, "_capture",
                        lambda self, fn, xt: (ran.append(threading.current_thread().name), real(self, fn, xt))[1])
    s = cp.cuda.Stream(non_blocking=True)
    xs = [cp.asarray(photo_batch[:5]) for _ in range(3)]  # three input slots of batch 5 (three addresses)
    outs: dict = {}

    def call(i, again=False):
        out = cuda_program.infer(xs[i], stream=s)[0]
        outs[(i, again)] = cp.asnumpy(out, stream=s)

    call(0)
    for i in (1, 2):
        t = threading.Thread(target=call, args=(i,), name=f"caller-{i}")
        t.start()
        t.join()
    before = len(ran)
    t = threading.Thread(target=call, args=(1, True), name="caller-again")  # a replay: nothing captured
    t.start()
    t.join()
    assert len(ran) == before >= 2, ran
    assert len(set(ran)) == 1 and ran[0].startswith("trtc-torch-run"), ran
    for key, got in outs.items():
        assert np.abs(got - outs[(0, False)]).max() < 1e-3, key


def test_validate_fp32_and_fp16_against_the_onnx(lite0_pt2, lite0_onnx, photos, bikes):
    """trtc validate on the GPU, the FP32 ONNX (ONNX Runtime CUDA) as the reference, photos and bikes.mp4's
    frames: FP32 agrees on every top-1, FP16 (trtc quantize's keep-list in FP32) on at least 99%."""
    from click.testing import CliRunner

    from toolchain.cli import cli

    r = CliRunner().invoke(cli, ["validate", "--reference", str(lite0_onnx[0]), "--candidate", str(lite0_pt2),
                                 "--candidate", f"torch-fp16:{lite0_pt2}", "--data", str(photos[0].parent),
                                 "--data", str(bikes), "--count", "256", "--device", "cuda:0", "--json", "-"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    fp32, fp16 = report["candidates"]
    print(f"validate on {report['data']}: FP32 top-1 {fp32['metrics']['top1_agreement']:.2%}, max|d| "
          f"{fp32['metrics'].get('max_abs_diff')}; FP16 top-1 {fp16['metrics']['top1_agreement']:.2%}")
    assert fp32["kind"] == fp16["kind"] == "torch" and fp16["precision"] == "fp16"
    assert fp32["metrics"]["top1_agreement"] == 1.0
    assert fp16["metrics"]["top1_agreement"] >= 0.99


def test_classify_a_clip_with_the_compiled_engine(lite0_pt2, bikes, cpu_lite0):
    """NVDEC -> the preprocessing kernel, writing channels_last slots (the engine's preferred_layout) -> the compiled
    engine (graphs bound to the pipeline's input slots) gives the CPU pipeline's answers."""
    import engines
    from engines.video import classify

    with engines.open_engine(lite0_pt2, device="cuda:0") as eng:
        assert eng.preferred_layout == "NHWC"
        gpu = {p.frame: p for p in classify([bikes], eng, batch=32)}
        slots = sum(len(r.slots) for r in eng._runs.values())
        layouts = {key[2] for key in eng._runs}
    assert layouts == {"nhwc"}  # compiled for the slots' layout only: no NCHW input reached it
    cpu = {p.frame: p for p in classify([bikes], cpu_lite0, batch=32)}
    assert sorted(gpu) == sorted(cpu) == list(range(250))
    agree = np.mean([gpu[i].indices[0] == cpu[i].indices[0] for i in gpu])
    print(f"bikes.mp4, compiled Lite0 on the GPU pipeline vs the CPU pipeline: top-1 agreement {agree:.2%}, "
          f"{slots} slot graphs")
    assert agree >= 0.99 and slots >= 1


def _model_copy(lite0_pt2, tmp_path) -> Path:
    """The program and its manifest in a folder of their own (the second start finds its artifacts there)."""
    folder = tmp_path / "model"
    folder.mkdir()
    for f in (lite0_pt2, Path(f"{lite0_pt2}.json")):
        shutil.copy(f, folder / f.name)
    return folder


def _fresh_process(code: str, args: list, tmp_path, name: str) -> dict:
    """Run ``code`` in a fresh interpreter with Inductor's and Triton's caches of their own (under ``name``) and this
    repository first on the path (a staged PYTHONPATH kept after it); its last stdout line, as JSON."""
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    env = checkout_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / name), TRITON_CACHE_DIR=str(tmp_path / name / "triton"))
    out = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=580)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


START = textwrap.dedent('''
    import json, sys, time
    t0 = time.perf_counter()
    import cupy as cp
    import engines
    e = engines.open_engine(sys.argv[1], device="cuda:0", precision=sys.argv[2])
    x = cp.asarray(cp.random.default_rng(0).standard_normal((int(sys.argv[3]), 3, 224, 224)), e.inputs[0].numpy_dtype)
    logits = cp.asnumpy(e.infer(x)[0])
    t1 = time.perf_counter()
    ready = e.wait_ready(300)  # the quick start (on by default on a GPU): eager until the function has loaded
    compiled = cp.asnumpy(e.infer(x)[0])  # so this batch runs the compiled function
    stats = list(e.compile_stats.values())[0]
    print(json.dumps({"seconds": t1 - t0, "compiled_seconds": time.perf_counter() - t0, "ready": ready,
                      "cache_file": stats["cache_file"], "eager_batches": stats["eager_batches"],
                      "hit": stats["inductor_cache_hit"], "start": stats["start"], "program_from": e.program_from,
                      "loaded_on": stats["loaded_on"], "preloaded": stats["preloaded"], "timings": e.timings,
                      "logits": logits[:4].tolist(), "compiled": compiled[:4].tolist(),
                      "top1": logits.argmax(1).tolist(), "compiled_top1": compiled.argmax(1).tolist()}))
''')


@pytest.mark.parametrize("precision", ["fp16"])
def test_second_start_uses_the_cache_beside_the_model(lite0_pt2, tmp_path, precision):
    """Two fresh processes, each with an empty Inductor cache of its own: the first compiles and keeps the
    artifacts beside the model, the second loads the plain program and the precompiled function (no
    torch.export.load, no trace, no compile), loading it from open on a thread of its own while the calling thread
    runs the module once eagerly, and computes the same logits (times printed; the target is <= 25% of the first;
    examples/torch_start_cost.py breaks them down). With the quick start (the default on a GPU) the first result
    comes from the module run eagerly, the load held back until then: it agrees with the compiled function's."""
    folder = _model_copy(lite0_pt2, tmp_path)

    def start(name):
        return _fresh_process(START, [folder / "lite0.pt2", precision, "32"], tmp_path, name)

    first, second = start("first"), start("second")
    print(f"Lite0 {precision} batch 32, open + first batch in a fresh process: first start {first['seconds']:.1f} s, "
          f"second {second['seconds']:.1f} s ({second['seconds'] / first['seconds']:.0%}; the compiled function's "
          f"first batch at {second['compiled_seconds']:.1f} s, {second['eager_batches']} batch(es) eagerly before); "
          "second: " + ", ".join(f"{k} {v:.2f} s" for k, v in second["timings"].items()))
    assert list((folder / "lite0.pt2.inductor").glob("*-b32-fp16-*.bin"))
    assert (first["start"], first["program_from"], first["cache_file"]) == ("cold", "export", False)
    assert (second["start"], second["program_from"], second["cache_file"]) == ("precompiled", "cache", True)
    # the default on a GPU: the function (the only one kept, so the newest) loaded from open on a thread of its own
    # while the calling thread ran the module eagerly (cuDNN's plans are per thread: see _PrecompiledLoader)
    assert (second["loaded_on"], second["preloaded"]) == ("trtc-torch-load", True)
    assert second["ready"] and second["eager_batches"] <= 1  # after wait_ready, the next batch ran compiled
    assert second["timings"]["warm_eager_s"] > 0
    # the load waited for the first eager batch (engines.torch_engine.LOAD_HOLD_S at most), so it did not hold the
    # interpreter lock while that first result was made: the first batch ran eagerly, after the eager warm-up
    assert second["eager_batches"] == 1
    assert second["timings"]["precompiled_held_s"] >= second["timings"]["warm_eager_s"]
    np.testing.assert_allclose(second["compiled"], first["compiled"], atol=0.02)  # cuDNN may time other algorithms
    # the first result, eager where the load had not ended (FP16 without Inductor's fusions), or compiled
    np.testing.assert_allclose(second["logits"], second["compiled"], atol=0.1)
    assert second["top1"] == second["compiled_top1"]
    assert second["seconds"] < first["seconds"]


PIPELINE_START = textwrap.dedent('''
    import json, sys, threading, time
    import engines
    from engines import torch_engine as te
    from engines.video import classify

    gate = threading.Event()  # the loader's thread may load only once two batches have come out
    plain_load = te._PrecompiledLoader.load_one

    def gated(self, payload):
        if threading.current_thread().name == "trtc-torch-load":
            assert gate.wait(120), "the gate was not opened"
        return plain_load(self, payload)

    if sys.argv[3] == "gated":
        te._PrecompiledLoader.load_one = gated
    eng = engines.open_engine(sys.argv[1], device="cuda:0")
    top1 = []
    for p in classify([sys.argv[2]] * 4, eng, batch=32):
        top1.append((p.frame, p.indices[0]))
        if len(top1) == 64 and sys.argv[3] == "gated":
            gate.set()
            deadline = time.time() + 120
            while any(t.name == "trtc-torch-load" for t in threading.enumerate()) and time.time() < deadline:
                time.sleep(0.05)  # the pipeline goes on eagerly while the function loads
    stats = list(eng.compile_stats.values())
    print(json.dumps({"top1": top1, "stats": [{k: s[k] for k in ("start", "eager_batches")} for s in stats],
                      "slots": sum(len(r.slots) for r in eng._runs.values()),
                      "eager_left": sum(r.loading is not None for r in eng._runs.values())}))
    eng.close()
''')


def test_quick_start_in_the_video_pipeline_hands_over_to_the_compiled_function(lite0_pt2, bikes, cpu_lite0,
                                                                               tmp_path):
    """A second start in the video pipeline whose precompiled function is held back until two batches have come
    out: those and the batches while it loads run eagerly, then the compiled function takes over mid-stream with
    graphs bound to the pipeline's slots; every frame of four copies of bikes.mp4 is classified, agreeing with the
    CPU pipeline."""
    from engines.video import classify

    folder = _model_copy(lite0_pt2, tmp_path)

    def start(how):
        return _fresh_process(PIPELINE_START, [folder / "lite0.pt2", bikes, how], tmp_path, how)

    first = start("first")  # compiles at batch 32, NHWC, and keeps the function beside the model
    second = start("gated")
    print(f"quick start in the pipeline: {second['stats']}, {second['slots']} slot graphs after the switch")
    assert first["stats"][0]["start"] == "cold"
    (stats,) = second["stats"]
    assert stats["start"] == "precompiled" and 2 <= stats["eager_batches"] < 1000 / 32
    assert second["slots"] >= 1 and second["eager_left"] == 0
    cpu = {p.frame: p.indices[0] for p in classify([bikes], cpu_lite0, batch=32)}
    assert sorted(f for f, _ in second["top1"]) == sorted(list(cpu) * 4)  # every frame of the four copies
    agree = np.mean([top1 == cpu[f] for f, top1 in second["top1"]])
    print(f"top-1 agreement with the CPU pipeline: {agree:.2%}")
    assert agree >= 0.99
