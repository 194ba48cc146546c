"""Exact counter deltas for tests (no tests here).

``assert_delta(before, after, expected)``: ``before``/``after`` are two ``stats()``
snapshots (any component's; see :mod:`aoti_farm.metrics.counters`).  Every top-level integer
counter must have changed by exactly ``expected.get(name, 0)`` (so an unexpected count
fails too), except names in ``ignore``; a nested family named in ``expected`` (e.g.
``per_op``, ``fallbacks``) must have changed by exactly that dict.
"""

from __future__ import annotations

from aoti_farm.metrics.counters import delta


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def assert_delta(before: dict, after: dict, expected: dict, ignore=()) -> dict:
    d = delta(before, after)
    wrong = {}
    for k, v in after.items():
        if _is_count(v) and k not in ignore and d.get(k, 0) != expected.get(k, 0):
            wrong[k] = (d.get(k, 0), expected.get(k, 0))
    for k, v in expected.items():
        if isinstance(v, dict) and d.get(k, {}) != v:
            wrong[k] = (d.get(k, {}), v)
        elif _is_count(v) and k not in after:
            wrong[k] = ("absent", v)
    assert not wrong, f"counter deltas (got, expected): {wrong}; all changes: {d}"
    return d
