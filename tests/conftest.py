"""Shared fixtures. Real models are exported once per test run: under pytest-xdist the first worker that needs one
makes it and the others load what it made (see :func:`made_once`)."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import pickle
import shutil
import subprocess
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist runs a worker per core: each worker's ONNX Runtime sessions, PyTorch and BLAS (and the trtc
    # processes its tests start, which inherit this) take one thread, instead of one per core each, which on two
    # cores cost a fifth more CPU time in thread hand-offs. Set before numpy and torch read them.
    for _name in ("TRTC_CPU_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


HAS_EXPORT = all(_has(m) for m in ("torch", "torchvision", "onnx", "onnxscript", "onnxruntime"))
needs_export = pytest.mark.skipif(not HAS_EXPORT, reason='needs the export and cpu extras: pip install -e ".[dev]"')


# made-once artifacts that take a minute or more to make: a worker whose test needs one while another worker makes
# it waits, idle, on the lock (see :func:`made_once`)
LONG_MADE_ONCE = {"lite0_int8", "lite0_int8_plain", "lite0_int8_cli"}


def pytest_configure(config):
    # pytest-xdist's default scheduling hands each worker a first chunk of a quarter of its share of consecutive
    # tests, which gave every slow test (sorted first below) to one worker while the others ran out of work after
    # half the run; one test at a time (two queued per worker) gives them out in order, as workers free up
    if hasattr(config.option, "maxschedchunk") and config.option.maxschedchunk is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(config, items):
    # tests marked slow first (a stable sort keeps the rest in order): under pytest-xdist a worker that starts one
    # late is still running it when the others have nothing left, and the run waits for it. A worker must not sit
    # waiting for a LONG_MADE_ONCE artifact while there is other work: the first slow test that needs one starts
    # first (it makes it), the other slow tests that need it follow the slow tests that need none, and the quick
    # tests that need it come last
    def rank(item) -> int:
        slow = item.get_closest_marker("slow") is not None
        wants = LONG_MADE_ONCE & set(item.fixturenames)
        if slow and wants and not wants & claimed:  # the maker: the run's longest chain starts with it
            claimed.update(wants)
            return 0
        if not wants:
            return 1 if slow else 3
        return 2 if slow else 4

    claimed: set[str] = set()
    ranks = {id(item): rank(item) for item in items}
    items.sort(key=lambda item: ranks[id(item)])
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# fixtures that give real models and data: a test using one must not silently skip where they should exist.
# With TRTC_REQUIRE_REAL=1 (set by .ci/run) such a skip is reported as a failure.
REAL_FIXTURES = {"photos", "lite0_export", "lite0_onnx", "resnet18_weights", "resnet18_onnx", "bikes", "mnist",
                 "orientation_model", "lite0_fp16", "lite0_int8", "test_videos", "ray_local", "rtsp", "mosquitto"}


def real_model_skip(item, report) -> str | None:
    """The reason to fail ``report`` (a skip of a real-model test under TRTC_REQUIRE_REAL=1), or None."""
    if not os.environ.get("TRTC_REQUIRE_REAL") or not report.skipped or "gpu" in item.keywords:
        return None
    used = REAL_FIXTURES & set(getattr(item, "fixturenames", ()))
    if not used:
        return None
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return (f"a real-model test (fixtures {', '.join(sorted(used))}) was skipped with TRTC_REQUIRE_REAL=1: "
            f"{reason}")


# On a GPU machine, TRTC_REQUIRE_GPU=1 turns every skip of a `gpu` test into a failure (with the gpu extra broken,
# every GPU test would otherwise skip and the run look green), except skips for what the machine or the gpu extra
# cannot have: a second GPU, TensorRT (not on PyPI as full wheels; tests marked `tensorrt`), OpenCV's CUDA build,
# GPUs on separate NUMA nodes, Debian's gst-rtsp-server (it does not run on the GPU machine's image; the tests that
# can, use aio-rtsp-toolkit's server there). Matched case-insensitively in the skip's reason.
GPU_SKIPS_ALLOWED = ("needs two nvidia gpus", "tensorrt", "opencv", "different numa nodes", "needs gst-rtsp-server")


def gpu_skip(item, report) -> str | None:
    """The reason to fail ``report`` (a skip of a GPU test under TRTC_REQUIRE_GPU=1), or None."""
    if not os.environ.get("TRTC_REQUIRE_GPU") or not report.skipped or "gpu" not in item.keywords:
        return None
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if "tensorrt" in item.keywords or any(a in reason.lower() for a in GPU_SKIPS_ALLOWED):
        return None
    return f"a GPU test was skipped with TRTC_REQUIRE_GPU=1: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    why = real_model_skip(item, report) or gpu_skip(item, report)
    if why:
        report.outcome, report.longrepr = "failed", why


def made_once(tmp_path_factory, name: str, make):
    """``make(folder)`` run once per test run, its result shared by every pytest-xdist worker.

    Without xdist this is ``make(tmp_path_factory.mktemp(name))``. Under xdist the workers of one run share the
    parent of their base temporary folders: the first worker to get here takes an exclusive lock on ``name.lock``
    there, makes the artifact in ``name/`` and pickles what ``make`` returned; a worker that gets the lock after it
    loads that pickle. A ``make`` that raised leaves no pickle, so the next worker tries again (and fails the same
    way, with its own traceback)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    root = Path(tmp_path_factory.getbasetemp()).parent
    done = root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return pickle.loads(done.read_bytes())
        folder = root / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        result = make(folder)
        tmp = done.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(result))
        tmp.replace(done)
        return result


@pytest.fixture(scope="session")
def photos():
    """scikit-image's photos; an error here is an error (a skip would hide every Lite0 test)."""
    from toolchain.datasets import sample_photos

    return sample_photos()


def cli_recording(module, name: str, command: str, folder: Path, **env):
    """``command`` (a `trtc ...` line) run through the CLI as written in ``folder`` (with ``env`` set), recording what
    the library function ``module.name``, which the command calls unchanged, returned to it: (that report, the
    CLI's exit code and output). The command must exit 0 and call the function once."""
    import shlex

    from click.testing import CliRunner

    from toolchain.cli import cli

    reports, plain = [], getattr(module, name)

    def recorded(*args, **kwargs):
        reports.append(plain(*args, **kwargs))
        return reports[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        for key, value in env.items():
            mp.setenv(key, value)
        mp.setattr(module, name, recorded)
        r = CliRunner().invoke(cli, shlex.split(command)[1:])
    assert r.exit_code == 0 and len(reports) == 1, f"{command}\nexit {r.exit_code}\n{r.output}"
    return reports[0], r.exit_code, r.output


# the README tour's export of Lite0: run once per test run, through the CLI as written (:func:`lite0_export_once`);
# every Lite0 test and the tour itself read that run
LITE0_EXPORT = "trtc export pretrained:efficientnet-lite0 -o lite0.onnx --check-data photos/"


def lite0_export_once(tmp_path_factory, photos):
    """LITE0_EXPORT run once per test run (:func:`made_once`) through the CLI, as written, in a folder laid out as
    `trtc data` leaves it (photos/ holding the sample photos): (the folder, the ONNX's absolute path, the report
    export_onnx returned to the CLI, the CLI's exit code and output). The report is recorded by wrapping
    toolchain.export.export_onnx, which the command calls unchanged."""

    def make(folder):
        from toolchain import export as ex

        (folder / "photos").mkdir()
        for p in photos:
            shutil.copy(p, folder / "photos" / Path(p).name)
        report, code, output = cli_recording(ex, "export_onnx", LITE0_EXPORT, folder)
        return folder, folder / "lite0.onnx", report, code, output

    return made_once(tmp_path_factory, "lite0", make)


@pytest.fixture(scope="session")
def lite0_export(tmp_path_factory, photos):
    """The run's one run of the README tour's Lite0 export (:func:`lite0_export_once`)."""
    if not HAS_EXPORT:
        pytest.skip("needs the export extra")
    return lite0_export_once(tmp_path_factory, photos)


@pytest.fixture(scope="session")
def lite0_onnx(lite0_export):
    """EfficientNet-Lite0 (real ImageNet weights) exported once, checked on the real photos: (the ONNX's path, the
    export report), from the README tour's command (:func:`lite0_export_once`)."""
    return lite0_export[1], lite0_export[2]


@pytest.fixture(scope="session")
def resnet18_weights(tmp_path_factory):
    """A ResNet-18 with a 10-class head, random but fixed weights, saved as a checkpoint dict with DataParallel
    'module.' prefixes (the shape users hand us)."""
    if not HAS_EXPORT:
        pytest.skip("needs the export extra")
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    # give BatchNorm non-trivial statistics so that the check exercises real arithmetic
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("r18") / "w.pth"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, path)
    return path, model.eval()


@pytest.fixture(scope="session")
def resnet18_onnx(tmp_path_factory, resnet18_weights, photos):
    from toolchain.export import export_onnx

    weights, _ = resnet18_weights

    def make(d):
        labels = d / "classes.txt"
        labels.write_text("\n".join(f"class-{i}" for i in range(10)) + "\n")
        out = d / "r18.onnx"
        return out, export_onnx("torchvision:resnet18", out, weights=str(weights), num_classes=10,
                                labels=str(labels), check_data=photos)

    return made_once(tmp_path_factory, "r18onnx", make)


def softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


HAS_QUANT = all(_has(m) for m in ("onnx", "onnxruntime"))
needs_quant = pytest.mark.skipif(not HAS_QUANT, reason='needs onnx and onnxruntime: pip install -e ".[dev]"')


def _data(fn):
    from toolchain.errors import MissingDependency

    try:
        return fn()
    except MissingDependency as exc:  # pragma: no cover - the dev extra installs them
        pytest.skip(exc.reason)


@pytest.fixture(scope="session")
def bikes():
    from toolchain.datasets import bikes_video

    if not _has("av"):
        pytest.skip("needs PyAV (the video-cpu extra)")
    return _data(bikes_video)


@pytest.fixture(scope="session")
def mnist(tmp_path_factory):
    """(model path, npz with x/labels of the 5000 digits, x, labels)."""
    from toolchain.datasets import mnist_digits, mnist_model

    model = _data(mnist_model)
    x, labels = _data(mnist_digits)
    npz = tmp_path_factory.mktemp("mnist") / "digits.npz"
    np.savez(npz, x=x, labels=labels)
    return model, npz, x, labels


@pytest.fixture(scope="session")
def orientation_model():
    from toolchain.datasets import orientation_model

    return _data(orientation_model)


def shared_folder(tmp_path_factory, name: str) -> Path:
    """A folder shared by every pytest-xdist worker of this test run (without xdist, one of this run's temporary
    folders): for caches whose entries any worker may write and all may read (each entry is written atomically)."""
    base = Path(tmp_path_factory.getbasetemp())
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def calib_cache(tmp_path_factory):
    """Quantize runs in tests cache calibration under this run's temporary folder, never in the user's ~/.cache;
    the folder is shared by the workers, so a calibration made by one is read by the others."""
    return shared_folder(tmp_path_factory, "calib-cache")


@pytest.fixture(scope="session")
def cli_cache_env(tmp_path_factory):
    """The environment for a `trtc` subprocess: XDG_CACHE_HOME in this run's shared folder, so that the CLI's
    default calibration cache is shared by the tests (never the user's ~/.cache)."""
    return {**os.environ, "XDG_CACHE_HOME": str(shared_folder(tmp_path_factory, "xdg-cache"))}


@pytest.fixture(scope="session")
def lite0_fp16(tmp_path_factory, lite0_onnx, bikes, photos):
    """FP16 Lite0, checked on the photos and every frame of bikes.mp4 (FP16 calibrates on nothing)."""
    from toolchain.quantize import quantize_onnx

    return made_once(tmp_path_factory, "lite0fp16", lambda d: quantize_onnx(
        lite0_onnx[0], d / "lite0.fp16.onnx", precision="fp16", check=[*map(str, photos), str(bikes)]))


# docs/QUANTIZE.md's two INT8 commands. The accuracy-aware search is the costliest step of the suite, and the plain
# one is what tests/cli/test_quantize_gate.py is about: the docs test and the INT8 tests need both on the same files,
# so each runs once per test run, through the CLI as written (:func:`quantize_cli_once`), and all read that run.
LITE0_INT8_T97 = ("trtc quantize lite0.onnx --precision int8 --calib bikes.mp4 --calib-count 64 "
                  "--target-agreement 0.97 -o lite0.int8.t97.onnx")
LITE0_INT8_PLAIN = "trtc quantize lite0.onnx --precision int8 --calib bikes.mp4"


def quantize_cli_once(tmp_path_factory, lite0_onnx, bikes, cache_home: str, command: str):
    """``command`` (a `trtc quantize` line) run once per test run (:func:`made_once`) through the CLI, as written, in
    a folder laid out as `trtc data` leaves it with the run's Lite0 export (lite0.onnx and its manifest, bikes.mp4),
    and with XDG_CACHE_HOME ``cache_home`` (the calibration cache): (the folder, the report quantize_onnx returned
    to the CLI with its file names made absolute, the CLI's exit code and output). The report is recorded by
    wrapping toolchain.quantize.quantize_onnx, which the command calls unchanged."""
    import dataclasses

    def make(folder):
        from toolchain import quantize as q

        shutil.copy(bikes, folder / "bikes.mp4")
        for suffix in ("", ".json"):
            shutil.copy(f"{lite0_onnx[0]}{suffix}", folder / f"lite0.onnx{suffix}")
        report, code, output = cli_recording(q, "quantize_onnx", command, folder, XDG_CACHE_HOME=cache_home)
        report = dataclasses.replace(report, output=str(folder / report.output),
                                     manifest=str(folder / report.manifest),
                                     parent={**report.parent, "file": str(folder / report.parent["file"])})
        return folder, report, code, output

    name = "lite0int8t97" if command == LITE0_INT8_T97 else "lite0int8cli"
    assert command in (LITE0_INT8_T97, LITE0_INT8_PLAIN), command
    return made_once(tmp_path_factory, name, make)


@pytest.fixture(scope="session")
def lite0_int8(tmp_path_factory, lite0_onnx, bikes, cli_cache_env):
    """INT8 Lite0 calibrated on 64 frames of bikes.mp4, accuracy-aware (97% target); the other 186 frames are
    split between tuning the search and the check: the report of LITE0_INT8_T97 (:func:`quantize_cli_once`). Its
    calibration is cached in the run's shared cache (``calibration["cache"]`` names the file)."""
    return quantize_cli_once(tmp_path_factory, lite0_onnx, bikes, cli_cache_env["XDG_CACHE_HOME"], LITE0_INT8_T97)[1]


@pytest.fixture(scope="session")
def lite0_int8_plain(tmp_path_factory, lite0_onnx, bikes, lite0_int8):
    """Plain INT8 Lite0 (every layer INT8, the default graph form) calibrated on the same 64 frames of bikes.mp4 as
    :func:`lite0_int8`, whose calibration cache (the file its report names) it reads, checked on the other 186
    (issue 13: what a default ONNX Runtime session computes)."""
    from toolchain.quantize import quantize_onnx

    return made_once(tmp_path_factory, "lite0int8plain", lambda d: quantize_onnx(
        lite0_onnx[0], d / "lite0.int8.onnx", precision="int8", calib=[str(bikes)], calib_count=64,
        calib_cache=lite0_int8.calibration["cache"]))


@pytest.fixture(scope="session")
def lite0_int8_cli(tmp_path_factory, lite0_onnx, bikes, cli_cache_env):
    """LITE0_INT8_PLAIN, run once (:func:`quantize_cli_once`): the CLI's defaults (128 calibration frames, the
    other 122 to check). Named by the tests that read it, for the test order (LONG_MADE_ONCE)."""
    return quantize_cli_once(tmp_path_factory, lite0_onnx, bikes, cli_cache_env["XDG_CACHE_HOME"], LITE0_INT8_PLAIN)


@pytest.fixture(scope="session")
def test_videos(tmp_path_factory, bikes):
    """Format and bad-input videos derived from bikes.mp4 with PyAV (see toolchain.datasets.make_test_videos)."""
    from toolchain.datasets import make_test_videos

    return made_once(tmp_path_factory, "videos", make_test_videos)


@pytest.fixture(scope="module")
def cpu_lite0(lite0_onnx):
    """The real Lite0 opened with ONNX Runtime on the CPU, once per test module."""
    import engines

    with engines.open_engine(lite0_onnx[0], device="cpu") as eng:
        yield eng
