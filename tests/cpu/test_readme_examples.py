"""Every `trtc` command in README.md's fenced bash blocks, run as written and in order, in a folder prepared the
way the README says (`trtc data`, `cd trtc-data`). Lines marked `# [GPU]`, `# [TensorRT]`, `# [TensorRT-RTX]` are
skipped where that is missing; `# [your files: ...]` lines need a model or data of the reader's own and are
skipped, and listed. Each command must exit 0 and never print "bug in trtc"."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import _has_gpu, needs_export

README = Path(__file__).resolve().parents[2] / "README.md"
# the pages whose bash blocks continue README's tour, in the order of README's documentation table
PAGES = ["CONVENTIONS", "EXPORT", "QUANTIZE", "BUILD", "VALIDATE", "BENCH", "OPENCV", "RUN", "LIVE", "PUSH", "DOCTOR",
         "TRAIN-THEN-DEPLOY", "VERIFIED"]
pytestmark = needs_export


def all_text() -> str:
    """README.md, then each page of PAGES: their bash blocks run in this order."""
    docs = README.parent / "docs"
    return "\n".join([README.read_text()] + [(docs / f"{p}.md").read_text() for p in PAGES])


def readme_commands(text: str) -> list[tuple[str, str]]:
    """(command line, trailing comment) for each logical line of the README's bash blocks, except the demo and
    test commands (the set-up blocks under their HTML markers)."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```bash" and not (i and lines[i - 1].strip().startswith("<!-- ")):
            i += 1
            logical = ""
            while lines[i].strip() != "```":
                logical += lines[i]
                if logical.rstrip().endswith("\\"):
                    logical = logical.rstrip()[:-1] + " "
                else:
                    out.append(logical)
                    logical = ""
                i += 1
        i += 1
    result = []
    for line in out:
        code, _, comment = line.partition(" #")
        if line.lstrip().startswith("#"):
            code, comment = "", line
        if code.strip():
            result.append((" ".join(code.split()), comment.strip()))
    return result


def _why_skip(comment: str) -> str | None:
    if "[repository checkout]" in comment:  # a script of the checkout's examples/: its own test runs it
        return "a script of the repository's checkout (tests/cpu/test_train_then_deploy.py and test_examples_run.py)"
    if "[your files" in comment:
        return "needs the reader's own files"
    if "[GPU]" in comment and not _has_gpu():
        return "needs an NVIDIA GPU"
    if "[TensorRT]" in comment and importlib.util.find_spec("tensorrt") is None:
        return "needs TensorRT"
    if "[TensorRT-RTX]" in comment and importlib.util.find_spec("tensorrt_rtx") is None:
        return "needs TensorRT-RTX"
    for extra, module in EXTRAS.items():
        if f"[{extra} extra]" in comment and importlib.util.find_spec(module) is None:
            return f'needs the {extra} extra (pip install "trtc[{extra}]")'
    return None


# the README's "# [X extra]" lines: packages the demo's environment lacks (the test environment has them)
EXTRAS = {"opencv": "cv2", "ray": "ray"}


def test_lines_that_need_an_extra_the_demo_lacks_are_marked():
    """Issue 25 item 11: "Try it" said every unmarked line runs in the demo's environment, but the OpenCV and
    --ray lines need extras that [demo] does not install."""
    import tomllib

    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    demo = " ".join(extras["demo"]).lower()
    assert "opencv" not in demo and "ray" not in demo  # else the markers are no longer needed
    for line, comment in readme_commands(all_text()):
        uses = {"opencv": "opencv" in line, "ray": " --ray" in line}
        for extra, used in uses.items():
            if used and "[GPU]" not in comment and "[your files" not in comment:
                assert f"[{extra} extra]" in comment, line


def test_every_docs_page_is_in_the_readme_table_and_in_this_test():
    """Each page the README's documentation table lists is one whose commands run here (or a page of figures)."""
    import re

    linked = set(re.findall(r"\(docs/([A-Z-]+)\.md\)", README.read_text()))
    # pages of figures, of internals or of how the tests work, with no commands of the tour; BRING-YOUR-OWN-ONNX's commands need
    # a model of the reader's own; TORCH's run on a GPU (its export would redo the tour's Lite0 export)
    assert set(PAGES) <= linked and linked - set(PAGES) <= {"BENCHMARKS", "INTERNALS", "CLUSTER", "TESTING",
                                                            "BRING-YOUR-OWN-ONNX", "EDGE", "TORCH"}
    for p in linked:
        assert (README.parent / "docs" / f"{p}.md").is_file(), p


def test_parser_reads_continuations_and_markers():
    cmds = readme_commands(all_text())
    assert cmds[0] == (". .venv/bin/activate", "the environment the demo made")
    assert cmds[1][0] == "trtc data" and cmds[2] == ("cd trtc-data", "")
    val = [c for c, _ in cmds if c.startswith("trtc validate --reference lite0.onnx")]
    assert len(val) >= 2 and val[1].endswith("--json report.json --html report.html")  # the tour's, then VALIDATE's
    # a line that is not a trtc command carries a visible mark saying what runs it instead
    odd = [c for c, comment in cmds if not c.startswith(("trtc ", "cd ", ". "))
           and "[repository checkout]" not in comment]
    assert not odd, odd
    assert any(c.startswith("python ../examples/train_then_deploy.py") for c, _ in cmds)  # no block is hidden


@pytest.mark.slow  # 3-4 minutes on two cores: an export, three quantizations (one accuracy-aware), a validation
def test_every_readme_command_runs_as_written(tmp_path, monkeypatch, cli_cache_env):
    from toolchain.cli import cli

    monkeypatch.chdir(tmp_path)
    # the calibration cache: not the user's ~/.cache but the run's, which the other `trtc quantize` runs of the same
    # export (it is byte for byte the session's) and bikes.mp4 share
    monkeypatch.setenv("XDG_CACHE_HOME", cli_cache_env["XDG_CACHE_HOME"])
    ran, skipped = [], []
    for line, comment in readme_commands(all_text()):
        if line.startswith(". "):
            continue  # activating the environment: this test already runs in it
        if line.startswith("cd "):
            monkeypatch.chdir(Path(line[3:]).expanduser())
            continue
        why = _why_skip(comment)
        if why:
            skipped.append(f"{line}  ({why})")
            continue
        r = CliRunner().invoke(cli, shlex.split(line)[1:])
        assert "bug in trtc" not in r.output, f"{line}\n{r.output}"
        assert r.exit_code == 0, f"{line}\nexit {r.exit_code}\n{r.output}"
        ran.append(line)
    print(f"README: ran {len(ran)} commands, skipped {len(skipped)}:\n  " + "\n  ".join(skipped))
    assert len(ran) >= 12  # data, export, 3 x quantize, inspect, validate, bench, 2 x run, 2 x doctor
    names = {p.name for p in Path.cwd().iterdir()}
    assert {"lite0.onnx", "lite0.fp16.onnx", "lite0.int8.onnx", "lite0.int8.t97.onnx", "report.json", "report.html",
            "preds.jsonl"} <= names
