""".ci/install.py gives uv what pip is configured with, read through pip itself, and falls back to pip: tested with a
real pip.conf holding two extra indexes (a multi-line value) and a find-links folder, each serving a package built
here, installed offline into a fresh environment by the real uv, then by pip when uv fails."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "install.py"
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def _wheel(folder: Path, name: str) -> Path:
    """A real, minimal pure-Python wheel of package ``name`` 1.0 (module ``name`` with VALUE = name)."""
    files = {f"{name}/__init__.py": f"VALUE = {name!r}\n",
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{name}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{name}-1.0.dist-info/RECORD,,")
    files[f"{name}-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out


def _index(root: Path, name: str) -> str:
    """A PEP 503 simple index on disk serving one package; its file:// URL."""
    wheel = _wheel(root / "files", name)
    page = root / "simple" / name.replace("_", "-")
    page.mkdir(parents=True)
    page.joinpath("index.html").write_text(f'<html><body><a href="../../files/{wheel.name}">{wheel.name}</a></body></html>')
    return (root / "simple").as_uri()


@pytest.fixture
def configured(tmp_path):
    """A pip.conf (the only one pip reads: PIP_CONFIG_FILE, no user or global files) with two extra indexes on
    separate lines, a find-links folder, a local index-url and a setting uv has no equivalent for."""
    one, two = _index(tmp_path / "one", "pkg_one"), _index(tmp_path / "two", "pkg_two")
    main = _index(tmp_path / "main", "pkg_main")
    _wheel(tmp_path / "links", "pkg_links")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {main}\nextra-index-url =\n    {one}\n    {two}\n"
                    f"find-links = {tmp_path / 'links'}\ntrusted-host = example.invalid\n"
                    "[install]\nsrc = /nowhere\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=str(conf), HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "xdg"),
               XDG_CONFIG_DIRS=str(tmp_path / "none"), UV_CACHE_DIR=str(tmp_path / "uv-cache"))
    return tmp_path, env, {"main": main, "one": one, "two": two}


def test_every_setting_reaches_uv_one_value_per_option(configured):
    tmp, env, urls = configured
    out = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "pkg_one"], env=env, capture_output=True,
                         text=True, check=True)
    uv_cmd = out.stdout.splitlines()[0].split()
    pairs = list(zip(uv_cmd, uv_cmd[1:]))
    assert ("--index-url", urls["main"]) in pairs
    assert ("--extra-index-url", urls["one"]) in pairs and ("--extra-index-url", urls["two"]) in pairs
    assert ("--find-links", str(tmp / "links")) in pairs
    assert ("--allow-insecure-host", "example.invalid") in pairs
    assert "pip's setting src has no uv equivalent" in out.stderr


@pytest.mark.skipif(UV is None, reason="uv is not installed (.ci/dev-install puts it in the venv)")
def test_uv_installs_from_both_extra_indexes_and_find_links_then_pip_takes_over_when_uv_fails(configured):
    tmp, env, _ = configured
    venv = tmp / "venv"
    subprocess.run([UV, "venv", "-q", "--seed", "--python", sys.executable, str(venv)], env=env, check=True)
    python = venv / "bin" / "python"
    shutil.copy(UV, venv / "bin" / "uv")
    run = subprocess.run([str(python), str(SCRIPT), "pkg_main", "pkg_one", "pkg_two", "pkg_links"], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "pip installs instead" not in run.stderr  # uv did it
    got = subprocess.run([str(python), "-c", "import pkg_main, pkg_one, pkg_two, pkg_links; print(pkg_two.VALUE)"],
                         capture_output=True, text=True)
    assert got.stdout.strip() == "pkg_two", got.stderr
    # a uv that fails: pip installs with its own reading of the same pip.conf
    broken = tmp / "broken-uv"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    run = subprocess.run([str(python), str(SCRIPT), "--uv", str(broken), "--no-cache-dir", "pkg_one"], env={
        **env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, capture_output=True, text=True)
    assert "the uv install failed; pip installs instead" in run.stderr
    assert run.returncode == 0, run.stderr + run.stdout
    assert "already satisfied" in run.stdout.lower() or "successfully installed" in run.stdout.lower()
