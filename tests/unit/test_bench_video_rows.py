"""The video benchmark's repeated runs: the median run is the row, every run's fps is kept, and the table says
what the range means. (Timing itself is only measured on a GPU: docs/BENCHMARKS.md.)"""
import io

import pytest
from rich.console import Console

from toolchain.bench_video import VideoBenchReport, VideoBenchRow, _median_rows
from toolchain.render import render_bench_video


def _row(name, fps):
    return VideoBenchRow(name, 16, 9600, round(9600 / fps, 3), fps)


def _runs(count=3):
    fps = [(3440.0, 3100.0), (3786.0, 3350.0), (3438.0, 3360.0)][:count]
    return [[_row("dec", d), _row("trtc", t)] for d, t in fps]


def test_the_median_run_is_the_row_and_every_run_is_kept():
    dec, ours = _median_rows(_runs(), ceilings=(0,))
    assert dec.fps == 3440.0 and dec.seconds == round(9600 / 3440.0, 3)  # the real run, not an average
    assert dec.fps_runs == [3440.0, 3786.0, 3438.0]
    assert ours.fps == 3350.0 and ours.fps_runs == [3100.0, 3350.0, 3360.0]
    # an even count never flatters trtc: its slower middle run against the decode-only's faster one
    dec, ours = _median_rows(_runs(2), ceilings=(0,))
    assert ours.fps == 3100.0 and dec.fps == 3786.0
    # one run keeps no list
    assert _median_rows(_runs(1))[0].fps_runs is None


def test_the_table_shows_the_range_of_the_runs():
    dec, ours = _median_rows(_runs(), ceilings=(0,))
    ours.vs_decode = round(ours.fps / dec.fps, 3)
    report = VideoBenchReport("clip.mp4", "m.onnx", "cuda:0", 64, [dec, ours], {}, {}, {"gpu": "GPU"}, {},
                              "2026-11-23")
    buf = io.StringIO()
    render_bench_video(Console(file=buf, width=200), report)
    text = buf.getvalue()
    assert "3350.0 (3100-3360)" in text and "3440.0 (3438-3786)" in text
    assert "median of the runs" in text


def test_several_gpus_rows_divide_by_their_own_pipeline_on_one_gpu():
    """`trtc bench --devices cuda:0,cuda:1`: each run measures decode-only on both GPUs, then trtc on both; the
    median runs become the rows; decode-only's `vs 1 GPU` divides by one GPU's decode-only, trtc's by one GPU's
    trtc, and trtc's `vs decode-only` by the two-GPU decode-only (the host's own ceiling)."""
    import types

    from toolchain._ui import Reporter
    from toolchain.bench_video import _several_gpus

    class DecPool:
        fps = iter([8000.0, 9000.0, 8600.0])

        def run(self, n):
            return 2 * n * 600, 2 * n * 600 / next(self.fps)

    class Pool:
        def __init__(self):
            self.calls = []

        def classify(self, sources, batch, top_k):
            self.calls.append(len(sources))
            return _Run(iter([types.SimpleNamespace(latency_ms=None, decode_ms=None)] * (len(sources) * 600)))

    class _Run:
        def __init__(self, it):
            self.it, self.problems = it, []

        def __iter__(self):
            return self.it

    pool = Pool()
    dec, multi = _several_gpus(pool, DecPool(), "clip.mp4", 16, 2, 64, 3, Reporter(),
                               _row("dec one", 4600.0), _row("trtc one", 4500.0))
    assert pool.calls == [32, 32, 32] and dec.streams == multi.streams == 32 and multi.frames == 32 * 600
    assert dec.fps == 8600.0 and dec.fps_runs == [8000.0, 9000.0, 8600.0]  # the median run
    assert dec.vs_one_gpu == round(8600 / 4600, 3)
    assert multi.vs_one_gpu == round(multi.fps / 4500, 3) and multi.vs_decode == round(multi.fps / 8600, 3)
    assert dec.cores_per_stream is None and multi.cores_per_stream is None  # their work is in other processes


def test_bench_devices_must_be_several_gpus(monkeypatch):
    import pytest

    from engines.errors import UsageProblem
    from toolchain.bench_video import bench_video

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("engines._gpu.gpus", lambda: {"devices": [{"index": 0, "name": "NVIDIA H200"}]})
    with pytest.raises(UsageProblem, match=r"no GPU cuda:1 here \(GPUs: cuda:0 \(NVIDIA H200\)\)"):
        bench_video("clip.mp4", "m.onnx", devices="cuda:0,cuda:1")  # as --devices gives it
    with pytest.raises(UsageProblem, match="is not all GPUs"):
        bench_video("clip.mp4", "m.onnx", devices=["cpu", "cpu"])
    with pytest.raises(UsageProblem, match="is one") as err:
        bench_video("clip.mp4", "m.onnx", devices=["cuda:0"])
    assert "leave --devices out" in err.value.fix


def test_the_video_bench_on_a_machine_without_gpu_says_what_to_run_instead(monkeypatch):
    """It used to fail on ONNX Runtime's CUDA provider with the fix "use --device cpu", which the video bench then
    refused ("compares GPU pipelines"): two fixes that sent the user in a circle."""
    import pytest

    from engines.errors import UsageProblem
    from toolchain.bench_video import bench_video

    monkeypatch.setattr("engines._gpu.gpus", lambda: {"devices": [], "reason": "nvidia-smi not found"})
    with pytest.raises(UsageProblem, match="has no NVIDIA GPU") as err:
        bench_video("clip.mp4", "m.onnx")
    assert "--device cpu" in err.value.fix and "trtc run" in err.value.fix
    # with --devices too (it was parsed first, and said "no GPU cuda:0 here (GPUs: none)")
    from click.testing import CliRunner

    from toolchain.cli import cli

    r = CliRunner().invoke(cli, ["bench", "clip.mp4", "--model", "m.onnx", "--devices", "cuda:0,cuda:1"])
    assert r.exit_code == 2 and "has no NVIDIA GPU" in r.output and "GPUs: none" not in r.output, r.output


def test_bench_batches_fit_the_model():
    """A default export takes batches up to 32: `trtc bench clip.mp4 --model lite0.onnx` refused it with "--batch 64
    is above the model's largest batch (32)" (a --batch the user never gave), after starting the several-GPU
    processes. The default is now 64 or the model's largest; a given --batch is checked before any warm-up."""
    import types

    import pytest

    from engines.errors import UsageProblem
    from toolchain.bench_video import _batches

    def engine(first_dim):
        return types.SimpleNamespace(inputs=[types.SimpleNamespace(shape=(first_dim, 3, 224, 224))])

    def manifest(largest):
        return types.SimpleNamespace(batch=types.SimpleNamespace(min=1, opt=8, max=largest))

    assert _batches(engine("batch"), manifest(32), None, 32, 8) == (32, 32, 8)
    assert _batches(engine("batch"), manifest(64), None, 32, 8) == (64, 32, 8)
    assert _batches(engine("batch"), manifest(256), None, 32, 8) == (64, 32, 8)
    assert _batches(engine("batch"), manifest(4), None, 32, 8) == (4, 4, 4)
    assert _batches(engine(1), manifest(1), None, 32, 8) == (1, 1, 1)  # a fixed batch of 1
    assert _batches(engine("batch"), manifest(32), 16, 32, 8) == (16, 32, 8)
    with pytest.raises(UsageProblem, match=r"--batch 64 is above the model's largest batch \(32\)"):
        _batches(engine("batch"), manifest(32), 64, 32, 8)
    with pytest.raises(UsageProblem, match="the model takes batches of exactly 1, not 8"):
        _batches(engine(1), manifest(1), 8, 32, 8)


def test_the_usual_pipeline_runs_on_a_session_of_its_own(monkeypatch):
    """The usual pipeline's partial batches change the input shape; sharing trtc's session, the next trtc run then
    paid ONNX Runtime's cuDNN search again (915 fps against 7186-7215 in the runs after, Lite0 on an H100). The
    bench's own order is kept here, with the pipelines replaced by recorders (the GPU figures: docs/BENCHMARKS.md)."""
    import types

    import engines
    import toolchain.bench_video as bv

    opened, closed, used = [], [], {"ours": set(), "usual": set()}

    def open_engine(model, device="cpu", **options):
        e = types.SimpleNamespace(device_id=0, inputs=[types.SimpleNamespace(shape=("batch", 3, 224, 224))])
        e.close = lambda: closed.append(e)
        opened.append(e)
        return e

    monkeypatch.setattr("engines._gpu.gpus", lambda: {"devices": [{"index": 0, "name": "NVIDIA H100"}]})
    monkeypatch.setattr(engines, "open_engine", open_engine)
    monkeypatch.setattr(engines, "read_manifest", lambda m: types.SimpleNamespace(
        preprocess=None, batch=types.SimpleNamespace(min=1, opt=8, max=64)))
    monkeypatch.setattr(bv, "_decode_only", lambda video, n, gpu: (250 * n, 0.1))
    monkeypatch.setattr(bv, "_decode_only_batched", lambda video, n, gpu: (250 * n, 0.1))
    monkeypatch.setattr(bv, "_ours", lambda video, n, e, batch, **kw: used["ours"].add(id(e)) or (250 * n, 0.2, []))
    monkeypatch.setattr(bv, "_usual", lambda video, n, e, spec, batch: used["usual"].add(id(e)) or (250 * n, 1.0))
    monkeypatch.setattr(bv, "_engine_only", lambda e, spec, sizes, batch, on_device: used["ours"].add(id(e)) or
                        (250 * len(sizes), 0.05))
    monkeypatch.setattr(bv, "gpu_device", lambda gpu: {})
    report = bv.bench_video("clip.mp4", "m.onnx", streams=(1, 4), latency_frames=0, repeat=2, first_result=False)
    assert len(opened) == 2 and len(used["ours"]) == 1 and len(used["usual"]) == 1
    assert used["ours"] != used["usual"]
    assert [id(e) for e in closed] == list(used["usual"])  # the bench's own session, closed at the end
    assert report.batch == 64 and [r.pipeline.split()[0] for r in report.rows[:4]] == ["decode-only", "decode-only",
                                                                                       "usual", "trtc"]


@pytest.mark.parametrize("model, read", [("torch-fp16:m.pt2", "m.pt2"), ("opencv:m.onnx", "m.onnx"),
                                         ("m.onnx", "m.onnx")])
def test_an_engine_prefix_opens_that_engine_and_reads_the_files_manifest(monkeypatch, model, read):
    """`trtc bench VIDEO --model torch-fp16:m.pt2` read the manifest of "torch-fp16:m.pt2" and stopped ("has no
    manifest lite0.pt2.json beside it", on the H100); the engine gets the spec, the manifest comes from the file."""
    import types

    import engines
    import toolchain.bench_video as bv

    opened, read_from = [], []

    def open_engine(spec, device="cpu", **options):
        opened.append(spec)
        e = types.SimpleNamespace(device_id=0, inputs=[types.SimpleNamespace(shape=("batch", 3, 224, 224))])
        e.close = lambda: None
        return e

    monkeypatch.setattr("engines._gpu.gpus", lambda: {"devices": [{"index": 0, "name": "NVIDIA H100"}]})
    monkeypatch.setattr(engines, "open_engine", open_engine)
    monkeypatch.setattr(engines, "read_manifest", lambda m: read_from.append(m) or types.SimpleNamespace(
        preprocess=None, batch=types.SimpleNamespace(min=1, opt=8, max=64)))
    monkeypatch.setattr(bv, "_decode_only", lambda video, n, gpu: (250 * n, 0.1))
    monkeypatch.setattr(bv, "_decode_only_batched", lambda video, n, gpu: (250 * n, 0.1))
    monkeypatch.setattr(bv, "_ours", lambda video, n, e, batch, **kw: (250 * n, 0.2, []))
    monkeypatch.setattr(bv, "_usual", lambda video, n, e, spec, batch: (250 * n, 1.0))
    monkeypatch.setattr(bv, "_engine_only", lambda e, spec, sizes, batch, on_device: (250 * len(sizes), 0.05))
    monkeypatch.setattr(bv, "gpu_device", lambda gpu: {})
    bv.bench_video("clip.mp4", model, streams=(1,), latency_frames=0, repeat=1, first_result=False)
    assert read_from == [read] and set(opened) == {model}


def test_engine_only_runs_the_batches_the_trtc_run_ran_and_the_limit_is_the_lower_ceiling(monkeypatch):
    """The engine-only row: as many batches as the trtc run just before it ran, each of the size it ran (host
    input here; on the GPU each is the full buffer), its frames the pipeline's. trtc's row names the lower of
    decode-only and engine-only and divides by it."""
    import types

    import numpy as np

    import toolchain.bench_video as bv
    from toolchain._ui import Reporter

    sizes = [8] * 5 + [3]
    calls = []
    engine = types.SimpleNamespace(inputs=[types.SimpleNamespace(numpy_dtype=np.dtype(np.float32))],
                                   infer=lambda x: calls.append(x.shape[0]) or [x[:, :2, 0, 0]])
    monkeypatch.setattr(bv, "_ours", lambda video, n, e, batch, **kw: (43 * n, 0.5, [], sizes * n))
    spec = types.SimpleNamespace(size=(16, 16), channels=3)
    other = types.SimpleNamespace(size=(24, 24), channels=3)  # the bench's model's; the engine here is a baseline of its own
    bench = bv._Bench("clip.mp4", engine, other, 0, 8, 8, 1, Reporter(), on_gpu=False)
    shapes = []
    engine.infer = lambda x: calls.append(x.shape[0]) or shapes.append(x.shape[1:]) or [x[:, :2, 0, 0]]
    ours, only = bv._engine_rows(bench, 2, engine, spec, "", "")
    assert ours.batches == only.batches == 12 and only.frames == ours.frames == 86
    assert sorted(calls) == sorted([8, 3] + sizes * 2)  # each size warmed once, then the run's 12 batches
    assert set(shapes) == {(3, 16, 16)}  # the input of the engine's own preprocessing
    assert only.pipeline.startswith("engine-only (bs 8, host numpy input")
    ours.fps = 300.0
    bv.limit(ours, 400.0, 350.0)
    assert ours.limited_by == "engine" and ours.vs_limit == round(300 / 350, 3)
    bv.limit(ours, 320.0, 350.0)
    assert ours.limited_by == "decode" and ours.vs_limit == round(300 / 320, 3)


@pytest.mark.parametrize("preferred", ["NHWC", None])
def test_engine_only_on_the_device_gets_the_layout_the_pipeline_writes_for_the_engine(monkeypatch, preferred):
    """The GPU pipeline writes channels_last slots for an engine that prefers NHWC (the compiled PyTorch engine), so
    engine-only runs it on such a batch too, else its row would time a transpose the pipeline never pays."""
    import types

    import numpy as np

    import toolchain.bench_video as bv
    from engines.preprocess import PreprocessSpec
    from tests import fake_cupy

    fake_cupy.install(monkeypatch)
    seen = []
    engine = types.SimpleNamespace(device_id=0, inputs=[types.SimpleNamespace(numpy_dtype=np.dtype(np.float16))],
                                   infer=lambda x, stream=None: seen.append(x.strides))
    if preferred:
        engine.preferred_layout = preferred
    frames, _ = bv._engine_only(engine, PreprocessSpec(size=(4, 5)), [8, 8, 3], 8, on_device=True)
    assert frames == 19 and len(seen) == 4  # one untimed run, then one per batch
    c, h, w = 3, 4, 5
    want = (h * w * c * 2, 2, w * c * 2, c * 2) if preferred else (c * h * w * 2, h * w * 2, w * 2, 2)
    assert set(seen) == {want}


def test_a_baseline_that_cannot_be_compared_is_refused_before_anything_opens(monkeypatch):
    """--baseline's refusals come before any engine opens (the models here do not exist: an open would fail on the
    path instead), each with its fix; and the CLI refuses the options outside a video benchmark."""
    import pytest
    from click.testing import CliRunner

    from engines.errors import UsageProblem
    from toolchain import bench_video as bv
    from toolchain.cli import cli

    def no_open(*a, **k):
        raise AssertionError("an engine was opened before the refusal")

    monkeypatch.setattr("engines.open_engine", no_open)
    with pytest.raises(UsageProblem, match="is the model itself, opened the same way") as err:
        bv.bench_video("clip.mp4", "m.onnx", device="cpu", baseline="./m.onnx")
    assert "--baseline-tuning off" in err.value.fix
    with pytest.raises(UsageProblem, match="is the model itself"):  # a program against itself: no tuning to vary
        bv.bench_video("clip.mp4", "torch-fp16:m.pt2", device="cpu", baseline="torch-fp16:m.pt2")
    with pytest.raises(UsageProblem, match="does not run on ONNX Runtime") as err:
        bv.bench_video("clip.mp4", "m.onnx", device="cpu", baseline="m.pt2", baseline_tuning="off")
    assert "--baseline-tuning" in err.value.fix
    with pytest.raises(UsageProblem, match="is not auto or off"):
        bv.bench_video("clip.mp4", "m.onnx", device="cpu", baseline="b.onnx", baseline_tuning="graphs")
    # the same file is a fair baseline at other options: it gets as far as opening (here: refused by no_open)
    with pytest.raises(AssertionError, match="was opened"):
        bv.bench_video("clip.mp4", "m.onnx", device="cpu", baseline="m.onnx", baseline_tuning="off")
    with pytest.raises(AssertionError, match="was opened"):
        bv.bench_video("clip.mp4", "m.onnx", device="cpu", baseline="m.onnx", ort_tuning="off")
    r = CliRunner().invoke(cli, ["bench", "m.onnx", "--baseline", "b.onnx"])
    assert r.exit_code == 2 and "for a video benchmark" in r.output and "fix: trtc bench clip.mp4" in r.output
    r = CliRunner().invoke(cli, ["bench", "clip.mp4", "--model", "m.onnx", "--baseline-tuning", "off"])
    assert r.exit_code == 2 and "no --baseline was given" in r.output, r.output


def test_the_model_s_trtc_rows_divide_by_the_baseline_s_of_the_same_runs(monkeypatch):
    """Rows of one stream count with a baseline: the baseline's trtc and engine-only rows come last in every run,
    each of the model's trtc rows (tuned and untuned) gets vs_baseline = its median fps over the baseline's median
    trtc fps, and the baseline's own rows get none."""
    from toolchain import bench_video as bv

    fps = {"": [100.0, 130.0, 120.0], ", onnxruntime untuned": [50.0, 40.0, 45.0],
           ", baseline b.onnx": [60.0, 58.0, 61.0]}
    calls = []

    def engine_rows(bench, n, engine, spec, suffix, again):
        calls.append((suffix, spec))
        f = fps[suffix][len([c for c in calls if c[0] == suffix]) - 1]
        return [bv.VideoBenchRow(f"trtc (x{suffix})", n, 10, 1.0, f),
                bv.VideoBenchRow(f"engine-only (x{suffix})", n, 10, 1.0, 1000.0)]

    monkeypatch.setattr(bv, "_engine_rows", engine_rows)
    monkeypatch.setattr(bv, "_decode_rows", lambda bench, n, again: [bv.VideoBenchRow("decode-only", n, 10, 1.0,
                                                                                      500.0)])
    bench = bv._Bench("clip.mp4", object(), "spec-a", 0, 8, 8, 3, bv.Reporter(), on_gpu=False)
    bench.usual_ok = False  # no usual pipeline here
    bench.untuned = object()
    bench.baseline = (", baseline b.onnx", object(), "spec-b")
    rows = bv._stream_rows(bench, 2, None)
    assert [r.pipeline for r in rows] == ["decode-only", "trtc (x)", "engine-only (x)",
                                          "trtc (x, onnxruntime untuned)", "engine-only (x, onnxruntime untuned)",
                                          "trtc (x, baseline b.onnx)", "engine-only (x, baseline b.onnx)"]
    assert calls[:3] == [("", "spec-a"), (", onnxruntime untuned", "spec-a"), (", baseline b.onnx", "spec-b")]
    assert rows[1].fps == 120.0 and rows[3].fps == 45.0 and rows[5].fps == 60.0  # medians
    assert rows[1].vs_baseline == 2.0 and rows[3].vs_baseline == 0.75
    assert rows[5].vs_baseline is None and all(r.vs_baseline is None for r in rows[::2])
