"""The command-line flags several commands share, declared once: where the cache is
(``--cache-dir``, ``--config``), ``--json`` and ``--memory-budget``; and the settings they
name, resolved (:func:`farm_config`, :func:`signing_key`)."""

from __future__ import annotations

import argparse

PROG = "aoti-farm"


def common(p: argparse.ArgumentParser, *, cache: bool = True, js: bool = True, table: str | None = None) -> None:
    """``--cache-dir`` and ``--config`` (``cache``; ``table``: the TOML table the command
    reads, named in the help), and ``--json`` (``js``)."""
    if cache:
        p.add_argument("--cache-dir", default=None,
                       help="cache directory (default: $AOTI_FARM_CACHE_DIR or ~/.cache/aoti-farm)")
        p.add_argument("--config", default=None,
                       help=f"TOML config file, table [{table}] (default: $AOTI_FARM_CONFIG); see docs/settings.md"
                       if table else "TOML config file (default: $AOTI_FARM_CONFIG); see docs/settings.md")
    if js:
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def memory_budget(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="refuse a signature whose compile would need more memory than this, per compile (6G, 512M; "
                        "default: $AOTI_FARM_MEMORY_BUDGET, [farm] memory_budget, else a quarter of this host's "
                        "memory)")


def farm_config(ns):
    from aoti_farm.config import FarmConfig, resolve

    return resolve(FarmConfig, cli={"cache_dir": getattr(ns, "cache_dir", None),
                                    "memory_budget": getattr(ns, "memory_budget", None)},
                   config_path=getattr(ns, "config", None))


def signing_key(cfg):
    from aoti_farm.config import signing_key

    return signing_key(cfg)   # fails closed: an empty or unreadable key is a UserError
