"""The validate HTML report as a browser draws it: headless Chromium renders a real report (the MNIST CNN against
an INT8 version calibrated on random inputs, so that it flips digits, on 1000 real digits, with the per-layer
comparison of --layers) and one with extreme values (a six-digit count on the longest bar, a long
class name); every text element of every SVG must lie inside its SVG, the scatter must have its tick labels, and
the screenshot must show the bars and the dots. Skipped, with the reason, where Chromium is not installed
(`apt-get install -y chromium`; CI installs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from tests.conftest import needs_quant

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                                                             "(apt-get install -y chromium)")

# runs after the page loaded: each SVG text's box (after transforms) against its SVG's box, written into the DOM
PROBE = """<script>
window.addEventListener('load', () => {
  const out = [];
  document.querySelectorAll('svg').forEach((svg, i) => {
    const s = svg.getBoundingClientRect();
    svg.querySelectorAll('text').forEach(t => {
      const r = t.getBoundingClientRect();
      out.push({svg: i, label: svg.getAttribute('aria-label'), text: t.textContent,
                inside: r.left >= s.left - 0.5 && r.right <= s.right + 0.5 && r.top >= s.top - 0.5 &&
                        r.bottom <= s.bottom + 0.5, width: r.width});
    });
  });
  const pre = document.createElement('pre');
  pre.id = 'geometry';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(*args, timeout=90):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--disable-dev-shm-usage", *args], capture_output=True, text=True, timeout=timeout)


def _geometry(page):
    probed = page.with_name(page.stem + ".probe.html")
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    r = _chromium("--virtual-time-budget=5000", "--dump-dom", probed.as_uri())
    m = re.search(r'<pre id="geometry">(.*?)</pre>', r.stdout, re.S)
    assert m, f"no geometry from Chromium: {r.stderr[-2000:]}"
    import html

    return json.loads(html.unescape(m.group(1)))


@pytest.fixture(scope="module")
def real_report(mnist, tmp_path_factory):
    from toolchain.layers import validate_layers
    from toolchain.quantize import quantize_onnx

    model, npz, x, labels = mnist
    d = tmp_path_factory.mktemp("html")
    data = d / "digits.npz"
    np.savez(data, x=x[:1000], labels=labels[:1000])
    # calibrated on random inputs on purpose: ranges that do not fit the digits make the flips the chart shows
    q = quantize_onnx(model, d / "mnist.int8.onnx", precision="int8", calib=["random"], calib_count=16,
                      calib_cache=False)
    return validate_layers(str(model), [q.output], [str(data)], samples=8, top=3).to_dict()  # with --layers


def _extreme(report: dict) -> dict:
    r = json.loads(json.dumps(report))
    c = r["candidates"][0]
    c["per_class_flips"] = {"a class name far longer than the space left for it in the chart": 999999,
                            "7": 12, "1": 1}
    c["confidence"] = [[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0], *c["confidence"]]
    return r


@needs_quant
@needs_chromium
@pytest.mark.parametrize("which", ["real", "extreme"])
def test_report_renders_in_chromium_with_nothing_clipped(which, real_report, tmp_path):
    from PIL import Image

    from toolchain.report_html import validate_html

    report = real_report if which == "real" else _extreme(real_report)
    c = report["candidates"][0]
    assert c["per_class_flips"], "the real INT8 MNIST model should flip some digits"
    page = tmp_path / "report.html"
    page.write_text(validate_html(report))

    texts = _geometry(page)
    outside = [t for t in texts if not t["inside"]]
    assert not outside, f"text drawn outside its SVG: {outside}"
    bars = [t["text"] for t in texts if t["label"] == "flips per class"]
    for cls, n in c["per_class_flips"].items():
        assert str(n) in bars  # every count is drawn, and (above) inside the picture
    ticks = [t["text"] for t in texts if t["label"] == "confidence scatter"]
    assert ticks.count("0.5") == 2 and ticks.count("1") == 2 and "reference confidence" in ticks
    assert all(t["width"] > 0 for t in texts)
    depth = [t["text"] for t in texts if t["label"] == "error along depth"]  # --layers: the worst ranked 1..3
    assert {"1", "2", "3"} <= set(depth) and any(t.startswith("1e") for t in depth), depth

    shot = tmp_path / "shot.png"
    r = _chromium(f"--screenshot={shot}", "--window-size=1000,2400", page.as_uri())
    assert shot.exists() and shot.stat().st_size > 5000, r.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    red = ((abs(img[..., 0] - 0xD6) < 12) & (abs(img[..., 1] - 0x27) < 12) & (abs(img[..., 2] - 0x28) < 12)).sum()
    blue = ((img[..., 2] > 150) & (img[..., 0] < 150) & (img[..., 1] < 200)).sum()
    ink = (img.sum(axis=2) < 600).sum()
    assert red > 200 and blue > 20 and ink > 2000, (red, blue, ink)
