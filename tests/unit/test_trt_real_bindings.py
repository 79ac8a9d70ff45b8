"""trtc's TensorRT calls and the recording fake, checked against TensorRT's REAL Python bindings.

The full TensorRT 10/11 library cannot be installed on the CPU machine, but these real binary wheels can, and they
import without a GPU (measured: lean 10.16 and 11.4, dispatch 11.4 and TensorRT-RTX 1.7.1 all import on a CPU-only
machine; the libraries are loaded, no CUDA call is made): ``tensorrt_lean_bindings`` (the lean runtime: Runtime,
ICudaEngine, IExecutionContext), ``tensorrt_dispatch_bindings`` and ``tensorrt_rtx_bindings`` (builder and runtime).
Each module is described in a subprocess (tests/trt_api_probe.py), because two versions of one binding cannot share
a process. Where they are found:

- in this environment (the dev extra installs lean and dispatch 11.x);
- in every folder under ``.trt-bindings/`` of the repository and in ``$TRTC_TRT_BINDINGS`` (folders separated by
  ``os.pathsep``), each made with ``pip install --no-deps --target DIR WHEELS`` (``.ci/run`` puts lean 10.x and
  TensorRT-RTX there).

What is checked, for each real module found:
1. every ``trt.X.Y`` chain written in engines/ and toolchain/build.py resolves (runtime-side chains against the lean
   runtime, all of them against TensorRT-RTX, the one real builder API installable here);
2. every class, enum member, method and property of the fake exists in the real module, with the same kind
   (method vs property) and a parameter count that one of the real overloads accepts (from pybind11 docstrings).
   The fake is what the CPU tests run trtc's code against, so a name trtc calls on a TensorRT object that the real
   module lacks fails here.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from tests import fake_tensorrt

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "trt_api_probe.py"
NAMES = ("tensorrt_lean_bindings", "tensorrt_dispatch_bindings", "tensorrt_rtx_bindings")
RUNTIME_FILES = ("engines/tensorrt_engine.py", "engines/_trt.py", "toolchain/plan_layers.py")
BUILD_FILES = ("toolchain/build.py", "toolchain/inspect_artifact.py")
RTX_ONLY = {"CudaGraphStrategy", "ComputeCapability", "IRuntimeConfig"}  # used only on the TensorRT-RTX path
# the fake's runtime side: what the lean runtime must have (the rest of the fake is the builder side)
RUNTIME_CLASSES = ("Runtime", "ICudaEngine", "IExecutionContext", "ILogger", "TensorIOMode", "DataType")


def _folders() -> list[str | None]:
    out: list[str | None] = [None]  # None: this environment
    base = ROOT / ".trt-bindings"
    if base.is_dir():
        out += sorted(str(p) for p in base.iterdir() if p.is_dir())
    out += [p for p in os.environ.get("TRTC_TRT_BINDINGS", "").split(os.pathsep) if p]
    return out


@lru_cache(maxsize=None)
def describe(import_name: str, folder: str | None) -> dict:
    env = dict(os.environ)
    if folder:
        env["PYTHONPATH"] = folder
    else:
        env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, str(PROBE), import_name], capture_output=True, text=True, env=env,
                       timeout=120, cwd="/")
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"probe failed: {r.stderr.strip()[-300:]}"}


def _available(import_name: str, folder: str | None) -> bool:
    if folder is None:
        import importlib.util

        return importlib.util.find_spec(import_name) is not None
    return (Path(folder) / import_name).is_dir()


CASES = [(n, f) for f in _folders() for n in NAMES if _available(n, f)]


def _id(case):
    name, folder = case
    return f"{name}@{Path(folder).name if folder else 'env'}"


def real(case) -> dict:
    d = describe(*case)
    if "error" in d:
        pytest.skip(f"{_id(case)} does not import here: {d['error']}")
    return d


def trt_chains(files) -> set[tuple[str, ...]]:
    """('BuilderFlag', 'VERSION_COMPATIBLE') for every ``trt.BuilderFlag.VERSION_COMPATIBLE`` written in ``files``."""
    chains = set()
    for rel in files:
        tree = ast.parse((ROOT / rel).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            parts, cur = [], node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id == "trt":
                chain = tuple(reversed(parts))
                chains.add(tuple(p for p in chain if p != "__init__") or chain)
    # keep only maximal chains (trt.ILogger.Severity also covers trt.ILogger)
    return {c for c in chains if not any(o != c and o[:len(c)] == c for o in chains)}


def resolve(desc: dict, chain: tuple[str, ...]) -> str | None:
    """None if ``chain`` exists in the described module, else what is missing."""
    node = desc["names"].get(chain[0])
    if node is None:
        return chain[0]
    for i, part in enumerate(chain[1:], 1):
        if node.get("kind") == "enum" and part in node.get("enum", []):
            node = {"kind": "value"}
            continue
        node = node.get("members", {}).get(part)
        if node is None:
            return ".".join(chain[:i + 1])
    return None


def test_the_probe_finds_real_bindings_in_the_dev_environment():
    """The dev extra installs the lean runtime: this test suite must really compare against something."""
    if os.environ.get("TRTC_ALLOW_NO_TRT_BINDINGS"):
        pytest.skip("TRTC_ALLOW_NO_TRT_BINDINGS is set")
    found = [c for c in CASES if "error" not in describe(*c)]
    assert any(c[0] == "tensorrt_lean_bindings" for c in found), \
        'no real TensorRT lean bindings importable: pip install -e ".[dev]"'


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_trtc_uses_only_names_the_real_bindings_have(case):
    d = real(case)
    rtx = case[0] == "tensorrt_rtx_bindings"
    chains = trt_chains(RUNTIME_FILES + (BUILD_FILES if rtx else ()))
    if not rtx:
        chains = {c for c in chains if c[0] not in RTX_ONLY}
    missing = sorted(m for c in chains if (m := resolve(d, c)))
    assert chains and not missing, f"{d['import_name']} {d['version']} lacks {missing}"


def _fake_classes(fake) -> dict:
    out = {}
    for name, obj in vars(fake).items():
        if not name.startswith("_") and isinstance(obj, type):
            out[name] = obj
    return out


def _fake_members(cls) -> dict:
    """Public members of a fake class: name -> ('method', (min, max) params) or ('property', None)."""
    members = {}
    for klass in cls.__mro__:
        if klass is object or klass.__module__ in ("enum", "builtins"):
            continue
        for name, raw in vars(klass).items():
            if name.startswith("_") or name in members:
                continue
            if inspect.isfunction(raw):
                params = list(inspect.signature(raw).parameters.values())[1:]
                if any(p.kind == p.VAR_POSITIONAL for p in params):
                    members[name] = ("method", None)
                else:
                    req = sum(p.default is p.empty for p in params)
                    members[name] = ("method", (req, len(params)))
            elif isinstance(raw, type):
                members[name] = ("class", raw)
            else:
                members[name] = ("property", None)
    return members


def _instance_attrs(fake) -> dict:
    """Public attributes the fake sets on instances (must be real properties too)."""
    logger = fake.ILogger()
    builder = fake.Builder(logger)
    config = builder.create_builder_config()
    network = builder.create_network(0)
    objs = {"Builder": builder, "IBuilderConfig": config, "INetworkDefinition": network,
            "OnnxParser": fake.OnnxParser(network, logger), "Runtime": fake.Runtime(logger),
            "IOptimizationProfile": builder.create_optimization_profile(),
            "ITimingCache": config.create_timing_cache(b"")}
    return {k: {a for a in vars(v) if not a.startswith("_")} for k, v in objs.items()}


def fake_problems(fake, d: dict, only: tuple[str, ...] | None = None) -> list[str]:
    problems = []
    inst = _instance_attrs(fake)
    for name, cls in _fake_classes(fake).items():
        if only is not None and name not in only:
            continue
        r = d["names"].get(name)
        if r is None:
            problems.append(f"{name}: no such class")
            continue
        if issubclass(cls, __import__("enum").Enum):
            extra = sorted(set(cls.__members__) - set(r.get("enum", [])))
            problems += [f"{name}.{e}: no such enum member" for e in extra]
            continue
        members = _fake_members(cls)
        for attr in inst.get(name, ()):
            members.setdefault(attr, ("property", None))
        for attr, (kind, info) in members.items():
            rm = r.get("members", {}).get(attr)
            if rm is None:
                problems.append(f"{name}.{attr}: no such member")
            elif kind == "class":
                sub = rm.get("enum", []) if rm.get("kind") == "enum" else []
                if issubclass(info, __import__("enum").Enum):
                    problems += [f"{name}.{attr}.{e}: no such enum member" for e in set(info.__members__) - set(sub)]
            elif kind == "property" and rm["kind"] == "method":
                problems.append(f"{name}.{attr}: a method in TensorRT, a property in the fake")
            elif kind == "method" and rm["kind"] != "method":
                problems.append(f"{name}.{attr}: a {rm['kind']} in TensorRT, a method in the fake")
            elif kind == "method" and info is not None and rm.get("overloads"):
                lo, hi = info
                if not any(o["required"] <= hi and lo <= o["n"] for o in rm["overloads"]):
                    problems.append(f"{name}.{attr}: the fake takes {lo}..{hi} arguments, TensorRT "
                                    f"{[o['n'] for o in rm['overloads']]}")
    for name, obj in vars(fake).items():
        if name.startswith("_") or name in ("FAKE", "calls") or isinstance(obj, type) or name.startswith("__"):
            continue
        if (only is None or name in only) and name not in d["names"]:
            problems.append(f"{name}: no such module attribute")
    return problems


@pytest.mark.parametrize("case", [c for c in CASES if c[0] != "tensorrt_dispatch_bindings"], ids=_id)
def test_the_fake_has_no_member_the_real_module_lacks(case):
    d = real(case)
    if case[0] == "tensorrt_rtx_bindings":
        fake = fake_tensorrt.make(d["version"], rtx=True, engine_io=[])
        problems = fake_problems(fake, d)
        # the TensorRT 10/11 fake's builder side, against the closest real builder API installable here
        plain = fake_tensorrt.make("10.13.0", engine_io=[])
        problems += [f"(TensorRT fake) {p}" for p in fake_problems(plain, d)
                     if not p.startswith(tuple(RUNTIME_CLASSES))]
    else:
        fake = fake_tensorrt.make(d["version"], engine_io=[])
        problems = fake_problems(fake, d, only=RUNTIME_CLASSES)
    assert not problems, f"{d['import_name']} {d['version']}: " + "; ".join(problems)


def test_the_check_catches_a_wrong_name_and_a_wrong_signature():
    """The comparison itself must be able to fail."""
    case = next((c for c in CASES if c[0] == "tensorrt_lean_bindings"), None)
    if case is None:
        pytest.skip("no lean bindings here")
    d = real(case)
    fake = fake_tensorrt.make(d["version"], engine_io=[])
    fake.IExecutionContext.execute_async_v4 = lambda self, s: True
    fake.IExecutionContext.set_tensor_address = lambda self, name: True  # one argument short
    problems = fake_problems(fake, d, only=RUNTIME_CLASSES)
    assert any("execute_async_v4: no such member" in p for p in problems)
    assert any("set_tensor_address: the fake takes 1..1" in p for p in problems)
    assert resolve(d, ("TensorIOMode", "INPUTS")) == "TensorIOMode.INPUTS" and resolve(d, ("Runtime",)) is None


def test_doctor_reports_the_real_lean_and_dispatch_runtimes_with_their_versions():
    from toolchain.doctor import packages

    pk = packages()
    for shown in ("tensorrt_lean", "tensorrt_dispatch"):
        import_name = f"{shown}_bindings"
        if not _available(import_name, None):
            pytest.skip(f"{import_name} is not installed here")
        d = describe(import_name, None)
        if "error" in d:
            assert d["error"].split(":")[0] in pk[shown].get("import_error", "")
            continue
        assert pk[shown]["version"] == d["version"] and pk[shown]["import_as"] == import_name, pk[shown]


def test_plan_fixes_with_the_real_lean_runtime_and_no_gpu(monkeypatch):
    """Issue 29 item 2 with the REAL lean bindings of this environment (the edge extra's runtime), full TensorRT and
    TensorRT-RTX absent, no GPU: a valid version-compatible plan needs a GPU, not a rebuild; one from a newer
    TensorRT needs a newer lean runtime (or an older TensorRT); a TensorRT-RTX plan is told what the edge extra
    runs. The manifests are written here; the real module supplies the runtime's flavour and version."""
    import sys

    from engines.manifest import BatchProfile, Manifest
    from engines.preprocess import PreprocessSpec
    from engines.tensorrt_engine import plan_problems, rebuild_command, runtime_for

    if not _available("tensorrt_lean_bindings", None) or "error" in describe("tensorrt_lean_bindings", None):
        pytest.skip("the real lean bindings do not import here")
    for name in ("tensorrt", "tensorrt_bindings", "tensorrt_rtx", "tensorrt_rtx_bindings", "tensorrt_lean"):
        monkeypatch.setitem(sys.modules, name, None)  # only tensorrt_lean_bindings (and dispatch) are found
    lean_version = describe("tensorrt_lean_bindings", None)["version"]

    def plan(flavor, version, **flags):
        builder = {"flavor": flavor, "version": version, "flags": {"hardware_compatibility": "none", **flags},
                   "gpu": {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"},
                   "compute_capabilities": ["SM89"] if flavor == "tensorrt-rtx" else []}
        return Manifest(kind="plan", model={"name": "m"}, preprocess=PreprocessSpec(), inputs=[], outputs=[],
                        batch=BatchProfile(1, 1, 1), builder=builder, parent={"file": "m.onnx"})

    def fix(m):
        backend = runtime_for(m)
        assert backend is not None and backend.flavor == "tensorrt-lean" and backend.version == lean_version
        problems = plan_problems(m, backend, None)
        return [str(p) for p in problems], rebuild_command(m, "m.plan", problems, backend)

    why, how = fix(plan("tensorrt", lean_version, version_compatible=True))
    assert why == ["no NVIDIA GPU found here"]
    assert how == ("run it on a machine with an NVIDIA GPU of compute capability 9.0 (it was built on NVIDIA H100 "
                   "80GB HBM3): the plan needs no rebuild")
    major, minor = (int(x) for x in lean_version.split(".")[:2])
    newer = f"{major}.{minor + 1}.0.1"
    why, how = fix(plan("tensorrt", newer, version_compatible=True))
    assert f"TensorRT lean runtime {lean_version} (tensorrt_lean_bindings) is older" in why[0]
    assert how.startswith(f"upgrade the lean runtime (pip install tensorrt-lean-cu13-bindings=={newer} "
                          f"tensorrt-lean-cu13-libs=={newer}) or build with TensorRT <= {major}.{minor} "
                          "--version-compatible (trtc build m.onnx -o m.plan --force --backend tensorrt "
                          "--version-compatible)"), how
    why, how = fix(plan("tensorrt-rtx", "1.7.1.116"))
    assert why[0].endswith("(tensorrt_lean_bindings) runs only TensorRT version-compatible plans"), why
    assert how.startswith('the edge extra runs only TensorRT version-compatible plans: pip install "trtc[rtx]" '
                          "to run TensorRT-RTX plans"), how
