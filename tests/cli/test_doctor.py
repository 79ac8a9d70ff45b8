import json

from click.testing import CliRunner

from tests.conftest import HAS_EXPORT
from toolchain.cli import cli


def test_doctor_json_describes_this_machine():
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report) == {"system", "packages", "gpu", "features"}
    assert report["system"]["python"].count(".") == 2
    for name in ("torch", "onnx", "onnxruntime", "tensorrt", "tensorrt_rtx", "cupy", "PyNvVideoCodec"):
        assert name in report["packages"]
    features = {f["feature"]: f for f in report["features"]}
    export = features["trtc export (PyTorch -> ONNX)"]
    assert export["ok"] is HAS_EXPORT
    for f in report["features"]:  # every "no" says why and how to fix it
        assert f["ok"] or (f["reason"] and f["fix"]), f
    if HAS_EXPORT:
        assert "CPUExecutionProvider" in report["packages"]["onnxruntime"]["providers"]
    if not report["gpu"]["devices"]:
        assert not features["NVDEC video decode (PyNvVideoCodec)"]["ok"]
    cv = report["packages"]["opencv (cv2)"]
    if cv["version"]:  # OpenCV's version and whether its dnn has CUDA (PyPI's wheels: no)
        assert cv["note"].startswith(f"dnn CUDA: {'yes' if cv['dnn_cuda'] else 'no'} (")
        assert features["OpenCV dnn engine on CPU (opencv:model.onnx)"]["ok"]
        gpu_row = features["OpenCV dnn engine on GPU (CUDA backend)"]
        assert gpu_row["ok"] is cv["dnn_cuda"] and (gpu_row["ok"] or "WITH_CUDA=ON" in gpu_row["fix"])


def test_doctor_table():
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 0
    assert "what trtc can do here" in result.output and "trtc export" in result.output


def test_nvdec_caps_lookup_with_a_stand_in_module(monkeypatch):
    """A stand-in for PyNvVideoCodec (NOT the real library) shaped like 2.2.4's pybind11 module, whose chroma
    enum names its members "420"/"444" (not attribute names). The real module ran on an H200: docs/VERIFIED.md."""
    import sys
    import types

    from toolchain import doctor

    calls = []

    class Enum:
        __members__ = {"420": 1, "444": 3}

    fake = types.SimpleNamespace(
        cudaVideoChromaFormat=Enum,
        cudaVideoCodec=types.SimpleNamespace(H264="h264", HEVC="hevc", AV1="av1", VP9="vp9"),
        GetDecoderCaps=lambda gpuid, codec, chromaformat, bitdepth: calls.append((codec, chromaformat, bitdepth)) or {
            "supported": codec != "av1", "width_max": 4096, "height_max": 2304, "num_decoder_engines": 7})
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", fake)
    monkeypatch.setattr(doctor, "is_installed", lambda m: True)
    caps = doctor.nvdec_caps()
    assert caps["H264 420 8-bit"] == "up to 4096x2304, 7 engine(s)"
    assert caps["HEVC 420 10-bit"].startswith("up to") and caps["AV1 420 8-bit"] == "not supported"
    assert ("hevc", 1, 10) in calls and all(c[1] == 1 for c in calls)


def test_several_gpus_and_ray_rows():
    """The rows for issue 12's features: several GPUs of one host need two GPUs and the GPU video stack; Ray needs
    the ray package. Package and GPU reports are this machine's, with the GPU list and installs varied."""
    from toolchain import doctor

    pk = doctor.packages()
    assert pk["ray"]["module"] == "ray"

    def rows(n_gpus, cupy=True, nvc=True, ray=True):
        p = {k: dict(v) for k, v in pk.items()}
        for name, on in (("cupy", cupy), ("PyNvVideoCodec", nvc), ("ray", ray)):
            p[name].update(version="1.0" if on else None, import_error=None)
        gpu = {"devices": [{"index": i, "name": "NVIDIA H200", "compute_capability": "9.0"} for i in range(n_gpus)]}
        return {f["feature"].split(" (")[0]: f for f in doctor.features(p, gpu)}

    several = "Several GPUs of this host"
    assert rows(2)[several]["ok"] and rows(8)[several]["ok"]
    assert rows(1)[several]["reason"] == "this host has 1 GPU" and "--ray" in rows(1)[several]["fix"]
    assert rows(0)[several]["reason"] == "no NVIDIA GPU"
    assert not rows(2, nvc=False)[several]["ok"] and rows(2, nvc=False)[several]["fix"] == 'pip install "trtc[gpu]"'
    assert rows(0)["Ray: trtc run --ray"]["ok"]
    no_ray = rows(2, ray=False)["Ray: trtc run --ray"]
    assert not no_ray["ok"] and no_ray["fix"].startswith('pip install "trtc[ray]"')


def _words(text: str) -> str:
    return " ".join(text.split())


def test_doctor_in_a_pipe_shows_every_fix_whole():
    """Issue 25 item 8: piped (80 columns) the feature column took the width and the fixes shrank to "n...". Below
    100 columns the features are a list, wrapped between words; every reason and fix is there in full."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run([sys.executable, "-m", "toolchain", "doctor"], capture_output=True, text=True, env=env,
                           timeout=120)
    assert piped.returncode == 0, piped.stderr
    report = json.loads(subprocess.run([sys.executable, "-m", "toolchain", "doctor", "--json"], capture_output=True,
                                       text=True, env=env, timeout=120).stdout)
    text = piped.stdout
    assert "…" not in text and "..." not in text, text
    listed = _words(text.split("what trtc can do here", 1)[1])
    for f in report["features"]:
        assert _words(f"{'yes' if f['ok'] else 'no'} {f['feature']}") in listed, f
        if not f["ok"]:
            assert _words(f"{f['feature']}: {f['reason']}") in listed and _words(f"fix: {f['fix']}") in listed, f
    for line in text.split("what trtc can do here", 1)[1].splitlines():
        assert len(line) <= 80 or " " not in line.strip()[60:], line  # wrapped, unless one word is longer


def test_doctor_on_a_wide_console_is_a_table_that_cuts_no_fix():
    import io

    from rich.console import Console

    from toolchain import render

    report = {"system": {}, "packages": {}, "gpu": {"devices": [], "reason": "none"},
              "features": [{"feature": "Several GPUs of this host (run --device cuda:all, bench --devices)",
                            "ok": False, "reason": "no NVIDIA GPU",
                            "fix": "needs a host with two or more NVIDIA GPUs; trtc run --ray spreads sources"}]}
    c = Console(file=io.StringIO(), width=render.DOCTOR_TABLE_WIDTH, highlight=False, color_system=None)
    render.render_doctor(c, report)
    out = c.file.getvalue()
    assert "…" not in out and "Several GPUs of this host (run --device cuda:all, bench --devices)" in out, out
    cells = _words(" ".join(ln.split("│")[3] for ln in out.splitlines() if ln.count("│") == 4))
    assert "needs a host with two or more NVIDIA GPUs; trtc run --ray spreads sources" in cells, out


def test_doctor_checks_that_cupys_kernel_compiler_loads(monkeypatch):
    """Issue 29: GPU preprocessing compiles its CuPy kernel at run time, and on a driver-only box NVRTC is missing
    although CuPy imports. A stand-in cupy (NOT the real library) whose nvrtc.getVersion() fails as cupy-cuda13x's
    does there, then answers; doctor reports the failure with its fix even without a GPU."""
    import sys
    import types

    from toolchain import doctor

    class DynamicLibNotFoundError(RuntimeError):
        pass

    def missing():
        raise DynamicLibNotFoundError("Failure finding \"libnvrtc.so\": libnvrtc.so.13 or libnvrtc.so.12 not found")

    nvrtc = types.SimpleNamespace(getVersion=missing)
    cuda = types.ModuleType("cupy.cuda")
    cuda.nvrtc = nvrtc
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    assert doctor.cupy_nvrtc() == {"nvrtc_error": 'DynamicLibNotFoundError: Failure finding "libnvrtc.so": '
                                                  "libnvrtc.so.13 or libnvrtc.so.12 not found",
                                   "note": "kernel compiler (NVRTC) does not load"}
    monkeypatch.setattr(doctor, "dist_version", lambda *names: "14.0.1" if names[0] in ("cupy-cuda13x",) else None)
    pk = doctor.packages()
    assert pk["cupy"]["version"] == "14.0.1" and "nvrtc_error" in pk["cupy"], pk["cupy"]
    h200 = {"devices": [{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0"}]}
    for gpu in (h200, {"devices": []}):
        row = {f["feature"]: f for f in doctor.features(pk, gpu)}["GPU preprocessing (CuPy)"]
        assert not row["ok"] and row["reason"].startswith("CuPy's kernel compiler (NVRTC) does not load: "
                                                          "DynamicLibNotFoundError"), row
        assert row["fix"].startswith('pip install "cuda-toolkit[nvrtc,cudart]==13.0.*"'), row
    nvrtc.getVersion = lambda: (13, 0)
    pk = doctor.packages()
    assert pk["cupy"]["nvrtc"] == "13.0" and pk["cupy"]["note"] == "kernel compiler: NVRTC 13.0"
    assert {f["feature"]: f for f in doctor.features(pk, h200)}["GPU preprocessing (CuPy)"]["ok"]


def test_doctors_edge_row_accepts_the_dispatch_runtime():
    """Issue 29 item 6: engines runs version-compatible plans on full TensorRT, the lean or the dispatch runtime;
    the edge row accepted only the first two."""
    from toolchain import doctor

    pk = {k: dict(v, version=None, import_error=None) for k, v in doctor.packages().items()}
    h200 = {"devices": [{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0"}]}
    edge = "TensorRT plans: run version-compatible plans (edge)"

    def row(*installed):
        p = {k: dict(v, version="11.4.0.106" if k in installed else None) for k, v in pk.items()}
        return {f["feature"]: f for f in doctor.features(p, h200)}[edge]

    assert row("tensorrt_dispatch")["ok"] and row("tensorrt_lean")["ok"] and row("tensorrt")["ok"]
    assert not row()["ok"] and row()["reason"] == "none of tensorrt, tensorrt_lean, tensorrt_dispatch installed"


def test_bytecode_status_of_a_package_without_importing_it(tmp_path, monkeypatch):
    """The check behind the compiled engine's restart row, on a package made here (never imported): no .pyc and a
    writable folder -> written at first import; the same with PYTHONDONTWRITEBYTECODE (sys.dont_write_bytecode) ->
    missing; after compileall -> cached; a .pyc for __init__ only, with a sampled submodule lacking one -> not
    cached."""
    import compileall
    import sys

    from toolchain import doctor

    pkg = tmp_path / "trtc_fake_pkg"
    (pkg / "_dynamo").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n")
    (pkg / "_dynamo" / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    st = doctor.bytecode_status("trtc_fake_pkg")
    assert st == {"bytecode": "written at first import", "package_dir": str(pkg)}
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert doctor.bytecode_status("trtc_fake_pkg")["bytecode"] == "missing"
    compileall.compile_file(str(pkg / "__init__.py"), quiet=1)
    assert doctor.bytecode_status("trtc_fake_pkg")["bytecode"] == "missing"  # _dynamo still has none
    compileall.compile_dir(str(pkg), quiet=1)
    assert doctor.bytecode_status("trtc_fake_pkg")["bytecode"] == "cached"
    assert "trtc_fake_pkg" not in sys.modules
    assert doctor.bytecode_status("trtc_no_such_package_here") == {}


def test_the_restart_row_gives_the_compileall_line_for_torchs_folder():
    from toolchain import doctor

    pk = doctor.packages()

    def row(**torch):
        p = {k: dict(v) for k, v in pk.items()}
        p["torch"].update(import_error=None, **torch)
        rows = {f["feature"]: f for f in doctor.features(p, {"devices": []})}
        return rows["Compiled PyTorch engine: quick restarts (torch's bytecode cached)"]

    assert row(version="2.11.0", bytecode="cached")["ok"]
    assert row(version="2.11.0", bytecode="written at first import")["ok"]
    bad = row(version="2.11.0", bytecode="missing", package_dir="/opt/torch/site-packages/torch")
    assert not bad["ok"] and "PYTHONDONTWRITEBYTECODE" in bad["reason"]
    assert bad["fix"].startswith("python -m compileall -q -j 0 /opt/torch/site-packages/torch")
    none = row(version=None)
    assert not none["ok"] and none["fix"] == 'pip install "trtc[torch]"'
