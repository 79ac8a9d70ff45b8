"""The quick session's copy of the real EfficientNet-Lite0 (FP32 export and trtc's FP16 copy), its 16 depthwise
convolutions as multiply-adds (engines._quick_model), against the model itself under ONNX Runtime's CPU EP, on the
real photos and frames of bikes.mp4: the copy is what the first batches of `trtc run` are answered with on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from engines.manifest import read_manifest
from tests.conftest import needs_export

pytestmark = needs_export


def _data(model, photos, bikes):
    import onnxruntime as ort

    from toolchain.precision.calibration import load_data

    inp = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).get_inputs()[0]
    spec = read_manifest(model).preprocess
    return load_data([*map(str, photos), str(bikes)], spec, [1, 3, 224, 224], inp.name, 40).x


def _depthwise_count(path) -> int:
    """Conv nodes whose weights are [C, 1, k, k] with group C, counted with onnx alone."""
    import onnx
    from onnx import helper

    m = onnx.load(str(path))
    dims = {t.name: list(t.dims) for t in m.graph.initializer}
    n = 0
    for node in m.graph.node:
        if node.op_type == "Conv":
            group = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "group"), 1)
            w = dims.get(node.input[1])
            n += bool(w and group > 1 and w[1] == 1 and group == w[0])
    return n


@pytest.mark.parametrize("which", ["fp32", "fp16"])
def test_the_quick_copy_of_lite0_answers_as_lite0(which, lite0_onnx, lite0_fp16, photos, bikes):
    import onnxruntime as ort

    from engines._quick_model import depthwise_as_taps

    model = lite0_onnx[0] if which == "fp32" else lite0_fp16.output
    assert _depthwise_count(model) == 16
    copy = depthwise_as_taps(model)
    assert copy is not None and b"trtc_taps15_" in copy and b"trtc_taps16_" not in copy
    x = _data(model, photos, bikes)
    assert len(x) >= 40
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(copy, providers=["CPUExecutionProvider"])
    name = want.get_inputs()[0].name
    a = want.run(None, {name: x})[0].astype(np.float32)
    b = got.run(None, {name: x})[0].astype(np.float32)
    diff = float(np.abs(a - b).max())
    print(f"\nLite0 {which}: quick copy vs model on {len(x)} real inputs: max|d| {diff:.3g}, "
          f"top-1 {np.mean(a.argmax(1) == b.argmax(1)):.0%}")
    assert (a.argmax(1) == b.argmax(1)).all()
    # FP32: the same sums in another order; FP16: the copy's depthwise sums run in FP32, the model's in FP16 kernels
    assert diff < (1e-3 if which == "fp32" else 2e-2) * max(1.0, float(np.abs(a).max()))


def test_a_model_without_depthwise_convolutions_gets_no_copy(resnet18_onnx, lite0_onnx):
    """ResNet-18's convolutions all carry group=1: the quick session opens the file itself."""
    from engines._quick_model import depthwise_as_taps

    assert depthwise_as_taps(resnet18_onnx[0]) is None and depthwise_as_taps(lite0_onnx[0]) is not None


def test_a_quantized_graph_gets_no_float_rewrite(lite0_int8, lite0_fp16):
    """INT8 Lite0 (Q/DQ, accuracy-aware: some convolutions kept in FP16 read their weights through DequantizeLinear
    and Cast): neither the quick copy nor ONNX Runtime's NHWC layout and conv-bias fusion, which are made for float
    graphs; FP16 Lite0 gets all three. The float test reads the file's bytes, without onnx."""
    from engines._quick_model import depthwise_as_taps
    from engines.manifest import is_float_graph
    from engines.onnxruntime_engine import TUNED_CUDA_OPTIONS, tuned_cuda_options

    assert not is_float_graph(lite0_int8.output) and is_float_graph(lite0_fp16.output)
    assert depthwise_as_taps(lite0_int8.output) is None
    assert depthwise_as_taps(lite0_fp16.output) is not None
    assert tuned_cuda_options(lite0_int8.output) == {"cudnn_conv_algo_search": "HEURISTIC"}
    assert tuned_cuda_options(lite0_fp16.output) == TUNED_CUDA_OPTIONS
    # the manifest's precision mode decides without a scan; a file without one is scanned
    assert tuned_cuda_options(lite0_fp16.output, {"mode": "int8"}) == tuned_cuda_options(lite0_int8.output)
    assert tuned_cuda_options(lite0_int8.output, {"mode": "fp16"}) == TUNED_CUDA_OPTIONS


def _keep(path, folder, tag="cpu", monkeypatch=None):
    """quick_session(path) on ONNX Runtime's CPU EP with XDG_CACHE_HOME ``folder``: (session, [(options, model)]
    each session was opened with)."""
    import onnxruntime as ort

    from engines._quick_model import quick_session
    from engines.ort_session import session_options

    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    opened = []

    def open_session(options, model):
        opened.append((options, model))
        return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])

    return quick_session(path, ort, lambda: session_options(ort, 2), open_session, tag), opened


def _answers(session, x):
    return session.run(None, {session.get_inputs()[0].name: x})[0].astype(np.float32)


def _agrees(got, want):
    assert (got.argmax(1) == want.argmax(1)).all()
    assert float(np.abs(got - want).max()) < 1e-3 * max(1.0, float(np.abs(want).max()))


@pytest.fixture(scope="module")
def lite0_inputs(lite0_onnx, photos, bikes):
    """FP32 Lite0, 8 of its real inputs (photos and frames of bikes.mp4) and its own answers to them."""
    import onnxruntime as ort

    model = lite0_onnx[0]
    x = _data(model, photos, bikes)[::5][:8]
    return model, x, _answers(ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]), x)


def test_the_copy_is_kept_optimized_and_a_later_start_loads_it_without_rewriting(lite0_inputs, tmp_path,
                                                                                 monkeypatch):
    """The first start rewrites Lite0 and keeps ONNX Runtime's optimized copy in the cache folder; the next loads
    that file with no optimization and without onnx's rewrite (which would fail here). Both answer as the model
    itself on real inputs."""
    import onnxruntime as ort

    import engines._quick_model as qm

    model, x, want = lite0_inputs
    first, opened = _keep(model, tmp_path, monkeypatch=monkeypatch)
    assert isinstance(opened[0][1], bytes) and b"trtc_taps15_" in opened[0][1]
    kept = list((tmp_path / "trtc" / "quick").iterdir())
    assert len(kept) == 1 and kept[0].suffix == ".onnx", kept  # no temporary file left beside it
    _agrees(_answers(first, x), want)
    monkeypatch.setattr(qm, "depthwise_as_taps", lambda path: 1 / 0)
    later, opened = _keep(model, tmp_path, monkeypatch=monkeypatch)
    assert opened[0][1] == str(kept[0])
    assert opened[0][0].graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    _agrees(_answers(later, x), want)


def test_a_changed_model_or_runtime_never_meets_an_old_copy(lite0_inputs, tmp_path, monkeypatch):
    """The key is the file's content (and the runtime's tag), not its name, size or time: Lite0 with its
    classifier's weights negated (the same size), written over the kept name with the same modification time, gets
    its own copy and answers as itself; another tag, another entry."""
    import os
    import shutil

    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    source, x, _ = lite0_inputs
    model, other = tmp_path / "m.onnx", tmp_path / "negated.onnx"
    m = onnx.load(str(source))
    last = max(m.graph.initializer, key=lambda t: int(np.prod(t.dims)) if len(t.dims) == 2 else 0)  # 1000 x 1280
    last.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(last), last.name))
    onnx.save(m, str(other))
    assert os.path.getsize(other) == os.path.getsize(source)
    shutil.copyfile(source, model)
    stamp = os.stat(model).st_mtime_ns
    _keep(model, tmp_path / "cache", monkeypatch=monkeypatch)
    shutil.copyfile(other, model)
    os.utime(model, ns=(stamp, stamp))
    want = _answers(ort.InferenceSession(str(other), providers=["CPUExecutionProvider"]), x)
    session, opened = _keep(model, tmp_path / "cache", monkeypatch=monkeypatch)
    assert isinstance(opened[0][1], bytes)  # rewritten: the first model's copy was not taken for it
    _agrees(_answers(session, x), want)
    _keep(model, tmp_path / "cache", tag="another runtime", monkeypatch=monkeypatch)
    assert len(list((tmp_path / "cache" / "trtc" / "quick").glob("*.onnx"))) == 3


def test_a_damaged_copy_is_made_again_and_no_cache_folder_still_opens(lite0_inputs, tmp_path, monkeypatch):
    model, x, want = lite0_inputs
    _keep(model, tmp_path, monkeypatch=monkeypatch)
    (kept,) = (tmp_path / "trtc" / "quick").glob("*.onnx")
    kept.write_bytes(b"not a model")
    session, opened = _keep(model, tmp_path, monkeypatch=monkeypatch)
    assert [m if isinstance(m, str) else "copy" for _, m in opened] == [str(kept), "copy"]
    _agrees(_answers(session, x), want)
    _, opened = _keep(model, tmp_path, monkeypatch=monkeypatch)  # the new copy loads
    assert [m for _, m in opened] == [str(kept)]
    (tmp_path / "file").write_text("XDG_CACHE_HOME is a file: no folder can be made under it")
    session, _ = _keep(model, tmp_path / "file", monkeypatch=monkeypatch)
    _agrees(_answers(session, x), want)


def test_a_model_without_depthwise_convolutions_is_marked_and_run_as_it_is(resnet18_onnx, tmp_path, monkeypatch):
    """ResNet-18 needs no copy: the first start reads it once and leaves a mark, so that a later start opens the
    file without onnx (whose rewrite would fail here)."""
    import engines._quick_model as qm

    _, opened = _keep(resnet18_onnx[0], tmp_path, monkeypatch=monkeypatch)
    assert opened[0][1] == str(resnet18_onnx[0])
    assert [p.suffix for p in (tmp_path / "trtc" / "quick").iterdir()] == [".as-is"]
    monkeypatch.setattr(qm, "depthwise_as_taps", lambda path: 1 / 0)
    _, opened = _keep(resnet18_onnx[0], tmp_path, monkeypatch=monkeypatch)
    assert opened[0][1] == str(resnet18_onnx[0])


def test_where_no_copy_can_be_kept_the_quick_session_still_opens(lite0_inputs, tmp_path, monkeypatch):
    """A name in the way of the temporary copy (a folder there), then a full disk in a process whose files may not
    grow past 32 KiB (RLIMIT_FSIZE: ONNX Runtime's save of the 18 MB copy fails midway): each time the quick session
    opens on the rewritten copy, answers as the model, and leaves nothing in the cache folder."""
    import json
    import os
    import subprocess
    import sys
    import threading

    import engines._quick_model as qm
    from engines._io import user_cache_dir

    model, x, want = lite0_inputs
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a"))
    key = qm.cache_key(model, "cpu")
    blocked = user_cache_dir("quick") / f"{key}.{os.getpid()}-{threading.get_ident()}.tmp.onnx"
    blocked.mkdir(parents=True)
    session, opened = _keep(model, tmp_path / "a", monkeypatch=monkeypatch)
    assert len(opened) == 1, "the session was opened to keep a copy where none could be kept"
    assert isinstance(opened[0][1], bytes) and not opened[0][0].optimized_model_filepath
    _agrees(_answers(session, x), want)
    assert sorted(p.name for p in user_cache_dir("quick").iterdir()) == [blocked.name]
    np.save(tmp_path / "x.npy", x)
    code = f"""
import json, resource, signal, sys
import numpy as np, onnxruntime as ort
from engines._quick_model import quick_session
from engines.ort_session import session_options
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, 32 << 10))
opened = []
def open_session(options, m):
    opened.append(bool(options.optimized_model_filepath))
    return ort.InferenceSession(m, sess_options=options, providers=["CPUExecutionProvider"])
s = quick_session({str(model)!r}, ort, lambda: session_options(ort, 1), open_session, "cpu")
x = np.load({str(tmp_path / 'x.npy')!r})
np.save({str(tmp_path / 'got.npy')!r}, s.run(None, {{s.get_inputs()[0].name: x}})[0].astype(np.float32))
print(json.dumps(opened))
"""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "b"), "PYTHONPATH": os.getcwd()}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.splitlines()[-1]) == [True, False]  # the save failed; opened again without it
    _agrees(np.load(tmp_path / "got.npy"), want)
    assert list((tmp_path / "b" / "trtc" / "quick").iterdir()) == []


def test_the_cache_stays_bounded_and_sweeps_dead_processes_temporary_copies(lite0_inputs, tmp_path, monkeypatch):
    """At most CACHE_ENTRIES entries, the least recently used going first (a load counts as a use); a temporary copy
    of a process that is gone is removed when a copy is kept, one of a live process stays; a new rewrite version
    makes a new entry."""
    import os
    import subprocess

    import engines._quick_model as qm

    model, _, _ = lite0_inputs
    monkeypatch.setattr(qm, "CACHE_ENTRIES", 2)
    folder = tmp_path / "trtc" / "quick"
    _keep(model, tmp_path, tag="one", monkeypatch=monkeypatch)
    _keep(model, tmp_path, tag="two", monkeypatch=monkeypatch)
    one = folder / f"{qm.cache_key(model, 'one')}.onnx"
    os.utime(one, (1, 1))  # long unused
    _, opened = _keep(model, tmp_path, tag="one", monkeypatch=monkeypatch)  # loaded: used again, now the newest
    assert opened[0][1] == str(one)
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, live = folder / f"k.{gone.pid}-1.tmp.onnx", folder / f"k.{os.getpid()}-1.tmp.onnx"
    dead.write_bytes(b"half a copy")
    live.write_bytes(b"being written")
    _keep(model, tmp_path, tag="three", monkeypatch=monkeypatch)
    names = {p.name for p in folder.iterdir()}
    assert names == {one.name, f"{qm.cache_key(model, 'three')}.onnx", live.name}, names
    key = qm.cache_key(model, "three")
    monkeypatch.setattr(qm, "REWRITE_VERSION", qm.REWRITE_VERSION + 1)
    assert qm.cache_key(model, "three") != key
    _, opened = _keep(model, tmp_path, tag="three", monkeypatch=monkeypatch)
    assert isinstance(opened[0][1], bytes)  # rewritten again, not the old rewrite's copy
