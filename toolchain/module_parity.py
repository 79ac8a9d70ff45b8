"""Per-layer parity against a PyTorch reference: each module's output in PyTorch against the ONNX tensor the export
made of it, on the same inputs.

    report = module_parity("pretrained:efficientnet-lite0", "lite0.fp16.onnx", x)

Which ONNX tensor is a module's output is read from the export, where its names allow:

- torch.onnx's dynamo exporter records, on each node, the module scopes it was made in
  (``pkg.torch.onnx.name_scopes``: ``['', 'blocks.0', 'blocks.0.bn1', 'batch_norm']``, the last entry the
  operation itself);
- the TorchScript exporter names each node by its scopes (``/blocks.0/blocks.0.bn1/BatchNormalization``).

A module's call is a run of consecutive nodes (graph order) made in its scope, and its output is the tensor of that
run that a node outside it reads (or the graph's output). A module called k times gives k runs, matched to its k
calls in order; where the counts differ it is left out (and said). A module whose nodes the exporter or an optimiser
merged into another's (a BatchNormalization folded into its convolution) has no run of its own: the convolution's
tensor is then the BatchNormalization's output, and the convolution module has no row. Where several modules end
in the same tensor (a block and its last layer), the row names the innermost.

A candidate that trtc made from the export (FP16, INT8) keeps the export's tensor names: the scopes are read from
the candidate, or from its parent ONNX (named by its manifest, found beside it) when the candidate has none.

Rows are those of toolchain.layers (relative L2 error and cosine against the module's output, the error carried
from the nearest compared tensors upstream and the error added, overflow), with no ``alone`` figure: PyTorch is not
cut at every layer.
"""

from __future__ import annotations

import ast
import time
from pathlib import Path

import numpy as np

from engines._deps import require

from ._ui import Reporter
from .errors import UsageProblem

SCOPES = "pkg.torch.onnx.name_scopes"


def _scopes(node) -> list[str] | None:
    """The module paths a node was made in, outermost first (the root module left out), or None if unknown."""
    for p in node.metadata_props:
        if p.key == SCOPES:
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                return None
            return [s for s in scopes[:-1] if s]  # the last entry is the operation's own name
    if node.name.startswith("/") and node.name.count("/") >= 2:  # the TorchScript exporter: /a/a.b/Op_1
        return _full_paths([s for s in node.name.split("/")[1:-1] if s])
    return None


def _full_paths(segments: list[str]) -> list[str]:
    """The TorchScript exporter's scope segments as module paths: each segment names a module inside the one before,
    by its attribute ("blocks"), or by its container's name and its index ("blocks.0" inside "blocks"):
    stages / stages.0 / blocks / blocks.0 / conv_dw -> stages, stages.0, stages.0.blocks, stages.0.blocks.0,
    stages.0.blocks.0.conv_dw."""
    out, full = [], ""
    for seg in segments:
        head = seg.split(".", 1)[0]
        if full and "." in seg and full.rsplit(".", 1)[-1] == head:
            full = full[: len(full) - len(head)] + seg
        else:
            full = f"{full}.{seg}" if full else seg
        out.append(full)
    return out


def module_outputs(model) -> tuple[list[tuple[str, int, str]], int]:
    """(module path, call index, ONNX tensor) for each call of a module whose output is a tensor of ``model`` (an
    onnx ModelProto), in graph order of the tensors, innermost module per tensor; and how many nodes carried scopes."""
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    scopes = [_scopes(n) for n in nodes]
    known = sum(s is not None for s in scopes)
    readers: dict[str, set[int]] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            readers.setdefault(t, set()).add(i)
    outputs = {o.name for o in model.graph.output}
    runs: dict[str, list[list[int]]] = {}  # module path -> runs of node indices
    for i, s in enumerate(scopes):
        for path in s or []:
            r = runs.setdefault(path, [])
            if r and r[-1][-1] == i - 1:
                r[-1].append(i)
            else:
                r.append([i])
    found: dict[str, tuple[str, int, int]] = {}  # tensor -> (module, call, depth)
    for path, calls in runs.items():
        for k, run in enumerate(calls):
            inside = set(run)
            leaving = [t for i in run for t in nodes[i].output
                       if t and (t in outputs or readers.get(t, set()) - inside)]
            if len(leaving) != 1:
                continue
            depth = scopes[run[-1]].index(path)  # how deep the module sits in the scopes of its last node
            t = leaving[0]
            if t not in found or depth > found[t][2]:
                found[t] = (path, k, depth)
    order = {t: i for i, n in enumerate(nodes) for t in n.output}
    return [(m, k, t) for t, (m, k, _) in sorted(found.items(), key=lambda kv: order[kv[0]])], known


def _calls_per_module(model) -> dict[str, int]:
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    count: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for path in _scopes(n) or []:
            if last.get(path) != i - 1:
                count[path] = count.get(path, 0) + 1
            last[path] = i
    return count


def _mapped_model(candidate: Path):
    """The ONNX whose node scopes map modules to tensors: the candidate, else its parent beside it."""
    from engines.manifest import read_manifest_if_any

    from .precision import graph as G

    def scoped(model) -> bool:
        return sum(_scopes(n) is not None for n in model.graph.node) * 2 >= len(model.graph.node)

    cand = G.load(candidate)
    m = read_manifest_if_any(candidate)
    name = ((m.parent or {}) if m is not None else {}).get("file")
    parent = candidate.parent / Path(name).name if name else None
    # the parent first: trtc's FP16 and INT8 passes keep its tensor names but add nodes (Casts, Q/DQ) without scopes
    if parent is not None and parent.suffix == ".onnx" and parent.is_file() and parent != candidate:
        pm = G.load(parent)
        if scoped(pm):
            return cand, pm
    if scoped(cand):
        return cand, cand
    raise UsageProblem(f"{candidate.name} does not say which PyTorch module made which of its tensors (no module "
                       "scopes in its nodes, nor in its parent's)",
                       "export it with trtc export (either exporter records them), or compare it per layer with its "
                       "ONNX parent as the reference")


def _ancestors(model, mapped: set[str]) -> dict[str, set[str]]:
    """For each tensor in ``mapped``: the nearest tensors in ``mapped`` (or graph inputs) upstream of it."""
    producer = {t: n for n in model.graph.node for t in n.output}
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for t in mapped:
        seen, stack, near = set(), list(producer[t].input) if t in producer else [], set()
        while stack:
            u = stack.pop()
            if not u or u in seen or u in inits:
                continue
            seen.add(u)
            if u in mapped or u not in producer:
                near.add(u)
            else:
                stack.extend(producer[u].input)
        out[t] = near
    return out


def module_parity(reference: str, candidate: str | Path, x: np.ndarray, *, precision: str = "fp32",
                  device: str = "cpu", batch: int = 4, threshold: float | None = None, top: int = 10,
                  qdq_fusion: bool = True, reporter: Reporter | None = None):
    """Compare each module of the PyTorch ``reference`` (a source as `trtc export` takes it) with the tensor its
    export made of it in ``candidate`` on the inputs ``x``; a toolchain.layers.LayerReport (``matched_by``:
    "module")."""
    from . import layer_stats as L
    from .reference import TorchReference

    torch = require("torch", "Comparing with a PyTorch reference per module", extra="export")
    reporter = reporter or Reporter()
    t0 = time.perf_counter()
    threshold = L.DEFAULT_LAYER_THRESHOLD.get(precision, 0.1) if threshold is None else threshold
    cand_path = Path(candidate)
    cand, mapped_from = _mapped_model(cand_path)
    found, _ = module_outputs(mapped_from)
    ref = TorchReference(reference, device=device)
    modules = dict(ref.fn.named_modules()) if hasattr(ref.fn, "named_modules") else {}
    pairs, warnings = _pairs(found, modules, {t for n in cand.graph.node for t in n.output}, cand_path)
    unmatched = sorted({m for m, _, _ in found} - {m for m, _, _ in pairs})
    if not pairs:
        raise UsageProblem(f"no module of {reference} maps to a tensor of {cand_path.name}",
                           "give the candidate exported from this reference (trtc export), or its FP16/INT8 copy")
    sess = L._ort_session(_with_outputs(cand, [t for _, _, t in pairs]), device, qdq_fusion)
    types = {o.name: L.ORT_TYPES.get(o.type, o.type) for o in sess.get_outputs()}
    sums, skipped = _compare(torch, ref, modules, pairs, _calls_per_module(mapped_from), sess, types,
                             next(iter(L._feeds(cand))), x, batch, reporter)
    if skipped:
        warnings.append(f"{len(skipped)} module output(s) not compared: " + "; ".join(list(skipped.values())[:4]))
    rows = _rows(mapped_from, pairs, sums, modules, types)
    worst = sorted(range(len(rows)), key=lambda i: L.rank_key(rows[i]), reverse=True)[:top]
    first = next((r for r in rows if L._over(r, threshold)), None)
    return L.LayerReport(reference=str(reference), candidate=str(candidate), precision=precision, samples=len(x),
                         matched_by="module", matched=len(rows), unmatched=unmatched, candidate_only={},
                         not_compared=sorted(skipped), threshold=threshold, first_over=first, worst=worst, rows=rows,
                         seconds=round(time.perf_counter() - t0, 2), warnings=warnings)


def _with_outputs(model, names):
    from .precision import suffix

    return suffix.with_outputs(model, names)


def _pairs(found, modules: dict, cand_tensors: set, cand_path: Path) -> tuple[list, list]:
    """([(module, call, tensor)] that both sides have, [warnings for tensors the candidate lacks])."""
    warnings, pairs = [], []
    for m, k, t in found:
        if m not in modules:
            continue
        if t not in cand_tensors:
            warnings.append(f"{m}: its tensor {t} is not in {cand_path.name}")
            continue
        pairs.append((m, k, t))
    return pairs, warnings


def _compare(torch, ref, modules, pairs, calls, sess, types, x_name, x, batch, reporter) -> tuple[dict, dict]:
    """Run the reference (its modules' outputs caught by forward hooks) and the candidate's session batch by batch:
    ({tensor: its sums}, {tensor: why it was not compared})."""
    from . import layer_stats as L
    from .precision import calibration as cal

    got: dict[str, list] = {m: [] for m, _, _ in pairs}
    hooks = []
    for m in got:
        def hook(_mod, _inp, out, m=m):
            o = out[0] if isinstance(out, (tuple, list)) else out
            got[m].append(o.detach().float().cpu().numpy() if torch.is_tensor(o) else None)
        hooks.append(modules[m].register_forward_hook(hook))
    names = [t for _, _, t in pairs]
    sums = {t: L._Sums() for t in names}
    skipped: dict[str, str] = {}
    fixed = sess.get_inputs()[0].shape[0]
    fixed = fixed if isinstance(fixed, int) else None
    try:
        with reporter.phase(f"per-module parity of {len(pairs)} modules on {len(x)} samples", total=len(x)) as bar:
            for _, n, xb in cal.run_batches(lambda xb: xb, x, fixed or batch, fixed is not None):
                for v in got.values():
                    v.clear()
                with torch.inference_mode():
                    ref.fn(torch.from_numpy(np.ascontiguousarray(xb, np.float32)).to(ref.device))
                outs = dict(zip(names, sess.run(names, {x_name: xb})))
                for m, k, t in pairs:
                    if t not in skipped:
                        _add(got[m], m, k, t, calls, outs, types, sums, skipped, n, len(xb))
                del outs
                bar.advance(n)
    finally:
        for h in hooks:
            h.remove()
    for t in skipped:
        sums.pop(t, None)
    return sums, skipped


def _add(seen, m, k, t, calls, outs, types, sums, skipped, n, size) -> None:
    """Module ``m``'s ``k``-th output this batch (``seen``) against the candidate's tensor ``t``: added to its sums,
    or the reason it cannot be compared noted in ``skipped``."""
    from . import layer_stats as L

    if len(seen) != calls.get(m, 1) or k >= len(seen) or seen[k] is None:
        skipped[t] = (f"{m} ran {len(seen)} time(s) in PyTorch and {calls.get(m, 1)} in the graph"
                      if seen and seen[-1] is not None else f"{m} gives no tensor")
        return
    if seen[k].shape != outs[t].shape or types.get(t) not in L.FLOATS:
        skipped[t] = f"{m}'s output {seen[k].shape} against {t} {outs[t].shape} {types.get(t)}"
        return
    sums[t].add(seen[k], outs[t], n, size)


def _rows(model, pairs, sums, modules, types) -> list[dict]:
    from . import layer_stats as L

    err = {t: s.rel_l2() for t, s in sums.items()}
    near = _ancestors(model, set(sums))
    op = {t: n.op_type for n in model.graph.node for t in n.output}
    counted: dict[str, int] = {}
    for m, _, _ in pairs:
        counted[m] = counted.get(m, 0) + 1
    rows = []
    for m, k, t in pairs:
        if t not in sums:
            continue
        s, e = sums[t], err[t]
        carried = max([err.get(u, 0.0) for u in near[t]], default=0.0)
        rows.append({"index": len(rows), "node": m + (f"#{k}" if counted[m] > 1 else ""),
                     "op": type(modules[m]).__name__, "onnx_op": op.get(t), "tensor": t, "candidate_tensor": t,
                     "dtype": types.get(t, "?"), "rel_l2": L._num(e), "cosine": round(s.cosine(), 7),
                     "max_abs_diff": L._num(s.max_abs), "carried": L._num(carried),
                     "added": L._num(e - carried if np.isfinite(e) else float("inf")), "alone": None,
                     "alone_overflow": None, "overflow_inherited": any(sums[u].ref_beyond or sums[u].nonfinite
                                                                 for u in near[t] if u in sums),
                     "overflow": {"nonfinite": s.nonfinite, "fp16_saturated": s.fp16_saturated}, "int8": None})
    return rows


__all__ = ["module_parity", "module_outputs"]
