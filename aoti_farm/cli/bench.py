"""``aoti-farm bench``: runs the benchmark suite of a source checkout (scripts/bench/run.py).

The benchmarks live in ``scripts/bench`` (they compare against upstream and need the
repository's example model); this forwards the arguments to it.
"""

from __future__ import annotations

import os
import subprocess
import sys

from aoti_farm.errors import UserError

RUNNER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts", "bench", "run.py")


def main(argv: list[str]) -> int:
    if not os.path.exists(RUNNER):
        raise UserError("the benchmarks ship with the source checkout (scripts/bench/run.py); "
                        "install aoti-farm editable from a clone (`pip install -e .`) to use `aoti-farm bench`")
    return subprocess.run([sys.executable, RUNNER, *argv]).returncode
