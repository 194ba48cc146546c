"""Drills of the attacks on what sits around the shared cache.

Threat model (docs/RELIABILITY.md): an unprivileged local user against a root (or other
user's) warm, serve or serving process, plus hostile trace and report files.  Where an
attack needs a second local user, the test creates one (``aotiattacker``, once) and runs
the attacker's steps as that user with ``setpriv``; it skips only where that is
impossible (not root, no ``useradd``/``setpriv``).  No drill here compiles or starts Ray
(the Ray and compile-worker drills are in ``test_drills_env.py``).
"""

from __future__ import annotations

import io
import json
import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
import torch

from aoti_farm.security import private
from aoti_farm import signature as S
from aoti_farm.security.safeio import UnsafeFile

ATTACKER = "aotiattacker"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def attacker():
    """The second local user (created once; never removed: other runs reuse it)."""
    if os.getuid() != 0:
        pytest.skip("a second local user needs root to create")
    if not shutil.which("setpriv"):
        pytest.skip("no setpriv to act as the second user")
    try:
        return pwd.getpwnam(ATTACKER)
    except KeyError:
        pass
    if not shutil.which("useradd"):
        pytest.skip("no useradd to create the second user")
    r = subprocess.run(["useradd", "-M", "-s", "/bin/sh", ATTACKER], capture_output=True, text=True)
    if r.returncode not in (0, 9):   # 9: created meanwhile
        pytest.skip(f"useradd failed: {r.stderr.strip()}")
    return pwd.getpwnam(ATTACKER)


def as_attacker(pw, script: str) -> None:
    subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
                    "sh", "-c", script], check=True)


@pytest.fixture()
def shared(attacker):
    """A world-writable directory both users reach (like /tmp), not sticky unless asked."""
    d = tempfile.mkdtemp(prefix="aoti-drill-shared-", dir="/tmp")
    os.chmod(d, 0o777)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture()
def torch_inductor_state(monkeypatch):
    """Restore what private.use_inductor_cache changes in this process."""
    import torch._inductor.codecache as cc
    import torch._inductor.runtime.cache_dir_utils as cdu
    import torch._inductor.runtime.runtime_utils as ru

    saved = [(m, "default_cache_dir", m.default_cache_dir) for m in (cdu, ru, cc)]
    saved += [(cc, "_HEADER_DIR", cc._HEADER_DIR), (cc, "_HEADER_LOCK_DIR", cc._HEADER_LOCK_DIR)]
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    yield
    for m, name, v in saved:
        setattr(m, name, v)
    if env is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = env


def _user_name() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


# --- 1. Inductor's cache ------------------------------------------------------------------------


@pytest.mark.parametrize("inductor_ran_first", [False, True])
def test_drill_1_squatted_default_inductor_cache_is_never_used(attacker, shared, monkeypatch, tmp_path,
                                                                 torch_inductor_state, inductor_ran_first):
    """The attacker pre-creates ``$TMPDIR/torchinductor_<user>/aoti_farm_common`` (0777);
    a compiler constructed in this process compiles elsewhere: torch's cache, its default
    (precompiled headers) and the split build's directory are all private.  Also where
    Inductor ran first and wrote its default into ``TORCHINDUCTOR_CACHE_DIR`` (importing the
    compile path does: ``cache_dir_utils.cache_dir()``), as in a fresh hostprep child."""
    os.chmod(shared, 0o1777)   # like /tmp
    squat = shared / f"torchinductor_{_user_name()}"
    as_attacker(attacker, f"mkdir -m 0777 {squat} {squat}/aoti_farm_common {squat}/precompiled_headers")
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    from torch._inductor.runtime import cache_dir_utils

    assert os.path.join(tempfile.gettempdir(), f"torchinductor_{_user_name()}") == str(squat)   # torch's default
    if inductor_ran_first:
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(squat))   # what Inductor's cache_dir() leaves

    from aoti_farm.build import commonobj
    from aoti_farm.compile.compiler import AOTICompiler

    AOTICompiler({})   # what every compiling process makes before its first compile
    import torch._inductor.codecache as cc
    from torch._inductor.runtime import runtime_utils

    used = [cache_dir_utils.cache_dir(), runtime_utils.default_cache_dir(), cc._HEADER_DIR, commonobj.common_dir()]
    for p in used:
        assert not p.startswith(str(shared)), p
        assert p.startswith(private.root() + "/"), p
        while not os.path.exists(p):   # not made yet: its nearest existing directory
            p = os.path.dirname(p)
        private.check_tree(p, private.root())
    assert os.listdir(squat / "aoti_farm_common") == []


def test_drill_1_unsafe_inductor_cache_dir_is_refused_with_one_line(attacker, shared, monkeypatch, capsys,
                                                                     torch_inductor_state):
    as_attacker(attacker, f"mkdir -m 0777 {shared}/ind")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared / "ind"))
    from aoti_farm.cli import main

    rc = main(["warm", "--model", str(REPO / "configs/examples/mlp_trace.json")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "TORCHINDUCTOR_CACHE_DIR" in err and "owned by uid" in err


def test_drill_1_common_object_with_a_rewritten_digest_is_not_trusted(attacker, shared):
    """An object and its .sha256 that agree, in a directory the attacker wrote: never linked."""
    from aoti_farm.build import commonobj

    d = shared / "aoti_farm_common"
    as_attacker(attacker, f"mkdir -m 0777 {d} && printf 'evil' > {d}/k.o && "
                          f"printf '%s\\n' $(printf evil | sha256sum | cut -d' ' -f1) > {d}/k.o.sha256")
    assert not commonobj._intact(str(d / "k.o"))
    # the same bytes in a private directory of ours are trusted (the digest check itself stands)
    mine = Path(private.subdir("drill-common"))
    shutil.copy(d / "k.o", mine / "k.o")
    shutil.copy(d / "k.o.sha256", mine / "k.o.sha256")
    assert commonobj._intact(str(mine / "k.o"))


# --- 2. the worker log --------------------------------------------------------------------------


def test_drill_2_worker_log_is_private_and_never_follows_a_link(attacker, shared, tmp_path, monkeypatch):
    """The attacker plants the log's old predictable name as a link to a root-only file:
    the default log is elsewhere (mkstemp in a 0700 directory), and a log named through a
    link is refused, the victim untouched."""
    from aoti_farm.runtime.room import ThreadRoom
    from aoti_farm.runtime.supervisor import WorkerSupervisor

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    victim = tmp_path / "victim"
    victim.write_bytes(b"root only\n")
    os.chmod(victim, 0o600)
    planted = shared / f"aoti-farm-worker-{os.getpid()}.log"
    as_attacker(attacker, f"ln -s {victim} {planted}")

    log = private.new_log("aoti-farm-worker")
    assert not log.startswith(str(shared)) and not log.startswith(tempfile.gettempdir() + "/aoti-farm-worker")
    assert stat.S_IMODE(os.stat(os.path.dirname(log)).st_mode) == 0o700

    class Cache:
        root, signing_key, allow_insecure = tmp_path / "cache", None, False

    class Fp:
        id = "0" * 16

    import threading

    class Sup(WorkerSupervisor):
        def command(self, device):
            return [sys.executable, "-c", "print('worker output')"]

    sup = Sup(Cache(), {"cpu": Fp()}, {}, str(planted), 1.0, ThreadRoom(), threading.Event())
    sup._start("cpu")
    if sup.last is not None:
        sup.last.wait(30)
    assert victim.read_bytes() == b"root only\n"
    assert sup.counters.snapshot()["worker_errors"] == 1


# --- 3. the native library and memos ------------------------------------------------------------


def _evil_library(tmp_path: Path, marker: Path) -> Path:
    src = tmp_path / "evil.c"
    src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void f(void) '
                   f'{{ FILE *o = fopen("{marker}", "w"); if (o) fclose(o); }}\n')
    out = tmp_path / "evil.so"
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler for the planted library")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def test_drill_3_planted_native_library_is_never_loaded(attacker, shared, tmp_path, monkeypatch):
    """``AOTI_FARM_NATIVE_DIR`` in a directory the attacker wrote, holding a library with a
    constructor at the exact path ``native.load()`` looks at: refused before dlopen."""
    from aoti_farm.speedgate import hitpath
    from aoti_farm.startup import loadenv
    from aoti_farm.runtime import native

    if not loadenv.load_safe():
        pytest.skip("this process cannot load native libraries (libstdc++ preload needed): no dlopen to attack")
    marker = shared / "constructor-ran"
    lib = _evil_library(tmp_path, marker)
    os.chmod(lib, 0o755)
    shutil.copy(lib, shared / "evil.so")
    ndir = shared / "native"
    monkeypatch.setenv("AOTI_FARM_NATIVE_DIR", str(ndir))
    monkeypatch.delenv("AOTI_FARM_NATIVE", raising=False)
    target = native.library_path()
    as_attacker(attacker, f"mkdir -p -m 0777 {target.parent} && cp {shared}/evil.so {target} && chmod 0777 {ndir}")
    monkeypatch.setattr(hitpath, "_loaded", None)
    monkeypatch.setattr(hitpath, "_load_error", None)
    assert native.load() is None
    assert not marker.exists(), "the planted library's constructor ran in this process"
    assert "refused" in (native.error() or "")


def test_drill_3_memos_live_apart_from_the_shared_cache_and_are_checked(attacker, shared, monkeypatch):
    from aoti_farm.config import cache_dir
    from aoti_farm.security.fsutil import memo_dir

    os.chmod(shared, 0o1777)   # like /tmp
    monkeypatch.setenv("HOME", str(shared / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    os.makedirs(shared / "home", mode=0o700)
    monkeypatch.delenv("AOTI_FARM_CACHE_DIR", raising=False)
    assert memo_dir() != cache_dir()
    assert stat.S_IMODE(os.stat(memo_dir()).st_mode) == 0o700
    # a private directory the attacker made first (and could fill) is refused, never used
    as_attacker(attacker, f"mkdir -p -m 0777 {shared}/xdg/aoti-farm-private")
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared / "xdg"))
    with pytest.raises(UnsafeFile):
        memo_dir()


# --- 4. reports ---------------------------------------------------------------------------------


def _report(path: Path, **over) -> None:
    doc = {"format": "aoti-farm-warm-report", "signatures": [{"key": "a" * 64, "status": "compiled",
                                                           "seconds": 1.0, "span": [100.0, 101.0]}],
           "timeline": {"process_start": 99.0, "end": 102.0}}
    for k, v in over.items():
        if k == "seconds":
            doc["signatures"][0]["seconds"] = v
        else:
            doc["timeline"][k] = v
    path.write_text(json.dumps(doc))


def test_drill_4_report_html_never_writes_through_a_planted_link(attacker, shared, tmp_path):
    from aoti_farm.cli.report_cmd import report_command

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    rep = tmp_path / "r.json"
    _report(rep)
    out = shared / "out.html"
    as_attacker(attacker, f"ln -s {victim} {shared}/.out.html.{os.getpid()}.tmp")

    class NS:
        report, html = str(rep), str(out)

    assert report_command(NS()) == 0
    assert victim.read_bytes() == b"precious\n"
    assert out.is_file() and not out.is_symlink() and b"<svg" in out.read_bytes()


@pytest.mark.parametrize("over", [{"end": float("inf")}, {"end": 1e300}, {"seconds": "abc"},
                                  {"seconds": float("nan")}, {"process_start": -5.0}])
def test_drill_4_absurd_report_numbers_are_one_line_errors(tmp_path, capsys, over):
    from aoti_farm.cli import main

    rep = tmp_path / "r.json"
    _report(rep, **over)
    assert main(["report", str(rep), "--html", str(tmp_path / "o.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "o.html").exists()


def test_drill_4_ticks_are_capped():
    from aoti_farm.report.report_html import MAX_TICKS, render

    doc = {"format": "aoti-farm-warm-report", "signatures": [],
           "timeline": {"process_start": 0.0, "end": 29 * 86400.0}}
    assert render(doc).count('class="tick"') <= MAX_TICKS + 1   # + the stylesheet's rule


# --- 5. terminal escapes ------------------------------------------------------------------------


def test_drill_5_names_from_a_trace_are_escaped_and_capped(tmp_path, capsys):
    from aoti_farm.cli import main

    doc = json.loads((REPO / "configs/examples/mlp_trace.json").read_text())
    e = dict(doc["entries"][0])
    e["\x1b]0;PWNED\x07\x1b[2J" + "A" * 5000] = 1
    bad_field = tmp_path / "f.json"
    bad_field.write_text(json.dumps({**doc, "entries": [e]}))
    e = dict(doc["entries"][0])
    e["hints"] = {"\x1b[2J\x1b]0;x\x07ok": {"range": [0, 1]}}
    bad_hint = tmp_path / "h.json"
    bad_hint.write_text(json.dumps({**doc, "entries": [e]}))
    for path in (bad_field, bad_hint):
        for cmd in ("validate", "show"):
            assert main(["trace", cmd, str(path)]) == 2
            out = capsys.readouterr()
            text = out.out + out.err
            assert "\x1b" not in text and "\x07" not in text, text
            assert len(text) < 600


# --- 6. metrics on loopback ---------------------------------------------------------------------


def test_drill_6_metrics_listen_on_loopback_by_default():
    from prometheus_client import CollectorRegistry

    from aoti_farm.config import metrics_endpoint
    from aoti_farm.metrics.exposition import serve_http

    ep = metrics_endpoint(0, env={})
    assert ep.addr == "127.0.0.1"
    ex = serve_http(CollectorRegistry(), ep.port, addr=ep.addr)
    try:
        assert ex.server.server_address[0] == "127.0.0.1"
    finally:
        ex.server.shutdown()
    assert metrics_endpoint(0, env={}, addr="0.0.0.0").addr == "0.0.0.0"   # opened on request
    assert metrics_endpoint(0, env={"AOTI_FARM_METRICS_ADDR": "0.0.0.0"}).addr == "0.0.0.0"


def _free_span(n: int) -> int:
    """The first port of ``n`` consecutive ports no one listens on (checked by binding)."""
    import socket

    for base in range(20000, 60000, 97):
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip("no free span of ports")


def _listen_as(pw, ports) -> subprocess.Popen:
    """The attacker listens on ``ports`` (all addresses) until killed; returns when they listen."""
    code = ("import socket, sys, time\n"
            "ss = []\n"
            f"for p in {list(ports)!r}:\n"
            "    s = socket.socket(); s.bind(('0.0.0.0', p)); s.listen(); ss.append(s)\n"
            "print('listening', flush=True)\n"
            "time.sleep(600)\n")
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    proc = subprocess.Popen(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
                             py, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    return proc


def test_drill_6_squatted_metrics_ports_are_named_counted_and_avoided(attacker, tmp_path, monkeypatch, caplog):
    """The attacker listens first on two ports of a hook's span and would answer scrapes
    there: the hook binds the next free one, a warning names each squatted port and its
    owner's uid, ``stats()`` and the scrape count them, and the port really bound is in a
    file of the private directory (0700), which only this user can write."""
    import json
    import urllib.request

    from aoti_farm.metrics.exposition import Endpoint
    from aoti_farm.runtime import metrics as rt_metrics

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    base = _free_span(4)
    squatter = _listen_as(attacker, [base, base + 2])

    class Hook:   # the collector reads stats(); a real hook's are built the same way (with_miss_reasons)
        exporter = None

        def stats(self):
            s = {"calls": 0, "hits": 0, "misses": 0, "failed_signatures": 0, "fallbacks": {},
                 "kernels_loaded": 0, "kernels_dropped": 0, "load_errors": 0, "kernel_errors": 0, "per_op": {}}
            return rt_metrics.with_miss_reasons(s, self.exporter)

    hook = Hook()
    try:
        with caplog.at_level(logging.WARNING, logger="aoti_farm.metrics"):
            ex = rt_metrics.start_for_hook(hook, Endpoint(base, span=4))
        hook.exporter = ex
        try:
            assert ex.port == base + 1, ex.port
            assert ex.held == [(base, attacker.pw_uid), (base + 2, attacker.pw_uid)]
            warn = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warn) == 1, warn
            assert f"{base}, {base + 2}" in warn[0] and f"uid {attacker.pw_uid}" in warn[0], warn
            assert str(base + 1) in warn[0]
            st = hook.stats()["metrics"]
            assert st["port"] == base + 1 and st["ports_held_by_others"] == 2
            doc = json.loads(open(st["port_file"]).read())
            assert doc["port"] == base + 1 and doc["pid"] == os.getpid()
            assert [(h["port"], h["uid"]) for h in doc["held_by_others"]] == ex.held
            d = os.path.dirname(st["port_file"])
            assert d.startswith(private.root() + "/")
            private.check_file(st["port_file"])   # ours, in a 0700 directory of ours
            assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
            body = urllib.request.urlopen(f"http://127.0.0.1:{ex.port}/metrics", timeout=10).read().decode()
            assert "aoti_farm_hook_metrics_ports_held_by_others 2.0" in body
        finally:
            ex.close()
        assert not os.path.exists(st["port_file"])
        # every port of the span taken: nothing exposed, still named and counted
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="aoti_farm.metrics"):
            none = rt_metrics.start_for_hook(hook, Endpoint(base, span=1))
        hook.exporter = none
        assert none.port is None and hook.stats()["metrics"]["ports_held_by_others"] == 1
        assert any(f"uid {attacker.pw_uid}" in r.getMessage() and str(base) in r.getMessage()
                   for r in caplog.records)
    finally:
        squatter.kill()
        squatter.wait()


# --- 7. the miss queue's cap --------------------------------------------------------------------


def test_drill_7_a_caller_choosing_shapes_cannot_flood_the_queue(tmp_path):
    from aoti_farm.cache.store import Cache
    from aoti_farm.runtime import misswriter
    from aoti_farm.runtime.calls import Call

    cache = Cache(tmp_path / "c")
    cache.ensure()

    class Fp:
        id = "f" * 24

    w = misswriter.MissWriter(cache, {"cpu": Fp()}, True, lambda call: None, cap=24, cap_per_op=10)
    w.start()
    try:
        for op in (torch.ops.aten.relu.default, torch.ops.aten.neg.default, torch.ops.aten.abs.default):
            for n in range(1, 41):
                sig = S.from_call(op, (torch.empty(n),), {})
                w.report(Call(sig, sig.key, "cpu"))
        w.flush()
    finally:
        w.close()
    items = os.listdir(cache.ns(Fp.id) / "queue")
    st = w.counters.snapshot()
    assert len(items) == 24 and st["queued"] == 24
    assert st["queue_overflow"] == 3 * 40 - 24


def test_drill_7_the_caps_are_install_settings(tmp_path, monkeypatch):
    """``install(settings=Settings(queue_cap=..., queue_cap_per_op=...))`` (or ``[hook]`` keys) bound what a
    real hook writes to the shared queue."""
    from aoti_farm.runtime import Settings, install

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with install(cache_dir=str(tmp_path / "c"), ops=["aten::relu", "aten::neg"], devices=["cpu"], on_miss="queue",
                 route="all", settings=Settings(install_trial=0, queue_cap=5, queue_cap_per_op=3)) as hook:
        for n in range(1, 7):
            torch.relu(torch.randn(n, 3))
            torch.neg(torch.randn(n, 3))
        hook.flush()
        st = hook.stats()
        queue = hook.cache.ns(hook.fps["cpu"].id) / "queue"
        items = os.listdir(queue)
    assert st["queued"] == 5 and len(items) == 5, st
    assert st["queue_overflow"] == 12 - 5


def test_drill_7_a_covering_class_is_queued_once_not_per_shape(tmp_path):
    from aoti_farm.cache.store import Cache
    from aoti_farm.runtime.misswriter import MissWriter
    from aoti_farm.runtime.calls import Call

    cache = Cache(tmp_path / "c")
    cache.ensure()

    class Fp:
        id = "f" * 24

    w = MissWriter(cache, {"cpu": Fp()}, True, lambda call: None)
    w.widen_of = lambda call: {"class": "relu-1d", "range": [1, 4096]}
    w.start()
    try:
        for n in range(1, 30):
            sig = S.from_call(torch.ops.aten.relu.default, (torch.empty(n),), {})
            w.report(Call(sig, sig.key, "cpu"))
        w.flush()
    finally:
        w.close()
    assert len(os.listdir(cache.ns(Fp.id) / "queue")) == 1
    assert w.counters.snapshot()["queue_widened_dedup"] == 28


# --- 8. the rule in one place -------------------------------------------------------------------


def test_the_rule_open_new_never_follows_a_link(tmp_path):
    (tmp_path / "victim").write_text("x")
    os.symlink(tmp_path / "victim", tmp_path / "link")
    with pytest.raises(FileExistsError):
        private.open_new(tmp_path / "link")
    with pytest.raises(OSError):
        private.open_append(tmp_path / "link")
    assert (tmp_path / "victim").read_text() == "x"


def test_inductor_cache_scope_leaves_the_programs_setting_as_it_was(monkeypatch, tmp_path):
    """A serving process probes its ISA in the private Inductor cache, then gets its own
    setting back exactly (unset stays unset)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with private.inductor_cache_scope() as d:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == d and d.startswith(private.root())
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    mine = tmp_path / "mine"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(mine))
    with private.inductor_cache_scope() as d:
        assert d == str(mine) and stat.S_IMODE(os.stat(mine).st_mode) == 0o700
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(mine)
