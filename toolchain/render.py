"""Human-readable tables for the CLI (rich). The same data is available as JSON with --json."""

from __future__ import annotations

from ._ui import model_label


def _print(console, table) -> None:
    """Print a table without cutting what identifies a row: rich shrinks columns to the console's width (80 when
    piped) and ends cut words with an ellipsis (model names became 'lite0.int...'). The first column never wraps
    or shrinks; the others wrap between words (a header's words are never cut); only when the console is narrower
    than that does the table get wider than the console (the terminal then wraps its lines, and nothing is
    lost)."""
    from rich.measure import Measurement

    wide = console.options.update_width(10_000)
    if table.columns:  # the first column names the row (model, source, feature): it never wraps or shrinks
        first = table.columns[0]
        first.no_wrap = True
        # rich measures even a no_wrap column by its longest word, and then cut its cells to fit ("Several G…"):
        # its minimum is its widest cell
        first.min_width = max([first.min_width or 0, *(Measurement.get(console, wide, cell).maximum
                                                       for cell in first.cells)])
    for col in table.columns[1:]:  # a header wraps between its words, never cut inside one ("top-1 (decisi…")
        words = str(col.header).split()
        col.min_width = max([col.min_width or 0, *(len(w) for w in words)])
    need = Measurement.get(console, wide, table).minimum
    if need <= console.width:
        console.print(table)
        return
    old = console.width
    console.width = need
    try:
        console.print(table)
    finally:
        console.width = old


def _colour(preprocess: dict) -> str:
    """A contract's colour as the tables show it: RGB, BGR, or grey (one channel: BT.601 of RGB)."""
    return "grey (1 channel)" if preprocess.get("channels", 3) == 1 else preprocess["color"]


def _warn(warnings) -> None:
    """A report's warnings go to stderr as log lines after its table (hidden by -q), never onto stdout with the
    results (they mixed into piped tables and were printed even with -q); --json keeps them in the report."""
    import logging

    log = logging.getLogger("trtc")
    for w in warnings or ():
        log.warning(w)


def short_path(path: str, width: int = 48) -> str:
    """``path`` shortened from the left to at most ``width`` characters at a folder boundary, always keeping the
    file name whole: ``…/datasets/data/bikes.mp4``."""
    if len(path) <= width:
        return path
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    head = path[: len(path) - len(name)]
    room = width - len(name) - 1
    tail = head[-room:] if room > 0 else ""
    tail = tail[tail.index("/"):] if "/" in tail else "/"
    return "…" + tail + name


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


# the manifest's model.weights in words (trtc export, trtc inspect)
WEIGHTS_TEXT = {"file": "from --weights", "random": "[yellow]RANDOM[/] (--random-weights: an untrained network)",
                "pretrained": "the package's pretrained weights", "source": "the source's own"}


def render_export(console, report) -> None:
    from rich.markup import escape
    from rich.table import Table

    c = report.check
    t = Table(title=f"exported {report.output}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("source", escape(report.source))
    if report.weights:
        t.add_row("weights", WEIGHTS_TEXT.get(report.weights, report.weights))
    t.add_row("exporter / opset", f"{report.exporter} / {report.opset}")
    t.add_row("input", f"{report.input_shape}  batch {report.batch['min']}:{report.batch['opt']}:{report.batch['max']}")
    t.add_row("classes", str(report.num_classes))
    t.add_row("size", _mb(report.bytes))
    p = report.preprocess
    t.add_row("preprocess", f"{_colour(p)} resize {p['resize'] or 'stretch'} crop {p['size'][0]}x{p['size'][1]} "
                            f"mean {p['mean']} std {p['std']}")
    verdict = "[green]pass[/]" if c.passed else "[red]FAIL[/]"
    t.add_row("check vs PyTorch", f"{verdict} on {c.samples} {c.data} inputs (batch sizes {c.batch_sizes}): max abs "
                                  f"diff {c.max_abs_diff:.2e} (tol {c.atol:g}), top-1 agreement "
                                  f"{100 * c.top1_agreement:.1f}%")
    tm = report.timings
    t.add_row("time", f"load {tm.get('load_s', 0):.1f} s, export {tm.get('export_s', 0):.1f} s, "
                      f"check {tm.get('check_s', 0):.1f} s")
    t.add_row("manifest", report.manifest)
    _print(console, t)
    if report.predictions:
        pt = Table(title="top-5 (ONNX Runtime)", title_justify="left")
        pt.add_column("image")
        pt.add_column("top-5")
        for p in report.predictions:
            pt.add_row(escape(p["file"].rsplit("/", 1)[-1]), escape(", ".join(f"{lab} {prob:.2f}" for lab, prob in p["top5"])))
        _print(console, pt)
    _warn(report.warnings)


def render_adopt(console, report) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"adopted {report.output} (the file is unchanged)", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("input", f"{report.input_shape}  batch {report.batch['min']}:{report.batch['opt']}:{report.batch['max']}")
    t.add_row("classes", str(report.num_classes))
    t.add_row("labels", escape(f"{report.labels} from {report.labels_from}" if report.labels else "none"))
    p = report.preprocess
    t.add_row("preprocess", escape(f"{_colour(p)} resize {p['resize'] or 'stretch'} crop {p['size'][0]}x{p['size'][1]} "
                                   f"({p['interpolation']}) mean {p['mean']} std {p['std']}"))
    t.add_row("manifest", escape(report.manifest))
    _print(console, t)
    _warn(report.warnings)


def turned(rotated) -> str:
    """"; frames turned upright (rotation metadata): clip.mp4 90 degrees" for the videos of a data set whose frames
    were turned (calibration.DataSet.rotated), or nothing."""
    if not rotated:
        return ""
    return "; frames turned upright (rotation metadata): " + ", ".join(
        f"{r['file'].rsplit('/', 1)[-1]} {r['degrees']} degrees"
        + (" after a mirror" if r.get("mirrored") else "") for r in rotated)


def render_quantize(console, report) -> None:
    from rich.markup import escape
    from rich.table import Table

    c = report.check
    t = Table(title=f"{report.precision.upper()} model {escape(report.output)}", show_header=False,
              title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("parent", f"{escape(report.parent['file'])} ({_mb(report.parent['bytes'])})")
    t.add_row("size", f"{_mb(report.bytes)} ({report.bytes / max(1, report.parent['bytes']):.2f} x the parent)")
    r = report.recipe
    if report.precision == "int8":
        li = report.layers
        t.add_row("recipe", f"INT8 Q/DQ on {li['int8']} of {li['total']} layers (weights per-channel, activations "
                            f"per-tensor), the rest in {r['high_precision'].upper()}")
        t.add_row("graph form", f"{escape(r.get('qdq', '?'))}; for {', '.join(r.get('runtimes', []))}")
        cal = report.calibration
        src = ", ".join(s.rsplit("/", 1)[-1] for s in cal["sources"])
        how = f"{cal['method']}" + (f" {cal['percentile']}" if cal.get("percentile") else "")
        t.add_row("calibration", f"{how} on {cal['samples']} samples of {escape(src)}"
                                 + (" [yellow](RANDOM)[/]" if cal.get("random") else "")
                                 + (" (ranges from cache)" if cal.get("from_cache") else "")
                                 + (f"; skipped {len(cal['skipped'])} unreadable" if cal.get("skipped") else "")
                                 + escape(turned(cal.get("rotated"))))
    else:
        t.add_row("recipe", f"FP16 on {report.layers['converted']} nodes, FP32 inputs/outputs")
    if report.kept:
        names = ", ".join(f"{k['node']} ({k['op']})" for k in report.kept[:8])
        more = f" and {len(report.kept) - 8} more" if len(report.kept) > 8 else ""
        t.add_row("kept higher", escape(names + more))
    if report.search:
        s = report.search
        t.add_row("search", f"target {s['target']:.1%} top-1 agreement on {s['tune_samples']} tuning samples: "
                            f"reached {s['reached']:.1%} with {report.layers['kept']} layer(s) kept out of INT8")
    acc = ""
    if "accuracy" in c:
        acc = (f"; accuracy {100 * c['accuracy_parent']:.2f}% -> {100 * c['accuracy']:.2f}% "
               f"({100 * c['accuracy_delta']:+.2f} pp)")
    t.add_row("vs parent", f"top-1 agreement [bold]{100 * c['top1_agreement']:.1f}%[/], top-5 overlap "
                           f"{100 * c['top5_overlap']:.1f}%, max abs logit diff {c['max_abs_diff']:.3g}, "
                           f"cosine {c['cosine']:.4f}{acc}")
    t.add_row("check data", f"{c['samples']} samples: {escape(c['data'])} ({c['device']})"
              + escape(turned(c.get("rotated"))))
    ds = c.get("default_session")
    if ds:
        t.add_row("default ORT session", ("the check's own session (no trtc session options)" if ds["same_as_check"]
                                          else f"top-1 agreement {100 * ds['top1_agreement']:.1f}%")
                  + (", [green]agrees[/]" if ds["passed"] else ", [red]disagrees with trtc's figures[/]"))
    if c["flips"]:
        t.add_row("flips", escape(", ".join(c["flips"][:6]) + (" ..." if len(c["flips"]) > 6 else "")))
    tm = report.timings
    t.add_row("time", ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in tm.items()))
    t.add_row("manifest", escape(report.manifest))
    _print(console, t)
    if report.search and report.search.get("ranking"):
        _print(console, _search_ranking(report))
    _warn(report.warnings)


def _search_ranking(report):
    """The accuracy-aware search's per-layer ranking, in the table `trtc validate --layers` shows its layers with."""
    kept = set(report.recipe.get("kept_layers", []))
    rows = [{"node": r["layer"], "rank": str(i), "kl": r["kl"], "op": "kept" if r["layer"] in kept else "INT8"}
            for i, r in enumerate(report.search["ranking"], 1)]
    return layer_table(f"INT8 cost per layer, costliest first (KL divergence from the parent when only that layer is "
                       f"INT8, {report.search['tune_samples']} tuning samples)",
                       rows, [("layer", "node"), ("rank", "rank"), ("KL", "kl"), ("now", "op")])


def render_build(console, report) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"{report.precision.upper()} plan {escape(report.output)}", show_header=False,
              title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("built from", escape(report.onnx))
    t.add_row("builder", escape(report.backend))
    t.add_row("size", _mb(report.bytes))
    for name, s in report.profiles.items():
        t.add_row("profile", f"{escape(name)}: min {s['min']} opt {s['opt']} max {s['max']}")
    f = report.flags
    extra = [k for k in ("version_compatible",) if f.get(k)]
    if f.get("hardware_compatibility", "none") != "none":
        extra.append(f"hardware {f['hardware_compatibility']}")
    if f.get("compute_capabilities"):
        extra.append("for " + ", ".join(f["compute_capabilities"]))
    t.add_row("flags", f"strongly typed, opt level {f['opt_level']}" + ("; " + ", ".join(extra) if extra else ""))
    if report.lean_runtime:
        t.add_row("runs on", escape(report.lean_runtime["needs"]))
    counts = ", ".join(f"{n} {p}" for p, n in sorted(report.layers["counts"].items()))
    t.add_row("compute layers", f"{counts} ({report.layers['source']})"
              + (f"\n{escape(report.layers['note'])}" if report.layers.get("note") else ""))
    if report.quantize:
        c = report.quantize["check"]
        t.add_row("quantized", f"{escape(report.quantize['output'])}: top-1 agreement {100 * c['top1_agreement']:.1f}% "
                               f"with the parent on {c['samples']} held-out samples")
    t.add_row("time", ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in report.timings.items()))
    t.add_row("manifest", escape(report.manifest))
    _print(console, t)
    _warn(report.warnings)


def built_with(builder: dict) -> str:
    """A plan's builder in words, saying only what the manifest knows: "tensorrt-rtx 1.7.1 without a GPU, for
    SM89" (TensorRT-RTX builds ahead of time on a machine without one), "tensorrt 10.13.0 on NVIDIA H100 (cc 9.0),
    CUDA 13.0, driver 580.1"."""
    text = f"{builder.get('flavor')} {builder.get('version')}"
    gpu = builder.get("gpu") or {}
    if gpu.get("name"):
        text += f" on {gpu['name']}" + (f" (cc {gpu['compute_capability']})" if gpu.get("compute_capability") else "")
    else:
        text += " without a GPU"
    targets = [str(t) for t in builder.get("compute_capabilities") or [] if str(t).upper() != "CURRENT"]
    if targets:
        text += f", for {', '.join(targets)}"
    known = [f"{k} {builder[key]}" for k, key in (("CUDA", "cuda"), ("driver", "driver")) if builder.get(key)]
    return ", ".join([text, *known])


def compatibility(builder: dict) -> str:
    """Which runtimes load a plan, from its manifest's builder: version-compatible or not, its lean runtime kept or
    excluded, and whether the edge extra's lean runtime (engines._trt.EDGE_LEAN_VERSION) is new enough."""
    from engines._trt import EDGE_LEAN_VERSION, version_tuple

    version, flags = str(builder.get("version")), builder.get("flags") or {}
    if builder.get("flavor") == "tensorrt-rtx":
        return f"TensorRT-RTX {version} only (TensorRT-RTX plans are not version-compatible; trtc[edge] cannot run it)"
    if not flags.get("version_compatible"):
        return (f"not version-compatible: only TensorRT {version} loads it (not the lean or dispatch runtime, so not "
                "trtc[edge])")
    text = f"version-compatible: TensorRT or its lean runtime {version} or newer loads it"
    text += ("; built with the lean runtime excluded (--exclude-lean-runtime): the dispatch runtime cannot load it"
             if flags.get("exclude_lean_runtime") else "; carries its lean runtime (the dispatch runtime loads it too)")
    if version_tuple(EDGE_LEAN_VERSION) >= version_tuple(version):
        return text + f"; trtc[edge] (lean runtime {EDGE_LEAN_VERSION}) runs it"
    return text + f"; trtc[edge]'s lean runtime {EDGE_LEAN_VERSION} is older and cannot run it"


def render_inspect(console, report: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"{report['kind']} {escape(report['artifact'])}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("model", escape(f"{report['model'].get('name')} ({report['model'].get('source')})"))
    if report["model"].get("weights"):
        t.add_row("weights", WEIGHTS_TEXT.get(report["model"]["weights"], escape(str(report["model"]["weights"]))))
    p = report["precision"] or {}
    t.add_row("precision", escape(precision_text(p)))
    b = report["batch"]
    t.add_row("batch", f"{b['min']}:{b['opt']}:{b['max']}")
    for io in ("inputs", "outputs"):
        for s in report[io]:
            t.add_row(io[:-1], escape(f"{s['name']} {s['dtype']} {s['shape']}"))
    if report.get("builder"):
        bd = report["builder"]
        t.add_row("built with", escape(built_with(bd)))
        t.add_row("runtimes", escape(compatibility(bd)))
        lp = bd.get("layer_precisions") or {}
        if lp.get("counts"):
            t.add_row("compute layers", escape(", ".join(f"{n} {k}" for k, n in sorted(lp["counts"].items()))
                                               + f" ({lp.get('source')})"))
    if report.get("operators"):
        ops = report["operators"]  # every type: a foreign model's unusual operators are what to look for
        t.add_row(f"operators ({len(ops)} types)", escape(", ".join(f"{k} {v}" for k, v in ops.items())))
    verdict = "[green]yes[/]" if report["runs_here"] else "[red]no[/]: " + escape("; ".join(report["why_not"]))
    t.add_row("runs here", verdict)
    if report.get("rebuild"):
        t.add_row("rebuild", escape(report["rebuild"]))
    parent = report.get("parent") or {}
    t.add_row("parent", escape(parent["file"]) if parent.get("file") else "none recorded")
    _print(console, t)


def render_validate(console, report: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    d = report["data"]
    t = Table(title=f"vs {escape(report['reference']['model'])} on {d['samples']} samples "
                    f"({'labelled' if d['labelled'] else 'no labels'}, {d['device']})", title_justify="left")
    for col in ("candidate", "prec", "top-1 (decisive)", "top-5", "cosine", "max|d|", "acc", "verdict"):
        t.add_column(col)
    short = {"top1_agreement": "top-1", "cosine": "cosine", "accuracy_drop": "accuracy",
             "default_session_top1_agreement": "default ORT session top-1",
             "default_session_cosine": "default ORT session cosine"}
    for c in report["candidates"]:
        m = c["metrics"]
        acc = f"{100 * m['accuracy_delta']:+.2f}pp" if "accuracy_delta" in m else "-"
        verdict = "[green]pass[/]" if c["passed"] else "[red]FAIL[/] " + escape(
            ", ".join(short.get(f["metric"], f["metric"]) for f in c["failures"]))
        t.add_row(escape(model_label(c["model"])), c["precision"],
                  f"{100 * m['top1_agreement']:.1f}% ({100 * m['decisive_agreement']:.1f}%)",
                  f"{100 * m['top5_overlap']:.1f}%", f"{m['cosine']:.4f}", f"{m['max_abs_diff']:.3g}", acc, verdict)
    _print(console, t)
    if d.get("rotated"):
        console.print(escape("F" + turned(d["rotated"])[3:]))
    for c in report["candidates"]:
        if c["flips"]:
            shown = ", ".join(f"{f['sample']} ({f['reference']} -> {f['candidate']})" for f in c["flips"][:5])
            console.print(f"{escape(model_label(c['model']))}: {len(c['flips'])} flips: {escape(shown)}"
                          + (" ..." if len(c["flips"]) > 5 else ""))
    for c in report["candidates"]:
        if c.get("layers"):
            render_layers(console, c["layers"])
    _warn(report.get("warnings", []))


def _fig(v, spec: str = ".4f") -> str:
    return "overflow" if v is None else format(v, spec)


def layer_table(title: str, rows: list[dict], columns: list[tuple[str, str]]):
    """A table of layers, one row each: ``columns`` are (header, key), the keys ``rank``, ``node``, ``op``,
    ``tensor`` and ``overflow_text`` shown as they are, the others as figures. `trtc validate --layers` and the
    accuracy-aware search of `trtc quantize` show their rankings with it."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for head, _ in columns:
        t.add_column(head)
    for r in rows:
        cells = []
        for _, key in columns:
            v = r.get(key)
            cells.append(escape(str(v)) if key in ("rank", "node", "op", "tensor", "overflow_text")
                         else _fig(v, ".3g" if key in ("kl", "max_abs_diff") else ".4f"))
        t.add_row(*cells)
    return t


def _overflow_text(r: dict) -> str:
    o, parts = r["overflow"], []
    if o["nonfinite"]:
        parts.append(f"{o['nonfinite']} inf/NaN")
    if o["fp16_saturated"]:
        parts.append(f"{o['fp16_saturated']} at FP16 max")
    if r.get("int8") and r["int8"]["clipped"]:
        parts.append(f"INT8 input clipped {100 * r['int8']['clipped']:.3g}%")
    if parts and r.get("overflow_inherited"):
        parts.append("from its input")
    return ", ".join(parts) or "-"


def render_plan_layers(console, lr: dict) -> None:
    """A TensorRT plan's layers (toolchain.plan_layers): each with its type, precision and the ONNX nodes it covers."""
    from collections import Counter

    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"{escape(model_label(lr['candidate']))}: {len(lr['layers'])} TensorRT layers ({lr['runtime']}'s "
                    "engine inspector; listed, not compared: a plan computes only its outputs)", title_justify="left")
    for col in ("#", "layer", "type", "prec", "ONNX nodes"):
        t.add_column(col)
    for r in lr["layers"]:
        t.add_row(str(r["index"]), escape(r["name"]), escape(str(r["type"] or "-")), r["precision"] or "-",
                  escape(", ".join(r["onnx_nodes"]) or ("(reformat)" if r["reformat"] else "-")))
    _print(console, t)
    counts = Counter(r["precision"] for r in lr["layers"] if r["precision"])
    covered = lr["onnx_nodes"] - len(lr["not_in_any_layer"])
    console.print(f"precisions: {', '.join(f'{k} {v}' for k, v in counts.most_common()) or 'unread'}; ONNX nodes in "
                  f"a layer: {covered} of {lr['onnx_nodes']}"
                  + (f" (in none: {escape(', '.join(lr['not_in_any_layer'][:5]))}"
                     f"{' ...' if len(lr['not_in_any_layer']) > 5 else ''})" if lr["not_in_any_layer"] else ""))
    _warn(lr.get("warnings") or [])


def render_layers(console, lr: dict) -> None:
    """The worst layers by error added, the first layer over the threshold and what could not be matched."""
    from rich.markup import escape

    if lr.get("kind") == "plan":
        render_plan_layers(console, lr)
        return

    rows = [{**lr["rows"][i], "rank": str(lr["rows"][i]["index"]), "overflow_text": _overflow_text(lr["rows"][i])}
            for i in lr["worst"]]
    modules = lr["matched_by"] == "module"  # a PyTorch reference: no "alone" (PyTorch is not cut at each layer)
    title = (f"{escape(model_label(lr['candidate']))}: worst {len(rows)} of {lr['matched']} "
             + (f"modules by the error they add ({lr['samples']} samples, relative L2 vs the module's output)"
                if modules else f"layers by the error they add (alone: on the reference's inputs; {lr['samples']} "
                                "samples, relative L2 vs the reference)"))
    columns = [("layer", "node"), ("#", "rank"), ("op", "op"), ("rel L2", "rel_l2"), ("added", "added"),
               ("alone", "alone"), ("cosine", "cosine"), ("overflow", "overflow_text")]
    _print(console, layer_table(title, rows, [c for c in columns if not (modules and c[1] == "alone")]))
    f = lr["first_over"]
    console.print(f"first layer over rel. L2 {lr['threshold']:g}: " + (
        f"#{f['index']} {escape(f['node'])} ({f['op']}, rel L2 {_fig(f['rel_l2'])})" if f else "none"))
    only = ", ".join(f"{op} {n}" for op, n in lr["candidate_only"].items())
    console.print(f"matched by {lr['matched_by']}: {lr['matched']} tensors"
                  + (f"; not matched: {len(lr['unmatched'])} ({escape(', '.join(lr['unmatched'][:5]))}"
                     f"{' ...' if len(lr['unmatched']) > 5 else ''})" if lr["unmatched"] else "")
                  + (f"; the candidate's own: {escape(only)}" if only else ""))


def render_bench(console, report) -> None:
    from rich.markup import escape
    from rich.table import Table

    gpu = report.machine.get("gpu")
    t = Table(title=f"{report.device}{' (' + gpu + ')' if gpu else ''}: transfers {report.transfers}; CUDA graphs "
                    f"{report.cuda_graphs}", title_justify="left")
    # the backend column where it tells rows apart (a reference, two tunings, device and host input)
    backends = any(getattr(r, "role", "engine") != "engine" or getattr(r, "backend", "") == "onnxruntime (untuned)"
                   or getattr(r, "input", "host") != getattr(report, "input", "host")
                   or getattr(r, "layout", "NCHW") != "NCHW" for r in report.rows)
    ref = any(getattr(r, "ratio_to_reference", None) is not None for r in report.rows)
    cols = ("model",) + (("backend",) if backends else ()) + ("prec", "batch", "p50 ms", "p90 ms", "p99 ms", "CV",
                                                             "samples/s", "vs first") + (("vs ref",) if ref else ())
    longest = max((len(w) for r in report.rows for w in getattr(r, "backend", "").split()), default=0)
    for col in cols:  # wrapped between words, never cut inside one ("onnxru…", "sample…")
        t.add_column(col, justify="right" if col not in ("model", "backend", "prec") else "left",
                     min_width=max(longest if col == "backend" else 0, *(len(w) for w in col.split())))
    for r in report.rows:
        where = " (host input)" if getattr(r, "input", "host") != getattr(report, "input", "host") else ""
        where += " (NHWC input)" if getattr(r, "layout", "NCHW") != "NCHW" else ""
        ratio = getattr(r, "ratio_to_reference", None)
        t.add_row(escape(model_label(r.model)), *((escape(r.backend + where),) if backends else ()), r.precision,
                  str(r.batch), f"{r.p50_ms:.2f}", f"{r.p90_ms:.2f}", f"{r.p99_ms:.2f}", f"{r.cv:.0%}",
                  f"{r.throughput:.1f}", f"{r.speedup:.2f}x", *((f"{ratio:.2f}x" if ratio is not None else "",)
                                                                if ref else ()))
    _print(console, t)
    _warn(report.warnings)


def render_doctor(console, report: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="this machine", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    for k, v in report["system"].items():
        t.add_row(k, str(v))
    _print(console, t)
    pk = Table(title="packages", title_justify="left")
    pk.add_column("package")
    pk.add_column("version")
    pk.add_column("notes")
    for name, info in report["packages"].items():
        pk.add_row(name, info.get("version") or "[dim]not installed[/]", escape(info.get("note", "")))
    _print(console, pk)
    gpu = report["gpu"]
    g = Table(title="GPU", show_header=False, title_justify="left")
    g.add_column(style="bold")
    g.add_column()
    if gpu.get("devices"):
        for i, d in enumerate(gpu["devices"]):
            g.add_row(f"cuda:{i}", f"{d['name']}  compute capability {d['compute_capability']}  "
                                   f"{d.get('memory_mib', '?')} MiB")
        g.add_row("driver / CUDA", f"{gpu.get('driver')} / {gpu.get('cuda')}")
    else:
        g.add_row("GPU", f"none found ({gpu.get('reason', '')})")
    for codec, caps in (gpu.get("nvdec") or {}).items():
        g.add_row(f"NVDEC {codec}", caps)
    _print(console, g)
    if console.width < DOCTOR_TABLE_WIDTH:
        _doctor_list(console, report["features"])
        return
    ft = Table(title="what trtc can do here", title_justify="left")
    ft.add_column("feature")
    ft.add_column("status")
    ft.add_column("fix")
    for f in report["features"]:
        ft.add_row(escape(f["feature"]), "[green]yes[/]" if f["ok"] else f"[red]no[/][dim]: {escape(f['reason'])}[/]",
                   escape(f.get("fix") or ""))
    _print(console, ft)


# below this many columns (80 in a pipe) the features are a list: a table left the fixes a few letters wide
DOCTOR_TABLE_WIDTH = 100


def _doctor_list(console, features) -> None:
    """The features as a list wrapped between words to the console's width: "yes|no  feature: reason", then the
    fix on a line of its own; continuation lines are indented under the text they continue."""
    from rich.text import Text

    console.print("what trtc can do here", soft_wrap=True, markup=False, highlight=False)
    for f in features:
        if f["ok"]:
            _wrapped(console, Text.assemble("  ", ("yes", "green"), " "), f["feature"], 6)
            continue
        _wrapped(console, Text.assemble("  ", ("no", "red"), "  "), f"{f['feature']}: {f['reason']}", 6)
        if f.get("fix"):
            _wrapped(console, Text("      fix: "), f["fix"], 11)


def _wrapped(console, head, body: str, indent: int) -> None:
    """``head`` then ``body`` wrapped between words (a word longer than the line stays whole), continuation lines
    indented by ``indent``; no line is cut or padded."""
    import textwrap

    from rich.text import Text

    lines = textwrap.wrap(body, width=max(20, console.width - indent), break_long_words=False,
                          break_on_hyphens=False) or [""]
    console.print(Text.assemble(head, lines[0]), soft_wrap=True, highlight=False)
    for line in lines[1:]:
        console.print(Text(" " * indent + line), soft_wrap=True, highlight=False)


def precision_text(p: dict) -> str:
    """A model's precision from its manifest's ``precision``: "int8 (INT8 on 4 of 50 layers, rest fp16)", so that a
    model mostly left out of INT8 does not read as an INT8 one; "int8, rest fp16" for a manifest without counts."""
    mode = p.get("mode", "fp32")
    layers = p.get("layers") or {}
    rest = f", rest {p['high_precision']}" if p.get("high_precision") else ""
    if mode == "int8" and layers.get("total"):
        return f"int8 (INT8 on {layers['int8']} of {layers['total']} layers{rest})"
    return mode + rest


def _dropped_cell(queue: int, lag: int) -> str:
    if not lag:
        return str(queue)
    return f"{queue + lag} ({lag} past --max-lag)"


STATUS_CHARS = 120  # a table's status cell: the problem's first words; the whole text is said beside the table


def _brief(reason: str, limit: int = STATUS_CHARS) -> str:
    """A problem as a table cell: without its fix, and cut between words after about ``limit`` characters (a 400
    character problem wrapped into 35 lines of the table); the whole text is in the warning, the error line and
    --summary."""
    import re

    reason = re.sub(r" \(fix: .*\)$", "", reason, flags=re.S)
    if len(reason) <= limit:
        return reason
    cut = reason.rfind(" ", 0, limit)
    return reason[:cut if cut > limit // 2 else limit].rstrip(" ;,:") + " ..."


def render_run(console, summary) -> None:
    """`trtc run`'s summary: one sentence, the table of sources, then what else the run has to say."""
    # one sentence, never broken by rich ("108.7 \nfps"): the terminal may wrap it, the text has no newline
    write_error = getattr(summary, "write_error", None)
    state = ("interrupted after" if summary.interrupted else
             "stopped by a write error after" if write_error else "")
    console.print(f"{state} {summary.frames} frames in {summary.seconds:.2f} s = {summary.fps:.1f} fps on "
                  f"{summary.device} ({summary.decoder}; mean batch {summary.mean_batch:.1f})".strip(),
                  soft_wrap=True, highlight=False)
    t, shown = _run_table(summary, write_error)
    if shown:
        _print(console, t)
    elif t.caption:
        console.print(t.caption, soft_wrap=True)
    _run_footer(console, summary)


def _run_table(summary, write_error):
    """(the table of sources, the sources it shows): a row per source, or only those with a problem in a batch."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title_justify="left")
    t.add_column("source")
    t.add_column("frames", justify="right")
    t.add_column("last frame", justify="right")
    problems = {p["source"]: p for p in summary.problems}
    last = getattr(summary, "last_frame", {}) or {}
    dropped = getattr(summary, "dropped", {}) or {}
    lagged = getattr(summary, "lagged", {}) or {}
    lag_s = {src: v for src, v in (getattr(summary, "lag_s", {}) or {}).items() if v and v.get("frames")}
    if dropped or lagged:  # queue: inference lagged; lag: past --max-lag (both before preprocessing)
        t.add_column("dropped", justify="right")
    if lag_s:  # live sources: capture -> result
        t.add_column("lag p50 / p99 / max", justify="right")
    t.add_column("status")
    shown = summary.sources
    if len(shown) > 40:  # a batch (--ray over a folder or a list): only the sources with a problem get a row
        shown = [s for s in summary.sources if s in problems]
        t.caption = f"{len(summary.sources) - len(shown)} other source(s) ok" if not summary.interrupted else None
    for src in shown:
        f = last.get(src)
        row = [escape(short_path(src)), str(summary.per_source.get(src, 0)), "-" if f is None else str(f)]
        if dropped or lagged:
            row.append(_dropped_cell(dropped.get(src, 0), lagged.get(src, 0)))
        if lag_s:
            v = lag_s.get(src)
            row.append("-" if v is None else f"{v['p50']:.2f} / {v['p99']:.2f} / {v['max']:.2f} s")
        t.add_row(*row, _run_status(summary, src, problems.get(src), write_error))
    return t, shown


def _run_status(summary, src, problem, write_error) -> str:
    """A source's status cell: ok, interrupted, or what happened to it (without its name again), with its notes."""
    from rich.markup import escape

    if problem is None:
        status = ("[yellow]interrupted[/]" if summary.interrupted else
                  "[red]stopped: -o not written[/]" if write_error else "[green]ok[/]")
    else:
        reason = problem["reason"]
        reason = reason[len(src) + 2:] if reason.startswith(f"{src}: ") else reason
        status = f"[red]{escape(_brief(reason))}[/]"
    missing = (getattr(summary, "missing", {}) or {}).get(src)
    damaged = (getattr(summary, "damaged", {}) or {}).get(src)
    notes = [f"{n} {what}" for n, what in ((missing, "missing in the stream"), (damaged, "damaged")) if n]
    if notes:
        status += f" [dim]({escape(', '.join(notes))})[/]"
    return status


def _run_footer(console, summary) -> None:
    """What follows the table: Ray's skips and failures, the latency, where the predictions are."""
    from rich.markup import escape

    ray = getattr(summary, "ray", None) or {}
    if ray.get("skipped"):
        console.print(f"skipped {ray['skipped']} of {ray['sources']} videos: complete in the output already",
                      soft_wrap=True)
    for line in ray.get("start_errors", []) + ray.get("failures", []):
        console.print(f"[yellow]ray: {escape(line)}[/]", soft_wrap=True)
    if summary.latency_ms:
        lat = summary.latency_ms
        console.print(f"latency (frame in -> result): p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms, "
                      f"max {lat['max']:.1f} ms",
                      soft_wrap=True)
    if summary.output:
        kept = getattr(summary, "resumed_lines", 0)
        console.print(f"predictions: {escape(summary.output)}" + (f" ({kept} kept from the earlier run, "
                                                                   f"{summary.frames} added)" if kept else ""),
                      soft_wrap=True)


def render_bench_video(console, report) -> None:
    from pathlib import Path

    from rich.markup import escape
    from rich.table import Table

    gpu = report.machine.get("gpu") or report.device
    t = Table(title=f"{escape(Path(report.video).name)} with {escape(Path(report.model).name)} on {gpu} "
                    f"({report.date})", title_justify="left")
    multi = any(getattr(r, "vs_one_gpu", None) is not None for r in report.rows)
    lim = any(getattr(r, "vs_limit", None) is not None for r in report.rows)
    base = any(getattr(r, "vs_baseline", None) is not None for r in report.rows)
    for col in ("pipeline", "streams", "frames", "seconds", "fps", "CPU cores/stream", "vs decode-only",
                "vs usual") + (("vs limit", "limited by") if lim else ()) + (("vs baseline",) if base else ()) + \
            (("vs 1 GPU",) if multi else ()):
        t.add_column(col, justify="left" if col == "pipeline" else "right")
    for r in report.rows:
        cores = getattr(r, "cores_per_stream", None)
        runs = getattr(r, "fps_runs", None)
        fps = f"{r.fps:.1f}" + (f" ({min(runs):.0f}-{max(runs):.0f})" if runs else "")
        vs_limit = getattr(r, "vs_limit", None)
        t.add_row(escape(r.pipeline), str(r.streams), str(r.frames), f"{r.seconds:.2f}", fps,
                  "" if cores is None else f"{cores:.2f}",
                  "" if r.vs_decode is None else f"{r.vs_decode:.2f}x",
                  "" if r.vs_usual is None else f"{r.vs_usual:.2f}x",
                  *((("", "") if vs_limit is None else (f"{vs_limit:.2f}x", r.limited_by)) if lim else ()),
                  *((("" if getattr(r, "vs_baseline", None) is None else f"{r.vs_baseline:.3f}x"),) if base else ()),
                  *((("" if r.vs_one_gpu is None else f"{r.vs_one_gpu:.2f}x"),) if multi else ()))
    _print(console, t)
    if lim:
        console.print("vs limit: trtc's fps over the lower of decode-only and engine-only (engine-only: the same "
                      "batches through the engine alone, no decode); limited by: which of the two is lower")
    if base:
        b = report.baseline
        how = "ONNX Runtime tuning off" if b["tuning"] == "off" else "opened as trtc opens it"
        console.print(f"vs baseline: trtc's fps over the trtc row of {escape(Path(b['model']).name)} ({how}) in the "
                      "same runs")
    first = getattr(report, "first_result", None)
    if first:
        a, b = first["first"], first["warm"]
        console.print(f"time to first result (fresh process, engine open + first batch of {first['batch']}): "
                      f"{a['first_result_s']:.2f} s (open {a['open_s']:.2f} s), caches warm "
                      f"{b['first_result_s']:.2f} s (open {b['open_s']:.2f} s); import engines {b['import_s']:.2f} s")
    if any(getattr(r, "fps_runs", None) for r in report.rows):
        console.print("fps: the median of the runs, (lowest-highest); each run's row is in the JSON's fps_runs")
    if report.latency:
        lat = report.latency
        console.print(f"latency (packet in -> top-k on host, {lat['frames']} frames, {lat['input']}): "
                      f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms; of which "
                      f"the decoder p50 {lat['decoder_p50_ms']:.1f} / p99 {lat['decoder_p99_ms']:.1f} ms, after it "
                      f"p50 {lat['after_decoder_p50_ms']:.1f} / p99 {lat['after_decoder_p99_ms']:.1f} ms")
    if report.memory:
        m = report.memory
        console.print(f"GPU memory over {m['loops']} passes: {m['used_mb_after_first']:.0f} MB after the first, "
                      f"{m['used_mb_at_end']:.0f} MB at the end (growth {m['growth_mb']:+.0f} MB)")
    _warn(report.warnings)


def render_fix(console, report: dict) -> None:
    """`trtc validate --fix`: the candidate as it is (with its layers), what the search kept, the command that makes
    the fixed model and that model's validation."""
    from rich.markup import escape

    render_validate(console, report["validate"])
    if report["output"] is None:
        console.print(f"{escape(model_label(report['candidate']))} passes as it is: nothing to fix")
        return
    tries = "; ".join(f"{t['kept']} {'pass' if t['passed'] else 'fail'} (top-1 {100 * t['top1_agreement']:.1f}%, "
                      f"cosine {t['cosine']:.6f})" for t in report["trail"])
    console.print(f"kept in higher precision: {len(report['kept'])} of {report['ranked']} layers "
                  f"({escape(', '.join(report['kept']))}); tried: {tries}")
    console.print(f"wrote {escape(report['output'])}; it is made again by:\n  {escape(report['command'])}")
    render_validate(console, report["fixed"])
