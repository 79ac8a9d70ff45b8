"""Every `trtc` command in README.md's fenced bash blocks, run as written and in order, in a folder prepared the
way the README says (`trtc data`, `cd trtc-data`). Lines marked `# [GPU]`, `# [TensorRT]`, `# [TensorRT-RTX]` are
skipped where that is missing; `# [your files: ...]` lines need a model or data of the reader's own and are
skipped, and listed. Each command must exit 0 and never print "bug in trtc". The pages of precision (INT8, validate)
run as a test of their own beside the rest, from the files the README's tour makes (see PRECISION)."""

from __future__ import annotations

import importlib.util
import shlex
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import _has_gpu, needs_export

README = Path(__file__).resolve().parents[2] / "README.md"
# the pages whose bash blocks continue README's tour, in the order of README's documentation table
PAGES = ["CONVENTIONS", "EXPORT", "QUANTIZE", "BUILD", "VALIDATE", "BENCH", "OPENCV", "RUN", "LIVE", "PUSH", "SERVE", "DOCTOR",
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


# The pages run in two groups, each one test in a folder of its own, so that two pytest-xdist workers run them at
# the same time: PRECISION (INT8 quantization with its accuracy-aware search, validation of FP16 and INT8 against
# FP32, the builds and benches of those files on a GPU) and the rest of the tour. The precision pages start where
# the README's tour left its folder: `trtc data`, `cd trtc-data` as written, then the tour's lite0.onnx and
# lite0.fp16.onnx, the run's shared Lite0 export and its FP16 conversion (tests/conftest.py: made once per run).
# The pages after them read only the tour's files (lite0.onnx, bikes.mp4, photos/).
PRECISION = ["QUANTIZE", "BUILD", "VALIDATE", "BENCH"]


def group_commands(group: str) -> list[tuple[str, str]]:
    """The commands of one group, in the order of README's documentation table: "tour" (README.md and the pages
    other than PRECISION) or "precision" (README's set-up lines up to `cd trtc-data`, then PRECISION's pages)."""
    docs = README.parent / "docs"
    if group == "tour":
        return readme_commands("\n".join([README.read_text()] + [(docs / f"{p}.md").read_text() for p in PAGES
                                                                 if p not in PRECISION]))
    setup = readme_commands(README.read_text())
    setup = setup[:next(i for i, (c, _) in enumerate(setup) if c.startswith("cd ")) + 1]
    return setup + readme_commands("\n".join((docs / f"{p}.md").read_text() for p in PRECISION))


def run_commands(commands, monkeypatch, after_cd=None, shared=None) -> tuple[list[str], list[str]]:
    """Each command run as written through the CLI in this process (``cd`` changes folder; ``after_cd``, called
    once after the first ``cd``, puts the files of earlier pages there): (commands run, commands skipped with the
    reason). Each must exit 0 and never print "bug in trtc". ``shared`` maps a command line to a function of the
    working folder that gives (exit code, output) of this test run's one run of that very command on the same
    files, having put what it wrote into the folder, or None where the files differ (the command then runs here)."""
    from toolchain.cli import cli

    ran, skipped = [], []
    for line, comment in commands:
        if line.startswith(". "):
            continue  # activating the environment: this test already runs in it
        if line.startswith("cd "):
            monkeypatch.chdir(Path(line[3:]).expanduser())
            if after_cd:
                after_cd(Path.cwd())
                after_cd = None
            continue
        why = _why_skip(comment)
        if why:
            skipped.append(f"{line}  ({why})")
            continue
        got = (shared or {}).get(line, lambda _: None)(Path.cwd())
        if got is None:
            r = CliRunner().invoke(cli, shlex.split(line)[1:])
            got = r.exit_code, r.output
        code, output = got
        assert "bug in trtc" not in output, f"{line}\n{output}"
        assert code == 0, f"{line}\nexit {code}\n{output}"
        ran.append(line)
    return ran, skipped


def test_the_groups_hold_every_command_once():
    """Split in two, the docs still run every command of all_text() exactly once: the precision group repeats
    only README's set-up lines (up to `cd trtc-data`)."""
    tour, precision = group_commands("tour"), group_commands("precision")
    setup = [c for c in precision if c in tour]
    assert [c for c, _ in setup] == [". .venv/bin/activate", "trtc data", "cd trtc-data"]
    assert sorted(tour + precision[len(setup):]) == sorted(readme_commands(all_text()))
    assert any(c.startswith("trtc quantize lite0.onnx --precision int8") for c, _ in precision)
    assert not any(c.startswith("trtc quantize lite0.onnx --precision int8") for c, _ in tour)


@pytest.fixture
def docs_env(tmp_path, monkeypatch, cli_cache_env):
    """A fresh folder as the working directory, and the calibration cache not the user's ~/.cache but the run's,
    which the other `trtc quantize` runs of the same export (it is byte for byte the run's) and bikes.mp4 share."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", cli_cache_env["XDG_CACHE_HOME"])
    return tmp_path


@pytest.mark.slow  # about a minute on two cores: an FP16 conversion, validation, runs, benches
def test_every_readme_command_runs_as_written(docs_env, monkeypatch, lite0_export):
    from engines._io import sha256_file
    from tests.conftest import LITE0_EXPORT

    def exported(folder: Path):
        """The run's one run of LITE0_EXPORT (tests/conftest.py), its files put in ``folder`` where that folder's
        photos are the ones it checked on; else None (it runs here)."""
        src, onnx, _report, code, output = lite0_export
        theirs, ours = sorted((src / "photos").iterdir()), sorted((folder / "photos").iterdir())
        if [p.name for p in theirs] != [p.name for p in ours] or \
                any(sha256_file(a) != sha256_file(b) for a, b in zip(theirs, ours)):
            return None
        for suffix in ("", ".json"):
            shutil.copy(f"{onnx}{suffix}", folder / f"lite0.onnx{suffix}")
        return code, output

    tour = group_commands("tour")
    assert LITE0_EXPORT in [c for c, _ in tour]  # the command the run's Lite0 fixture ran is the README's
    ran, skipped = run_commands(tour, monkeypatch, shared={LITE0_EXPORT: exported})
    print(f"README and pages: ran {len(ran)} commands, skipped {len(skipped)}:\n  " + "\n  ".join(skipped))
    assert len(ran) >= 10  # data, export, quantize, validate, bench, 3 x run, 2 x doctor
    names = {p.name for p in Path.cwd().iterdir()}
    assert {"lite0.onnx", "lite0.fp16.onnx", "preds.jsonl"} <= names


@pytest.mark.slow  # 3 minutes on two cores: two INT8 quantizations (one accuracy-aware), a validation
@pytest.mark.usefixtures("lite0_int8", "lite0_int8_cli")  # the INT8 runs shared below, named for the test order
def test_every_precision_page_command_runs_as_written(docs_env, monkeypatch, lite0_onnx, lite0_fp16, bikes,
                                                      tmp_path_factory, cli_cache_env):
    import shutil

    from engines._io import sha256_file
    from tests.conftest import LITE0_INT8_PLAIN, LITE0_INT8_T97, quantize_cli_once

    def tour_files(folder: Path):  # what the README's tour left in trtc-data: its export and FP16 conversion
        for src, name in ((Path(lite0_onnx[0]), "lite0.onnx"), (Path(lite0_fp16.output), "lite0.fp16.onnx")):
            shutil.copy(src, folder / name)
            shutil.copy(f"{src}.json", folder / f"{name}.json")

    def once(command: str):
        """The run's one run of ``command`` (tests/conftest.py: the lite0_int8 and lite0_int8_cli fixtures), its
        files put in ``folder``, where that folder holds the same inputs; else None (it runs here)."""
        def shared(folder: Path):
            src, report, code, output = quantize_cli_once(tmp_path_factory, lite0_onnx, bikes,
                                                          cli_cache_env["XDG_CACHE_HOME"], command)
            if any(sha256_file(folder / f) != sha256_file(src / f) for f in ("lite0.onnx", "lite0.onnx.json",
                                                                              "bikes.mp4")):
                return None
            for f in (report.output, report.manifest):
                shutil.copy(f, folder / Path(f).name)
            return code, output
        return shared

    commands = {line for line, _ in group_commands("precision")}
    assert {LITE0_INT8_PLAIN, LITE0_INT8_T97} <= commands  # else nothing is shared
    ran, skipped = run_commands(group_commands("precision"), monkeypatch, after_cd=tour_files,
                                shared={c: once(c) for c in (LITE0_INT8_PLAIN, LITE0_INT8_T97)})
    print(f"precision pages: ran {len(ran)} commands, skipped {len(skipped)}:\n  " + "\n  ".join(skipped))
    assert len(ran) >= 5  # data, 2 x quantize, inspect, validate
    names = {p.name for p in Path.cwd().iterdir()}
    assert {"lite0.int8.onnx", "lite0.int8.t97.onnx", "report.json", "report.html"} <= names
