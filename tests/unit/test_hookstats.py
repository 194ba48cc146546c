"""``Hook.stats()``'s summary (calls, served, hit rate, why not served) and the stats taken
after ``uninstall()`` (what ``aoti-farm run`` writes at exit), which describe the hook as
it served, not the empty registration left behind."""

from __future__ import annotations


from aoti_farm.runtime.hookstats import summary


def test_summary_adds_up_the_outcomes():
    s = {"calls": 100, "hits": 40, "gated": 25, "gate_pending": 5, "misses": 10, "failed_signatures": 2,
         "fallbacks": {"a view": 15, "requires_grad": 3}}
    got = summary(s)
    assert got["calls"] == 100 and got["served"] == 40 and got["hit_rate"] == 0.4
    assert got["not_served"] == {"gated": 25, "gate_pending": 5, "missed": 10, "failed": 2, "ineligible": 18}
    assert got["served"] + sum(got["not_served"].values()) == got["calls"]
    assert got["top_reason"] == "gated" and got["ineligible_by_reason"]["a view"] == 15
    assert summary({"calls": 0, "hits": 0, "fallbacks": {}}) == {
        "calls": 0, "served": 0, "hit_rate": 0.0, "ineligible_by_reason": {}, "top_reason": None,
        "not_served": {"gated": 0, "gate_pending": 0, "missed": 0, "failed": 0, "ineligible": 0}}
