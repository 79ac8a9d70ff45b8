"""The deployment files of examples/deploy/: the systemd unit (checked by `systemd-analyze verify` where systemd is
installed), the container file (every instruction one the format knows, its health check run against the real
/healthz), and the example cameras file (which the service's own reader accepts)."""

from __future__ import annotations

import inspect
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "examples" / "deploy"


# the systemd unit ---------------------------------------------------------------------------------------------------
def unit_settings(text: str) -> dict[str, dict[str, list[str]]]:
    """section -> key -> the values in order (a key may repeat), comments and blank lines left out."""
    out: dict = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.fixture(scope="module")
def unit():
    return unit_settings((DEPLOY / "trtc.service").read_text())


def test_the_unit_is_a_notify_service_with_a_watchdog_and_a_reload(unit):
    service = unit["Service"]
    assert service["Type"] == ["notify"] and service["NotifyAccess"] == ["main"]
    assert int(service["WatchdogSec"][0]) >= 10  # serve pings at half of it, from its loop
    assert service["Restart"] == ["on-failure"] and service["KillSignal"] == ["SIGTERM"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert shlex.split(service["ExecStart"][0])[1:] == ["serve", "/etc/trtc/cameras.yaml"]
    assert "2" in service["RestartPreventExitStatus"][0].split()  # a bad file: restarting cannot help
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_the_unit_keeps_the_gpu_and_writes_only_its_state_and_cache(unit, monkeypatch):
    service = unit["Service"]
    assert service.get("PrivateDevices", ["no"]) == ["no"]  # yes would hide /dev/nvidia*
    if service.get("DevicePolicy") in (["closed"], ["strict"]):
        assert any(v.split()[0].startswith(("char-nvidia", "/dev/nvidia")) and "rw" in v.split()[1]
                   for v in service["DeviceAllow"])
    assert service["ProtectSystem"] == ["strict"] and service["NoNewPrivileges"] == ["yes"]
    assert service["StateDirectory"] == ["trtc"] and service["WorkingDirectory"] == ["%S/trtc"]
    assert service["CacheDirectory"] == ["trtc"]
    env = dict(v.split("=", 1) for v in service["Environment"])
    # the cache trtc keeps there is CacheDirectory's folder: %C is /var/cache for a system service
    from engines._io import user_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"].replace("%C", "/var/cache"))
    assert user_cache_dir("quick").parent == Path("/var/cache") / service["CacheDirectory"][0]


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="needs systemd-analyze (systemd); the unit is checked where "
                                                    "systemd is installed")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    """`systemd-analyze verify` on the unit as shipped, with only ExecStart's program (/opt/trtc/bin/trtc, which
    this machine lacks: verify checks that it exists) pointed at one that exists."""
    text = (DEPLOY / "trtc.service").read_text()
    program = re.search(r"^ExecStart=(\S+)", text, re.M).group(1)
    assert program == "/opt/trtc/bin/trtc"
    (tmp_path / "trtc.service").write_text(text.replace(f"ExecStart={program}", f"ExecStart={shutil.which('true')}"))
    r = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(tmp_path / "trtc.service")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


# the container file -------------------------------------------------------------------------------------------------
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
                "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def container_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments (and the parser directive) left out."""
    out, logical = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not logical):
            continue
        logical += " " + line
        if logical.endswith("\\"):
            logical = logical[:-1]
            continue
        word, _, rest = logical.strip().partition(" ")
        out.append((word, rest.strip()))
        logical = ""
    assert not logical, "the file ends inside a continued line"
    return out


@pytest.fixture(scope="module")
def container():
    return container_instructions((DEPLOY / "Containerfile").read_text())


def test_every_container_instruction_is_known_and_the_image_is_for_a_gpu(container):
    words = [w for w, _ in container]
    assert set(words) <= INSTRUCTIONS, set(words) - INSTRUCTIONS
    assert all(w == w.upper() for w in words)
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for w, a in container if w == "ARG" and "=" in a}
    first = next(a for w, a in container if w == "FROM")
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], first)
    assert base.startswith("nvidia/cuda:13.") and "runtime" in base  # CUDA 13: the gpu extra's wheels
    assert words.index("FROM") < words.index("RUN")


def test_the_image_installs_the_extras_it_needs_and_copies_what_exists(container):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    install = next(a for w, a in container if w == "RUN" and "pip install" in a)
    wanted = re.search(r"\[([\w,-]+)\]", install).group(1).split(",")
    assert {"gpu", "serve"} <= set(wanted) and set(wanted) <= set(extras)
    for w, a in container:
        if w == "COPY":
            *sources, _ = a.split()
            for source in sources:  # relative to the build context: the repository's root
                assert (ROOT / source).exists(), source


def test_the_container_runs_serve_as_a_user_with_its_volumes_and_stop_signal(container):
    last = {}
    for w, a in container:
        last[w] = a
    assert last["USER"] not in ("root", "0") and last["STOPSIGNAL"] == "SIGTERM"
    assert json.loads(last["ENTRYPOINT"]) == ["trtc", "serve"]
    assert json.loads(last["CMD"]) == ["/etc/trtc/cameras.yaml"]
    assert set(json.loads(last["VOLUME"])) == {"/etc/trtc", "/var/lib/trtc", "/var/cache/trtc"}
    env = " ".join(a for w, a in container if w == "ENV")
    assert "XDG_CACHE_HOME=/var/cache " in env + " " and "video" in re.search(r"NVIDIA_DRIVER_CAPABILITIES=(\S+)",
                                                                               env).group(1)


def _healthcheck(container) -> tuple[list[str], str]:
    """(the HEALTHCHECK's command, the URL it reads)."""
    check = next(a for w, a in container if w == "HEALTHCHECK")
    command = json.loads(check[check.index("CMD ") + 4:])
    return command, re.search(r"http://[^'\"]+", " ".join(command)).group(0)


def test_the_health_check_reads_healthz_on_the_http_default_port(container):
    from toolchain.serve.http import StatusServer

    _, url = _healthcheck(container)
    default = inspect.signature(StatusServer.__init__).parameters
    parts = urlsplit(url)
    assert (parts.hostname, parts.port, parts.path) == (default["host"].default, default["port"].default, "/healthz")
    assert str(parts.port) in next(a for w, a in container if w == "EXPOSE").split()


def test_the_health_check_passes_while_the_loop_turns_and_fails_when_it_hangs(container):
    """The check's own command, run against a real status server: exit 0 while the loop beats, not 0 once it
    stopped beating (the server answers 503), as Docker and Podman count it."""
    pytest.importorskip("prometheus_client", reason='needs the serve extra: pip install -e ".[dev]"')
    from toolchain.serve.http import ServiceState, StatusServer

    command, url = _healthcheck(container)
    state = ServiceState(loop_timeout=60)  # a busy machine may take seconds to start the check's Python
    server = StatusServer(state, port=0).start()
    try:
        ours = [sys.executable] + [c.replace(url, url.replace(":9108", f":{server.port}")) for c in command[1:]]
        assert subprocess.run(ours, capture_output=True, timeout=30).returncode == 0
        state.loop_timeout = 0.0  # the loop's last beat is now too old: it hangs
        assert subprocess.run(ours, capture_output=True, timeout=30).returncode != 0
    finally:
        server.stop()


# the example cameras file -------------------------------------------------------------------------------------------
def test_the_example_cameras_file_is_accepted():
    pytest.importorskip("yaml", reason='needs the serve extra: pip install -e ".[dev]"')
    from toolchain.serve.config import load_config

    config = load_config(DEPLOY / "cameras.yaml")
    assert set(config.cameras) == {"door", "dock", "yard"} and not config.cameras["yard"].enabled
    assert config.sections["http"] == {"host": "127.0.0.1", "port": 9108}  # as the container's health check reads
    assert all(c.model == "lite0.fp16.onnx" for c in config.cameras.values())  # beside the file: /etc/trtc
    # what serve writes goes to the state folder of the unit and the container (/etc/trtc is read-only there)
    assert {config.sections["spool"]["dir"], config.sections["files"]["dir"]} == {"/var/lib/trtc/spool",
                                                                                  "/var/lib/trtc/results"}
    from click.testing import CliRunner

    from toolchain.cli import cli

    r = CliRunner().invoke(cli, ["serve", str(DEPLOY / "cameras.yaml"), "--check"])  # the command's own check
    assert r.exit_code == 0 and "3 camera(s)" in r.output, r.output
    assert "dock: rtsp://10.0.0.6/main model lite0.fp16.onnx stride 1 rotate 180" in r.output, r.output
