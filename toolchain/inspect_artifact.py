"""`trtc inspect`: what an artifact is, from its manifest, and whether this machine can run it (and why not)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from engines._gpu import device as gpu_device
from engines.errors import TrtcError, UsageProblem, first_line
from engines.manifest import read_manifest, read_manifest_if_any


def inspect_artifact(path: str | Path, device: int = 0) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UsageProblem(f"no such file: {p}", "give an .onnx or .plan made by trtc")
    m = read_manifest_if_any(p)
    if m is None:  # an artifact trtc made (a .pt2 program too) is described from its manifest
        from .model_source import refuse_non_onnx

        refuse_non_onnx(p, "inspect", plans=True)
    if m is None and p.suffix.lower() == ".onnx":
        return _bare_onnx(p)
    if m is None and p.suffix.lower() != ".plan":
        raise UsageProblem(f"{p} is neither an .onnx model nor a .plan", "give an .onnx or .plan made by trtc")
    if m is None:
        m = read_manifest(p)  # raises: a plan without its manifest cannot be described
    out = {"artifact": str(p), "kind": m.kind, "bytes": m.artifact.get("bytes"), "sha256": m.artifact.get("sha256"),
           "model": m.model, "precision": m.precision, "batch": m.batch.to_dict(),
           "inputs": [t.to_dict() for t in m.inputs], "outputs": [t.to_dict() for t in m.outputs],
           "preprocess": m.preprocess.to_dict(), "labels": len(m.labels) if m.labels else 0, "parent": m.parent,
           "created": m.created, "producer": m.producer.get("tool")}
    gpu = gpu_device(device)
    if m.kind == "plan":
        from engines.tensorrt_engine import plan_problems, rebuild_command, runtime_for

        from .render import compatibility

        b = m.builder or {}
        out["builder"] = b
        flags = b.get("flags") or {}
        out["version_compatible"] = bool(flags.get("version_compatible"))
        out["lean_runtime_excluded"] = bool(flags.get("exclude_lean_runtime"))
        out["runtimes"] = compatibility(b)  # which runtimes load it, trtc[edge]'s lean runtime among them
        backend = runtime_for(m)  # the runtime load_plan would use (full TensorRT, else the lean or dispatch one)
        problems = plan_problems(m, backend, gpu)
        out["runs_here"] = not problems
        out["why_not"] = [str(x) for x in problems]
        if problems:
            out["rebuild"] = rebuild_command(m, p, problems, backend)
        else:
            out["layer_precisions"] = _engine_layers(p, device)
    elif m.kind == "program":  # a torch.export program: the compiled PyTorch engine runs it where torch is
        from engines._deps import is_installed

        out["runs_here"] = is_installed("torch")
        out["why_not"] = [] if out["runs_here"] else ['torch is not installed: pip install "trtc[torch]"']
    else:
        out["runs_here"], out["why_not"] = _onnx_runs(m, gpu)
        out["operators"] = _onnx_ops(p)
    return out


def _engine_layers(path: Path, device: int) -> dict | None:
    from engines.tensorrt_engine import load_plan

    from .build import engine_precisions

    try:
        backend, runtime, _engine, _m = load_plan(path, device)
        if not hasattr(backend.module, "EngineInspector"):  # the lean/dispatch runtimes have no inspector
            return {"error": f"{backend.describe()} has no EngineInspector binding: layer precisions unread"}
        info = engine_precisions(backend.module, runtime, path.read_bytes())
    except TrtcError as exc:
        return {"error": exc.reason}
    if info is None:
        return None
    counts = Counter(r["precision"] for r in info["layers"])
    return {"source": info["source"], "counts": dict(counts), "layers": info["layers"]}


def _onnx_runs(m, gpu) -> tuple[bool, list[str]]:
    from engines._deps import is_installed

    if not is_installed("onnxruntime"):
        return False, ['ONNX Runtime is not installed (pip install "trtc[cpu]" or "trtc[gpu]")']
    return True, []


def _onnx_ops(path: Path) -> dict | None:
    from engines._deps import is_installed

    if not is_installed("onnx"):
        return None
    model = _load_onnx(path)
    return dict(Counter(n.op_type for n in model.graph.node).most_common())


def _load_onnx(path: Path):
    """The ONNX model in ``path``; a file that is not one (corrupt, cut short, another format) is a TrtcError."""
    from engines._deps import require

    onnx = require("onnx", "Inspecting ONNX files", extra="export")
    if path.stat().st_size == 0:  # protobuf parses no bytes as an empty ModelProto, which "runs" nothing
        raise TrtcError(f"{path} is empty (0 bytes), not an ONNX model",
                        "give an .onnx file made by trtc export/quantize (or re-export it: the file may be cut short)")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends: the file is not an ONNX model
        first = first_line(exc)
        raise TrtcError(f"{path} is not a readable ONNX model ({first})",
                        "give an .onnx file made by trtc export/quantize (or re-export it: the file may be cut "
                        "short or corrupt)") from exc
    if not model.graph.node or not model.graph.input:
        raise TrtcError(f"{path} holds no ONNX graph (no nodes or no inputs)",
                        "give an .onnx file made by trtc export/quantize (or re-export it)")
    return model


def _bare_onnx(path: Path) -> dict:
    """An ONNX file from elsewhere: what its graph says (no preprocessing or labels are known)."""
    from engines._deps import require

    onnx = require("onnx", "Inspecting ONNX files without a manifest", extra="export")
    from .precision.graph import tensor_spec

    model = _load_onnx(path)
    inits = {i.name for i in model.graph.initializer}

    ops = dict(Counter(n.op_type for n in model.graph.node).most_common())
    half = any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    mode = "int8" if "QuantizeLinear" in ops else "fp16" if half else "fp32"
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    runs, why = _onnx_runs(None, None)
    return {"artifact": str(path), "kind": "onnx (no manifest)", "bytes": path.stat().st_size,
            "model": {"name": path.stem, "source": f"opset {opset}"}, "precision": {"mode": mode},
            "batch": {"min": "?", "opt": "?", "max": "?"},
            "inputs": [tensor_spec(v).to_dict() for v in model.graph.input if v.name not in inits],
            "outputs": [tensor_spec(v).to_dict() for v in model.graph.output], "operators": ops, "runs_here": runs, "why_not": why,
            "parent": None, "note": "no manifest: preprocessing, labels and batch range unknown"}
