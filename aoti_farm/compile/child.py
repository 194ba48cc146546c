"""The verification child's side: ``python -m aoti_farm.compile.child`` verifies one kernel
(request on stdin, result as one JSON line) where the parent cannot load AOTI libraries;
``--serve``: one request per line for as long as stdin is open (the long-lived child of
:mod:`aoti_farm.compile.verifyserver`).  It imports torch, not Inductor
(``AOTICompiler(builds=False)``)."""

from __future__ import annotations

import json
import sys

from aoti_farm import signature as S
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.errors import CompileRefused


def _verify_request(req: dict) -> dict:
    """One verification request of a child: the result, or ``{"refused", "evidence"}``."""
    sig = S.parse_signature(req["sig"])
    try:
        return AOTICompiler(verify_trials=req["trials"], measure_speed=req.get("speed", True),
                            builds=False)._verify_here(sig, req["path"],
                                                       [tuple(g) for g in req.get("guards") or ()] or None)
    except CompileRefused as e:
        return {"refused": e.reason, "evidence": e.evidence}


def _verify_child_main() -> int:
    """``python -m aoti_farm.compile.child``: verify one kernel (request on stdin) and print
    the result as one JSON line.  Used where the parent cannot load AOTI libraries.
    ``--serve``: one request per line for as long as stdin is open (the long-lived child
    of :mod:`aoti_farm.compile.verifyserver`)."""
    if "--serve" in sys.argv[1:]:
        from aoti_farm.compile import verifyserver

        return verifyserver.serve(_verify_request)
    print(json.dumps(_verify_request(json.loads(sys.stdin.read())), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(_verify_child_main())
