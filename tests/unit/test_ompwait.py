"""The compile processes' OpenMP wait policy (aoti_farm/startup/ompwait.py): passive unless the
environment names one or the A/B switch is off, in every environment the farm builds for a
process that verifies kernels.  tests/e2e/test_ompwait_differential.py shows the policy
changes no result; tests/e2e/test_warm_startup.py that a real actor starts with it."""

from __future__ import annotations

import pytest

from aoti_farm.startup import ompwait
from aoti_farm.runtime import supervisor
from aoti_farm.workers.placement import CPU, actor_options, worker_env


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("AOTI_FARM_DEV", raising=False)
    return monkeypatch


def test_the_compile_actors_and_the_hooks_compile_worker_start_passive(clean):
    assert worker_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    assert worker_env(libstdcxx=False)["OMP_WAIT_POLICY"] == "PASSIVE"   # what an embedded Ray inherits
    assert actor_options(CPU, 0.25)["runtime_env"]["env_vars"]["OMP_WAIT_POLICY"] == "PASSIVE"   # a cluster's
    assert supervisor.worker_env()["OMP_WAIT_POLICY"] == "PASSIVE"


def test_a_policy_the_environment_names_is_kept(clean):
    clean.setenv("OMP_WAIT_POLICY", "active")
    assert worker_env()["OMP_WAIT_POLICY"] == "active"   # and it travels to a cluster's actors
    assert supervisor.worker_env()["OMP_WAIT_POLICY"] == "active"
    assert ompwait.compile_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_the_ab_switch_leaves_libgomps_default(clean):
    clean.setenv("AOTI_FARM_DEV", "omp_passive=0")
    assert "OMP_WAIT_POLICY" not in worker_env()
    assert "OMP_WAIT_POLICY" not in supervisor.worker_env()
    assert ompwait.compile_env({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert ompwait.compile_env({"AOTI_FARM_DEV": "omp_passive=0"}) == {}
