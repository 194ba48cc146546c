"""Drill 5 (P8): fuzzed input.  Every bad trace, flag or TOML config gets exit 2 and ONE
line on stderr naming the input -- never a traceback -- and nothing is written to the
cache.  The CLI runs in-process (``aoti_farm.cli.main``) for speed; a handful of cases run
as real subprocesses to prove the console script behaves the same.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aoti_farm.cache.store import Cache
from aoti_farm.cli import main
from aoti_farm.fingerprint import fingerprint
from aoti_farm.trace import Trace, TraceEntry, save_trace

from conftest import sig_add_alpha, sig_mul
from e2e.test_drills_util import snapshot

EXAMPLES = int(os.environ.get("AOTI_FARM_DRILL_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
FIGURES: dict[str, dict] = {}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small real cache (layout only: no compile needed) and a valid trace."""
    base = tmp_path_factory.mktemp("drill5")
    cache = Cache(base / "cache", signing_key=None)
    cache.ensure(fingerprint("cpu"))
    trace = base / "good.json"
    save_trace(Trace([TraceEntry(sig_add_alpha(), 3, 0), TraceEntry(sig_mul(), 1, 1)]), trace)
    return {"base": base, "cache": cache.root, "trace": trace,
            "doc": json.loads(trace.read_text()), "before": snapshot(cache.root)}


def _run(capsys, argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _assert_one_line(rc, err, *, names: str | None = None, allow_ok=False):
    if allow_ok and rc == 0:
        return
    assert rc == 2, f"exit {rc}, stderr={err!r}"
    assert "Traceback" not in err, err
    assert err.count("\n") == 1 and err.endswith("\n"), f"not one line: {err!r}"
    assert err.startswith("aoti-farm: error: "), err
    if names is not None:
        assert names in err, f"error does not name {names!r}: {err!r}"


def _count(name, rc):
    f = FIGURES.setdefault(name, {"cases": 0, "exit2": 0, "exit0": 0, "other": 0})
    f["cases"] += 1
    f["exit2" if rc == 2 else "exit0" if rc == 0 else "other"] += 1


# --- trace content ---------------------------------------------------------------------

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                        st.floats(allow_nan=False), st.text(max_size=12))
json_value = st.recursive(json_scalar, lambda c: st.one_of(st.lists(c, max_size=4),
                                                           st.dictionaries(st.text(max_size=8), c, max_size=4)),
                          max_leaves=12)
# Interesting replacement values for fields of a real trace.
hostile = st.one_of(json_value, st.sampled_from([
    -1, 0, 2**63, 1e308, "", "../../etc/passwd", "aten::does_not_exist", "aten::add.Tensor",
    "aten::bernoulli", "aten::add_.Tensor", "float1024", "cuda:99", "meta", [], {}, [[]], [-1], [2**40, 2**40],
    [1] * 70, "tensor", "tensor_list", "int", "\x00", "\u202e",
]))


def _paths(obj, prefix=()):
    """Every (path) into a JSON document, for targeted mutation."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_trace(draw, doc):
    d = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(d))
        path = draw(st.sampled_from(paths))
        how = draw(st.sampled_from(["replace", "delete", "add"]))
        if not path:
            d = draw(hostile)
            continue
        parent = d
        for p in path[:-1]:
            parent = parent[p]
        last = path[-1]
        if how == "delete":
            del parent[last]
        elif how == "add" and isinstance(parent[last], dict):
            parent[last][draw(st.text(max_size=6))] = draw(hostile)
        else:
            parent[last] = draw(hostile)
    return d


def _write(base: Path, name: str, data) -> Path:
    p = base / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def test_fuzzed_trace_content(world, capsys):
    base, cache = world["base"], world["cache"]

    @SETTINGS
    @given(doc=st.one_of(mutated_trace(world["doc"]), json_value))
    def check(doc):
        p = _write(base, "fuzz.json", doc)
        rc, out, err = _run(capsys, ["trace", "validate", p])
        _count("trace-content", rc)
        _assert_one_line(rc, err, names=str(p), allow_ok=True)
        # `key` reads the cache's config but writes nothing.
        rc2, _, err2 = _run(capsys, ["key", "--trace", p, "--index", "0", "--cache-dir", cache])
        _assert_one_line(rc2, err2, allow_ok=True)
        if rc == 2:
            assert rc2 == 2, err2

    check()
    assert snapshot(cache) == world["before"]
    f = FIGURES["trace-content"]
    assert f["exit2"] > 0
    print(f"drill 5 trace content: cases={f['cases']} exit2={f['exit2']} exit0={f['exit0']} "
          f"tracebacks=0 cache_changed=0")


@pytest.mark.parametrize("name, data", [
    ("bytes.json", b"\xff\xfe\x00garbage"),
    ("empty.json", b""),
    ("deep.json", "[" * 100000 + "]" * 100000),
    ("nan.json", '{"format": "aoti-farm-trace", "version": NaN, "entries": []}'),
    ("bigint.json", '{"format": "aoti-farm-trace", "version": 1, "entries": [{"count": ' + "9" * 5000 + "}]}"),
])
def test_hostile_trace_files(world, capsys, name, data):
    p = _write(world["base"], name, data)
    rc, _, err = _run(capsys, ["trace", "validate", p])
    _assert_one_line(rc, err, names=str(p))
    assert snapshot(world["cache"]) == world["before"]


# --- command-line arguments ------------------------------------------------------------

SUBCOMMANDS = [["trace", "validate"], ["trace", "show"], ["trace", "merge"], ["key"], ["cache", "stats"],
               ["cache", "ls"], ["cache", "verify"], ["cache", "gc"], ["compile-one"], ["warm"], ["serve"],
               ["cache"], ["trace"], []]
FLAGS = ["--cache-dir", "--config", "--trace", "--index", "--json", "--max-size", "--failed", "--repair",
         "--out", "--address", "--cpu-workers", "--timeout", "--retries", "--lease-ttl", "--report",
         "--bogus", "-x", "--", "-"]


@st.composite
def argvs(draw, world):
    files = [str(world["base"] / "missing.json"), str(world["base"]), str(world["base"] / "bytes.json"),
             "/dev/null", "/proc/self/mem", "", " ", "-1", "nan", "1e999", "0", "-5", "9" * 40, "..", "\x7f"]
    argv = list(draw(st.sampled_from(SUBCOMMANDS)))
    for _ in range(draw(st.integers(0, 5))):
        tok = draw(st.one_of(st.sampled_from(FLAGS), st.sampled_from(files), st.text(max_size=10)))
        argv.append(tok)
    return argv


def test_fuzzed_arguments(world, capsys, monkeypatch):
    cache = world["cache"]
    # A bad argv must never reach a compile or a cluster: the env points every command
    # at the snapshot cache, and a valid trace is never offered to warm/serve/compile-one.
    monkeypatch.setenv("AOTI_FARM_CACHE_DIR", str(cache))
    monkeypatch.chdir(world["base"])
    _write(world["base"], "bytes.json", b"\xff\xfe\x00garbage")

    @SETTINGS
    @given(argv=argvs(world))
    def check(argv):
        if argv[:1] in (["serve"],) and not any(a.startswith("-") and a not in ("--json",) for a in argv[1:]):
            argv = argv + ["--bogus"]  # a bare `serve` would run forever; it must fail here
        rc, out, err = _run(capsys, argv)
        _count("argv", rc)
        _assert_one_line(rc, err, allow_ok=True)

    check()
    assert snapshot(cache) == world["before"]
    f = FIGURES["argv"]
    print(f"drill 5 arguments: cases={f['cases']} exit2={f['exit2']} exit0={f['exit0']} tracebacks=0 cache_changed=0")


# --- TOML configs ----------------------------------------------------------------------

FARM_KEYS = ["cache_dir", "address", "cpu_workers", "gpu_workers", "gpus_per_worker", "timeout", "retries",
             "lease_ttl", "max_in_flight", "inductor_options", "signing_key_file", "poll_interval", "bogus"]
toml_scalar = st.one_of(st.integers(-10, 2**65), st.floats(allow_nan=True), st.booleans(),
                        st.text(max_size=8), st.lists(st.integers(), max_size=2))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


@st.composite
def tomls(draw):
    kind = draw(st.sampled_from(["table", "table", "raw", "wrong-section"]))
    if kind == "raw":
        return draw(st.text(max_size=60))
    items = draw(st.dictionaries(st.sampled_from(FARM_KEYS), toml_scalar, max_size=3))
    body = "\n".join(f"{k} = {_toml_value(v)}" for k, v in items.items())
    head = "[farm]" if kind == "table" else draw(st.sampled_from(["farm = 3", "[[farm]]", "[farm.x]"]))
    return f"{head}\n{body}\n"


def test_fuzzed_toml_config(world, capsys, monkeypatch):
    cache = world["cache"]
    base = world["base"]
    monkeypatch.delenv("AOTI_FARM_CACHE_DIR", raising=False)

    @SETTINGS
    @given(text=tomls())
    def check(text):
        cfg = base / "fuzz.toml"
        cfg.write_bytes(text.encode("utf-8", "surrogatepass"))
        rc, out, err = _run(capsys, ["cache", "stats", "--config", cfg, "--cache-dir", cache])
        _count("toml", rc)
        _assert_one_line(rc, err, names=None, allow_ok=True)
        if rc == 2:
            assert "config" in err or "cache" in err, err
        # the same file through the resolver used by warm/serve: a bad file is a UserError
        from aoti_farm.config import FarmConfig, resolve
        from aoti_farm.errors import UserError

        try:
            resolve(FarmConfig, config_path=str(cfg), env={})
        except UserError as e:
            assert "\n" not in str(e) and str(cfg) in str(e), str(e)

    check()
    assert snapshot(cache) == world["before"]
    f = FIGURES["toml"]
    assert f["exit2"] > 0
    print(f"drill 5 TOML: cases={f['cases']} exit2={f['exit2']} exit0={f['exit0']} tracebacks=0 cache_changed=0")


# --- a handful through the real console script ------------------------------------------

def test_subprocess_cases(world):
    exe = os.path.join(os.path.dirname(sys.executable), "aoti-farm")
    base = world["base"]
    bad_trace = _write(base, "sub-bad.json", {"format": "aoti-farm-trace", "version": 1,
                                               "entries": [{"op": "aten::no_such_op", "args": []}]})
    bad_toml = _write(base, "sub-bad.toml", "[farm]\nretries = -3\n")
    cases = [
        ([exe, "trace", "validate", str(bad_trace)], str(bad_trace)),
        ([exe, "cache", "stats", "--config", str(bad_toml), "--cache-dir", str(world["cache"])], str(bad_toml)),
        ([exe, "cache", "gc", "--max-size", "lots", "--cache-dir", str(world["cache"])], "--max-size"),
        ([exe, "key", "--trace", str(base / "nope.json"), "--index", "0"], str(base / "nope.json")),
    ]
    cases.append(([exe, "warm", "--model", str(bad_trace), "--cache-dir", str(world["cache"])], str(bad_trace)))
    for argv, names in cases:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "AOTI_FARM_CACHE_DIR": str(world["cache"])})
        _assert_one_line(p.returncode, p.stderr, names=names)
    assert snapshot(world["cache"]) == world["before"]
    print(f"drill 5 subprocess: cases={len(cases)} exit2={len(cases)} tracebacks=0 cache_changed=0")
