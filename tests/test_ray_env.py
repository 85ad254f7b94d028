"""The runtime_env the ray.init probe hands Ray: the user's values kept, ours added."""

from __future__ import annotations

import os

import pytest

from mlatrace.probe.handlers.ray import merge_runtime_env, tracing_env_vars
from mlatrace.settings import BOOTSTRAP_DIR

TRACED = {"MLATRACE_OUT": "/runs/t", "MLATRACE_RUN_ID": "abc", "HOME": "/root"}


def test_tracing_env_vars_only_when_traced() -> None:
    ours = tracing_env_vars(TRACED)
    assert ours == {"MLATRACE_OUT": "/runs/t", "MLATRACE_RUN_ID": "abc",
                    "PYTHONPATH": BOOTSTRAP_DIR + os.pathsep + "${PYTHONPATH}"}
    assert tracing_env_vars({"HOME": "/root"}) == {}
    assert tracing_env_vars({**TRACED, "MLATRACE_DISABLE": "1"}) == {}


def test_merge_keeps_the_users_values() -> None:
    ours = tracing_env_vars(TRACED)
    merged, added = merge_runtime_env(None, ours)
    assert merged == {"env_vars": ours} and sorted(added) == sorted(ours)
    user = {"pip": ["x"], "env_vars": {"MLATRACE_RUN_ID": "theirs", "PYTHONPATH": "/app"}}
    merged, added = merge_runtime_env(user, ours)
    assert merged["pip"] == ["x"]
    assert merged["env_vars"]["MLATRACE_RUN_ID"] == "theirs"  # never overwritten
    assert merged["env_vars"]["PYTHONPATH"] == BOOTSTRAP_DIR + os.pathsep + "/app"
    assert user["env_vars"]["PYTHONPATH"] == "/app"  # the caller's dict is not changed
    again, added = merge_runtime_env(merged, ours)
    assert again == merged and added == []  # idempotent (ray.init called twice)


def test_merge_gives_back_a_runtime_env() -> None:
    runtime_env = pytest.importorskip("ray.runtime_env")
    user = runtime_env.RuntimeEnv(env_vars={"A": "1"})
    merged, _ = merge_runtime_env(user, tracing_env_vars(TRACED))
    assert isinstance(merged, runtime_env.RuntimeEnv)
    assert merged["env_vars"]["A"] == "1" and merged["env_vars"]["MLATRACE_OUT"] == "/runs/t"


def test_a_submitted_jobs_own_variables_are_left_to_it() -> None:
    from mlatrace.probe.handlers.ray import submitted_job_env_vars

    job = '{"runtime_env": {"env_vars": {"PYTHONPATH": "/job", "X": "1"}}}'
    assert submitted_job_env_vars({"RAY_JOB_CONFIG_JSON_ENV_VAR": job}) == {"PYTHONPATH", "X"}
    assert submitted_job_env_vars({"RAY_JOB_CONFIG_JSON_ENV_VAR": "not json"}) == set()
    assert submitted_job_env_vars({}) == set()
