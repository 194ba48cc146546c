"""config.resolve: precedence and the checks it makes once for every command."""

from __future__ import annotations

import pytest

from aoti_farm.config import FarmConfig, HookConfig, resolve
from aoti_farm.errors import UserError
from aoti_farm.leases import MAX_TTL


def test_precedence_cli_over_env_over_toml(tmp_path):
    toml = tmp_path / "f.toml"
    toml.write_text("[farm]\ntimeout = 10\nretries = 5\nlease_ttl = 20\n")
    cfg = resolve(FarmConfig, cli={"timeout": 30}, env={"AOTI_FARM_RETRIES": "7"}, config_path=str(toml))
    assert (cfg.timeout, cfg.retries, cfg.lease_ttl) == (30.0, 7, 20.0)


def test_lease_ttl_beyond_what_leases_accept_is_refused():
    assert resolve(FarmConfig, cli={"lease_ttl": MAX_TTL}, env={}).lease_ttl == MAX_TTL
    with pytest.raises(UserError, match="lease_ttl: .* more than an hour"):
        resolve(FarmConfig, cli={"lease_ttl": MAX_TTL * 2}, env={})
    with pytest.raises(UserError, match="AOTI_FARM_LEASE_TTL"):
        resolve(FarmConfig, env={"AOTI_FARM_LEASE_TTL": "0"})


@pytest.mark.parametrize("field,value", [("on_miss", "later"), ("serve", "sometimes")])
def test_hook_choices_are_checked(field, value):
    with pytest.raises(UserError, match=field):
        resolve(HookConfig, cli={field: value}, env={})
