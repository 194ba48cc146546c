"""The README's examples run as shown.

Every fenced ``sh`` and ``python`` block of README.md runs, in the README's order, in one
fresh working directory, with this environment's ``aoti-farm`` and ``python`` first on
PATH: a ``sh`` block through ``bash -eu -o pipefail``, a ``python`` block as a script of
its own.  A ``python`` block whose first line is ``# file: NAME`` is the file NAME that
later blocks use (the README's ``model.py``), so it is written, not run.  Output shown in
``text`` blocks is not checked (it is one run's, on one host).  The two install
commands (the blocks with ``pip install``) are skipped: they are what CI runs (.ci/run).

Real components throughout: a model we did not write (Hugging Face GPT-2 from a small
config, random weights), a real record, a real warm on a local Ray (ten real compiles
into a temporary cache), the hook in real processes.  A block that fails, or a workflow
step that leaves the runnable blocks, fails the test; so does a served run whose tokens
differ from the recorded (eager) run's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _install import clean_env

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
FILE_MARK = re.compile(r"^# file: (\S+)\n")

#: what the README's workflow must show in blocks that run (not only in prose)
WORKFLOW = ("from transformers import", "aoti-farm record ", "aoti-farm warm ", "aoti-farm run ",
            "AOTI_FARM_HOOK_STATS=", ".stats()", "aoti-farm cache stats", "aoti-farm explain ", "rt.install(")


def snippets(text: str) -> list[tuple[str, str]]:
    """(language, body) of every block that runs, in order; the install commands left out."""
    out = []
    for m in FENCE.finditer(text):
        lang, body = m.group(1), m.group(2)
        if lang not in ("sh", "python"):
            continue
        if lang == "sh" and "pip install" in body:
            continue   # the two commands: CI runs them
        out.append((lang, body))
    return out


def test_snippets_cover_the_workflow():
    runnable = "\n".join(body for _, body in snippets(README.read_text()))
    missing = [w for w in WORKFLOW if w not in runnable]
    assert not missing, f"README's runnable examples lack {missing}"


def test_snippet_extraction():
    text = ("x\n```sh\npython3 -m venv .venv && .venv/bin/pip install torch\n```\n"
            "```python\n# file: m.py\nprint(1)\n```\n```text\nnot run\n```\n```sh\naoti-farm --help\n```\n")
    assert snippets(text) == [("python", "# file: m.py\nprint(1)\n"), ("sh", "aoti-farm --help\n")]


def _ours(marker: str) -> list[int]:
    """Processes started by this test: their command line names its working directory."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.mark.slow
def test_readme_examples_run_as_shown(tmp_path):
    work = tmp_path / "readme"
    work.mkdir()
    bindir = str(Path(sys.executable).parent)
    env = clean_env(PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    env = {k: v for k, v in env.items() if not k.startswith("AOTI_FARM_") or k == "AOTI_FARM_DEV"}
    ran, outputs = [], []
    try:
        for i, (lang, body) in enumerate(snippets(README.read_text())):
            m = FILE_MARK.match(body) if lang == "python" else None
            if m:
                (work / m.group(1)).write_text(body)
                continue
            if lang == "sh":
                cmd = ["bash", "-eu", "-o", "pipefail", "-c", body]
            else:
                script = work / f"readme_snippet_{i}.py"
                script.write_text(body)
                cmd = [sys.executable, str(script)]
            p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
            assert p.returncode == 0, (f"README {lang} block {i} failed (rc {p.returncode}):\n{body}\n"
                                       f"--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}")
            assert "Traceback" not in p.stderr, f"README {lang} block {i}:\n{body}\n{p.stderr[-3000:]}"
            ran.append(body)
            outputs.append(p.stdout)
    finally:
        # a safety net: nothing these blocks started may outlive the test
        for pid in _ours(str(work)):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while _ours(str(work)) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert any("aoti-farm warm " in b for b in ran) and any("rt.install(" in b for b in ran), ran
    # the program's tokens are eager's, recorded and served alike (record, run, install())
    tokens = [line for out in outputs for line in out.splitlines() if line.startswith("tokens ")]
    assert len(tokens) >= 3 and len(set(tokens)) == 1, tokens
    assert (work / "aoti-cache").is_dir() and (work / "trace.json").is_file()
