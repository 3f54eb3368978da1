"""Reports in a real browser: headless Chromium renders each page, takes a screenshot
and dumps the DOM; the screenshot must not be blank and the key elements must be there.

Each Chromium start costs about a second, so there is one start per page and width.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

TINY = Path(__file__).parent / "_tiny.py"
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
                 if p and Path(p).exists()), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not found (Debian package 'chromium'; .ci/run installs it with apt-get)"
)
# Headless Chromium will not make a window narrower than 500 px, so pages are shown in a
# srcdoc iframe of the wanted width (same origin: the host can read the page's scroll width
# and write it into its own DOM, which --dump-dom prints).
HOST = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="page" style="width:{width}px;height:{height}px;border:0" srcdoc="{srcdoc}"></iframe>
<script>window.addEventListener("load", function () {{
  var doc = document.getElementById("page").contentDocument;
  document.body.dataset.scrollWidth = doc.documentElement.scrollWidth;
  var shown = function (sel) {{ var e = doc.querySelector(sel); return e ? doc.defaultView.getComputedStyle(e).display : "none"; }};
  document.body.dataset.charts = shown(".chart-wide") + " " + shown(".chart-tall");
  var tall = doc.querySelector(".chart-tall svg");
  document.body.dataset.tallWidth = tall ? tall.getBoundingClientRect().width : 0;
  document.body.dataset.dom = doc.documentElement.outerHTML;
}});</script></body></html>"""


def render(page: Path, width: int, height: int = 2000) -> tuple[Path, str]:
    """Screenshot and DOM (after scripts ran) of ``page`` in a ``width`` px viewport, from one Chromium run."""
    shot = page.with_suffix(f".{width}.png")
    host = page.with_suffix(f".host{width}.html")
    host.write_text(HOST.format(width=width, height=height, srcdoc=html.escape(page.read_text(), quote=True)))
    profile = tempfile.mkdtemp(prefix="lt-chromium-")
    try:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--screenshot={shot}", "--dump-dom",
             f"--window-size={max(width, 500)},{height}", host.as_uri()],
            capture_output=True, text=True, timeout=120,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert shot.exists(), proc.stderr[-2000:]
    match = re.search(r'data-dom="([^"]*)"', proc.stdout)
    assert match, "the page did not load in Chromium: " + proc.stdout[-500:]
    return shot, html.unescape(match.group(1)) + proc.stdout[: match.start()]


def assert_not_blank(shot: Path) -> None:
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.std() > 10, f"{shot} looks blank (pixel std {pixels.std():.1f})"
    assert (pixels < 128).mean() > 0.002, f"{shot} has almost no dark pixels (no text drawn?)"


def scroll_width(dom: str) -> int:
    return int(re.search(r'data-scroll-width="(\d+)"', dom).group(1))


@pytest.fixture(scope="module")
def pages(torch_mod, tmp_path_factory):
    """A layers page, a compare page (diverging file) and an extract page, from the Python API."""
    import onnx
    from onnx import numpy_helper

    import layertap as lt
    from layertap.reports import report_page, tensors_page, write_report

    sys.path.insert(0, str(TINY.parent))
    from _tiny import small_cnn

    d = tmp_path_factory.mktemp("browser")
    model, x = small_cnn(), torch_mod.randn(2, 3, 16, 16)
    write_report(d / "layers.html", report_page(lt.layers(model, x), "layers of small_cnn"))
    onnx_path = d / "m.onnx"
    torch_mod.onnx.export(model, (x,), str(onnx_path), dynamo=True, input_names=["x"])
    proto = onnx.load(str(onnx_path))
    init = next(i for i in proto.graph.initializer if i.name == "block.0.weight")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(proto, str(d / "bad.onnx"))
    report = lt.compare(model, (x,), d / "bad.onnx")
    write_report(d / "compare.html", report_page(report, "compare small_cnn vs bad.onnx"))
    arrays = {k: v.numpy() for k, v in lt.extract(model, x, taps=["stem", "block.2"]).items()}
    arrays["tokens"] = np.random.default_rng(0).normal(size=(1, 12, 48)).astype(np.float32)
    write_report(d / "extract.html", tensors_page("extract from small_cnn", arrays))
    return d, report


def test_compare_report_in_chromium_desktop_and_phone(pages):
    d, report = pages
    shot, dom = render(d / "compare.html", 1280)
    assert_not_blank(shot)
    assert 'class="errchart"' in dom and 'class="first-divergence"' in dom
    assert f"first divergence: {report.first_divergence}" in dom
    assert dom.count("<details") >= 3 and "The numbers first part at" in dom
    assert scroll_width(dom) <= 1280
    assert re.search(r'data-charts="([^"]*)"', dom).group(1) == "block none"  # the wide chart on a desktop
    shot, dom = render(d / "compare.html", 390, 1600)
    assert_not_blank(shot)
    assert scroll_width(dom) <= 390, "the page scrolls sideways on a phone"
    # a phone shows the tall chart (one line per module), its names drawn at 10.5 of 380 units: >= 9 px
    assert re.search(r'data-charts="([^"]*)"', dom).group(1) == "none block"
    assert float(re.search(r'data-tall-width="([\d.]+)"', dom).group(1)) * 10.5 / 380 >= 9


def test_layers_and_extract_reports_in_chromium(pages):
    d, _ = pages
    shot, dom = render(d / "layers.html", 1280, 1000)
    assert_not_blank(shot)
    assert 'class="tree"' in dom and "BatchNorm2d" in dom and "block.2" in dom
    shot, dom = render(d / "extract.html", 1280, 1400)
    assert_not_blank(shot)
    assert dom.count('<img alt="') == 4 and dom.count('class="hist"') == 4  # stem, block.2, output, tokens
    assert "token x hidden heat map" in dom and "NaN 0, +Inf 0, -Inf 0" in dom
    from PIL import Image

    assert Image.open(shot).size == (1280, 1400)
