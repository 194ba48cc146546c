"""`aoti-farm report REPORT.json --html OUT.html`: the command line of
:mod:`aoti_farm.report.report_html`."""

from __future__ import annotations

import os

from aoti_farm.security import private
from aoti_farm.errors import UserError
from aoti_farm.report.report_html import load_report, render


def add_report_args(p) -> None:
    p.add_argument("report", metavar="REPORT.json", help="a warm report (`aoti-farm warm --report`)")
    p.add_argument("--html", required=True, metavar="OUT.html", help="where to write the page")


def report_command(ns) -> int:
    doc = load_report(ns.report)
    out = ns.html
    d = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(d):
        raise UserError(f"--html {out}: directory {d} does not exist; create it or pass another path")
    if os.path.isdir(out):
        raise UserError(f"--html {out}: is a directory; pass a file path")
    page = render(doc, os.path.basename(ns.report))
    try:   # whole or nothing, through an O_EXCL temp file (no torch import: this command stays fast)
        private.atomic_write(out, page.encode("utf-8"))
    except OSError as e:
        raise UserError(f"--html {out}: cannot write ({e.strerror}); pass a writable path") from None
    print(f"wrote {out}: {len(doc['signatures'])} signatures")
    return 0
