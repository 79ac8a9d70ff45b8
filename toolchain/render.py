"""Human-readable tables for the CLI (rich). The same data is available as JSON with --json."""

from __future__ import annotations


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def render_export(console, report) -> None:
    from rich.markup import escape
    from rich.table import Table

    c = report.check
    t = Table(title=f"exported {report.output}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("source", escape(report.source))
    t.add_row("exporter / opset", f"{report.exporter} / {report.opset}")
    t.add_row("input", f"{report.input_shape}  batch {report.batch['min']}:{report.batch['opt']}:{report.batch['max']}")
    t.add_row("classes", str(report.num_classes))
    t.add_row("size", _mb(report.bytes))
    p = report.preprocess
    t.add_row("preprocess", f"{p['color']} resize {p['resize'] or 'stretch'} crop {p['size'][0]}x{p['size'][1]} "
                            f"mean {p['mean']} std {p['std']}")
    verdict = "[green]pass[/]" if c.passed else "[red]FAIL[/]"
    t.add_row("check vs PyTorch", f"{verdict} on {c.samples} {c.data} inputs (batch sizes {c.batch_sizes}): max abs "
                                  f"diff {c.max_abs_diff:.2e} (tol {c.atol:g}), top-1 agreement "
                                  f"{100 * c.top1_agreement:.1f}%")
    tm = report.timings
    t.add_row("time", f"load {tm.get('load_s', 0):.1f} s, export {tm.get('export_s', 0):.1f} s, "
                      f"check {tm.get('check_s', 0):.1f} s")
    t.add_row("manifest", report.manifest)
    console.print(t)
    if report.predictions:
        pt = Table(title="top-5 (ONNX Runtime)", title_justify="left")
        pt.add_column("image")
        pt.add_column("top-5")
        for p in report.predictions:
            pt.add_row(escape(p["file"].rsplit("/", 1)[-1]), escape(", ".join(f"{lab} {prob:.2f}" for lab, prob in p["top5"])))
        console.print(pt)


def render_doctor(console, report: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="this machine", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    for k, v in report["system"].items():
        t.add_row(k, str(v))
    console.print(t)
    pk = Table(title="packages", title_justify="left")
    pk.add_column("package")
    pk.add_column("version")
    pk.add_column("notes")
    for name, info in report["packages"].items():
        pk.add_row(name, info.get("version") or "[dim]not installed[/]", escape(info.get("note", "")))
    console.print(pk)
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
    console.print(g)
    ft = Table(title="what trtc can do here", title_justify="left")
    ft.add_column("feature")
    ft.add_column("status")
    ft.add_column("fix")
    for f in report["features"]:
        ft.add_row(f["feature"], "[green]yes[/]" if f["ok"] else f"[red]no[/] [dim]{escape(f['reason'])}[/]",
                   escape(f.get("fix") or ""))
    console.print(ft)
