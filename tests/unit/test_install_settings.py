"""install()'s surface (issue #50): a few named keywords, no ``**kw`` passthrough, every
setting a field of the public ``Settings`` object, and docs/hook.md listing both exactly
as the code has them."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from aoti_farm.config import RETIRED_SETTINGS, HookConfig
from aoti_farm.errors import UserError
from aoti_farm.runtime import hook, settings
from aoti_farm.runtime.settings import Settings

HOOK_MD = Path(__file__).resolve().parents[2] / "docs" / "hook.md"


def _params():
    return inspect.signature(hook.install).parameters


def test_install_has_at_most_10_named_keywords_and_no_var_keyword():
    params = _params()
    kinds = {p.kind for p in params.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds, params
    assert len(params) <= 10, list(params)
    assert "settings" in params


def test_errors_name_how_install_takes_a_setting():
    """config.py's fixes say install(name=...) for a keyword, install(settings=Settings(name=...))
    for the rest: its list of keywords is install()'s."""
    from aoti_farm import config

    assert config.INSTALL_KEYWORDS == tuple(n for n in _params() if n != "settings")
    with pytest.raises(UserError, match=r"fix install\(settings=Settings\(widen=...\)\)"):
        settings.resolve(Settings(widen="wider"), env={})
    with pytest.raises(UserError, match=r"^install\(settings=Settings\(install_trial=...\)\): install_trial"):
        settings.resolve(Settings(install_trial="soon"), env={})
    with pytest.raises(UserError, match=r"^on_miss: 'later' .*fix install\(on_miss=...\)"):
        settings.resolve(Settings(on_miss="later"), env={})


def test_settings_holds_every_setting_install_knows():
    """Every keyword of install() and every HookConfig field is a Settings field, unset
    (None) by default, and the object is frozen."""
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    assert set(_params()) - {"settings"} <= set(fields)
    assert {f.name for f in dataclasses.fields(HookConfig)} <= set(fields)
    assert all(f.default is None for f in fields.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().serve = "always"   # type: ignore[misc]


@pytest.mark.parametrize("name", sorted(RETIRED_SETTINGS))
def test_a_retired_setting_is_refused_by_name(name):
    with pytest.raises(UserError, match=rf"^Settings\({name}=...\): retired \("):
        Settings(**{name: 1})
    with pytest.raises(UserError, match=rf"^install\({name}=...\): retired \("):
        hook.install(**{name: 1})


def test_an_unknown_or_misplaced_name_is_refused_by_name():
    with pytest.raises(UserError, match=r"^Settings\(no_such=...\): unknown argument 'no_such'"):
        Settings(no_such=1)
    with pytest.raises(UserError, match=r"^install\(no_such=...\): unknown argument 'no_such'"):
        hook.install(no_such=1)
    # a setting that is a Settings field, not a keyword: the message names the way to give it
    with pytest.raises(UserError, match=r"^install\(native=...\): not a keyword .*settings=Settings\(native=...\)"):
        hook.install(native="off")


def test_a_keyword_and_settings_disagreeing_is_an_error():
    s = settings.merge(Settings(serve="always"), serve="always", on_miss="ignore")   # the same value: fine
    assert (s.serve, s.on_miss) == ("always", "ignore")
    with pytest.raises(UserError, match=r"install\(serve=...\): 'faster' but settings.serve is 'always'"):
        hook.install(serve="faster", settings=Settings(serve="always"))
    with pytest.raises(UserError, match=r"install\(settings=...\): a dict, not a Settings"):
        hook.install(settings={"serve": "always"})


def test_settings_resolve_through_the_one_path(tmp_path):
    """A Settings field resolves as the keyword did: explicit > environment > default."""
    env = {"AOTI_FARM_WIDEN": "always", "AOTI_FARM_CACHE_DIR": str(tmp_path)}
    assert settings.resolve(Settings(), env=env).config.widen == "always"
    r = settings.resolve(Settings(widen="off", native="off", worker_idle=3.0), env=env)
    assert (r.config.widen, r.native, r.worker_idle, r.route) == ("off", "off", 3.0, "paying")
    assert settings.resolve(Settings(on_miss="ignore"), env=env).route == "servable-at-install"
    with pytest.raises(UserError, match="native: 'fast'"):
        settings.resolve(Settings(native="fast"), env=env)


def _doc_section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_docs_hook_md_lists_install_keywords_and_settings_fields_as_the_code_has_them():
    text = HOOK_MD.read_text()
    m = re.search(r"```python\ninstall\((.*?)\) -> Hook\n```", text, re.S)
    assert m, "docs/hook.md: no ```python install(...) -> Hook``` block"
    documented = [a.strip() for a in m.group(1).replace("\n", " ").split(",") if a.strip()]
    code = []
    for p in _params().values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in code:
            code.append("*")
        code.append(f"{p.name}={p.default!r}")
    assert documented == code, f"docs/hook.md's install() signature {documented} is not the code's {code}"
    rows = re.findall(r"^\| `(\w+)` \|", _doc_section(text, "Settings"), re.M)
    fields = [f.name for f in dataclasses.fields(Settings)]
    assert rows == fields, f"docs/hook.md's Settings table {rows} is not Settings' fields {fields}"
    defaults = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
                for f in dataclasses.fields(HookConfig)}
    for name, rest in re.findall(r"^\| `(\w+)` \|(.*)$", _doc_section(text, "Settings"), re.M):
        default = rest.split("|")[0].strip()
        assert ("keyword too" in rest) == (name in _params()), f"docs/hook.md: {name}: 'keyword too' is wrong"
        if name in defaults and defaults[name] is not None:   # a literal default: the doc gives it
            assert re.fullmatch(r"`[^`]+`", default), f"docs/hook.md: {name}'s default {default}"
            assert ast.literal_eval(default.strip("`")) == defaults[name], f"docs/hook.md: {name}'s default {default}"
