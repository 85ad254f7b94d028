"""What the rules share: evidence of a record, a graph's key, the graphs that were
replayed and a decision judged against the replays (Verdict, judge)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mlatrace import decisions as known
from mlatrace.analysis.config import Config
from mlatrace.analysis.findings import Evidence
from mlatrace.analysis.model import DecisionShape, GraphModel, Ref, TraceModel


def ev(ref: Ref | None, what: str) -> list[Evidence]:
    if ref is None:
        return []
    return [Evidence(ref.file, ref.seq, ref.kind, what)]


def key_text(model: TraceModel, graph: GraphModel) -> str:
    key = model.effective_key(graph)
    return f"{key}" if key is not None else f"gid {graph.gid}"


def chain_hint(model: TraceModel, graph: GraphModel, name: str) -> tuple[Any, Ref | None]:
    """A host hint passed to an attention call captured in this graph or an ancestor."""
    for g in model.ancestors(graph):
        for call in g.calls:
            if name in call.hints:
                return call.hints[name], call.ref
    return None, None


def replayed_graphs(model: TraceModel) -> Iterator[tuple[GraphModel, GraphModel]]:
    """(captured graph, the graph its replays ran under) for every graph that was replayed."""
    for graph in model.graphs.values():
        rg = model.replay_graph(graph)
        if rg is not None:
            yield graph, rg


def replay_evidence(rg: GraphModel) -> list[Evidence]:
    stats = rg.replays
    out = ev(stats.first, f"first replay of gid {rg.gid}")
    out += ev(stats.seq_len_max_ref, f"metadata before a replay: seq_len_max={stats.seq_len_max}")
    return out


def rerun_eagerly(model: TraceModel, pid: int | None, names: set) -> Ref | None:
    """An eager call/launch of one of these ops/kernels after replays began, if any.

    A breakable capture runs the split-deciding call between graph segments on every step,
    so the one-split decision seen while capturing was not what the replays used.
    """
    for name in names:
        entry = model.runtime_eager.get((pid, name))
        if entry:
            return entry[1]
    return None


def stage1_without_stage2(nodes: list[dict]) -> bool:
    names = [str(n.get("name", "")).lower() for n in nodes]
    stage1 = any("stage1" in n or "stage_1" in n for n in names)
    stage2 = any("stage2" in n or "stage_2" in n for n in names)
    return stage1 and not stage2


# -- host.decision against the replays -----------------------------------------------
@dataclass
class Verdict:
    """What the evidence says of one captured decision (see `judge`)."""

    status: str                     # holds | mismatch | outside | far | unknown
    reason: str = ""
    eager: list = field(default_factory=list)   # EagerDecision values that differ
    input: str | None = None        # the input that left its range / moved far
    captured_input: Any = None
    replay_input: Any = None
    replay_ref: Ref | None = None
    valid: dict | None = None
    at_replay: dict = field(default_factory=dict)  # {"lo": v, "hi": v}: the formula's values


def input_range(rg: GraphModel, name: str) -> list | None:
    return rg.replays.inputs.get(name)


def decision_at_replay(d: DecisionShape, rg: GraphModel) -> dict:
    """The known formula's value at the shortest and longest replayed inputs."""
    out = {}
    for end, index in (("lo", 0), ("hi", 2)):
        replay = {name: entry[index] for name, entry in rg.replays.inputs.items()
                  if name in d.inputs}
        if replay:
            value = known.value_at(d.name, d.inputs, **replay)
            if value is not None:
                out[end] = value
    return out


def judge(d: DecisionShape, rg: GraphModel, config: Config) -> Verdict:
    """Does the value captured in `d` still hold for the replays of `rg`?

    In order: the same decision made eagerly after the capture and before the replays (same
    value: holds; another: mismatch); the `valid` range recorded or given by a known formula
    (a replay input outside it: outside); else the factor between captured and replayed
    inputs (>= far_factor: far).
    """
    eager = rg.replays.decisions.get(d.name)
    at_replay = decision_at_replay(d, rg)
    if eager:
        differ = [e for e in eager.values() if e.value != d.value]
        if differ:
            return Verdict("mismatch", eager=differ, at_replay=at_replay)
        return Verdict("holds", "the host re-made it eagerly before the replays, same value")
    valid = known.valid_range(d.name, d.value, d.inputs, d.valid)
    if valid:
        for name, bounds in valid.items():
            entry = input_range(rg, name)
            if entry is None or not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
                continue
            lo, hi = bounds
            if lo is not None and entry[0] < lo:
                return Verdict("outside", input=name, captured_input=d.inputs.get(name),
                               replay_input=entry[0], replay_ref=entry[1], valid=valid,
                               at_replay=at_replay)
            if hi is not None and entry[2] > hi:
                return Verdict("outside", input=name, captured_input=d.inputs.get(name),
                               replay_input=entry[2], replay_ref=entry[3], valid=valid,
                               at_replay=at_replay)
        return Verdict("holds", "its valid range covers every replay", valid=valid)
    for name, captured in d.inputs.items():
        entry = input_range(rg, name)
        if entry is None or type(captured) is not int:
            continue
        base = max(1, captured)
        if entry[2] >= config.far_factor * base and entry[2] >= config.far_min_len:
            return Verdict("far", input=name, captured_input=captured, replay_input=entry[2],
                           replay_ref=entry[3], at_replay=at_replay)
        if captured >= config.far_factor * max(1, entry[0]) and captured >= config.far_min_len:
            return Verdict("far", input=name, captured_input=captured, replay_input=entry[0],
                           replay_ref=entry[1], at_replay=at_replay)
    return Verdict("unknown")


def split_decisions(graph: GraphModel) -> list[DecisionShape]:
    return [d for d in graph.decisions if known.is_split_decision(d.name)]


def inputs_text(inputs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in inputs.items())
