"""scripts/bench/startup_ab.py's pairing and its verdict (no warm is run here)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))

import startup_ab as A  # noqa: E402


def test_each_pair_rotates_so_no_side_always_goes_first():
    runs = A.sides(["fork_server", "split_build"])
    assert [s for s, _ in runs] == ["on", "fork_server-off", "split_build-off"]
    firsts = {A.order(runs, p)[0][0] for p in range(3)}
    assert firsts == {"on", "fork_server-off", "split_build-off"}
    assert all(sorted(A.order(runs, p)) == sorted(runs) for p in range(5))


def test_a_mechanism_is_kept_only_where_its_median_pair_saves_5_percent():
    rows = [{"pair": p, "side": s, "rc": 0, "wall_s": w} for p, s, w in (
        (0, "on", 90.0), (0, "fork_server-off", 100.0), (0, "split_build-off", 92.0),
        (1, "on", 80.0), (1, "fork_server-off", 90.0), (1, "split_build-off", 81.0),
        (2, "on", 85.0), (2, "fork_server-off", 84.0), (2, "split_build-off", 86.0))]
    got = A.summary(rows, ["fork_server", "split_build"])
    assert got["fork_server"]["pairs"] == 3 and got["fork_server"]["on_off_median"] == 0.9
    assert got["fork_server"]["keep"] is True
    assert got["split_build"]["keep"] is False            # 0.978: saves less than 5%


def test_a_failed_warm_counts_in_no_pair():
    rows = [{"pair": 0, "side": "on", "rc": 0, "wall_s": 50.0},
            {"pair": 0, "side": "fork_server-off", "rc": 2, "wall_s": 5.0}]
    assert A.summary(rows, ["fork_server"])["fork_server"] == {"pairs": 0}
