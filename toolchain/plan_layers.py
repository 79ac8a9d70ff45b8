"""The layers of a TensorRT plan, as its engine inspector lists them, matched to the ONNX nodes they were built from.

    listing = plan_layers("lite0.plan")   # needs a TensorRT (or TensorRT-RTX) that deserializes the plan here

TensorRT fuses and reorders the network it parses, so a plan has no tensor for most ONNX nodes: a convolution, its
bias and its activation become one kernel. The engine inspector (``ICudaEngine.create_engine_inspector()``, then
``get_engine_information(LayerInformationFormat.JSON)``) lists the layers of the built engine; with the DETAILED
profiling verbosity that `trtc build` sets, each layer carries its inputs and outputs with their types and, in
``Metadata``, the ONNX nodes it was made from (``[ONNX Layer: NAME]``, one per fused node, separated by the ASCII
unit or record separator). With less verbosity only the layers' names are listed, and a layer is matched to ONNX
nodes by the names in its own name (TensorRT names a fused layer ``a + b``, a pointwise fusion ``PWN(a, b)``).

For each layer, in the engine's order: its name, type, the precision it computes in (read from its inputs, as the
post-build precision check reads them), its outputs and their types, and the ONNX nodes it covers. Also: the ONNX
nodes no layer names (folded into constants, or fused without a trace), and the layers that name no ONNX node
(reformatting copies TensorRT inserts between layouts or types).

What this is not: a per-layer comparison of a plan's values. A plan computes only its marked outputs; comparing its
layers needs an engine built with those layers' tensors marked as outputs (Polygraphy's ``--trt-outputs mark all``),
which trtc does not build. The per-layer comparison of the plan's parent ONNX (`trtc validate --layers` with the
.onnx the plan was built from) shows where the precision recipe loses; the listing shows what TensorRT made of it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import TrtcError, UsageProblem

_ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]\x1e\x1f]+)\]")
_NAME_TOKEN = re.compile(r"[^\s+(),\x1e\x1f]+")
_REFORMAT = ("reformat", "copynode", "reformatting")


@dataclass
class PlanLayers:
    plan: str
    onnx: str | None  # the ONNX file the layers were matched to (the plan's parent), if found
    runtime: str  # the TensorRT that read the plan
    verbosity: str  # "detailed" (types and ONNX nodes per layer) or "names" (names only)
    layers: list[dict]  # {"index", "name", "type", "precision", "outputs", "onnx_nodes", "reformat"}
    onnx_nodes: int  # nodes in the ONNX
    not_in_any_layer: list[str]  # ONNX nodes no layer names
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def onnx_nodes_of(layer: dict | str, known: set[str]) -> list[str]:
    """The ONNX nodes one inspector layer was made from: its ``Metadata`` entries, else the names among ``known``
    that its name is made of."""
    if isinstance(layer, dict):
        if "Metadata" in layer:  # DETAILED verbosity: the ONNX nodes as TensorRT recorded them (none: a copy)
            return list(dict.fromkeys(n.strip() for n in _ONNX_LAYER.findall(str(layer.get("Metadata") or ""))))
        name = str(layer.get("Name", ""))
    else:
        name = layer
    if _is_reformat(name):  # "Reformatting CopyNode for Input Tensor 0 to conv1" names the layer it feeds
        return []
    return list(dict.fromkeys(t for t in _NAME_TOKEN.findall(name) if t in known))


def _is_reformat(text: str) -> bool:
    return any(w in text.lower() for w in _REFORMAT)


def _tensor(t) -> dict:
    from .build import inspector_precision

    if not isinstance(t, dict):
        return {"name": str(t), "precision": None}
    return {"name": str(t.get("Name", "?")), "precision": inspector_precision(t)}


def parse_layers(info: dict, nodes: list[str]) -> tuple[list[dict], str]:
    """The rows of :class:`PlanLayers` from ``get_engine_information(JSON)`` (10.x or 11.x form) and the ONNX node
    names in graph order; and the verbosity the plan was built with."""
    from .build import inspector_precision

    known = set(nodes)
    raw = info.get("Layers")
    if not isinstance(raw, list):
        raise TrtcError("the engine inspector's answer has no list of layers",
                        "run with --debug and report the TensorRT version and the inspector output")
    rows, detailed = [], any(isinstance(layer, dict) for layer in raw)
    for i, layer in enumerate(raw):
        if isinstance(layer, dict):
            name, kind = str(layer.get("Name", "?")), str(layer.get("LayerType", "?"))
            found = [p for p in (inspector_precision(t) for t in layer.get("Inputs", []) if isinstance(t, dict)) if p]
            precision = next((p for p in ("int8", "fp8", "fp16", "bf16", "fp32") if p in found), None)
            outputs = [_tensor(t) for t in layer.get("Outputs", [])]
        else:
            name, kind, precision, outputs = str(layer), None, None, []
        covered = onnx_nodes_of(layer, known)
        rows.append({"index": i, "name": name, "type": kind, "precision": precision, "outputs": outputs,
                     "onnx_nodes": covered,
                     "reformat": not covered and _is_reformat(f"{name} {kind}")})
    return rows, "detailed" if detailed else "names"


def _parent_onnx(plan: Path, manifest) -> Path | None:
    parent = (manifest.parent or {}) if manifest is not None else {}
    name = parent.get("file")
    if not name:
        return None
    p = plan.parent / Path(name).name
    return p if p.is_file() else None


def engine_layers(trt, runtime_name: str, engine, onnx_path: Path | None) -> tuple[list[dict], str, list[str], int]:
    """Ask ``engine``'s inspector (of the bindings module ``trt``) for the engine information as JSON and match the
    layers to ``onnx_path``'s nodes: (rows, verbosity, ONNX nodes no layer names, ONNX node count)."""
    if not hasattr(trt, "EngineInspector"):  # the lean and dispatch runtimes bind no inspector
        raise UsageProblem(f"{runtime_name} has no engine inspector binding, so a plan's layers cannot be listed",
                           "install full TensorRT (or TensorRT-RTX for its plans) where the plan runs")
    inspector = engine.create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    nodes = []
    if onnx_path is not None:
        import onnx

        nodes = [n.name for n in onnx.load(str(onnx_path), load_external_data=False).graph.node if n.name]
    rows, verbosity = parse_layers(info, nodes)
    named = {n for r in rows for n in r["onnx_nodes"]}
    return rows, verbosity, [n for n in nodes if n not in named], len(nodes)


def plan_layers(plan: str | Path, device: int = 0, onnx: str | Path | None = None) -> PlanLayers:
    """The layers of ``plan`` (see the module docstring), matched to the nodes of ``onnx`` (default: the plan's
    parent, named by its manifest and found beside it)."""
    from engines.tensorrt_engine import load_plan

    p = Path(plan)
    backend, _runtime, engine, manifest = load_plan(p, device)  # the manifest checked against this machine first
    onnx_path = Path(onnx) if onnx else _parent_onnx(p, manifest)
    warnings = []
    if onnx_path is None:
        warnings.append(f"the ONNX that {p.name} was built from is not found beside it: layers are listed without "
                        "their ONNX nodes")
    rows, verbosity, missing, count = engine_layers(backend.module, backend.describe(), engine, onnx_path)
    if verbosity != "detailed":
        warnings.append(f"{p.name} was built without DETAILED profiling verbosity: the inspector gives layer names "
                        "only (no types, no ONNX nodes of fused layers); rebuild with trtc build")
    return PlanLayers(plan=str(p), onnx=str(onnx_path) if onnx_path else None, runtime=backend.describe(),
                      verbosity=verbosity, layers=rows, onnx_nodes=count, not_in_any_layer=missing,
                      warnings=warnings)


__all__ = ["plan_layers", "parse_layers", "engine_layers", "onnx_nodes_of", "PlanLayers"]
