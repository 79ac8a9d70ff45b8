"""What happens to an output when something else is there or goes wrong, on the real `trtc` command.

- a device (a `mknod` copy of /dev/null in a temporary folder), given as an output, is refused with and without
  --force, and stays a device;
- two `trtc run -o` on the same file: the second is refused at once, naming the first's PID, host and start time;
  a lock left by a run that was killed (SIGKILL) is taken over, said once;
- the disk fills mid-run (a 40 KiB tmpfs): every complete line is kept in -o, the summary goes to stderr with one
  error line and the command that finishes the file, exit 1; --resume on more space finishes it;
- stdout that cannot be written (/dev/full): exit 1, one line, no "Exception ignored".

These tests run as root in CI (mknod and mount need it); where the machine refuses, they skip saying so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.test_outputs import COMMANDS, _argv, _error_lines, _invoke, inputs  # noqa: F401 - a fixture
from tests.conftest import needs_export

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _trtc(*args, cwd, **kw):
    return subprocess.run([sys.executable, "-m", "toolchain", *map(str, args)], cwd=cwd, env=ENV, text=True,
                          **({"capture_output": True} if "stdout" not in kw else {"stderr": subprocess.PIPE}), **kw)


def _mknod_null(path: Path) -> Path:
    """A copy of /dev/null (character device 1,3) at ``path``."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as exc:
        pytest.skip(f"mknod refused here ({exc.strerror}): needs root, as in CI")
    return path


@pytest.fixture
def null_device(tmp_path):
    return _mknod_null(tmp_path / "null")


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "data"])
@pytest.mark.parametrize("force", [False, True])
def test_a_device_is_never_replaced(name, force, inputs, tmp_path):  # noqa: F811 - the fixture
    argv = _argv(name, inputs, tmp_path / "null")
    i = next(i for i, a in enumerate(argv) if a.startswith(str(tmp_path / "null")))
    dev = _mknod_null(Path(argv[i]))  # with the suffix the option wants (null.onnx, null.jsonl, ...)
    code, text = _invoke(argv + (["--force"] if force else []))
    assert code == 2, text
    line = _error_lines(text)
    assert "is a character device, not a file" in line and str(dev) in line, text
    assert "add --force" not in text and "> /dev/null" in text  # the fix offers what works
    st = os.stat(dev)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [dev.name]  # no lock, no temporary file


def test_atomic_write_never_replaces_a_device(null_device):
    """The library's own guard, for a caller that skipped the CLI's check."""
    from engines._io import atomic_write_text
    from engines.errors import UsageProblem

    with pytest.raises(UsageProblem, match="not a regular file"):
        atomic_write_text(null_device, "x")
    assert stat.S_ISCHR(os.stat(null_device).st_mode)


def _run_args(lite0_onnx, bikes, out):
    return ["run", bikes, "--model", lite0_onnx[0], "--device", "cpu", "--batch", "4", "--top-k", "1", "-o", out]


@needs_export
def test_second_run_on_the_same_output_is_refused(lite0_onnx, bikes, tmp_path):
    out = tmp_path / "same.jsonl"
    first = subprocess.Popen([sys.executable, "-m", "toolchain", *map(str, _run_args(lite0_onnx, bikes, out)),
                              "--realtime"], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lock = tmp_path / ".same.jsonl.lock"
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".same.jsonl.*.tmp")) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # the first run is writing
    assert first.poll() is None and lock.exists(), first.communicate()
    t0 = time.monotonic()
    second = _trtc(*_run_args(lite0_onnx, bikes, out), "--force", cwd=tmp_path, timeout=120)
    refused_in = time.monotonic() - t0
    first.send_signal(signal.SIGINT)
    _, err1 = first.communicate(timeout=60)
    assert second.returncode == 2, second.stderr
    assert (f"is being written by another trtc run (PID {first.pid} on {socket.gethostname()} since "
            in second.stderr), second.stderr
    assert f"kill {first.pid}" in second.stderr
    assert refused_in < 20  # at once: before any model is opened (a generous bound for a loaded machine)
    assert first.returncode == 130, err1
    kept = [json.loads(x) for x in out.read_text().splitlines()]  # the first run's lines, whole and its own
    assert kept and [x["frame"] for x in kept] == list(range(len(kept)))
    assert not lock.exists()


@needs_export
def test_lock_of_a_killed_run_is_taken_over(lite0_onnx, bikes, tmp_path):
    out = tmp_path / "preds.jsonl"
    # a holder that takes the lock as trtc does and is then SIGKILLed: the file stays, the flock is gone
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from engines._io import output_lock\n"
                               "with output_lock(sys.argv[1]):\n print('held', flush=True); time.sleep(600)", out],
                              cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    busy = _trtc(*_run_args(lite0_onnx, bikes, out), cwd=tmp_path, timeout=120)
    assert busy.returncode == 2 and f"PID {holder.pid} on" in busy.stderr, busy.stderr
    holder.kill()
    holder.wait()
    assert (tmp_path / ".preds.jsonl.lock").exists()
    r = _trtc(*_run_args(lite0_onnx, bikes, out), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "took over its lock" in r.stderr and f"PID {holder.pid} on" in r.stderr, r.stderr
    assert len(out.read_text().splitlines()) == 250
    assert not (tmp_path / ".preds.jsonl.lock").exists()


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()}): needs root, as in CI")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


@needs_export
def test_disk_full_keeps_every_complete_line(lite0_onnx, bikes, small_disk, tmp_path):
    out = small_disk / "out.jsonl"
    r = _trtc(*_run_args(lite0_onnx, bikes, out), cwd=tmp_path, timeout=300)
    assert r.returncode == 1, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: writing {out} failed: No space left on device; the run stopped, {out} keeps its "
                      f"{len(out.read_text().splitlines())} complete lines"], r.stderr
    assert f"df -h {small_disk}" in r.stderr and "--resume" in r.stderr
    assert "frames in" in r.stderr and "stopped by a write error" in r.stderr and r.stdout == ""  # summary: stderr
    raw = out.read_bytes()
    assert raw.endswith(b"\n")
    frames = [json.loads(x)["frame"] for x in raw.decode().splitlines()]
    assert 50 < len(frames) < 250 and frames == list(range(len(frames)))
    assert sorted(p.name for p in small_disk.iterdir()) == ["out.jsonl"]  # no temporary file, no lock

    subprocess.run(["mount", "-o", "remount,size=400k", str(small_disk)], check=True)
    r = _trtc(*_run_args(lite0_onnx, bikes, out), "--resume", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["frame"] for x in out.read_text().splitlines()] == list(range(250))


@pytest.fixture
def full_stdout():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as f:
        yield f


@pytest.mark.parametrize("argv", [["doctor"], ["doctor", "--json"], ["--help"], ["run", "--help"]])
def test_stdout_that_cannot_be_written(argv, full_stdout, tmp_path):
    r = _trtc(*argv, cwd=tmp_path, stdout=full_stdout, timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[0] == ("error: cannot write to stdout: No space left on device; what was printed "
                                        "is incomplete"), r.stderr
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr


@needs_export
def test_run_predictions_to_a_full_stdout(lite0_onnx, bikes, full_stdout, tmp_path):
    r = _trtc("run", bikes, "--model", lite0_onnx[0], "--device", "cpu", "--top-k", "1", cwd=tmp_path,
              stdout=full_stdout, timeout=300)
    assert r.returncode == 1, r.stderr
    assert "error: cannot write to stdout: No space left on device" in r.stderr
    assert "Exception ignored" not in r.stderr and "bug in trtc" not in r.stderr


@needs_export
def test_disk_full_where_even_the_rename_fails(lite0_onnx, bikes, small_disk, tmp_path):
    """The full disk also refuses the rename onto -o (injected: a folder without room for the new name): the
    error names the file that holds the complete lines and the mv + --resume that finish it, and the next run on
    that output says what the file is."""
    out = small_disk / "out.jsonl"
    # the CLI in a process of its own (the next run must see a writer that is gone), with the rename onto -o refused
    inject = ("import errno, os, sys\nfrom toolchain.cli import main\nreal, target = os.replace, sys.argv[1]\n"
              "def no_room(src, dst, *a, **k):\n"
              "    if os.fspath(dst) == target:\n"
              "        raise OSError(errno.ENOSPC, 'No space left on device')\n"
              "    return real(src, dst, *a, **k)\n"
              "os.replace = no_room\nsys.argv = ['trtc', *sys.argv[2:]]\nmain()\n")
    p = subprocess.run([sys.executable, "-c", inject, str(out), *map(str, _run_args(lite0_onnx, bikes, out))],
                       cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    r = type("R", (), {"exit_code": p.returncode, "output": p.stderr})
    assert r.exit_code == 1, r.output
    left = [p for p in small_disk.iterdir() if p.name.startswith(".out.jsonl.") and p.name.endswith(".tmp")]
    assert len(left) == 1 and not out.exists(), sorted(small_disk.iterdir())
    kept = left[0].read_text().splitlines()
    assert kept and [json.loads(x)["frame"] for x in kept] == list(range(len(kept)))
    error = next(ln for ln in r.output.splitlines() if ln.startswith("error:"))
    assert error == (f"error: writing {out} failed: No space left on device; the run stopped, its {len(kept)} "
                     f"complete lines are in {left[0]} (the rename onto {out} failed too)"), r.output
    assert f"mv {left[0]} {out} and run the same command with --resume" in r.output

    subprocess.run(["mount", "-o", "remount,size=400k", str(small_disk)], check=True)
    again = _trtc(*_run_args(lite0_onnx, bikes, out), "--resume", cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "could not finish the file (killed, or its disk was full)" in again.stderr, again.stderr
    assert [json.loads(x)["frame"] for x in out.read_text().splitlines()] == list(range(250))
