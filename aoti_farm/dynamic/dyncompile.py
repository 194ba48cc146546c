"""Shape-general kernels: what makes a class kernel different from an exact one.

A shape class (:mod:`aoti_farm.dynamic.shapes`) is compiled on the one compile path: the compiler
(:class:`aoti_farm.compile.compiler.AOTICompiler`, through the ``Compiler`` protocol) takes a
:class:`~aoti_farm.dynamic.shapes.ShapeClass` where it takes a signature, and
:func:`aoti_farm.compile.job.compile_and_publish` leases, compiles and publishes it.  The build
block, the verification loop (every thread count it may be served at, adversarial inputs,
the proxy-executor refusal) and the publish are the exact kernels'.  This module holds
only what is the class's own, and imports neither the compiler nor the job:

* :func:`dynamic_spec`: the export's ``dynamic_shapes`` (``torch.export.Dim`` with the
  class's observed ``[lo, hi]``; dims of size 0/1 are in the class's layout and stay
  exact);
* the verification's points: :func:`verify_points` (:func:`aoti_farm.dynamic.shapes.sample_points`:
  both ends of every range, an odd size, random interior points and every observed
  shape).  One disagreement refuses the kernel;
* :func:`gate`: the speed gate across the range.  The speed is timed at every sample
  (``manifest["speed_samples"]``).  The entry is always the whole verified class;
  ``manifest["speed"]["serve_range"]`` is where the gate lets it serve: the whole range
  when it won at every sample, for a class of one symbol the widest run of consecutive
  winning samples, else None.  Under ``serve="faster"`` the hook matches a call to the
  class only inside ``serve_range`` (elsewhere the call is a miss that queues its exact
  signature, whose own kernel may win); under ``"always"`` the whole verified range is
  served;
* :class:`ClassEntry` (what ``Cache.publish`` takes for a class) and the hint
  ``<root>/<fp>/classes/<group key>/<class key>`` for the serving hook's index
  (:func:`write_hint`, :func:`hinted_keys`).

Where the export with symbolic dims fails (an op whose meta function guards on a size,
a divisibility the range does not satisfy), Inductor cannot compile the graph, or the
verification refuses the kernel, the compile raises :class:`DynamicUnsupported` (or
another ``CompileRefused``) saying why and the farm compiles the class's members exactly.
No failure record is written for a class: its members get their own.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass

from aoti_farm.dynamic import shapes as SH
from aoti_farm import signature as S
from aoti_farm.errors import CompileRefused

#: Seconds of the speed measurement per sampled shape.
SAMPLE_SPEED_BUDGET_S = 0.15
#: Random interior points the verification samples (besides the ends, an odd size and the members).
RANDOM_SAMPLES = 3
CLASSES_DIR = "classes"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class DynamicUnsupported(CompileRefused):
    """This class gets no shape-general kernel (the reason says why): compile its members
    exactly."""


@dataclass(frozen=True)
class ClassEntry:
    """What :meth:`aoti_farm.cache.store.Cache.publish` needs: the class key, and as the
    manifest's ``signature`` the class's example (a member; ``shape_class`` carries the
    class itself)."""

    cls: SH.ShapeClass

    @property
    def key(self) -> str:
        return self.cls.key

    def to_obj(self) -> dict:
        return self.cls.example.to_obj()


def export_signature(cls: SH.ShapeClass) -> S.Signature:
    """The member the export traces (its sizes become the symbols' example values);
    DynamicUnsupported for a class with no varying size."""
    if not cls.varies:
        raise DynamicUnsupported("no varying size: an exact kernel")
    return cls.point(SH.export_point(cls))


def dynamic_spec(cls: SH.ShapeClass) -> tuple:
    """``torch.export.export``'s ``dynamic_shapes`` for the op module's tensors."""
    import torch

    dims = {n: torch.export.Dim(n, min=lo, max=hi) for n, (lo, hi) in cls.symbols.items()}
    return (tuple({d: dims[p] for d, p in enumerate(pat) if isinstance(p, str)} or None for pat in cls.dims),)


def verify_points(cls: SH.ShapeClass) -> list[tuple[S.Signature, int, dict]]:
    """(member signature, input seed, symbol values) of every sampled shape."""
    return [(cls.point(env), 1000 + i, env)
            for i, env in enumerate(SH.sample_points(cls, RANDOM_SAMPLES, seed=len(cls.key)))]


def gate(cls: SH.ShapeClass, samples: list[dict], ratio: float) -> dict | None:
    """The manifest's ``speed`` of a class kernel timed at ``samples`` (``at``, ``speed``).
    The class published is always the whole verified class; the speed gate's part is
    ``speed["serve_range"]``: where the kernel won at every sample (the whole range), for
    one symbol the widest run of consecutive winning samples (at least two), else None (it
    wins nowhere it can be trusted to).  ``speed``'s ratio is the worst sample inside
    ``serve_range`` (the worst overall when None), so the gate's usual checks apply to it."""
    timed = [s for s in samples if "speed" in s]
    if not timed:
        return None
    worst = max(timed, key=lambda s: s["speed"]["ratio"])
    full = ranges(cls)
    if worst["speed"]["ratio"] <= ratio:
        return {**_speed(worst), "serve_range": full, "worst_ratio": worst["speed"]["ratio"]}
    if len(cls.ranges) != 1:
        return {**_speed(worst), "serve_range": None, "worst_ratio": worst["speed"]["ratio"]}
    name = cls.ranges[0][0]
    pts = sorted(timed, key=lambda s: s["at"][name])
    best, run = [], []
    for s in pts:
        run = run + [s] if s["speed"]["ratio"] <= ratio else []
        if len(run) > len(best):
            best = run
    if len(best) < 2:
        return {**_speed(worst), "serve_range": None, "worst_ratio": worst["speed"]["ratio"]}
    w = max(best, key=lambda s: s["speed"]["ratio"])
    return {**_speed(w), "serve_range": {name: [best[0]["at"][name], best[-1]["at"][name]]},
            "worst_ratio": worst["speed"]["ratio"]}


def _speed(sample: dict) -> dict:
    return {**sample["speed"], "at": sample["at"]}


def widest(cls: SH.ShapeClass) -> S.Signature:
    """The member at the top of every range (the memory budget's check of a class)."""
    return cls.point({n: hi for n, (lo, hi) in cls.symbols.items()})


def ranges(cls: SH.ShapeClass) -> dict:
    return {n: [lo, hi] for n, lo, hi in cls.ranges}


# --- the serving hook's hint ------------------------------------------------------------------------


def write_hint(cache, fp, cls: SH.ShapeClass) -> None:
    """``<root>/<fp>/classes/<group key>/<class key>``: an empty file telling the serving
    hook which class entries exist for a group.  Only a hint: the entry itself is verified
    (key, hashes, HMAC) before it is used."""
    d = cache.root / fp.id / CLASSES_DIR / cls.group_key
    d.mkdir(parents=True, exist_ok=True)
    p = d / cls.key
    if not p.exists():
        tmp = d / f".{cls.key}.{uuid.uuid4().hex[:8]}"
        tmp.touch()
        os.replace(tmp, p)


def hinted_keys(cache, fp_id: str, gkey: str) -> list[str]:
    """The class keys hinted for a group (names checked; nothing else trusted)."""
    try:
        names = os.listdir(cache.root / fp_id / CLASSES_DIR / gkey)
    except OSError:
        return []
    return sorted(n for n in names if _HEX64.match(n))


def serve_range(cache, fp, key: str):
    """A published class entry's ``speed["serve_range"]`` (a report detail: None when unreadable)."""
    try:
        sp = cache.read_manifest(cache.entry_dir(fp.id, key)).get("speed")
        return sp.get("serve_range") if isinstance(sp, dict) else None
    except Exception:  # noqa: BLE001 -- a report detail only
        return None


__all__ = ["ClassEntry", "DynamicUnsupported", "export_signature", "dynamic_spec", "verify_points", "gate",
           "widest", "ranges", "write_hint", "hinted_keys", "serve_range", "CLASSES_DIR",
           "SAMPLE_SPEED_BUDGET_S", "RANDOM_SAMPLES"]
