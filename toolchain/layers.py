"""Per-layer parity between two ONNX models on the same inputs: where a candidate parts from its reference.

    report = layer_parity("lite0.onnx", "lite0.int8.onnx", x)   # x: (N, C, H, W) model inputs, N small (8-32)

The tensors of the two graphs are matched by name where the candidate kept its parent's names (trtc's FP16 and INT8
passes do; a Q/DQ pair is matched to the tensor it quantizes), otherwise by graph position (the sequences of
operators, Casts and Q/DQ left out, aligned). Both models run with the matched tensors as extra outputs, one batch
at a time: per tensor only running sums are kept (squared error and norm, per-sample cosine, overflow counts), so
no input's tensors outlive its batch.

For each reference node, in graph order: the relative L2 error and the cosine of the candidate's tensor against the
reference's, the error its inputs already carried (the largest of theirs) and the error the node adds (its output's
minus that), and overflow: non-finite values in the candidate, and in an FP16 tensor, values at or beyond FP16's
largest (65504). A quantized input also gets its INT8 error and the share of its values beyond the quantizer's
range (clipped).
"""

from __future__ import annotations

import copy
import difflib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._ui import Reporter
from .errors import UsageProblem, first_line
from .layer_stats import (DEFAULT_LAYER_THRESHOLD, FLOATS, ORT_TYPES, LayerReport, _feeds, _num,
                          _ort_session, _over, _Sums, rank_key)
from .precision import calibration as cal
from .precision import suffix

# ops that do not compute (type changes and quantizers): left out of the alignment by graph position
PASS_THROUGH = {"Cast", "QuantizeLinear", "DequantizeLinear", "Identity", "Constant"}
DEFAULT_SAMPLES = 16
DEFAULT_TOP = 10
BATCH = 4  # inputs per run: each run holds every matched tensor of this many inputs (Lite0: about 1.1 GB peak)


@dataclass
class Matching:
    """Which candidate tensor stands for each reference tensor, and how it was found."""

    pairs: dict[str, str]  # reference tensor -> candidate tensor
    by: str  # "name" or "position"
    quantized: dict[str, tuple[str, str | None]]  # reference tensor -> (candidate DQ output, its scale initializer)
    unmatched: list[str]  # reference tensors without a candidate tensor
    candidate_only: dict[str, int]  # op type -> candidate node outputs that stand for no reference tensor


def _computing_nodes(model) -> list:
    return [n for n in model.graph.node if n.op_type != "Constant"]


def match_tensors(ref, cand) -> Matching:
    """Match the node outputs of ``ref`` to those of ``cand`` (onnx ModelProtos): by name when at least half of them
    have a namesake in the candidate, else by graph position."""
    ref_tensors = [t for n in _computing_nodes(ref) for t in n.output if t]
    cand_tensors = {t for n in cand.graph.node for t in n.output if t}
    named = {t: t for t in ref_tensors if t in cand_tensors}
    if ref_tensors and len(named) * 2 >= len(ref_tensors):
        pairs, by = named, "name"
    else:
        pairs, by = _by_position(ref, cand), "position"
    pairs.update({t: t for t in _feeds(ref) & _feeds(cand)})  # the graph input: the same data on both sides
    quantized = _quantized(cand, {c: r for r, c in pairs.items()})
    used = set(pairs.values()) | {dq for dq, _ in quantized.values()}
    only: dict[str, int] = {}
    for n in cand.graph.node:
        for t in n.output:
            if t and t not in used:
                only[n.op_type] = only.get(n.op_type, 0) + 1
    return Matching(pairs=pairs, by=by, quantized=quantized, unmatched=[t for t in ref_tensors if t not in pairs],
                    candidate_only=dict(sorted(only.items(), key=lambda kv: -kv[1])))


def _by_position(ref, cand) -> dict[str, str]:
    """Align the two graphs' sequences of computing operators (type changes and quantizers left out) and pair the
    outputs of aligned nodes slot by slot."""
    a = [n for n in ref.graph.node if n.op_type not in PASS_THROUGH]
    b = [n for n in cand.graph.node if n.op_type not in PASS_THROUGH]
    sm = difflib.SequenceMatcher(None, [n.op_type for n in a], [n.op_type for n in b], autojunk=False)
    pairs = {}
    for block in sm.get_matching_blocks():
        for k in range(block.size):
            for r, c in zip(a[block.a + k].output, b[block.b + k].output):
                if r and c:
                    pairs[r] = c
    _through(ref, cand, pairs)
    return pairs


def _through(ref, cand, pairs: dict[str, str]) -> None:
    """Pair the outputs of the reference's Identity and Cast nodes, left out of the alignment, with the candidate's
    node of the same type that reads the same tensor (directly, or through a Cast the candidate added)."""
    readers: dict[str, list] = {}
    for n in cand.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    for n in ref.graph.node:
        if n.op_type not in ("Identity", "Cast") or n.input[0] not in pairs or n.output[0] in pairs:
            continue
        near = readers.get(pairs[n.input[0]], [])
        near = near + [r for c in near if c.op_type == "Cast" for r in readers.get(c.output[0], [])]
        same = next((c for c in near if c.op_type == n.op_type), None)
        if same is not None:
            pairs[n.output[0]] = same.output[0]


def _quantized(cand, back: dict[str, str]) -> dict[str, tuple[str, str | None]]:
    """Activation Q/DQ pairs of the candidate: reference tensor -> (DQ output, scale initializer), found by
    following each DequantizeLinear back through its QuantizeLinear and the Casts before it."""
    producer = {t: n for n in cand.graph.node for t in n.output}
    inits = {i.name for i in cand.graph.initializer}
    out = {}
    for n in cand.graph.node:
        if n.op_type != "DequantizeLinear" or n.input[0] in inits:
            continue
        q = producer.get(n.input[0])
        if q is None or q.op_type != "QuantizeLinear":
            continue
        src = q.input[0]
        while src in producer and producer[src].op_type == "Cast":
            src = producer[src].input[0]
        if src in back and back[src] not in out:
            out[back[src]] = (n.output[0], q.input[1] if len(q.input) > 1 else None)
    return out


def _load(path) -> object:
    from .precision import graph as G

    return G.load(path)


def _scale_of(cand, name: str | None) -> float | None:
    if name is None:
        return None
    from onnx import numpy_helper

    init = next((i for i in cand.graph.initializer if i.name == name), None)
    if init is None:
        return None
    s = numpy_helper.to_array(init)
    return float(s.reshape(-1)[0]) if s.size == 1 else None


def _isolated(cand, m: Matching, types: dict[str, str]):
    """The candidate cut at every matched tensor: each such tensor becomes an input (fed the reference's values, in the
    candidate's type) and its producer writes a renamed copy, so that each node computes from the reference's inputs:
    (the model, reference tensor -> the candidate's own output, candidate input -> (reference tensor, numpy dtype))."""
    from onnx import helper

    from .precision.graph import all_names, unique

    model = copy.deepcopy(cand)
    outputs = {o.name for o in model.graph.output}
    back = {c: r for r, c in m.pairs.items()}
    cut = {c: types[c] for c in back if c not in _feeds(cand) and c not in outputs
           and types.get(c) in FLOATS}
    taken = all_names(model)
    own = {}
    for n in model.graph.node:
        for k, o in enumerate(n.output):
            if o in cut:
                n.output[k] = own[back[o]] = unique(f"{o}_alone", taken)
            elif o in back and o in outputs:  # a graph output is left as it is: it computes from the cut tensors
                own[back[o]] = o
    model.graph.input.extend(helper.make_tensor_value_info(c, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), None)
                             for c, dt in cut.items())
    return suffix.with_outputs(model, list(own.values())), own, {c: (back[c], dt) for c, dt in cut.items()}


def _run_pairs(ref, cand, m: Matching, x: np.ndarray, device: str, batch: int, qdq_fusion: bool,
               reporter: Reporter) -> tuple[dict[str, _Sums], dict[str, _Sums], dict[str, _Sums], dict[str, str]]:
    """Run both models batch by batch with the matched tensors as extra outputs, and the candidate cut at them
    (:func:`_isolated`); the running sums of each matched floating-point tensor, of each quantized input and of each
    node's output computed from the reference's inputs (reference tensor -> sums), and the candidate's tensor types
    (as ONNX Runtime gives them: a foreign graph may carry none)."""
    feeds_r, feeds_c = _feeds(ref), _feeds(cand)
    if len(feeds_r) != 1 or len(feeds_c) != 1:
        raise UsageProblem("per-layer parity compares single-input models",
                           "give a classifier with one image input as reference and candidate")
    x_r, x_c = next(iter(feeds_r)), next(iter(feeds_c))
    qnames = list(m.quantized)
    every = [m.pairs[t] for t in m.pairs if t not in feeds_r] + [m.quantized[t][0] for t in qnames]
    s_cand = _ort_session(suffix.with_outputs(cand, every), device, qdq_fusion)
    types = {o.name: ORT_TYPES.get(o.type, o.type) for o in s_cand.get_outputs()}
    names = [t for t in m.pairs if t not in feeds_r and types.get(m.pairs[t]) in FLOATS]
    cand_out = [m.pairs[t] for t in names] + [m.quantized[t][0] for t in qnames]
    s_ref = _ort_session(suffix.with_outputs(ref, names), device)
    alone_model, own, cut = _isolated(cand, m, types)
    s_alone = _ort_session(alone_model, device, qdq_fusion)
    scales = {t: _scale_of(cand, m.quantized[t][1]) for t in qnames}
    sums, qsums, osums = {t: _Sums() for t in names}, {t: _Sums() for t in qnames}, {t: _Sums() for t in own}
    fixed = next((d for d in (s_ref.get_inputs()[0].shape[0], s_cand.get_inputs()[0].shape[0])
                  if isinstance(d, int)), None)
    batch = fixed or batch  # a graph with a fixed batch runs exactly that many (the last batch padded)
    with reporter.phase(f"per-layer parity of {len(names)} tensors on {len(x)} samples", total=len(x)) as bar:
        for _, n, xb in cal.run_batches(lambda xb: xb, x, batch, fixed is not None):
            got_r = dict(zip(names, s_ref.run(names, {x_r: xb})))
            got_r.update({t: xb for t in feeds_r})
            got_c = s_cand.run(cand_out, {x_c: xb})
            for t, c in zip(names, got_c[:len(names)]):
                sums[t].add(got_r[t], c, n, len(xb))
            for t, c in zip(qnames, got_c[len(names):]):
                qsums[t].add(got_r[t], c, n, len(xb), scales[t])
            del got_c
            with np.errstate(over="ignore"):  # reference values beyond FP16 become inf: that layer's overflow
                cut_feeds = {c: got_r[r].astype(dt) for c, (r, dt) in cut.items()}
            alone = s_alone.run(list(own.values()), {x_c: xb, **cut_feeds})
            for t, c in zip(own, alone):
                osums[t].add(got_r[t], c, n, len(xb))
            del got_r, alone, cut_feeds
            bar.advance(n)
    return sums, qsums, osums, types


def _rows(ref, m: Matching, sums: dict[str, _Sums], qsums: dict[str, _Sums], osums: dict[str, _Sums],
          cand_types: dict) -> list[dict]:
    """One row per output of each computing reference node, in graph order."""
    err = {t: s.rel_l2() for t, s in sums.items()}
    err.update({t: 0.0 for t in _feeds(ref)})
    inits = {i.name for i in ref.graph.initializer}
    rows = []
    for node_index, n in enumerate(ref.graph.node):
        if n.op_type == "Constant":
            continue
        carried = max([err[i] for i in n.input if i and i not in inits and i in err], default=0.0)
        # the reference's values of an input are beyond its FP16 type: fed to this node on their own, they are inf
        # already, so its overflow there comes from the layer that made them
        inherited = any(sums[i].ref_beyond for i in n.input if i in sums)
        for t in n.output:
            if not t or t not in sums:
                continue
            s, q = sums[t], qsums.get(t)
            e = err[t]
            row = {"index": len(rows), "node": n.name or f"{n.op_type}:{t}", "op": n.op_type, "tensor": t,
                   "candidate_tensor": m.pairs[t], "dtype": cand_types.get(m.pairs[t], "?"),
                   "rel_l2": _num(e), "cosine": round(s.cosine(), 7), "max_abs_diff": _num(s.max_abs),
                   "carried": _num(carried), "added": _num(e - carried if np.isfinite(e) else float("inf")),
                   "alone": _num(osums[t].rel_l2()) if t in osums else None,
                   "alone_overflow": osums[t].nonfinite + osums[t].fp16_saturated if t in osums else None,
                   "overflow_inherited": inherited,
                   "overflow": {"nonfinite": s.nonfinite, "fp16_saturated": s.fp16_saturated},
                   "int8": None}
            if q is not None:
                row["int8"] = {"tensor": m.quantized[t][0], "rel_l2": _num(q.rel_l2()),
                               "clipped": round(q.clipped / q.elements, 7) if q.elements else 0.0}
            rows.append(row)
    return rows


def sample_indices(total: int, samples: int) -> np.ndarray:
    """``samples`` indices spread evenly over ``total`` inputs (every source of the data gets its share)."""
    return np.unique(np.linspace(0, total - 1, min(samples, total)).round().astype(int))


def layer_parity(reference: str | Path, candidate: str | Path, x: np.ndarray, *, precision: str = "fp32",
                 device: str = "cpu", batch: int = BATCH, threshold: float | None = None, top: int = DEFAULT_TOP,
                 qdq_fusion: bool = True, reporter: Reporter | None = None) -> LayerReport:
    """Compare every matched tensor of ``candidate`` with ``reference`` on the inputs ``x`` (all of them: pass a
    small sample). ``precision`` (the candidate's) picks the default ``threshold`` of relative L2 error."""
    reporter = reporter or Reporter()
    t0 = time.perf_counter()
    threshold = DEFAULT_LAYER_THRESHOLD.get(precision, 0.1) if threshold is None else threshold
    ref, cand = _load(reference), _load(candidate)
    m = match_tensors(ref, cand)
    warnings = []
    if m.unmatched:
        warnings.append(f"{len(m.unmatched)} reference tensor(s) have no counterpart in {Path(candidate).name} "
                        f"(matched by {m.by}): {', '.join(m.unmatched[:8])}{' ...' if len(m.unmatched) > 8 else ''}")
    try:
        sums, qsums, osums, types = _run_pairs(ref, cand, m, x, device, batch, qdq_fusion, reporter)
    except UsageProblem:
        raise
    except Exception as exc:  # ONNX Runtime refused a tensor as an output, or the models do not run on x
        raise UsageProblem(f"the models cannot run with their layers' tensors as outputs: {first_line(exc)}",
                           "compare the models without --layers, or report the model") from exc
    rows = _rows(ref, m, sums, qsums, osums, types)
    worst = sorted(range(len(rows)), key=lambda i: rank_key(rows[i]), reverse=True)[:top]
    first = next((r for r in rows if _over(r, threshold)), None)
    return LayerReport(reference=str(reference), candidate=str(candidate), precision=precision, samples=len(x),
                       matched_by=m.by, matched=len(rows), unmatched=m.unmatched, candidate_only=m.candidate_only,
                       not_compared=[t for t in m.pairs if t not in sums and t not in _feeds(ref)],
                       threshold=threshold, first_over=first, worst=worst, rows=rows,
                       seconds=round(time.perf_counter() - t0, 2), warnings=warnings)


PLAN_SUFFIXES = (".plan", ".engine")


def _onnx_path(spec: str, role: str) -> Path:
    p = Path(spec)
    if role == "candidate" and p.suffix.lower() in PLAN_SUFFIXES and p.is_file():
        return p  # a TensorRT plan: its layers are listed (toolchain.plan_layers), not compared
    if role == "reference" and p.suffix.lower() not in (".onnx", *PLAN_SUFFIXES, ".pt2"):
        from .model_source import parse_source

        if parse_source(spec).kind in ("torchscript", "exported"):
            raise UsageProblem(f"--layers compares a PyTorch reference module by module, and {spec} is a compiled "
                               "program (TorchScript or torch.export) whose modules cannot be hooked",
                               "give the reference as torchvision:ARCH, timm:NAME, pretrained:NAME or file.py:factory, "
                               "or its ONNX export")
        return p  # a PyTorch module: compared per module (toolchain.module_parity)
    if p.suffix.lower() != ".onnx" or not p.is_file():
        raise UsageProblem(f"--layers compares ONNX models layer by layer, and the {role} {spec} is not an .onnx file "
                           "(a PyTorch module is compared per layer only as the reference; a TensorRT plan's layers "
                           "are listed as a candidate)",
                           f"give the {role}'s ONNX file (trtc export writes one; a plan's parent .onnx)")
    return p


def layers_hook(samples: int, top: int, threshold: float | None, device: str, reporter: Reporter, seen=None):
    """validate()'s per-candidate hook that adds the per-layer comparison on ``samples`` of the inputs (spread over
    the data) to each result; ``seen``, a list, also gets (inputs, reference logits, result) of each candidate."""
    from engines.manifest import qdq_fusion_ok

    def each(c, ref, x, ref_logits, result) -> None:
        if c.kind == "plan":  # what TensorRT made of the network: listed, not compared (toolchain.plan_layers)
            from engines._gpu import parse_device

            from .plan_layers import plan_layers

            result.layers = {"kind": "plan", "candidate": c.spec,
                             **plan_layers(c.spec, device=parse_device(device)[1] or 0).to_dict()}
            if seen is not None:
                seen.append((x, ref_logits, result))
            return
        pick = x[sample_indices(len(x), samples)]
        fusion = qdq_fusion_ok(c.manifest.precision or {}) if c.manifest is not None else True
        if ref.kind == "pytorch":  # each module's output against the tensor the export made of it
            from .module_parity import module_parity

            report = module_parity(ref.spec, c.spec, pick, precision=c.precision, device=device, threshold=threshold,
                                   top=top, qdq_fusion=fusion, reporter=reporter)
        else:
            report = layer_parity(ref.spec, c.spec, pick, precision=c.precision, device=device, threshold=threshold,
                                  top=top, qdq_fusion=fusion, reporter=reporter)
        result.layers = report.to_dict()
        if seen is not None:
            seen.append((x, ref_logits, result))

    return each


def validate_layers(reference: str, candidates: list[str], data: list[str], *, samples: int = DEFAULT_SAMPLES,
                    top: int = DEFAULT_TOP, threshold: float | None = None, reporter: Reporter | None = None,
                    seen: list | None = None, **validate_args):
    """`trtc validate --layers`: :func:`toolchain.validate.validate`, and for each candidate a per-layer comparison
    with the reference on ``samples`` of the same inputs (spread over the data), in ``result.layers``."""
    from .validate import validate

    if not 1 <= samples <= 256:
        raise UsageProblem(f"--layer-samples {samples} is outside 1..256", "e.g. --layer-samples 16 (8-32 suffice)")
    _onnx_path(reference, "reference")
    for c in candidates:
        _onnx_path(c, "candidate")
    reporter = reporter or Reporter()
    each = layers_hook(samples, top, threshold, validate_args.get("device", "cpu"), reporter, seen)
    return validate(reference, candidates, data, reporter=reporter, each=each, **validate_args)


__all__ = ["layer_parity", "match_tensors", "validate_layers", "LayerReport", "DEFAULT_LAYER_THRESHOLD"]
