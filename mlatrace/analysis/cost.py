"""What a finding costs: the GPU time of its graph's replays, and what a fix would buy.

Applied after the rules to every finding whose rule is `costed` (analysis/rules) and names a
graph (a new rule on graphs gets a cost by being declared `costed`):

    finding.cost = {"replays": int,                 # replays of the finding's graph
                    "timed": int,                   # of them timed (graph.replay.time)
                    "replay_gpu_ns_p50": int|null, "replay_gpu_ns_p90": int|null,
                    "total_gpu_ns": int|null,       # mean timed replay x replays
                    "timed_via": "gpu"|"host"|null,  # host: a CPU host graph's host clock
                    "estimate": {"gpu_ns_p50": int, "how": str} | null}

A graph whose replays were never timed has null times (the trace was recorded with
``--replay-timing off``, on a device without events, or the process died first). The
estimate comes from ``whatif.json`` next to the trace (``mlatrace whatif --save``): the
measured p50 minus the per-step saving the reference kernel showed on that GPU at the
replays' middle length. Without that file, or for a graph it does not cover, it is null.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlatrace.analysis.findings import Finding
from mlatrace.analysis.model import TraceModel
from mlatrace.analysis.rules import RULES
from mlatrace.trace import Problem

WHATIF_FILE = "whatif.json"
WHATIF_SCHEMA = "mlatrace.whatif/1"


def attach_costs(model: TraceModel, findings: list[Finding]) -> None:
    """Set `cost` on each finding of a `costed` rule that names a graph of the model."""
    wanted = [f for f in findings
              if f.id in RULES and RULES[f.id].costed and f.gid is not None]
    if not wanted:
        return
    whatif = load_whatif(model)
    for finding in wanted:
        finding.cost = finding_cost(model, finding, whatif)


def finding_cost(model: TraceModel, finding: Finding, whatif: dict | None) -> dict | None:
    graph = model.graph(finding.pid, finding.gid)
    if graph is None:
        return None
    replayed = model.replay_graph(graph) or graph
    stats = replayed.replays
    pct = stats.percentiles()
    cost: dict[str, Any] = {
        "replays": stats.count,
        "timed": pct["samples"] if pct else 0,
        "replay_gpu_ns_p50": pct["p50"] if pct else None,
        "replay_gpu_ns_p90": pct["p90"] if pct else None,
        "total_gpu_ns": round(stats.gpu_sum / stats.gpu_seen * stats.count) if pct else None,
        "timed_via": ("host" if stats.host_timed else "gpu") if pct else None,
        "estimate": None,
    }
    if pct and whatif:
        cost["estimate"] = estimate(whatif, finding.pid, replayed.gid, pct["p50"])
    return cost


def estimate(whatif: dict, pid: int | None, gid: int, p50: int) -> dict | None:
    """The replay p50 with the device policy, from a saved whatif run of this graph."""
    for entry in whatif.get("graphs") or []:
        if not isinstance(entry, dict) or entry.get("pid") != pid or entry.get("gid") != gid:
            continue
        rows = [r for r in entry.get("rows") or [] if isinstance(r, dict)
                and isinstance(r.get("saving_step_us"), (int, float))
                and isinstance(r.get("len"), int)]
        if not rows:
            return None
        row = sorted(rows, key=lambda r: r["len"])[len(rows) // 2]
        saving_ns = round(row["saving_step_us"] * 1000)
        return {
            "gpu_ns_p50": max(0, p50 - saving_ns),
            "how": (f"measured p50 minus the saving per step at length {row['len']} from "
                    f"`mlatrace whatif` (the reference mla_gluon on {whatif.get('device_name')}, "
                    f"{entry.get('frozen_splits')} frozen split(s) vs the device policy, "
                    f"x {entry.get('layers')} layers), not the traced kernel"),
        }
    return None


def load_whatif(model: TraceModel) -> dict | None:
    """whatif.json of the trace, or None; an unreadable one becomes a problem of the model."""
    path = Path(model.root) / WHATIF_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        model.problems.append(Problem(WHATIF_FILE, 0, f"unreadable, no cost estimates ({exc})"))
        return None
    if not isinstance(data, dict) or data.get("schema") != WHATIF_SCHEMA:
        model.problems.append(Problem(WHATIF_FILE, 0, f"not a {WHATIF_SCHEMA} file; "
                                                      "no cost estimates"))
        return None
    return data
