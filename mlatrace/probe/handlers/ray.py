"""Handlers for Ray: carry the run's settings to every Ray worker of the job, and record
which Ray worker a traced process is.

A Ray worker is started by the raylet of its node, not by the traced program: when the
cluster was started separately (`ray start --head`, `ray start --address=...`), no
environment reaches it from `mlatrace run`. Ray's own mechanism for a job's workers is
the runtime environment: `ray.init(runtime_env=...)` applies to every task and actor of
the job, on every node, and actors' own runtime envs inherit its `env_vars`. So the
probe on `ray.init` adds mlatrace's settings to the job's runtime env, merged with the
user's: the `MLATRACE_*` variables of this process (trace dir, run id, options, the
launcher's host), and the bootstrap directory in front of the worker's PYTHONPATH, so
each worker interpreter starts traced by the same sitecustomize as any other process
(`${PYTHONPATH}` is Ray's syntax for the node's own value). The user's values win:
a variable they set is never overwritten, and their PYTHONPATH is kept after ours.

Ray ends its workers without running their exit handlers (the core worker's "quick
exit" when the driver disconnects, from a C++ thread), so no `process.end` is written
and whatever was still queued would be lost. Every task's end therefore writes the
queue out (`RayTaskEnded`), in the worker's own thread, before Ray sends the task's
result back: what a finished task recorded is on disk before its caller can return.

No `worker_process_setup_hook` is used: Ray allows one per job (the user's, or Ray
Serve LLM's own), and a hook that fails to import makes Ray drain and exit the worker,
while a bootstrap directory missing on a node only leaves that node untraced.
"""

from __future__ import annotations

import os
from typing import Any

from mlatrace import record
from mlatrace.probe.handlers import Handler
from mlatrace.settings import BOOTSTRAP_DIR, Settings, tracing_env

PYTHONPATH_OF_NODE = "${PYTHONPATH}"
# Set by Ray's job manager for a driver started with `ray job submit`: the job's runtime env.
JOB_CONFIG_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def tracing_env_vars(environ: dict[str, str] | os._Environ | None = None) -> dict[str, str]:
    """The env vars a Ray worker needs to trace itself into this run: {} when not traced."""
    if not Settings.from_env(environ).traced:
        return {}
    out = tracing_env(environ)
    out["PYTHONPATH"] = BOOTSTRAP_DIR + os.pathsep + PYTHONPATH_OF_NODE
    return out


def merge_runtime_env(user: Any, ours: dict[str, str]) -> tuple[Any, list[str]]:
    """The user's runtime_env (None, a dict or a RuntimeEnv) with `ours` added to its
    env_vars; returns it and the names added. The user's own values are kept."""
    if not ours:
        return user, []
    merged = {} if user is None else dict(user)
    env_vars = dict(merged.get("env_vars") or {})
    added = []
    for name, value in ours.items():
        if name == "PYTHONPATH":
            theirs = env_vars.get("PYTHONPATH")
            bootstrap = value.split(os.pathsep, 1)[0]
            if theirs is None:
                env_vars[name] = value
            elif bootstrap not in theirs.split(os.pathsep):
                env_vars[name] = bootstrap + os.pathsep + theirs
            else:
                continue
            added.append(name)
        elif name not in env_vars:
            env_vars[name] = value
            added.append(name)
    merged["env_vars"] = env_vars
    if user is not None and type(user) is not dict:
        try:  # a ray.runtime_env.RuntimeEnv: give back the same type
            return type(user)(**merged), added
        except Exception:
            return merged, added
    return merged, added


def submitted_job_env_vars(environ: dict[str, str] | os._Environ | None = None) -> set[str]:
    """Env var names the submitted job's runtime env sets (`ray job submit`): ray.init
    refuses a runtime_env that sets one of them again, so those are left to the job."""
    raw = (os.environ if environ is None else environ).get(JOB_CONFIG_VAR)
    if not raw:
        return set()
    import json

    try:
        env_vars = (json.loads(raw).get("runtime_env") or {}).get("env_vars") or {}
    except (ValueError, AttributeError):
        return set()
    return set(env_vars) if isinstance(env_vars, dict) else set()


class RayInitRuntimeEnv(Handler):
    """`ray.init(...)`: add the run's settings to the job's runtime_env (keyword-only)."""

    def before(self, view: Any, info: Any) -> Any:
        ours = tracing_env_vars()
        if not ours:
            return None
        taken = submitted_job_env_vars()
        kept_for_job = sorted(taken & set(ours))
        ours = {k: v for k, v in ours.items() if k not in taken}
        merged, added = merge_runtime_env(view.kwargs.get("runtime_env"), ours)
        view.kwargs["runtime_env"] = merged  # the very dict the call is made with
        address = view.arg("address")
        record.emit("ray.init", address=address if isinstance(address, str) else None,
                    env_vars=sorted(added), left_to_job=kept_for_job)
        return None


class RayWorkerConnected(Handler):
    """`ray._private.worker.connect` returned in a worker: record Ray's context for it."""

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        import ray

        mode = view.arg("mode")
        if mode != getattr(ray, "WORKER_MODE", 1):
            return
        context = ray.get_runtime_context()
        record.emit("ray.worker", job_id=_str(context.get_job_id),
                    node_id=_str(context.get_node_id), worker_id=_str(context.get_worker_id),
                    node_ip=_str(lambda: ray.util.get_node_ip_address()))


# How long a task's end waits for the flush thread, if it is mid-write (a write takes well
# under a millisecond; a loaded host can stretch it), before leaving the records to it.
TASK_END_FLUSH_TIMEOUT_S = 1.0


class RayTaskEnded(Handler):
    """`Worker.record_task_log_end`, called by Ray's task loop after each task and actor
    call (its result not yet sent): write this process's queued records now."""

    def before(self, view: Any, info: Any) -> Any:
        record.flush_now(TASK_END_FLUSH_TIMEOUT_S)
        return None


def _str(getter: Any) -> str | None:
    try:
        value = getter()
    except Exception:
        return None
    return None if value is None else str(value)
