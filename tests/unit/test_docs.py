"""The README stays a front door and the docs stay linked: README.md is at most 300 lines,
every relative link of README.md and docs/*.md names a file that exists, and every
``#anchor`` names a heading (or an explicit anchor) of the page it points to.  Fast: it
reads Markdown only.  The README's examples themselves run in tests/e2e/test_readme.py."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: pages other branches are writing, linked ahead of their merge
#: (e.g. a page another branch adds).  Drop an entry once it lands.
PENDING = set()

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    h = re.sub(r"[`*_]", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    out = {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}
    out |= set(re.findall(r'<a id="([^"]+)"', text))
    return out


def links(page: Path):
    for m in LINK.finditer(FENCE.sub("", page.read_text())):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        yield path, frag


def test_readme_is_a_front_door():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines; move reference text to docs/"


def test_relative_links_resolve():
    bad = []
    for page in PAGES:
        for path, frag in links(page):
            dest = (page.parent / path).resolve() if path else page
            rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
            if rel in PENDING:
                continue
            if not dest.exists():
                bad.append(f"{page.relative_to(REPO)}: {path} does not exist")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                bad.append(f"{page.relative_to(REPO)}: #{frag} is no heading of {rel}")
    assert not bad, "\n".join(bad)


def test_slug_matches_github():
    assert slug("The libstdc++ trap") == "the-libstdc-trap"
    assert slug("`serve`") == "serve"
    assert slug("Why did this miss? (`aoti-farm explain`)") == "why-did-this-miss-aoti-farm-explain"


def test_checkable_claims_of_the_docs_hold():
    """Claims a reader acts on and a test can read: the README's Python version is
    pyproject's minimum, its two commands are CI's (``.ci/run`` runs the second exactly),
    and the hook's documented default route is the one ``check_arguments`` picks."""
    import tomllib

    from aoti_farm.runtime.settings import check_arguments

    readme = (REPO / "README.md").read_text()
    minimum = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert minimum.startswith(">="), minimum
    assert f"Python {minimum[2:]}" in readme and not re.search(r"Python 3\.(?!" + minimum[4:] + r"\b)\d+", readme)
    test_cmd = "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e '.[test]' && .venv/bin/pytest -q"
    assert test_cmd in readme and test_cmd in (REPO / ".ci/run").read_text()
    hook_doc = (REPO / "runtime/hook.py").read_text()
    default = re.search(r'``route="(\w+)"`` \(the default with ``on_miss`` "compile" or "queue"\)', hook_doc)
    assert default and check_arguments("compile", 1.0, ("cpu",), "auto", None) == default.group(1)
