"""A self-contained HTML report for `trtc validate`: a summary table and two plots drawn as inline SVG (no
plotting library, no network): flips per class, and the reference's vs the candidate's confidence per sample."""

from __future__ import annotations

import html


def _svg_bars(items: list[tuple[str, int]], width: int = 640, bar_h: int = 18) -> str:
    if not items:
        return "<p>No flips: every sample kept its top-1 class.</p>"
    top = max(v for _, v in items)
    h = bar_h * len(items) + 10
    rows = []
    for i, (label, v) in enumerate(items):
        w = int((width - 260) * v / top)
        y = 5 + i * bar_h
        rows.append(f'<text x="250" y="{y + 13}" text-anchor="end" font-size="12">{html.escape(label[:38])}</text>'
                    f'<rect x="255" y="{y + 2}" width="{w}" height="{bar_h - 5}" fill="#d62728"/>'
                    f'<text x="{260 + w}" y="{y + 13}" font-size="12">{v}</text>')
    return f'<svg width="{width}" height="{h}" role="img" aria-label="flips per class">{"".join(rows)}</svg>'


def _svg_scatter(points: list[list[float]], size: int = 320) -> str:
    pad = 30
    inner = size - 2 * pad
    dots = "".join(f'<circle cx="{pad + a * inner:.1f}" cy="{size - pad - b * inner:.1f}" r="2" fill="#1f77b4" '
                   f'fill-opacity="0.5"/>' for a, b in points[:5000])
    axes = (f'<line x1="{pad}" y1="{size - pad}" x2="{size - pad}" y2="{size - pad}" stroke="black"/>'
            f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{size - pad}" stroke="black"/>'
            f'<line x1="{pad}" y1="{size - pad}" x2="{size - pad}" y2="{pad}" stroke="#999" stroke-dasharray="4"/>'
            f'<text x="{size / 2}" y="{size - 5}" text-anchor="middle" font-size="11">reference confidence</text>'
            f'<text x="10" y="{size / 2}" font-size="11" transform="rotate(-90 10 {size / 2})" '
            f'text-anchor="middle">candidate confidence</text>')
    return f'<svg width="{size}" height="{size}" role="img" aria-label="confidence scatter">{axes}{dots}</svg>'


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
            f"<details><summary>{len(c['flips'])} flipped samples</summary><ul>{flips}</ul></details>")
    style = ("body{font-family:sans-serif;max-width:900px;margin:2em auto}th{text-align:left;padding-right:1em}"
             "code{background:#eee}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>trtc validate</title><style>{style}</style>" \
           f"</head><body>{''.join(parts)}</body></html>\n"
