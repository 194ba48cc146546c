"""The unit tests split from tests/e2e/test_earlyray.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import json
from pathlib import Path

from aoti_farm import trace
from aoti_farm.workers import earlyray

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "examples" / "mlp_trace.json"


def _entries(path=EXAMPLE) -> list:
    return json.loads(Path(path).read_text())["entries"]


def _write(path: Path, entries: list) -> str:
    path.write_text(json.dumps({"format": "aoti-farm-trace", "version": 1, "entries": entries}))
    return str(path)


def test_anything_odd_in_a_trace_means_no_count(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert earlyray.count_entries([str(bad)]) is None
    assert earlyray.count_entries([str(tmp_path / "missing.json")]) is None
    assert earlyray.count_entries([_write(tmp_path / "x.json", [{"op": "aten::relu"}])]) is None
    assert earlyray.MAX_TRACE_BYTES == trace.MAX_BYTES


def test_no_early_start_where_it_does_not_apply(tmp_path, monkeypatch):
    from aoti_farm.config import FarmConfig
    from aoti_farm.workers import warm

    monkeypatch.setattr(warm, "PREP_MIN_CORES", 1)
    steps = warm.early_steps()
    t = _write(tmp_path / "t.json", _entries()[:1])
    cfg = FarmConfig(cache_dir=str(tmp_path / "cache"))
    tl: dict = {}
    assert earlyray.begin(FarmConfig(cache_dir=cfg.cache_dir, address="auto"), [t], None, None, tl, steps) is None
    assert earlyray.begin(cfg, [t], None, object(), tl, steps) is None          # a test double compiler
    assert earlyray.begin(FarmConfig(cache_dir=cfg.cache_dir, dynamic="auto"), [t], None, None, tl, steps) is None
    assert earlyray.begin(cfg, [str(tmp_path / "missing.json")], None, None, tl, steps) is None
    monkeypatch.setenv("AOTI_FARM_DEV", f"{earlyray.DEV}=0")
    assert earlyray.begin(cfg, [t], None, None, tl, steps) is None
    monkeypatch.delenv("AOTI_FARM_DEV")
    monkeypatch.setattr(warm, "PREP_MIN_CORES", 10 ** 6)                       # the 2-core path
    assert earlyray.begin(cfg, [t], None, None, tl, warm.early_steps()) is None
    assert tl == {}
