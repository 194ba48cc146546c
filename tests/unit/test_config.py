"""config.resolve: precedence and the checks it makes once for every command."""

from __future__ import annotations

import dataclasses

import pytest

from aoti_farm.config import FarmConfig, HookConfig, default_cache_dir, resolve
from aoti_farm.errors import UserError
from aoti_farm.cache.leases import MAX_TTL


def test_precedence_cli_over_env_over_toml(tmp_path):
    toml = tmp_path / "f.toml"
    toml.write_text("[farm]\ntimeout = 10\ndynamic = \"off\"\nlease_ttl = 20\n")
    cfg = resolve(FarmConfig, cli={"timeout": 30}, env={"AOTI_FARM_DYNAMIC": "auto"}, config_path=str(toml))
    assert (cfg.timeout, cfg.dynamic, cfg.lease_ttl) == (30.0, "auto", 20.0)


def test_lease_ttl_beyond_what_leases_accept_is_refused():
    assert resolve(FarmConfig, cli={"lease_ttl": MAX_TTL}, env={}).lease_ttl == MAX_TTL
    with pytest.raises(UserError, match="lease_ttl: .* more than an hour"):
        resolve(FarmConfig, cli={"lease_ttl": MAX_TTL * 2}, env={})
    with pytest.raises(UserError, match="--lease-ttl: lease_ttl: 0.0 must be positive"):
        resolve(FarmConfig, cli={"lease_ttl": 0}, env={})


@pytest.mark.parametrize("field,value", [("on_miss", "later"), ("serve", "sometimes")])
def test_hook_choices_are_checked(field, value):
    with pytest.raises(UserError, match=field):
        resolve(HookConfig, cli={field: value}, env={})


# --- each layer, each check ------------------------------------------------------------


def test_each_layer_overrides_the_one_below(tmp_path):
    toml = tmp_path / "f.toml"
    toml.write_text("[farm]\nretries = 5\nmemory_budget = \"1G\"\ndynamic = \"off\"\n")
    env = {"AOTI_FARM_MEMORY_BUDGET": "2G", "AOTI_FARM_DYNAMIC": "off"}
    cfg = resolve(FarmConfig, cli={"dynamic": "auto"}, env=env, config_path=str(toml))
    assert cfg.retries == 5                    # TOML over the default (2)
    assert cfg.memory_budget == 2 << 30        # environment over TOML
    assert cfg.dynamic == "auto"               # command line over environment
    # nothing set: the defaults, with the cache directory's default applied (here only)
    assert resolve(FarmConfig, env={}) == FarmConfig(cache_dir=default_cache_dir())


def test_config_file_from_the_environment_and_its_table(tmp_path):
    toml = tmp_path / "f.toml"
    toml.write_text("[farm]\nretries = 4\n[hook]\non_miss = \"queue\"\npoll_interval = 0.5\n")
    env = {"AOTI_FARM_CONFIG": str(toml)}
    assert resolve(FarmConfig, env=env).retries == 4
    hook = resolve(HookConfig, env=env)
    assert (hook.on_miss, hook.poll_interval) == ("queue", 0.5)
    # --config wins over $AOTI_FARM_CONFIG
    other = tmp_path / "g.toml"
    other.write_text("[farm]\nretries = 9\n")
    assert resolve(FarmConfig, env=env, config_path=str(other)).retries == 9


def test_unset_values_do_not_override(tmp_path):
    toml = tmp_path / "f.toml"
    toml.write_text("[farm]\nretries = 4\n")
    cfg = resolve(FarmConfig, cli={"retries": None}, env={"AOTI_FARM_DYNAMIC": ""}, config_path=str(toml))
    assert cfg.retries == 4 and cfg.dynamic == "off"


def test_values_are_converted_from_the_environment():
    env = {"AOTI_FARM_OPS": "aten::add.Tensor, aten::mul.Tensor,",
           "AOTI_FARM_EXPLAIN_MISSES": "TRUE", "AOTI_FARM_INSTALL_TRIAL": " 0.25 "}
    hook = resolve(HookConfig, env=env)
    assert hook.explain_misses is True
    assert hook.ops == ("aten::add.Tensor", "aten::mul.Tensor")
    assert hook.install_trial == 0.25
    farm = resolve(FarmConfig, env={"AOTI_FARM_MEMORY_BUDGET": "6G", "AOTI_FARM_ADDRESS": " auto "})
    assert farm.memory_budget == 6 << 30 and farm.address == "auto"


@pytest.mark.parametrize("cls,var,value,says", [
    (HookConfig, "EXPLAIN_MISSES", "maybe", "not a boolean"),
    (HookConfig, "INSTALL_TRIAL", "-1", "must be >= 0"),
    (HookConfig, "INSTALL_TRIAL", "two", "could not convert"),
    (FarmConfig, "MEMORY_BUDGET", "lots", "not a size"),
])
def test_a_bad_environment_value_names_its_variable(cls, var, value, says):
    with pytest.raises(UserError, match=f"environment AOTI_FARM_{var}: {var.lower()}: .*{says}"):
        resolve(cls, env={f"AOTI_FARM_{var}": value})


@pytest.mark.parametrize("body,says", [
    ("[farm]\nretries = \"two\"\n", r"\[farm\]: retries: "),
    ("[farm]\nretries = true\n", "retries: True is not an integer"),
    ("[farm]\ninductor_options = 3\n", "inductor_options: 3 is not a table"),
    ("[farm]\nno_such_key = 1\n", "unknown key 'no_such_key'; valid keys: cache_dir"),
    ("farm = 3\n", r"\[farm\] must be a table"),
    ("[farm\n", "not valid TOML"),
])
def test_a_bad_config_file_names_the_file_and_the_field(tmp_path, body, says):
    toml = tmp_path / "bad.toml"
    toml.write_text(body)
    with pytest.raises(UserError, match=f"config {toml}.*{says}"):
        resolve(FarmConfig, env={}, config_path=str(toml))


def test_a_missing_config_file_is_refused(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        resolve(FarmConfig, env={"AOTI_FARM_CONFIG": str(tmp_path / "nope.toml")})


def test_bad_options_are_refused():
    with pytest.raises(UserError, match="option --no-such: unknown"):
        resolve(FarmConfig, cli={"no_such": 1}, env={})
    with pytest.raises(UserError, match="option --gpus-per-worker: gpus_per_worker: .*positive"):
        resolve(FarmConfig, cli={"gpus_per_worker": -0.5}, env={})


@pytest.mark.parametrize("field,value", [("warmup", "heavy"), ("dynamic", "sometimes"), ("address", "")])
def test_farm_choices_are_checked(field, value):
    with pytest.raises(UserError, match=field):
        resolve(FarmConfig, cli={field: value}, env={})


def test_resolved_config_is_frozen():
    cfg = resolve(HookConfig, env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.on_miss = "ignore"


# --- one resolver: the file, the retired variables, the developer switches -------------------


def test_the_toml_file_is_named_by_the_flag_else_the_variable_never_implicitly(tmp_path, monkeypatch):
    from aoti_farm.config import config_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "aoti-farm.toml").write_text("[farm]\nretries = 9\n")   # not read: no implicit file
    assert config_file(None, {}) is None and resolve(FarmConfig, env={}).retries == 2
    assert config_file(None, {"AOTI_FARM_CONFIG": "a.toml"}) == "a.toml"
    assert config_file("b.toml", {"AOTI_FARM_CONFIG": "a.toml"}) == "b.toml"


@pytest.mark.parametrize("var,says", [
    ("AOTI_FARM_TIMEOUT", r"--timeout or \[farm\] timeout in the TOML file"),
    ("AOTI_FARM_POLL_INTERVAL", r"--poll-interval or \[farm\] poll_interval or "
                                r"install\(settings=Settings\(poll_interval=...\)\) or \[hook\] poll_interval"),
    ("AOTI_FARM_DEVICES", r"install\(devices=...\) or \[hook\] devices"),
    ("AOTI_FARM_FORK_SERVER", "AOTI_FARM_DEV=fork_server=0"),
    ("AOTI_FARM_SPLIT_WRAPPER", "AOTI_FARM_DEV=split_build=0"),
    ("AOTI_FARM_SIGNING_KEY", "a key file: .* set AOTI_FARM_SIGNING_KEY_FILE"),
])
def test_a_retired_variable_is_refused_naming_its_replacement(var, says):
    """An old variable never silently stops counting: every resolution refuses it."""
    for cls in (FarmConfig, HookConfig):
        with pytest.raises(UserError, match=f"environment {var}: no longer read; use {says}"):
            resolve(cls, env={var: "0"})


def test_developer_switches_are_one_variable():
    from aoti_farm.config import DEV, dev

    assert {k: dev(k, {}) for k in DEV} == {k: d for k, (d, _) in DEV.items()}
    env = {"AOTI_FARM_DEV": " fork_server=0, split_build=0 ,"}
    assert (dev("fork_server", env), dev("split_build", env), dev("isa_replay", env)) == ("0", "0", "1")
    assert resolve(HookConfig, env=env).on_miss == "compile"
    for bad in ("fork_server", "no_such=1", "fork_server="):
        with pytest.raises(UserError, match="AOTI_FARM_DEV: .* is not key=value"):
            resolve(FarmConfig, env={"AOTI_FARM_DEV": bad})
        assert dev("fork_server", {"AOTI_FARM_DEV": bad}) == "auto"   # never raises where it acts


def test_install_arguments_are_named_as_arguments(tmp_path):
    from aoti_farm.runtime.settings import resolve as install_resolve

    with pytest.raises(UserError,
                       match=r"install\(settings=Settings\(poll_interval=...\)\): poll_interval: .* must be positive"):
        install_resolve(env={}, poll_interval=0)
    with pytest.raises(UserError, match="unknown argument 'no_such'"):
        install_resolve(env={}, no_such=1)


def test_contract_is_a_setting_with_one_check(tmp_path):
    """``contract``: install() argument > AOTI_FARM_CONTRACT > [hook] contract > "finite"."""
    import pytest

    from aoti_farm.config import HookConfig, resolve
    from aoti_farm.errors import UserError

    assert resolve(HookConfig, env={}).contract == "finite"
    assert resolve(HookConfig, env={"AOTI_FARM_CONTRACT": "strict"}).contract == "strict"
    toml = tmp_path / "f.toml"
    toml.write_text('[hook]\ncontract = "strict"\n')
    assert resolve(HookConfig, env={}, config_path=str(toml)).contract == "strict"
    assert resolve(HookConfig, env={"AOTI_FARM_CONTRACT": "strict"}, cli={"contract": "finite"}).contract == "finite"
    with pytest.raises(UserError, match="contract: 'lax' is not one of finite, strict"):
        resolve(HookConfig, env={"AOTI_FARM_CONTRACT": "lax"})


def test_edge_notes_read_from_a_manifest():
    from aoti_farm.cache.manifest import edge_notes

    assert edge_notes({}) == () and edge_notes({"verification": {"ok": True}}) == ()
    m = {"verification": {"edge_notes": [{"class": "non-finite inputs", "case": "a"},
                                         {"class": "sign of zero", "case": "b"},
                                         {"class": "non-finite inputs", "case": "c"}]}}
    assert edge_notes(m) == ("non-finite inputs", "sign of zero")
    assert edge_notes({"verification": {"edge_notes": "junk"}}) == ("malformed edge notes",)
