"""The compiled PyTorch engine on the CPU with real models: the program trtc export --program writes (manifest,
atomic, refused for TorchScript), the real Lite0 program against ONNX Runtime on the same export (eagerly, FP32 and
FP16), open_engine's dispatch, a batch change, trtc validate / run through the CLI, and Inductor's cache reused by
a second process (a small net, compiled with Inductor's C++ backend)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import needs_export

pytestmark = needs_export
ROOT = Path(__file__).parents[2]
# Lite0's logits through torch (eager, CPU) and ONNX Runtime (CPU) from the same weights: measured 1.6e-5 on the
# photos; FP16 (weights and activations, the keep-list in FP32) against FP32: measured 0.018
FP32_ATOL = 1e-4
FP16_ATOL = 0.1

TINY = textwrap.dedent('''
    import torch


    class Net(torch.nn.Module):
        def __init__(self, num_classes=10):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.norm = torch.nn.LayerNorm(8)
            self.fc = torch.nn.Linear(8, num_classes)

        def forward(self, x):
            x = torch.relu(self.bn(self.conv(x))).mean((2, 3))
            y = self.fc(self.norm(x))
            return y + 0.1 * torch.softmax(y, -1)


    def build(num_classes=10):
        torch.manual_seed(0)
        return Net(num_classes).eval()
''')


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small net exported with --program through the CLI: (folder, onnx, pt2, the CLI's output)."""
    from toolchain.cli import cli

    d = tmp_path_factory.mktemp("tiny")
    (d / "tinynet.py").write_text(TINY)
    r = CliRunner().invoke(cli, ["export", f"{d / 'tinynet.py'}:build", "-o", str(d / "tiny.onnx"), "--input-size",
                                 "32", "--program", "--json"])
    assert r.exit_code == 0, r.output
    return d, d / "tiny.onnx", d / "tiny.pt2", r.stdout


@pytest.fixture(scope="module")
def lite0_program(lite0_onnx, tmp_path_factory):
    """The real Lite0's program, written by the code trtc export --program runs, with the manifest of the session's
    Lite0 export (the ONNX itself is exported once per session, without --program)."""
    import torch

    from engines.manifest import read_manifest
    from toolchain._ui import Reporter
    from toolchain.export import _write_program
    from toolchain.model_source import load_model, parse_source

    loaded = load_model(parse_source("pretrained:efficientnet-lite0"))
    manifest = read_manifest(lite0_onnx[0])
    target = tmp_path_factory.mktemp("lite0pt2") / "lite0.pt2"
    example = torch.zeros(2, 3, 224, 224)
    report = _write_program(target, None, loaded, example, manifest.batch, manifest, None, 1e-3, Reporter())
    return target, report


@pytest.fixture(scope="module")
def photo_batch(photos, lite0_onnx):
    from engines.manifest import read_manifest
    from toolchain.precision.calibration import image_or_skip

    spec = read_manifest(lite0_onnx[0]).preprocess
    return np.stack([image_or_skip(p, spec, []) for p in photos])


def test_export_program_writes_the_pt2_with_its_manifest(tiny):
    from engines.manifest import read_manifest

    d, onnx, pt2, output = tiny
    report = json.loads(output)
    assert report["program"]["file"] == str(pt2) and report["program"]["check"]["max_abs_diff"] < 1e-5
    m, o = read_manifest(pt2), read_manifest(onnx)  # both hashes checked
    assert m.kind == "program" and o.kind == "onnx"
    assert m.preprocess == o.preprocess and m.batch == o.batch and m.labels == o.labels
    assert [t.to_dict() for t in m.inputs] == [t.to_dict() for t in o.inputs]
    assert m.producer["format"] == "torch.export" and m.producer["onnx_sibling"] == "tiny.onnx"
    assert not [f for f in os.listdir(d) if ".tmp" in f]  # nothing left of the atomic writes


def test_export_program_refuses_what_it_cannot_write(tiny, tmp_path):
    from toolchain.cli import cli

    d, onnx, pt2, _ = tiny
    out = tmp_path / "t.onnx"
    (tmp_path / "t.pt2").write_text("an older program")
    r = CliRunner().invoke(cli, ["export", f"{d / 'tinynet.py'}:build", "-o", str(out), "--input-size", "32",
                                 "--program"])
    assert r.exit_code == 2 and "t.pt2 already exists" in r.output and not out.exists()  # checked before the work
    r = CliRunner().invoke(cli, ["export", str(onnx), "--program"])
    assert r.exit_code == 2 and "--program does not apply to an ONNX model" in r.output


def test_lite0_program_manifest(lite0_program, lite0_onnx):
    from engines.manifest import read_manifest

    pt2, report = lite0_program
    m, o = read_manifest(pt2), read_manifest(lite0_onnx[0])
    assert m.kind == "program" and m.labels == o.labels and m.preprocess == o.preprocess and m.batch == o.batch
    assert report["check"]["max_abs_diff"] < 1e-3 and report["check"]["loaded_back"]
    from toolchain.inspect_artifact import inspect_artifact

    seen = inspect_artifact(pt2)  # trtc inspect m.pt2: described from its manifest, not parsed as an ONNX
    assert seen["kind"] == "program" and seen["runs_here"] and seen["batch"] == o.batch.to_dict()


def test_open_engine_dispatch(lite0_program, lite0_onnx):
    import engines
    from engines.onnxruntime_engine import OnnxRuntimeEngine
    from engines.torch_engine import TorchEngine

    pt2 = lite0_program[0]
    with engines.open_engine(pt2) as e:
        assert isinstance(e, TorchEngine) and e.precision == "fp32" and not e.compile
        assert e.inputs[0].shape == ("batch", 3, 224, 224) and e.outputs[0].shape == ("batch", 1000)
        assert e.manifest.labels[0] == read_label0(lite0_onnx[0])
    with engines.open_engine(f"torch:{pt2}") as e:
        assert isinstance(e, TorchEngine) and e.precision == "fp32"
    with engines.open_engine(lite0_onnx[0]) as e:
        assert isinstance(e, OnnxRuntimeEngine)
    with pytest.raises(engines.UsageProblem, match="INT8 needs TensorRT or ONNX Runtime"):
        engines.open_engine(pt2, precision="int8")
    with pytest.raises(engines.UsageProblem, match="open it with device='cuda:N'"):
        engines.open_engine(pt2).infer(_FakeDevice())


def read_label0(onnx):
    return json.loads(Path(f"{onnx}.json").read_text())["labels"][0]


class _FakeDevice:
    """Looks like a CUDA array to the engine (DLPack device type 2)."""
    shape = (1, 3, 224, 224)

    def __dlpack_device__(self):
        return (2, 0)


def test_lite0_eager_matches_onnxruntime(lite0_program, cpu_session_lite0, photo_batch):
    import engines

    with engines.open_engine(lite0_program[0]) as e:
        got = e.infer(photo_batch)[0]
        one = e.infer(photo_batch[:1])[0]  # a batch change: another size, same answers
        again = e.infer(photo_batch)[0]
    ref = cpu_session_lite0.infer(photo_batch)[0]
    diff = float(np.abs(got - ref).max())
    print(f"Lite0 torch eager vs ONNX Runtime CPU on {len(photo_batch)} photos: max abs logit diff {diff:.2e}")
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert (got.argmax(1) == ref.argmax(1)).all()
    assert diff < FP32_ATOL
    assert np.abs(one - got[:1]).max() < 1e-5 and np.array_equal(again, got)
    with engines.open_engine(lite0_program[0]) as e, pytest.raises(engines.UsageProblem, match="outside"):
        e.infer(np.zeros((33, 3, 224, 224), np.float32))  # the export's range is 1..32


def test_lite0_fp16_program(lite0_program, cpu_session_lite0, photo_batch):
    """FP16 on the CPU (slow: torch's CPU FP16 kernels), two photos: same top-1 as FP32."""
    import engines

    x = photo_batch[:2]
    with engines.open_engine(f"torch-fp16:{lite0_program[0]}") as e:
        assert e.precision == "fp16" and e.inputs[0].dtype == "float16" and e.outputs[0].dtype == "float32"
        got = e.infer(x)[0]  # float32 in: cast inside
    ref = cpu_session_lite0.infer(x)[0]
    diff = float(np.abs(got - ref).max())
    print(f"Lite0 torch FP16 vs ONNX Runtime FP32 on 2 photos: max abs logit diff {diff:.3f}")
    assert got.dtype == np.float32 and (got.argmax(1) == ref.argmax(1)).all() and diff < FP16_ATOL


@pytest.fixture(scope="module")
def cpu_session_lite0(lite0_onnx):
    import engines

    with engines.open_engine(lite0_onnx[0]) as e:
        yield e


def test_validate_the_program_against_its_onnx(lite0_program, lite0_onnx, photos):
    from toolchain.cli import cli

    r = CliRunner().invoke(cli, ["validate", "--reference", str(lite0_onnx[0]), "--candidate", str(lite0_program[0]),
                                 "--data", str(photos[0].parent), "--count", "8", "--json", "-"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    cand = report["candidates"][0]
    assert cand["kind"] == "torch" and cand["precision"] == "fp32" and cand["passed"]
    assert cand["metrics"]["top1_agreement"] == 1.0


def test_run_with_the_program(lite0_program, bikes):
    from toolchain.cli import cli

    r = CliRunner().invoke(cli, ["-q", "run", str(bikes), "--model", str(lite0_program[0]), "--device", "cpu",
                                 "--stride", "50", "--batch", "5"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [p["frame"] for p in lines] == [0, 50, 100, 150, 200]


SECOND_START = textwrap.dedent('''
    import json, os, sys, time
    import numpy as np
    t0 = time.perf_counter()
    import torch
    if len(sys.argv) > 2:
        torch.__version__ = sys.argv[2]  # a torch upgrade, as far as the cache's keys can tell
    if os.environ.get("TRTC_TEST_EAGER_BACKEND") == "1":  # a start that must not use the cache: Dynamo traces,
        import functools  # its graph runs as traced instead of through Inductor (the first start compiled with it)

        torch.compile = functools.partial(torch.compile, backend="eager")
    import engines
    warm = {"": None, "1": True, "0": False}[os.environ.get("TRTC_TEST_WARM_BESIDE_LOAD", "")]
    e = engines.open_engine(sys.argv[1], compile=True, warm_beside_load=warm)
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    logits = e.infer(x)[0]
    stats = list(e.compile_stats.values())[0]
    two = os.environ.get("TRTC_TEST_ONE_BATCH") != "1"
    if two:
        e.infer(x[:2])  # another batch size: its own key
    print(json.dumps({"seconds": time.perf_counter() - t0, "cache_file": stats["cache_file"],
                      "hit": stats["inductor_cache_hit"], "start": stats["start"], "program_from": e.program_from,
                      "loaded_on": stats["loaded_on"], "preloaded": stats["preloaded"],
                      "warm_eager_s": e.timings.get("warm_eager_s"),
                      "batch2": list(e.compile_stats.values())[1]["start"] if two else None,
                      "batch2_preloaded": list(e.compile_stats.values())[1]["preloaded"] if two else None,
                      "logits": logits.tolist()}))
''')


def _fresh_copy(tiny, tmp_path):
    """The tiny program and its manifest copied into ``tmp_path`` (no cache beside them yet), and the start
    script: (pt2, script)."""
    pt2 = tmp_path / "tiny.pt2"
    for suffix in ("", ".json"):
        (tmp_path / f"tiny.pt2{suffix}").write_bytes((tiny[2].parent / f"tiny.pt2{suffix}").read_bytes())
    script = tmp_path / "second_start.py"
    script.write_text(SECOND_START)
    return pt2, script


@pytest.fixture(scope="module")
def first_start(tiny, tmp_path_factory):
    """The tiny program's first start (cold: compiled, its artifacts kept beside the model) made once per test run
    and shared by every worker: (the folder holding tiny.pt2, its manifest and tiny.pt2.inductor/, the start's
    JSON). Each test copies that folder (:func:`_after_first`), so what it damages or adds is its own."""
    from tests.conftest import made_once

    def make(folder):
        pt2, script = _fresh_copy(tiny, folder)
        return folder, _start(script, pt2, folder / "caches")

    return made_once(tmp_path_factory, "tiny-first-start", make)


def _after_first(first_start, tmp_path):
    """``tmp_path`` as the first start left its folder (the model, its manifest, the kept artifacts with their
    modification times): (pt2, script, the first start's JSON)."""
    import shutil

    folder, first = first_start
    for suffix in ("", ".json"):
        shutil.copy2(folder / f"tiny.pt2{suffix}", tmp_path / f"tiny.pt2{suffix}")
    shutil.copytree(folder / "tiny.pt2.inductor", tmp_path / "tiny.pt2.inductor")
    script = tmp_path / "second_start.py"
    script.write_text(SECOND_START)
    return tmp_path / "tiny.pt2", script, first


def _start(script, pt2, caches, *args, warm: str = "", one_batch: bool = False):
    """One start of the engine in a fresh process with an Inductor cache of its own (empty where ``caches`` does
    not exist yet; ``warm``: "1" or "0" opens it with warm_beside_load True or False; "" with the default, off on
    the CPU). It runs batch 4, then batch 2 unless ``one_batch``: a start expected to compile, whose second batch
    would only compile again, and whose compile is Dynamo's trace run by its eager backend (what such a start is
    checked for is that trtc's cache was not used; Inductor's compile is the first start's, and costs 15-20 CPU-s)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches), "PYTHONPATH": str(ROOT),
           "TRTC_TEST_WARM_BESIDE_LOAD": warm, "TRTC_TEST_ONE_BATCH": "1" if one_batch else "",
           "TRTC_TEST_EAGER_BACKEND": "1" if one_batch else ""}
    out = subprocess.run([sys.executable, str(script), str(pt2), *args], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_second_start_loads_the_cache_beside_the_model(first_start, tmp_path):
    """Compiled with Inductor in one process, the artifacts kept beside the model: the program's plain copy, Inductor's
    artifacts and the precompiled function. A second process with an empty Inductor cache of its own loads the program
    from its plain copy (no torch.export.load) and runs the precompiled function (no trace, no compile), with the same
    logits bit for bit; another batch size is compiled (its own key). With warm_beside_load (forced on here; the
    default on a GPU) the function loads on the loader's thread, from open when it is the most recently used one,
    and without it on the calling thread. Damaged files are compiled again, said, not fatal. (On the CPU the second start is not much faster: tests/gpu/test_torch_engine_gpu.py times it on a GPU.)"""
    from engines.torch_engine import precompile_supported, require_torch

    pt2, script, first = _after_first(first_start, tmp_path)
    first_done = time.time()
    folder = tmp_path / "tiny.pt2.inductor"
    assert len(list(folder.glob("program-*-fp32-*.program"))) == 1, "the plain program was not kept"
    assert len(list(folder.glob("*-b4-fp32-nchw-float32-*.bin"))) == 1, "Inductor's artifacts were not kept"
    second = _start(script, pt2, tmp_path / "second", warm="1")
    print(f"tiny net on the CPU: first start {first['seconds']:.1f} s, second {second['seconds']:.1f} s")
    assert (first["start"], first["program_from"], first["cache_file"], first["hit"]) == ("cold", "export", False, False)
    assert second["program_from"] == "cache" and second["cache_file"]
    if precompile_supported(require_torch()):
        b4, b2 = (next(folder.glob(f"*-b{b}-fp32-nchw-float32-*.aot")) for b in (4, 2))
        assert second["start"] == "precompiled"
        # warm beside the load: the function loaded on the loader's thread while this one ran the module eagerly;
        # the newest file at open was batch 2's (written last), so batch 4's was loaded when asked for, not at open
        assert (second["loaded_on"], second["preloaded"]) == ("trtc-torch-load", False)
        assert second["batch2_preloaded"]  # batch 2's load, begun at open, served the second batch
        assert second["warm_eager_s"] > 0
        assert b2.stat().st_mtime >= b4.stat().st_mtime > first_done  # both loaded: marked as used
        os.utime(b4, (time.time() + 5, time.time() + 5))  # batch 4 the most recently used: loaded at open next time
        again = _start(script, pt2, tmp_path / "second", warm="1")
        assert (again["start"], again["loaded_on"], again["preloaded"]) == ("precompiled", "trtc-torch-load", True)
        plain = _start(script, pt2, tmp_path / "second", warm="0")  # as before: loaded on the calling thread
        assert (plain["start"], plain["loaded_on"], plain["preloaded"]) == ("precompiled", "MainThread", False)
        assert plain["warm_eager_s"] is None
        assert again["logits"] == plain["logits"] == first["logits"]
    else:
        assert second["start"] == "inductor cache"
    assert second["logits"] == first["logits"]
    assert first["batch2"] == "cold" and second["batch2"] == second["start"]  # the first start kept batch 2 too
    for damaged in folder.glob("*-b4-*"):
        damaged.write_bytes(damaged.read_bytes()[:100])
    for damaged in folder.glob("program-*"):
        damaged.write_bytes(damaged.read_bytes()[:-10])
    third = _start(script, pt2, tmp_path / "third", one_batch=True)
    assert (third["start"], third["program_from"], third["cache_file"]) == ("cold", "export", False)
    np.testing.assert_allclose(third["logits"], first["logits"], atol=FP32_ATOL)  # eager against Inductor's


@pytest.mark.slow
def test_the_cache_is_not_used_for_another_torch_or_another_model(first_start, tmp_path):
    """A start under another torch version compiles afresh (the kept files are not loaded), and so does a start of a
    replaced model (another hash) with the same file name, which computes the new model's logits."""
    from toolchain.cli import cli

    pt2, script, first = _after_first(first_start, tmp_path)
    upgraded = _start(script, pt2, tmp_path / "upgraded", "9.9.9", one_batch=True)
    assert (upgraded["start"], upgraded["program_from"], upgraded["cache_file"]) == ("cold", "export", False)
    (tmp_path / "other.py").write_text(TINY.replace("manual_seed(0)", "manual_seed(1)"))
    r = CliRunner().invoke(cli, ["export", f"{tmp_path / 'other.py'}:build", "-o", str(tmp_path / "tiny.onnx"),
                                 "--input-size", "32", "--program", "--force"])
    assert r.exit_code == 0, r.output
    replaced = _start(script, pt2, tmp_path / "replaced", one_batch=True)
    assert (replaced["start"], replaced["program_from"], replaced["cache_file"]) == ("cold", "export", False)
    assert replaced["logits"] != first["logits"]


QUICK_START = textwrap.dedent('''
    import json, sys, threading, time
    import numpy as np
    import engines
    from engines import torch_engine as te

    gate = threading.Event()  # the loader's thread may load only once the test opens it
    plain_load = te._PrecompiledLoader.load_one

    def gated(self, payload):
        if threading.current_thread().name == "trtc-torch-load":
            assert gate.wait(30), "the gate was not opened"
        return plain_load(self, payload)

    te._PrecompiledLoader.load_one = gated
    e = engines.open_engine(sys.argv[1], compile=True, warm_beside_load=True, quick_start=True)
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    eager = [e.infer(x)[0].tolist() for _ in range(3)]  # the function cannot have loaded: the gate is shut
    while_loading = len(e.compile_stats)
    ready_before = e.wait_ready(0.2)
    gate.set()
    ready = e.wait_ready(120)
    deadline, after = time.time() + 120, 0
    while not e.compile_stats and time.time() < deadline:  # eager until the switch
        e.infer(x)
        after += 1
    stats = list(e.compile_stats.values())
    print(json.dumps({"eager": eager, "while_loading": while_loading, "after": after, "ready": ready,
                      "ready_before": ready_before,
                      "stats": [{k: s[k] for k in ("start", "eager_batches", "loaded_on")} for s in stats],
                      "compiled": e.infer(x)[0].tolist()}))
''')


@pytest.mark.slow
def test_quick_start_serves_eagerly_while_the_precompiled_function_loads(tiny, first_start, tmp_path):
    """A second start whose precompiled function is held back (the loader's thread waits at a gate): the first
    batches are computed by the module eagerly, agreeing with ONNX Runtime on the same export, and nothing is
    compiled meanwhile; once the gate opens and wait_ready says the load has ended, the next batch runs the compiled
    function, which gives the first start's logits bit for bit, and compile_stats counts the eager batches."""
    import onnxruntime as ort

    from engines.torch_engine import precompile_supported, require_torch

    if not precompile_supported(require_torch()):
        pytest.skip("this torch has no precompiled functions: nothing loads beside the first batch")
    pt2, script, first = _after_first(first_start, tmp_path)
    quick = tmp_path / "quick_start.py"
    quick.write_text(QUICK_START)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "second"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(quick), str(pt2)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["while_loading"] == 0, "something was compiled or loaded while the gate was shut"
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    session = ort.InferenceSession(str(tiny[1]), providers=["CPUExecutionProvider"])
    reference = session.run(None, {session.get_inputs()[0].name: x})[0]
    for eager in got["eager"]:
        np.testing.assert_allclose(np.asarray(eager), reference, atol=FP32_ATOL)
    (stats,) = got["stats"]
    assert (stats["start"], stats["loaded_on"]) == ("precompiled", "trtc-torch-load")
    assert (got["ready_before"], got["ready"]) == (False, True)  # wait_ready: False while held back, then True
    assert got["after"] == 1 and stats["eager_batches"] == 3  # the first batch after the load ran compiled
    assert got["compiled"] == first["logits"]
