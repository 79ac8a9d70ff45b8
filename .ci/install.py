"""Install packages into the Python that runs this script, through uv with pip's settings, or with pip.

usage: PYTHON .ci/install.py [--uv PATH] [--dry-run] PIP-INSTALL-ARGS...
       PYTHON .ci/install.py --setting NAME      (the values of one pip setting, one per line)

uv installs PyTorch's 5 GB in seconds where pip takes minutes, but it does not read pip's configuration (pip.conf
files, PIP_* variables). This script reads that configuration through pip itself (the same files, sections and
precedence pip uses for `pip install`: global, then install, then the environment) and passes on every setting uv
has an equivalent for: index-url, extra-index-url, find-links, constraint, no-index, trusted-host, pre, only-binary,
no-binary as options; cert, client-cert, proxy and timeout as the variables uv reads. A setting with no equivalent
is named on stderr. With --require-hashes (a lock, every release pinned) pip's constraints are left out: uv refuses
range constraints in that mode. Where uv is missing, or its install fails, pip does the same install with its own settings.
The exit status is the install's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

LISTS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint",
         "trusted-host": "--allow-insecure-host"}
SINGLE = {"index-url": "--index-url", "only-binary": "--only-binary", "no-binary": "--no-binary"}
FLAGS = {"no-index": "--no-index", "pre": "--prerelease=allow"}
ENV = {"cert": "SSL_CERT_FILE", "client-cert": "SSL_CLIENT_CERT", "proxy": "HTTPS_PROXY", "timeout": "UV_HTTP_TIMEOUT",
       "default-timeout": "UV_HTTP_TIMEOUT"}
# settings of pip's that concern pip itself, not what gets installed
IGNORED = {"disable-pip-version-check", "no-cache-dir", "cache-dir", "quiet", "verbose", "progress-bar",
           "root-user-action", "no-color", "no-input", "retries", "log", "require-virtualenv", "break-system-packages",
           "prefer-binary", "no-warn-script-location", "user", "config-file"}


def pip_settings() -> dict[str, str]:
    """pip's effective settings for `pip install`: name -> value, the later of the sections global, install and the
    environment (PIP_*) winning, as pip applies them."""
    from pip._internal.configuration import Configuration

    config = Configuration(isolated=False)
    config.load()
    order = {"global": 0, "install": 1, ":env:": 2}
    found: dict[str, tuple[int, str]] = {}
    for key, value in _flat(config.items()):
        section, _, name = key.partition(".")
        rank = order.get(section)
        if rank is not None and (name not in found or found[name][0] <= rank):
            found[name] = (rank, str(value))
    return {name: value for name, (_, value) in found.items()}


def _flat(items):
    """(section.name, value) pairs in pip's order of precedence, the later winning: pip 23 yields them per file
    ((file, {section.name: value})), later releases directly."""
    for key, value in items:
        if isinstance(value, dict):
            yield from value.items()
        else:
            yield key, value


def _local_path_missing(value: str) -> bool:
    """A local index or links folder that is not there (pip skips it with a warning; uv would fail)."""
    path = value[len("file://"):] if value.startswith("file://") else value
    local = value.startswith("file://") or "://" not in value
    return local and not Path(path).exists()


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str], list[str]]:
    """(uv options, environment variables, names of settings with no uv equivalent) for pip's ``settings``."""
    options: list[str] = ["--index-strategy", "unsafe-best-match"]  # every index's best match, as pip takes it
    env: dict[str, str] = {}
    unknown: list[str] = []
    for name, value in settings.items():
        if name in LISTS:
            for item in value.split():  # a multi-line value in pip.conf, or a space-separated PIP_* variable
                if name in ("extra-index-url", "find-links") and _local_path_missing(item):
                    print(f"install: pip's {name} {item} is not there; left out, as pip leaves it", file=sys.stderr)
                    continue
                options += [LISTS[name], item]
        elif name in SINGLE:
            options += [SINGLE[name], value.strip()]
        elif name in FLAGS:
            if value.strip().lower() in ("1", "true", "yes", "on"):
                options.append(FLAGS[name])
        elif name in ENV:
            env[ENV[name]] = value.strip()
        elif name not in IGNORED:
            unknown.append(name)
    return options, env, unknown


def main(argv: list[str]) -> int:
    uv = str(Path(sys.executable).parent / "uv")
    dry_run = False
    while argv and argv[0] in ("--uv", "--dry-run", "--setting"):
        flag = argv.pop(0)
        if flag == "--dry-run":
            dry_run = True
        elif flag == "--uv":
            uv = argv.pop(0)
        else:
            print("\n".join(pip_settings().get(argv[0], "").split()))
            return 0
    settings = pip_settings()
    if "--require-hashes" in argv and settings.pop("constraint", None):
        # uv takes no range constraints in hash-checking mode; the requirements pin every release anyway
        print("install: pip's constraints are left out: every release is pinned (--require-hashes)", file=sys.stderr)
    options, env, unknown = uv_options(settings)
    for name in unknown:
        print(f"install: pip's setting {name} has no uv equivalent; uv installs without it", file=sys.stderr)
    uv_cmd = [uv, "pip", "install", "--python", sys.executable, *options, *argv]
    pip_cmd = [sys.executable, "-m", "pip", "install", *argv]
    if dry_run:
        print("\n".join([" ".join(uv_cmd), *(f"{k}={v}" for k, v in sorted(env.items())), " ".join(pip_cmd)]))
        return 0
    if shutil.which(uv):
        if subprocess.call(uv_cmd, env={**os.environ, **env}) == 0:
            return 0
        print("install: the uv install failed; pip installs instead", file=sys.stderr)
    else:
        print(f"install: no uv at {uv}; pip installs", file=sys.stderr)
    return subprocess.call(pip_cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
