"""`aoti-farm report REPORT.json --html OUT.html` on the report of a real warm: real Ray,
one real actor, one real compile (relu), one entry already cached (from the session cache)
and one signature eager rejects (a failure, no compile).  The page is parsed with
html.parser, and, where chromium is installed, loaded by a real headless browser.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_report_html.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cli import main
from aoti_farm.fingerprint import fingerprint
from aoti_farm.trace import Trace, TraceEntry, save_trace

from conftest import sig_add_alpha

pytestmark = pytest.mark.slow

ADD = sig_add_alpha()
RELU = S.from_call(torch.ops.aten.relu.default, (torch.empty(3, 7),), {})
_bad = S.from_call(torch.ops.aten.mm.default, (torch.empty(3, 4), torch.empty(4, 5)), {}).to_obj()
_bad["args"][1]["sizes"], _bad["args"][1]["strides"] = [7, 5], [5, 1]
BAD = S.parse_signature(_bad)


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self._stack: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        self._stack.append((tag, a))

    def handle_endtag(self, tag):
        while self._stack and self._stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        self.text.append(data)
        if self._stack and self._stack[-1][0] == "title" and len(self._stack) > 1:
            self._stack[-2][1]["_title"] = self._stack[-2][1].get("_title", "") + data

    def rects(self, cls: str) -> list[dict]:
        return [a for t, a in self.tags if t == "rect" and cls in (a.get("class") or "").split()]


@pytest.fixture(scope="module")
def warm_report(kernels, tmp_path_factory):
    assert kernels.ensure(ADD).status in ("compiled", "cached")
    d = tmp_path_factory.mktemp("report")
    cache = kernels.copy_to(d / "cache")
    fp = fingerprint("cpu")
    for s in (RELU, BAD):
        cache.remove(fp.id, s.key)
    try:
        cache.failure_path(fp.id, BAD.key).unlink()
    except FileNotFoundError:
        pass
    trace = d / "t.json"
    save_trace(Trace([TraceEntry(s, 1, i) for i, s in enumerate([ADD, RELU, BAD])]), str(trace))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, "-m", "aoti_farm", "warm", "--model", str(trace), "--cache-dir",
                        str(cache.root), "--cpu-workers", "1", "--report", str(d / "r.json")],
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 1, p.stderr          # BAD failed; the others compiled / cached
    return d, json.loads((d / "r.json").read_text())


def test_html_timeline_of_a_real_warm(warm_report, capsys):
    d, rep = warm_report
    status = {r["key"]: r["status"] for r in rep["signatures"]}
    assert status == {ADD.key: "cached", RELU.key: "compiled", BAD.key: "failed"}
    out = d / "r.html"
    capsys.readouterr()
    assert main(["report", str(d / "r.json"), "--html", str(out)]) == 0
    html = out.read_text()
    page = Page()
    page.feed(html)
    # self-contained: nothing to fetch
    assert not [a for _, a in page.tags if a.get("src") or a.get("href")]
    assert "<script" not in html and "@import" not in html and "url(" not in html
    # one lane per actor, with its warm-up; one bar per signature an actor ran, by outcome
    worker = {r["worker"] for r in rep["signatures"] if r["status"] != "cached"}
    assert len(worker) == 1
    text = " ".join(page.text)
    assert f"actor {worker.pop()}" in text
    assert len(page.rects("warmup")) == len(rep["timeline"]["workers"]) == 1
    compiled, failed = page.rects("compiled"), page.rects("failed")
    assert len(compiled) == 1 and RELU.key[:16] in compiled[0]["_title"]
    assert len(failed) == 1 and BAD.key[:16] in failed[0]["_title"] and "eager rejects" in failed[0]["_title"]
    assert compiled[0]["fill"] != failed[0]["fill"]
    assert not page.rects("cached")          # found while planning: no actor bar, but in the table
    # Ray's start-up and the driver's phases
    assert len(page.rects("ray")) == 1 and "Ray start-up" in page.rects("ray")[0]["_title"]
    # the summary on top, and every signature in the table
    assert "3 (1 cached, 1 compiled, 1 failed)" in text and "Ray start-up" in text and "actor warm-up" in text
    rows = [a for t, a in page.tags if t == "tr" and a.get("class") in ("cached", "compiled", "failed")]
    assert sorted(a["class"] for a in rows) == ["cached", "compiled", "failed"]
    # bars lie inside the time axis, in order: warm-up before the first compile
    xs = lambda a: (float(a["x"]), float(a["x"]) + float(a["width"]))  # noqa: E731
    w0, w1 = xs(page.rects("warmup")[0])
    assert w1 <= min(xs(compiled[0])[0], xs(failed[0])[0]) + 1.0


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")), reason="no chromium here")
def test_headless_browser_renders_it(warm_report, tmp_path):
    d, _ = warm_report
    out = tmp_path / "r.html"
    assert main(["report", str(d / "r.json"), "--html", str(out)]) == 0
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    common = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,700"]
    dom = subprocess.run(common + ["--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Page()
    page.feed(dom.stdout)        # the browser's DOM after parsing: the SVG bars are in it
    assert len(page.rects("compiled")) == 1 and len(page.rects("failed")) == 1
    png = tmp_path / "r.png"
    shot = subprocess.run(common + [f"--screenshot={png}", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("AOTI_FARM_KEEP_SCREENSHOT"):
        shutil.copy(png, os.environ["AOTI_FARM_KEEP_SCREENSHOT"])
