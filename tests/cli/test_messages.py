"""Small message fixes: every line true, whole and with its fix."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.conftest import needs_export
from toolchain.cli import cli


def run(args):
    return CliRunner().invoke(cli, args)


def test_help_introduces_every_command():
    r = run(["--help"])
    assert r.exit_code == 0
    intro = r.output.split("Options:")[0]
    for name in ("data", "export", "quantize", "build", "inspect", "validate", "bench", "run", "doctor"):
        assert f"\n  {name} " in intro, f"{name} missing from the introduction:\n{intro}"


def test_doctor_never_says_no_no():
    r = run(["doctor"])
    assert r.exit_code == 0, r.output
    assert "no no" not in r.output.replace("\n", " ")


def test_inspect_of_an_onnx_without_manifest_has_no_none(mnist):
    r = run(["inspect", str(mnist[0])])
    assert r.exit_code == 0, r.output
    assert "None" not in r.output and "parent" in r.output and "none recorded" in r.output


def test_missing_source_file_has_a_fix(tmp_path):
    r = run(["export", str(tmp_path / "nope.pt"), "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 2 and "source file not found" in r.output
    assert "  fix: check the path" in r.output


@needs_export
def test_text_file_as_weights_is_named_whole(tmp_path):
    w = tmp_path / "w.pth"
    w.write_text("these are not weights\n")
    r = run(["export", "torchvision:resnet18", "--weights", str(w), "-o", str(tmp_path / "m.onnx")])
    assert r.exit_code == 1, r.output
    err = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert err == [f"error: {w} is not a PyTorch weights file (it looks like a text file)"], r.output
    assert "torch.save(model.state_dict(), path)" in r.output


def test_a_report_warning_goes_to_stderr_and_q_hides_it(lite0_onnx, photos, tmp_path):
    """Issue 25 item 10: quantize's FP16 warning was printed on stdout under the table, even with -q."""
    args = ["quantize", str(lite0_onnx[0]), "--precision", "fp16", "--check", str(photos[0])]
    r = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "a.onnx")])
    assert r.exit_code == 0, r.output
    assert "became 0 in FP16" in r.stderr and "became 0" not in r.stdout, r.output
    assert "warning:" not in r.stdout.lower()
    q = CliRunner().invoke(cli, ["-q", *args, "-o", str(tmp_path / "b.onnx")])
    assert q.exit_code == 0 and q.stderr == "", q.output
    assert "became 0" not in q.stdout and "FP16 model" in q.stdout


def test_cuda_on_a_machine_without_a_gpu_says_so_first(lite0_onnx, monkeypatch):
    """Issue 25 item 10: run --device cuda:0 on a machine with no GPU suggested installing trtc[gpu] (which gives no
    GPU). Without nvidia-smi and without ONNX Runtime's CUDA provider, the missing GPU comes first."""
    import onnxruntime

    import engines
    from engines import _gpu

    monkeypatch.setattr(_gpu.shutil, "which", lambda name: None)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(engines.UsageProblem) as e:
        engines.open_engine(lite0_onnx[0], device="cuda:0")
    assert e.value.reason == ("cuda:0: no NVIDIA GPU found here (nvidia-smi not found (no NVIDIA driver)), and ONNX "
                              "Runtime here has no CUDA execution provider")
    assert e.value.fix.startswith("use --device cpu (on a machine with an NVIDIA GPU: ")


def test_a_missing_core_dependency_is_an_install_problem_not_a_bug(monkeypatch):
    """Run from a checkout with a Python that lacks rich, `trtc doctor` said "internal error ... this is a bug in
    trtc". It is an install without trtc's dependencies: say which and how to install them."""
    import toolchain.cli as cli_module

    def no_rich(*_a, **_k):
        raise ModuleNotFoundError("No module named 'rich'", name="rich")

    monkeypatch.setattr(cli_module.State, "__init__", no_rich)
    r = run(["doctor"])
    assert r.exit_code == 1
    assert "rich, a package trtc needs, is not installed for this Python" in r.output
    assert "fix: install trtc with its dependencies" in r.output and "bug" not in r.output

    def own_bug(*_a, **_k):  # a module trtc imports that is no dependency of it stays a bug
        raise ModuleNotFoundError("No module named 'trtc_missing'", name="trtc_missing")

    monkeypatch.setattr(cli_module.State, "__init__", own_bug)
    assert "this is a bug in trtc" in run(["doctor"]).output


def test_the_core_package_list_is_pyproject_s():
    import re
    from pathlib import Path

    from toolchain.cli import CORE_PACKAGES

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    deps = tomllib.loads(pyproject)["project"]["dependencies"]
    assert sorted(CORE_PACKAGES.values()) == sorted(re.split(r"[<>=!~ \[]", d)[0].lower() for d in deps)


def test_first_line_of_an_error_message():
    from engines.errors import first_line

    assert first_line(RuntimeError("cudnn failed\n  at conv 3\n")) == "cudnn failed"
    assert first_line(RuntimeError("\n\n  out of memory \nmore")) == "out of memory"
    assert first_line(RuntimeError("")) == "RuntimeError"  # str(exc).splitlines()[0] raised IndexError here
    assert first_line(ValueError("x" * 500), 300) == "x" * 300
