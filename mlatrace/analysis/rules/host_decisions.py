"""MLT006 frozen-host-decision and MLT007 decision-mismatch: host decisions a capture
froze, judged against the replays."""

from __future__ import annotations

from mlatrace import decisions as known
from mlatrace.analysis.config import Config
from mlatrace.analysis.findings import Finding, make_finding
from mlatrace.analysis.model import DecisionShape, GraphModel, TraceModel
from mlatrace.analysis.rules.common import (
    ev,
    inputs_text,
    judge,
    key_text,
    replay_evidence,
    replayed_graphs,
)
from mlatrace.analysis.rules.splits import frozen_one_split
from mlatrace.decisions import bucketed_splits, legacy_splits


# -- MLT006 frozen-host-decision -----------------------------------------------------
def frozen_host_decision(model: TraceModel, config: Config) -> list[Finding]:
    """Another captured host value (split count, length hint) far from what replays saw."""
    findings = []
    covered = _one_split_graphs(model, config)
    for graph, rg in replayed_graphs(model):
        found = _frozen_decision(model, graph, rg, config, covered)
        if found is not None:
            findings.append(found)
            continue
        if rg.replays.seq_len_max is None:
            continue
        longest = rg.replays.seq_len_max
        if longest < config.far_min_len:
            continue
        key = key_text(model, graph)
        chain = model.ancestors(graph)
        split_known = any(g.splits or any(la.num_kv_splits for la in g.launches) for g in chain)
        # (a) a captured split count > 1 far below what its own policy picks at the replay length
        for d in graph.splits:
            if d.num_kv_splits is None or d.num_kv_splits <= 1 or d.policy == "device":
                continue
            block_n = d.block_n or config.default_block_n
            wanted = (bucketed_splits(longest) if d.policy == "bucketed" else
                      legacy_splits(longest, batch=d.batch or 1, qlen=d.qlen or 1,
                                    nhead=d.nhead or 16, block_n=block_n))
            if wanted < config.far_factor * d.num_kv_splits:
                continue
            message = (f"graph {key} froze {d.op} at {d.num_kv_splits} KV splits (policy "
                       f"{d.policy}, min_kv_seq_len={d.min_kv_seq_len}) but replays reached "
                       f"seq_len {longest}, where the same policy picks {wanted}")
            findings.append(make_finding(
                "MLT006", message, _FIX_006,
                ev(d.ref, f"{d.op}: num_kv_splits={d.num_kv_splits} while capturing") +
                replay_evidence(rg),
                pid=graph.pid, rank=model.rank_of(graph.pid), gid=rg.gid,
                details={"key": model.effective_key(graph), "op": d.op, "value": "num_kv_splits",
                         "captured": d.num_kv_splits, "at_replay": wanted,
                         "replay_seq_len_max": longest}))
            break  # one finding per (rule, process, graph)
        if split_known:
            continue  # the hint's effect is visible in the split decision (MLT001 / (a) above)
        # (b) a captured length hint far below the replayed lengths (not max_seq_len: MLT002)
        for call in graph.calls:
            for name, value in call.hints.items():
                if name == "max_seq_len" or "seq_len" not in name:
                    continue
                if not isinstance(value, int) or isinstance(value, bool):
                    continue
                replay_value = rg.replays.seq_len_min_max if name.startswith("min") else longest
                if replay_value is None or replay_value < config.far_min_len:
                    continue
                if replay_value < config.far_factor * max(1, value):
                    continue
                message = (f"{call.op} in graph {key} was captured with host hint {name}={value} "
                           f"but replays ran at seq_len up to {replay_value}: any host decision "
                           "derived from it is frozen at the capture value")
                findings.append(make_finding(
                    "MLT006", message, _FIX_006,
                    ev(call.ref, f"{call.op} hints {name}={value} while capturing") +
                    replay_evidence(rg),
                    pid=graph.pid, rank=model.rank_of(graph.pid), gid=rg.gid,
                    details={"key": model.effective_key(graph), "op": call.op, "value": name,
                             "captured": value, "at_replay": replay_value,
                             "replay_seq_len_max": longest}))
                break
            else:
                continue
            break  # one finding per (rule, process, graph)
    return findings


def _one_split_graphs(model: TraceModel, config: Config) -> set[tuple]:
    """(pid, captured gid) of the graphs MLT001 reports: its special case is not repeated."""
    return {(f.pid, f.details.get("captured_gid")) for f in frozen_one_split(model, config)}


def _covered(graph: GraphModel, d: DecisionShape, covered: set[tuple]) -> bool:
    return (known.is_cap_decision(d.name)  # MLT002's
            or (known.is_split_decision(d.name) and d.value == 1
                and (graph.pid, graph.gid) in covered))


def _frozen_decision(model: TraceModel, graph: GraphModel, rg: GraphModel, config: Config,
                     covered: set[tuple]) -> Finding | None:
    """MLT006 for host.decision records: the first decision of G the replays contradict."""
    worst = None
    for d in graph.decisions:
        if _covered(graph, d, covered):
            continue
        verdict = judge(d, rg, config)
        if verdict.status == "outside" or (verdict.status == "far" and worst is None):
            worst = (d, verdict)
            if verdict.status == "outside":
                break
    if worst is None:
        return None
    d, v = worst
    key = key_text(model, graph)
    would = ""
    if v.at_replay:
        values = sorted(set(v.at_replay.values()))
        would = (f"; at the replayed inputs {known.known(d.name).formula} gives "
                 f"{'..'.join(str(x) for x in values)}")
    if v.status == "outside":
        lo, hi = v.valid[v.input]
        message = (f"graph {key} froze {d.name}={d.value}, which holds for {v.input} in "
                   f"[{lo}, {'inf' if hi is None else hi}], but a replay ran at "
                   f"{v.input}={v.replay_input} (captured at {v.captured_input}){would}")
        severity = "error"
    else:
        message = (f"graph {key} froze {d.name}={d.value} from {v.input}={v.captured_input}, "
                   f"but replays ran at {v.input}={v.replay_input} (>= {config.far_factor}x "
                   f"apart){would}")
        severity = "warning"
    evidence = ev(d.ref, f"{d.name}={d.value} while capturing ({inputs_text(d.inputs)})")
    evidence += ev(v.replay_ref, f"metadata before a replay: {v.input}={v.replay_input}")
    evidence += ev(rg.replays.first, f"first replay of gid {rg.gid}")
    return make_finding(
        "MLT006", message, _FIX_006, evidence, pid=graph.pid, rank=model.rank_of(graph.pid),
        gid=rg.gid, severity=severity,
        details={"key": model.effective_key(graph), "captured_gid": graph.gid, "op": d.name,
                 "value": d.value, "captured": d.value, "inputs": d.inputs,
                 "valid": v.valid, "input": v.input, "replay_input": v.replay_input,
                 "decision_at_replay": v.at_replay or None, "replays": rg.replays.count})


# -- MLT007 decision-mismatch --------------------------------------------------------
def decision_mismatch(model: TraceModel, config: Config) -> list[Finding]:
    """A decision made inside G's capture with X, and re-made eagerly before G's replays as Y != X."""
    findings = []
    covered = _one_split_graphs(model, config)
    for graph, rg in replayed_graphs(model):
        for d in graph.decisions:
            if _covered(graph, d, covered):
                continue
            verdict = judge(d, rg, config)
            if verdict.status != "mismatch":
                continue
            other = max(verdict.eager, key=lambda e: e.count)
            values = sorted({str(e.value) for e in verdict.eager})
            key = key_text(model, graph)
            message = (f"graph {key} captured {d.name}={d.value} ({inputs_text(d.inputs)}), "
                       f"but before its replays the host decided {d.name}="
                       f"{', '.join(values)} ({inputs_text(other.inputs)}, {other.count} "
                       "replays): the graph runs what the host no longer intends")
            fix = ("make the captured value an upper bound passed at both capture and run time, "
                   "re-capture per value (one graph per bucket), or move the decision on device")
            evidence = ev(d.ref, f"{d.name}={d.value} while capturing")
            evidence += ev(other.ref, f"{d.name}={other.value} eagerly before a replay")
            evidence += ev(rg.replays.first, f"first replay of gid {rg.gid}")
            findings.append(make_finding(
                "MLT007", message, fix, evidence, pid=graph.pid, rank=model.rank_of(graph.pid),
                gid=rg.gid, details={"key": model.effective_key(graph), "captured_gid": graph.gid,
                                     "op": d.name, "captured": d.value,
                                     "eager": [e.value for e in verdict.eager],
                                     "decision_at_replay": verdict.at_replay or None,
                                     "replays": rg.replays.count}))
            break  # one per (rule, process, graph)
    return findings


_FIX_006 = ("capture with a representative value (the longest length you serve), or make the "
            "decision on device / in an eager break so replays see the runtime value")
