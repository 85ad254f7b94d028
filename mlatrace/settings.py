"""The MLATRACE_* settings of a traced process, parsed. Stdlib only: every traced
process imports it."""

from __future__ import annotations

import os
from typing import Any

DEFAULT_LAUNCH_SAMPLE = 8
DEFAULT_SAMPLE = 1
DEFAULT_STEP_ASIDE = (8, 64)
DEFAULT_REPLAY_TIMING = (8, 64)   # time the first 8 replays of each graph, then 1 in 64
DEFAULT_FOLD_S = 10.0             # steady steps folded per graph and this many seconds


def settings(environ: dict[str, str] | os._Environ | None = None) -> dict[str, Any]:
    """The MLATRACE_* settings of this process, parsed (the probe engine reads them too)."""
    env = os.environ if environ is None else environ
    ranks = env.get("MLATRACE_RANKS") or ""
    sample = env.get("MLATRACE_REPLAY_SAMPLE") or ""
    launch = env.get("MLATRACE_LAUNCH_SAMPLE") or ""
    calls = env.get("MLATRACE_SAMPLE") or ""
    call_sample = int(calls) if calls.isdigit() else DEFAULT_SAMPLE
    timing = env.get("MLATRACE_REPLAY_TIMING")
    return {
        "out": env.get("MLATRACE_OUT") or None,
        "run_id": env.get("MLATRACE_RUN_ID") or None,
        "ranks": {int(r) for r in ranks.split(",") if r.strip()} or None,
        "replay_sample": int(sample) if sample.isdigit() and int(sample) > 0 else None,
        # eager probed calls repeating their last record (all fields but `layer`): keep
        # the first N of each run, count the rest, close the run with a sample.run
        # record (0: keep all). Launches follow it unless MLATRACE_LAUNCH_SAMPLE is set.
        "sample": call_sample,
        "launch_sample": int(launch) if launch.isdigit() else call_sample,
        "graph_nodes": env.get("MLATRACE_GRAPH_NODES", "1") != "0",
        # replay GPU time: (first, every) = the first N replays of each graph, then 1 in M;
        # None = off ("off" or "0")
        "replay_timing": parse_replay_timing(timing),
        "probes": [p for p in (env.get("MLATRACE_PROBES") or "").split(os.pathsep) if p],
        "otlp": env.get("MLATRACE_OTLP") or None,
        "disabled": env.get("MLATRACE_DISABLE", "0") not in ("", "0"),
        # probes that look at only the first call of each steady step (sampling.StepAside):
        # (settle, verify) steps; None = off ("0")
        "step_aside": parse_step_aside(env.get("MLATRACE_STEP_ASIDE")),
        # steady steps folded into `steady` records, one per graph and this many seconds
        # (record.fold); 0 = off
        "fold": parse_seconds(env.get("MLATRACE_FOLD"), DEFAULT_FOLD_S),
        # per process file: at this many MB keep only KEEP_AT_CAP and changes; None = no cap
        "max_mb": parse_seconds(env.get("MLATRACE_MAX_MB"), None),
    }


def parse_seconds(text: str | None, default: float | None) -> float | None:
    """A non-negative number setting (MLATRACE_FOLD, MLATRACE_MAX_MB); unset or bad -> default."""
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        return default
    return value if value >= 0 and value == value and value != float("inf") else default


def parse_step_aside(text: str | None) -> tuple[int, int] | None:
    """MLATRACE_STEP_ASIDE "SETTLE,VERIFY" -> (SETTLE, VERIFY); unset -> the default;
    "0", "off" or anything else -> None (every call inspected)."""
    if text is None or text == "":
        return DEFAULT_STEP_ASIDE
    settle, _, verify = text.partition(",")
    if not (settle.isdigit() and verify.isdigit()) or int(settle) < 1 or int(verify) < 2:
        return None
    return int(settle), int(verify)


def parse_replay_timing(text: str | None) -> tuple[int, int] | None:
    """MLATRACE_REPLAY_TIMING "N:M" -> (N, M); unset -> the default; "off"/"0"/bad -> None."""
    if text is None or text == "":
        return DEFAULT_REPLAY_TIMING
    first, _, every = text.partition(":")
    if not (first.isdigit() and every.isdigit()) or int(every) < 1:
        return None
    return int(first), int(every)

