"""engines.video.native_out: the count of NVDEC's "Decode Error" lines per source, from real C stdio prints on file
descriptor 1 (what PyNvVideoCodec's C++ code does), in a child process whose fd 1 is a pipe the test reads: every
byte printed arrives once, in order, and each window counts the lines printed in it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import ctypes, json, sys, threading
    from engines.video.native_out import TAP
    libc = ctypes.CDLL(None)

    def cprint(text):  # C's buffered stdio, as PyNvVideoCodec prints
        libc.printf(text.encode() + b"\\n")

    out = {}
    print("before", flush=True)
    a = TAP.begin("a.mp4")
    cprint("Decode Error occurred for picture 3")
    print("python line")
    cprint("Decode Error occurred for picture 7")
    print("no newline yet", end="")
    n, others = a.end()
    out["alone"] = [n, sorted(others)]
    cprint("Decode Error occurred for picture 1")  # after every window: counted by none
    a = TAP.begin("a.mp4")
    b = TAP.begin("b.mp4")
    t = threading.Thread(target=cprint, args=("Decode Error occurred for picture 2",))
    t.start(); t.join()
    n, others = b.end()
    out["b"] = [n, sorted(others)]
    cprint("plain")
    n, others = a.end()
    out["a"] = [n, sorted(others)]
    c = TAP.begin("c.mp4")
    n, others = c.end()
    out["clean"] = [n, sorted(others)]
    print(" -- after", flush=True)
    sys.stderr.write(json.dumps(out))
""")


def test_each_window_counts_the_lines_printed_in_it_and_every_byte_passes_on():
    r = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stderr)
    assert got["alone"] == [2, []]
    assert got["b"] == [1, ["a.mp4"]]  # b's window saw one line, and a decoding beside it
    assert got["a"] == [1, ["b.mp4"]]  # a's second window: the same line (whose, the line does not say)
    assert got["clean"] == [0, []]
    assert r.stdout.splitlines() == [
        "before", "Decode Error occurred for picture 3", "python line", "Decode Error occurred for picture 7",
        "no newline yet" + "Decode Error occurred for picture 1", "Decode Error occurred for picture 2", "plain",
        " -- after"], r.stdout


FAILING = textwrap.dedent("""
    import ctypes, errno, json, os, sys, time
    from engines.video.native_out import TAP
    libc = ctypes.CDLL(None)
    where = sys.argv[1]
    if where == "closed-pipe":  # the reader went away (`| head -3` after its lines)
        r, w = os.pipe()
        os.close(r)
        os.dup2(w, 1)
    else:  # a full device
        os.dup2(os.open(where, os.O_WRONLY), 1)
    out = {}
    a = TAP.begin("a.mp4")
    libc.printf(b"Decode Error occurred for picture 3\\n")  # NVDEC's line: the tap cannot pass it on
    libc.fflush(None)
    deadline = time.monotonic() + 10
    while TAP.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    out["kept"] = TAP.error.errno if TAP.error is not None else None
    try:  # the process's next write meets the error itself, as without the tap
        os.write(1, b'{"frame": 0}\\n')
        out["next"] = "written"
    except OSError as exc:
        out["next"] = exc.errno
    n, others = a.end()  # the window still ends (the pipe drained, no wait)
    out["counted"] = n
    sys.stderr.write(json.dumps(out))
""")


def test_a_failed_stdout_is_kept_and_met_by_the_next_write():
    """fd 1 a closed pipe, then /dev/full: the tap keeps the error and gives fd 1 back, so that the process's next
    write fails with EPIPE / ENOSPC as it would without the tap (it used to swallow every OSError: a GPU run went on
    to the end of its file into a closed pipe, and lines to a full device were lost without a word)."""
    import errno
    import os

    cases = [("closed-pipe", errno.EPIPE)] + ([("/dev/full", errno.ENOSPC)] if os.path.exists("/dev/full") else [])
    for where, code in cases:
        r = subprocess.run([sys.executable, "-c", FAILING, where], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stderr)
        assert got == {"kept": code, "next": code, "counted": 1}, (where, got)
