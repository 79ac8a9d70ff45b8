"""A self-contained HTML report for `trtc validate`: a summary table and two plots drawn as inline SVG (no
plotting library, no network): flips per class, and the reference's vs the candidate's confidence per sample."""

from __future__ import annotations

import html
import math


def _svg_bars(items: list[tuple[str, int]], width: int = 640, bar_h: int = 18) -> str:
    """Horizontal bars, one per class: its name right-aligned left of x=250, the bar, and the count after the bar.
    The longest bar leaves room for its count (up to six digits) inside the picture."""
    if not items:
        return "<p>No flips: every sample kept its top-1 class.</p>"
    top = max(v for _, v in items)
    label_x, bar_x, count_room = 250, 255, 8 * 7 + 10
    h = bar_h * len(items) + 10
    rows = []
    for i, (label, v) in enumerate(items):
        w = int((width - bar_x - count_room) * v / top)
        y = 5 + i * bar_h
        shown = label if len(label) <= 38 else label[:37] + "…"
        rows.append(f'<text x="{label_x}" y="{y + 13}" text-anchor="end" font-size="12"><title>'
                    f'{html.escape(label)}</title>{html.escape(shown)}</text>'
                    f'<rect x="{bar_x}" y="{y + 2}" width="{w}" height="{bar_h - 5}" fill="#d62728"/>'
                    f'<text x="{bar_x + w + 5}" y="{y + 13}" font-size="12">{v}</text>')
    return (f'<svg width="{width}" height="{h}" viewBox="0 0 {width} {h}" role="img" aria-label="flips per class">'
            f'{"".join(rows)}</svg>')


def _svg_scatter(points: list[list[float]], size: int = 340) -> str:
    """Candidate vs reference confidence, both in [0, 1], with ticks every 0.25 on both axes, axis titles and
    the diagonal (no change)."""
    left, bottom, top_pad, right_pad = 52, 44, 10, 14
    inner = size - left - right_pad
    inner_h = size - bottom - top_pad

    def x(a: float) -> float:
        return left + a * inner

    def y(b: float) -> float:
        return size - bottom - b * inner_h

    dots = "".join(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="2" fill="#1f77b4" fill-opacity="0.5"/>'
                   for a, b in points[:5000])
    parts = [f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(1)}" y2="{y(0)}" stroke="black"/>',
             f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(0)}" y2="{y(1)}" stroke="black"/>',
             f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(1)}" y2="{y(1)}" stroke="#999" stroke-dasharray="4"/>']
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{x(t):.1f}" y1="{y(0)}" x2="{x(t):.1f}" y2="{y(0) + 5}" stroke="black"/>'
                     f'<text x="{x(t):.1f}" y="{y(0) + 17}" text-anchor="middle" font-size="10">{t:g}</text>'
                     f'<line x1="{x(0) - 5}" y1="{y(t):.1f}" x2="{x(0)}" y2="{y(t):.1f}" stroke="black"/>'
                     f'<text x="{x(0) - 8}" y="{y(t) + 3:.1f}" text-anchor="end" font-size="10">{t:g}</text>')
    parts.append(f'<text x="{x(0.5):.1f}" y="{size - 6}" text-anchor="middle" font-size="11">reference confidence'
                 f'</text><text x="14" y="{y(0.5):.1f}" font-size="11" transform="rotate(-90 14 {y(0.5):.1f})" '
                 f'text-anchor="middle">candidate confidence</text>')
    return (f'<svg width="{size}" height="{size}" viewBox="0 0 {size} {size}" role="img" '
            f'aria-label="confidence scatter">{"".join(parts)}{dots}</svg>')


def _svg_depth(lr: dict, width: int = 760, height: int = 300) -> str:
    """Relative L2 error of each layer along the network's depth (log scale): the error of its output (blue) and
    the error it makes on the reference's inputs (orange); the worst layers ringed in red with their rank."""
    rows = lr["rows"]
    left, right, top, bottom = 56, 16, 24, 44
    inner_w, inner_h = width - left - right, height - top - bottom
    vals = [v for r in rows for v in (r["rel_l2"], r.get("alone")) if v is not None and v > 0]
    lo = math.floor(math.log10(min(vals))) if vals else -6
    hi = max(lo + 1, math.ceil(math.log10(max(vals))) if vals else 0)
    overflow_y = top - 8

    def x(i: int) -> float:
        return left + inner_w * (i / max(1, len(rows) - 1))

    def y(v) -> float:
        if v is None:
            return overflow_y
        return top + inner_h * (hi - math.log10(max(v, 10.0 ** lo))) / (hi - lo)

    parts = [f'<line x1="{left}" y1="{top + inner_h}" x2="{left + inner_w}" y2="{top + inner_h}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + inner_h}" stroke="black"/>']
    for e in range(lo, hi + 1):
        parts.append(f'<line x1="{left - 5}" y1="{y(10.0 ** e):.1f}" x2="{left}" y2="{y(10.0 ** e):.1f}" '
                     f'stroke="black"/><text x="{left - 8}" y="{y(10.0 ** e) + 3:.1f}" text-anchor="end" '
                     f'font-size="10">1e{e}</text>')
    step = max(1, len(rows) // 8)
    for i in range(0, len(rows), step):
        parts.append(f'<text x="{x(i):.1f}" y="{top + inner_h + 14}" text-anchor="middle" font-size="10">{i}</text>')
    pts = " ".join(f"{x(i):.1f},{y(r['rel_l2']):.1f}" for i, r in enumerate(rows))
    parts.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>')
    parts.extend(f'<circle cx="{x(i):.1f}" cy="{y(r["alone"]):.1f}" r="2.2" fill="#ff7f0e"/>'
                 for i, r in enumerate(rows) if r.get("alone") is not None)
    for rank, i in enumerate(lr["worst"], 1):
        r = rows[i]
        cy = y(r.get("alone") if r.get("alone") is not None else r["rel_l2"])
        parts.append(f'<circle cx="{x(i):.1f}" cy="{cy:.1f}" r="5" fill="none" stroke="#d62728" stroke-width="2">'
                     f'<title>{rank}: {html.escape(r["node"])} ({r["op"]})</title></circle>'
                     f'<text x="{x(i):.1f}" y="{max(10.0, cy - 8):.1f}" text-anchor="middle" font-size="9" '
                     f'fill="#d62728">{rank}</text>')
    parts.append(f'<text x="{left + inner_w / 2:.0f}" y="{height - 6}" text-anchor="middle" font-size="11">layer '
                 f'(graph order); blue: output error, orange dots: error on the reference\'s inputs</text>')
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="error along depth">{"".join(parts)}</svg>')


def _layers_html(lr: dict) -> str:
    if lr.get("kind") == "plan":  # a TensorRT plan's layers: listed, not compared
        head = "".join(f"<th>{h}</th>" for h in ("#", "layer", "type", "precision", "ONNX nodes"))
        body = "".join(f"<tr><td>{r['index']}</td><td>{html.escape(r['name'])}</td>"
                       f"<td>{html.escape(str(r['type'] or '-'))}</td><td>{r['precision'] or '-'}</td>"
                       f"<td>{html.escape(', '.join(r['onnx_nodes']))}</td></tr>" for r in lr["layers"])
        return (f"<h3>TensorRT layers ({len(lr['layers'])}, from the engine inspector; listed, not compared)</h3>"
                f"<table><tr>{head}</tr>{body}</table>")
    f = lr["first_over"]
    first = (f"first layer over relative L2 {lr['threshold']:g}: #{f['index']} {html.escape(f['node'])} ({f['op']})"
             if f else f"no layer over relative L2 {lr['threshold']:g}")
    keys = ("rel_l2", "added", "cosine") if lr["matched_by"] == "module" else ("rel_l2", "added", "alone", "cosine")
    names = {"rel_l2": "rel L2", "added": "added", "alone": "alone", "cosine": "cosine"}
    head = "".join(f"<th>{h}</th>" for h in ("rank", "#", "layer", "op", *(names[k] for k in keys)))
    body = "".join(
        f"<tr><td>{k}</td><td>{lr['rows'][i]['index']}</td><td>{html.escape(lr['rows'][i]['node'])}</td>"
        f"<td>{lr['rows'][i]['op']}</td>"
        + "".join(f"<td>{'overflow' if lr['rows'][i].get(key) is None else format(lr['rows'][i][key], '.4f')}</td>"
                  for key in keys) + "</tr>"
        for k, i in enumerate(lr["worst"], 1))
    return (f"<h3>Per layer ({lr['matched']} layers matched by {lr['matched_by']}, {lr['samples']} samples)</h3>"
            f"{_svg_depth(lr)}<p>{html.escape(first)}</p><table><tr>{head}</tr>{body}</table>")


def validate_html(report: dict) -> str:
    ref = report["reference"]
    data = report["data"]
    parts = [f"<h1>trtc validate: {'PASS' if report['passed'] else 'FAIL'}</h1>",
             f"<p>Reference <code>{html.escape(ref['model'])}</code> ({ref['kind']}, {ref['precision']}); "
             f"{data['samples']} samples from {html.escape(', '.join(data['sources']))} on {data['device']}"
             f"{' (labelled)' if data['labelled'] else ''}.</p>"]
    for c in report["candidates"]:
        m = c["metrics"]
        verdict = "PASS" if c["passed"] else "FAIL: " + "; ".join(
            f"{f['metric']} {f['value']:.4g} vs {f['threshold']:.4g}" for f in c["failures"])
        rows = [("top-1 agreement", f"{m['top1_agreement']:.2%} (decisive {m['decisive_agreement']:.2%}, "
                                    f"{m['near_ties']} near-ties)"),
                ("top-5 overlap", f"{m['top5_overlap']:.2%}"), ("cosine", f"{m['cosine']:.5f}"),
                ("max / mean |logit diff|", f"{m['max_abs_diff']:.4g} / {m['mean_abs_diff']:.4g}"),
                ("KL divergence", f"{m['kl']:.3g}"), ("confidence drift", f"{m['confidence_drift']:+.4f}")]
        if "accuracy" in m:
            rows.append(("accuracy", f"{m['accuracy_reference']:.2%} -> {m['accuracy']:.2%} "
                                     f"({100 * m['accuracy_delta']:+.2f} pp)"))
        table = "".join(f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
        flips = "".join(f"<li>{html.escape(f['sample'])}: {html.escape(f['reference'])} &rarr; "
                        f"{html.escape(f['candidate'])}</li>" for f in c["flips"][:50])
        parts.append(
            f"<h2>{html.escape(c['model'])} ({c['precision']}): {html.escape(verdict)}</h2><table>{table}</table>"
            f"<h3>Flips per reference class</h3>{_svg_bars(list(c['per_class_flips'].items())[:25])}"
            f"<h3>Confidence in the reference's top-1 class</h3>{_svg_scatter(c['confidence'])}"
            f"<details><summary>{len(c['flips'])} flipped samples</summary><ul>{flips}</ul></details>"
            + (_layers_html(c["layers"]) if c.get("layers") else ""))
    style = ("body{font-family:sans-serif;max-width:900px;margin:2em auto}th{text-align:left;padding-right:1em}"
             "code{background:#eee}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>trtc validate</title><style>{style}</style>" \
           f"</head><body>{''.join(parts)}</body></html>\n"
