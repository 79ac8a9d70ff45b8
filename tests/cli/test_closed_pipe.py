"""A closed stdout (`trtc doctor | head -1`, `trtc run ... | head -3`) stops trtc quietly with the shell's SIGPIPE
code 141, never 'internal error: BrokenPipeError ... this is a bug in trtc' (issue 25, item 4). Real processes and
real pipes: the reading end is closed before trtc writes, so every write of theirs meets EPIPE."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from toolchain.cli import EXIT_PIPE


def _run_with_closed_stdout(*args, timeout=300):
    p = subprocess.Popen([sys.executable, "-m", "toolchain", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader has gone before the first line
    err = p.stderr.read().decode()
    return p.wait(timeout=timeout), err


def _quiet(err: str) -> None:
    for bad in ("internal error", "BrokenPipe", "Traceback", "Exception ignored", "this is a bug"):
        assert bad not in err, err


def test_doctor_into_a_closed_pipe_stops_quietly():
    code, err = _run_with_closed_stdout("doctor")
    assert code == EXIT_PIPE == 141, err
    _quiet(err)


def test_run_into_a_closed_pipe_stops_quietly(lite0_onnx, bikes):
    code, err = _run_with_closed_stdout("-q", "run", str(bikes), "--model", str(lite0_onnx[0]), "--device", "cpu")
    assert code == 141, err
    _quiet(err)
    assert err == ""  # -q: not a word


def test_only_a_closed_stdout_counts(tmp_path, monkeypatch):
    """Another pipe that breaks (a worker's, FFmpeg's) is not the reader going away: it stays an error."""
    from toolchain import cli

    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "w") as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        assert cli._stdout_reader_gone()
    with open(tmp_path / "out.txt", "w") as f:
        monkeypatch.setattr(sys, "stdout", f)
        assert not cli._stdout_reader_gone()
    r, w = os.pipe()
    with os.fdopen(w, "w") as open_pipe, os.fdopen(r) as _:
        monkeypatch.setattr(sys, "stdout", open_pipe)
        assert not cli._stdout_reader_gone()


@pytest.mark.parametrize("args", [["doctor", "--json"], ["--help"], ["export", "--help"]])
def test_other_outputs_into_a_closed_pipe(args):
    """JSON (click.echo) and help (click's own handler) end the same way as the tables (rich's handler)."""
    code, err = _run_with_closed_stdout(*args)
    assert code == 141, (code, err)
    _quiet(err)
