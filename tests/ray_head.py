"""A running Ray cluster for tests, as users start one: `ray start --head --block` in a process of its own, with its
own temporary folder and free ports (several test runs on one machine do not meet), ended by its process id
(SIGTERM: Ray's head then stops every process it started, its workers and detached actors included)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolchain._env import checkout_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_cli() -> list[str]:
    """The `ray` command of this interpreter's Ray: the script beside it (a venv), else Ray's own entry point run by
    this interpreter (a wheel installed with pip --target has its scripts elsewhere)."""
    script = Path(sys.executable).with_name("ray")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


class RayHead:
    """``with RayHead(num_cpus=2) as head: head.address, head.env`` (the environment a driver joins it with:
    ``RAY_ADDRESS`` for ``--ray auto``, this checkout on ``PYTHONPATH`` for the workers). ``num_gpus``: None for
    the GPUs Ray finds on this host."""

    def __init__(self, num_cpus: int = 2, num_gpus: int | None = 0, timeout: float = 90.0):
        self.temp = tempfile.mkdtemp(prefix="trtc-ray-")  # short: Ray's socket paths must fit 107 bytes
        self.env = checkout_env()
        self.env.pop("RAY_ADDRESS", None)
        # a head started where ~/.ray/auth_token exists asks for tokens, and a driver given an address sends none
        # unless told to (docs/CLUSTER.md): the test cluster and its drivers agree on no token
        self.env["RAY_AUTH_MODE"] = "disabled"
        gpus = [] if num_gpus is None else ["--num-gpus", str(num_gpus)]  # None: the GPUs Ray finds
        cmd = [*ray_cli(), "start", "--head", "--block", "--port", "0", "--num-cpus", str(num_cpus), *gpus,
               "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", self.temp,
               "--dashboard-agent-listen-port", str(_free_port()), "--dashboard-agent-grpc-port", str(_free_port()),
               "--runtime-env-agent-port", str(_free_port()), "--metrics-export-port", str(_free_port())]
        self.log = open(os.path.join(self.temp, "head.log"), "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                        start_new_session=True)
        found = os.path.join(self.temp, "ray_current_cluster")
        deadline = time.monotonic() + timeout
        while not os.path.exists(found):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ray start --head did not come up: {self.tail()}")
            time.sleep(0.2)
        self.address = Path(found).read_text().strip()
        self.env["RAY_ADDRESS"] = self.address

    def tail(self) -> str:
        try:
            return Path(self.temp, "head.log").read_text()[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)  # its own session: only what this head started
                self.process.wait(10)
        self.log.close()
        shutil.rmtree(self.temp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
