"""A trtc export/quantize/build killed with SIGKILL (or a power cut) skips its clean-up and leaves its temporary
file beside the output; the next run on the same output removes it, saying so (issue 25 item 2, for the atomic
writers; trtc run's -o has its own rule)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from click.testing import CliRunner

from engines._io import atomic_write_text, orphans
from tests.conftest import needs_export
from toolchain.cli import cli


def _temporaries(folder, name):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}."))


@needs_export
def test_the_next_export_removes_what_a_killed_one_left(tmp_path, photos):
    out = tmp_path / "lite0.onnx"
    p = subprocess.Popen([sys.executable, "-m", "toolchain", "-q", "export", "pretrained:efficientnet-lite0", "-o",
                          str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not _temporaries(tmp_path, out.name) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        left = _temporaries(tmp_path, out.name)
        assert left, "the export never made its temporary file"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=60)
    assert _temporaries(tmp_path, out.name) == left and not out.exists()  # what SIGKILL leaves
    r = CliRunner().invoke(cli, ["export", "pretrained:efficientnet-lite0", "-o", str(out), "--batch", "1:2:4"])
    assert r.exit_code == 0, r.output
    err = "".join(r.stderr.split())  # the log's lines wrap anywhere
    for name in left:
        assert f"removed{name}:atemporaryfileoflite0.onnxleftbyanearliertrtcrunthatwaskilled" in err, r.stderr
    assert _temporaries(tmp_path, out.name) == [] and out.exists()


def test_a_live_writer_is_left_alone_and_an_unknown_one_is_named(tmp_path, caplog):
    target = tmp_path / "report.json"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from engines._io import _host

        live = tmp_path / f".report.json.trtc-{_host()}-{sleeper.pid}-abc123.tmp.json"  # a writer still at work
        live.write_text("{")
        old = tmp_path / ".report.json.k2x9_q7a.tmp.json"  # written before names carried their writer
        old.write_text("{")
        assert orphans(target) == ([], [old])
        with caplog.at_level("WARNING", logger="trtc"):
            atomic_write_text(target, "{}\n")
        assert live.exists() and old.exists() and target.read_text() == "{}\n"
        assert any(old.name in r.getMessage() and "remove it if no other trtc is writing report.json"
                   in r.getMessage() for r in caplog.records), caplog.text
    finally:
        sleeper.kill()
        sleeper.wait()
    assert orphans(target) == ([live], [old])  # its writer is gone now
