"""Rules MLT001-MLT008: pure functions from the graph model to findings with evidence.

Every rule reads only the TraceModel and the Config; none emits a finding without at
least one record (file, seq) to show for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mlatrace import decisions as known
from mlatrace.analysis.config import Config
from mlatrace.analysis.findings import Evidence, Finding, make_finding
from mlatrace.analysis.model import DecisionShape, GraphModel, Ref, TraceModel, classify_op
from mlatrace.decisions import bucketed_splits, legacy_splits
from mlatrace.tables import plural


def _ev(ref: Ref | None, what: str) -> list[Evidence]:
    if ref is None:
        return []
    return [Evidence(ref.file, ref.seq, ref.kind, what)]


def _key_text(model: TraceModel, graph: GraphModel) -> str:
    key = model.effective_key(graph)
    return f"{key}" if key is not None else f"gid {graph.gid}"


def _chain_hint(model: TraceModel, graph: GraphModel, name: str) -> tuple[Any, Ref | None]:
    """A host hint passed to an attention call captured in this graph or an ancestor."""
    for g in model.ancestors(graph):
        for call in g.calls:
            if name in call.hints:
                return call.hints[name], call.ref
    return None, None


def _replayed_graphs(model: TraceModel) -> Iterator[tuple[GraphModel, GraphModel]]:
    """(captured graph, the graph its replays ran under) for every graph that was replayed."""
    for graph in model.graphs.values():
        rg = model.replay_graph(graph)
        if rg is not None:
            yield graph, rg


def _replay_evidence(rg: GraphModel) -> list[Evidence]:
    stats = rg.replays
    out = _ev(stats.first, f"first replay of gid {rg.gid}")
    out += _ev(stats.seq_len_max_ref, f"metadata before a replay: seq_len_max={stats.seq_len_max}")
    return out


def _rerun_eagerly(model: TraceModel, pid: int | None, names: set) -> Ref | None:
    """An eager call/launch of one of these ops/kernels after replays began, if any.

    A breakable capture runs the split-deciding call between graph segments on every step,
    so the one-split decision seen while capturing was not what the replays used.
    """
    for name in names:
        entry = model.runtime_eager.get((pid, name))
        if entry:
            return entry[1]
    return None


def _stage1_without_stage2(nodes: list[dict]) -> bool:
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


def _input_range(rg: GraphModel, name: str) -> list | None:
    return rg.replays.inputs.get(name)


def _at_replay(d: DecisionShape, rg: GraphModel) -> dict:
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
    at_replay = _at_replay(d, rg)
    if eager:
        differ = [e for e in eager.values() if e.value != d.value]
        if differ:
            return Verdict("mismatch", eager=differ, at_replay=at_replay)
        return Verdict("holds", "the host re-made it eagerly before the replays, same value")
    valid = known.valid_range(d.name, d.value, d.inputs, d.valid)
    if valid:
        for name, bounds in valid.items():
            entry = _input_range(rg, name)
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
        entry = _input_range(rg, name)
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


def _split_decisions(graph: GraphModel) -> list[DecisionShape]:
    return [d for d in graph.decisions if known.is_split_decision(d.name)]


def _inputs_text(inputs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in inputs.items())


# -- MLT001 frozen-one-split ---------------------------------------------------------
def frozen_one_split(model: TraceModel, config: Config) -> list[Finding]:
    """One KV split captured inside graph G, and G replayed at long KV lengths."""
    findings = []
    for graph in model.graphs.values():
        one_split_refs: list[Evidence] = []
        decision = None
        for d in graph.splits:
            if d.num_kv_splits == 1 and d.policy != "device":
                decision = decision or d
                one_split_refs += _ev(d.ref, f"{d.op}: num_kv_splits=1 (min_kv_seq_len="
                                             f"{d.min_kv_seq_len}, block_n={d.block_n}, policy={d.policy})")
        launch = next((la for la in graph.launches if la.num_kv_splits == 1), None)
        if launch is not None:
            one_split_refs += _ev(launch.ref, f"{launch.name}: NUM_KV_SPLITS=1 grid={list(launch.grid or ())}")
        for ref, name, reason in graph.skips[:1]:
            one_split_refs += _ev(ref, f"{name} skipped while capturing ({reason})")
        rg = model.replay_graph(graph)
        one_decisions = [d for d in _split_decisions(graph) if d.value == 1]
        if one_decisions and rg is not None:
            verdicts = [(d, judge(d, rg, config).status) for d in one_decisions]
            open_ = [d for d, status in verdicts if status not in ("holds", "mismatch")]
            if not open_:
                # 1 is right at the replayed lengths, or the host re-decided it eagerly with
                # another value before the replays: MLT007 says the graph runs a stale value
                continue
            decided = open_[0]
            one_split_refs = _ev(decided.ref, f"{decided.name}=1 while capturing "
                                               f"({_inputs_text(decided.inputs)})") + one_split_refs
        else:
            decided = None
        if not one_split_refs and _stage1_without_stage2(graph.nodes):
            one_split_refs += _ev(graph.nodes_ref, "graph nodes: a stage-1 kernel and no stage-2 "
                                                   "node (the one-split fast path)")
        if not one_split_refs:
            continue
        if rg is None or rg.replays.seq_len_max is None:
            continue
        block_n = (decision.block_n if decision and decision.block_n else None)
        if block_n is None and decided is not None and type(decided.inputs.get("block_n")) is int:
            block_n = decided.inputs["block_n"]
        if block_n is None and launch is not None and isinstance(launch.const.get("BLOCK_N"), int):
            block_n = launch.const["BLOCK_N"]
        block_n = block_n or config.default_block_n
        longest = rg.replays.seq_len_max
        if longest < config.long_len_factor * block_n:
            continue
        names = {d.op for d in graph.splits if d.num_kv_splits == 1 and d.op}
        names |= {la.name for la in graph.launches if la.num_kv_splits == 1}
        names |= {name for _ref, name, _reason in graph.skips if name}
        if decided is None and _rerun_eagerly(model, graph.pid, names):
            continue
        hint = decision.min_kv_seq_len if decision else None
        hint_ref = None
        if hint is None:
            hint, hint_ref = _chain_hint(model, graph, "min_kv_seq_len")
        batch = (decision.batch if decision and decision.batch else None) or \
            ((graph.capture_metadata or {}).get("num_reqs") if isinstance(
                (graph.capture_metadata or {}).get("num_reqs"), int) else None) or 1
        nhead = (decision.nhead if decision and decision.nhead else 16)
        qlen = (decision.qlen if decision and decision.qlen else 1)
        # the host policies take the batch's shortest length (min_kv_seq_len)
        real_min = rg.replays.seq_len_min_max or longest
        legacy = legacy_splits(real_min, batch=batch, qlen=qlen, nhead=nhead, block_n=block_n)
        bucketed = bucketed_splits(real_min)
        if decided is None and legacy == 1:
            # the batch alone fills the workgroup budget (AITER's 256 // (batch*qlen*head
            # blocks)): one split is what the kernel picks at every replayed length
            continue
        op = decision.op if decision else (decided.name if decided else
                                           (launch.name if launch else None))
        key = _key_text(model, graph)
        count = rg.replays.count
        at_replay = _at_replay(decided, rg) if decided is not None else {}
        if decided is not None:
            captured = _inputs_text(decided.inputs) or "no inputs recorded"
            would = (f"; {known.known(decided.name).formula} gives {at_replay.get('hi')} at the "
                     "longest replay" if at_replay.get("hi") else "")
            message = (f"graph {key} (gid {rg.gid}, {model.effective_mode(graph) or '?'}) froze "
                       f"{decided.name} at 1 ({captured}) and was replayed {plural(count, 'time')} up to "
                       f"seq_len {longest} (>= {config.long_len_factor * block_n} = "
                       f"{config.long_len_factor} x BLOCK_N {block_n}){would}")
        else:
            message = (f"graph {key} (gid {rg.gid}, {model.effective_mode(graph) or '?'}) froze "
                       f"{op or 'the split-KV decode'} at 1 KV split (host hint min_kv_seq_len={hint}) "
                       f"and was replayed {plural(count, 'time')} up to seq_len {longest} "
                       f"(>= {config.long_len_factor * block_n} = {config.long_len_factor} x BLOCK_N {block_n}); "
                       f"given the real min_kv_seq_len {real_min} the legacy policy would pick "
                       f"{legacy} splits, bucketed {bucketed}")
        fix = ("pass a representative capture hint (e.g. min_kv_seq_len=16384), pick the split on "
               "device from the runtime length, or run the split-deciding call eagerly between "
               "graph segments / capture one graph per length bucket")
        evidence = one_split_refs[:3] + _ev(hint_ref, f"host hint min_kv_seq_len={hint}")
        evidence += _ev(graph.begin, f"capture of gid {graph.gid} begins")
        evidence += _replay_evidence(rg)
        findings.append(make_finding(
            "MLT001", message, fix, evidence, pid=graph.pid, rank=model.rank_of(graph.pid),
            gid=rg.gid, details={
                "key": model.effective_key(graph), "captured_gid": graph.gid, "op": op,
                "num_kv_splits": 1, "block_n": block_n, "hint_min_kv_seq_len": hint,
                "replays": count, "replay_seq_len_max": longest,
                "threshold": config.long_len_factor * block_n,
                "replay_min_kv_seq_len": real_min,
                "policies_at_replay_len": {"legacy": legacy, "bucketed": bucketed},
                "decision": decided.name if decided else None,
                "decision_at_replay": at_replay or None}))
    return findings


# -- MLT002 replay-beyond-capture ----------------------------------------------------
def replay_beyond_capture(model: TraceModel, config: Config) -> list[Finding]:
    """A capture-at-max kernel (hint max_seq_len) replayed past the length it was captured at.

    One finding per graph: a backend forward and the kernel it calls often carry the same
    hint; the kernel's own call is named first when both are there.
    """
    findings = []
    for graph in model.graphs.values():
        capped = [c for c in graph.calls if type(c.hints.get("max_seq_len")) is int]
        if not capped:
            found = _split_cap(model, graph)
            if found is not None:
                findings.append(found)
            continue
        rg = model.replay_graph(graph)
        if rg is None or rg.replays.seq_len_max is None:
            continue
        longest = rg.replays.seq_len_max
        beyond = [c for c in capped if longest > c.hints["max_seq_len"]]
        if not beyond:
            continue
        beyond.sort(key=lambda c: (c.op == "forward", c.hints["max_seq_len"]))
        call, cap = beyond[0], beyond[0].hints["max_seq_len"]
        ops = sorted({c.op for c in beyond})
        key = _key_text(model, graph)
        message = (f"{call.op} was captured in graph {key} with max_seq_len={cap} and "
                   f"replayed {plural(rg.replays.count, 'time')} up to seq_len {longest}")
        fix = ("capture at the maximum sequence length (max_model_len), or keep this kernel "
               "out of the graph / fall back to eager beyond the captured length")
        evidence = []
        for c in beyond[:2]:
            evidence += _ev(c.ref, f"{c.op} hints max_seq_len={c.hints['max_seq_len']} while capturing")
        evidence += _replay_evidence(rg)
        findings.append(make_finding(
            "MLT002", message, fix, evidence, pid=graph.pid, rank=model.rank_of(graph.pid),
            gid=rg.gid, details={"key": model.effective_key(graph), "captured_gid": graph.gid,
                                 "op": call.op, "ops": ops, "captured_max_seq_len": cap,
                                 "replay_seq_len_max": longest, "replays": rg.replays.count}))
    return findings


def _split_cap(model: TraceModel, graph: GraphModel) -> Finding | None:
    """A split cap / capacity captured in G (FA3's max_num_splits sizes the workspace then).

    Error when a split count the host decided eagerly before a replay exceeds it (the kernel
    writes past the workspace sized at capture: vllm#20301's illegal memory access); warning
    when the cap's own heuristic would pick more splits at the replay lengths (the cap binds:
    slow at long context, vllm#25274).
    """
    rg = model.replay_graph(graph)
    if rg is None:
        return None
    for d in graph.decisions:
        if not known.is_cap_decision(d.name) or type(d.value) is not int or d.value <= 0:
            continue
        cap = d.value
        split_name = known.CAP_HEURISTICS.get(d.name) or d.name.rsplit(".", 1)[0] + ".num_splits"
        eager = rg.replays.decisions.get(split_name, {})
        over = [e for e in eager.values() if type(e.value) is int and e.value > cap]
        key = _key_text(model, graph)
        base = {"key": model.effective_key(graph), "captured_gid": graph.gid, "op": d.name,
                "cap": cap, "replays": rg.replays.count}
        if over:
            worst = max(over, key=lambda e: e.value)
            message = (f"graph {key} was captured with {d.name}={cap} (the split workspace is "
                       f"sized then), but before a replay the host chose {split_name}="
                       f"{worst.value} ({_inputs_text(worst.inputs)}): the kernel writes past "
                       "the captured workspace")
            evidence = _ev(d.ref, f"{d.name}={cap} while capturing") + \
                _ev(worst.ref, f"{split_name}={worst.value} before a replay")
            return make_finding("MLT002", message, _FIX_CAP, evidence + _replay_evidence(rg),
                                pid=graph.pid, rank=model.rank_of(graph.pid), gid=rg.gid,
                                details={**base, "needed": worst.value})
        entry = rg.replays.inputs.get("seq_len_max")
        if entry is None:
            continue
        uncapped = known.value_at(split_name, {**d.inputs, "max_num_splits": 0},
                                  seq_len_max=entry[2])
        if uncapped is None or uncapped <= cap:
            continue
        message = (f"graph {key} caps {split_name} at {d.name}={cap}; at the longest replay "
                   f"(seq_len_max {entry[2]}) {known.known(split_name).formula} would pick "
                   f"{uncapped}: the cap binds and long contexts run under-split")
        evidence = _ev(d.ref, f"{d.name}={cap} while capturing ({_inputs_text(d.inputs)})")
        evidence += _ev(entry[3], f"metadata before a replay: seq_len_max={entry[2]}")
        return make_finding("MLT002", message, _FIX_CAP, evidence + _replay_evidence(rg)[:1],
                            pid=graph.pid, rank=model.rank_of(graph.pid), gid=rg.gid,
                            severity="warning", details={**base, "wanted": uncapped,
                                                         "replay_seq_len_max": entry[2]})
    return None


_FIX_CAP = ("size the split workspace for the largest split count any replay can pick and pass "
            "that bound at both capture and run time (vLLM: "
            "attention_config.flash_attn_max_num_splits_for_cuda_graph)")


# -- MLT003 static-buffer-drift ------------------------------------------------------
def static_buffer_drift(model: TraceModel, config: Config) -> list[Finding]:
    """A pointer baked in at capture differs from the one the metadata filled before a replay.

    Covers every buffer the probes name: KV indptr / block tables, and the scheduler
    metadata a backend plans per step (FA3's scheduler_metadata, FlashMLA's
    tile_scheduler_metadata and num_splits). One finding per graph, naming every buffer
    that moved.
    """
    findings = []
    done = set()
    for graph, rg in _replayed_graphs(model):
        if not graph.capture_ptrs or (graph.pid, rg.gid) in done:
            continue
        moved = []
        for name, (ptr, ref) in graph.capture_ptrs.items():
            seen = rg.replays.ptrs.get(name)
            if not seen:
                continue
            other = [(p, c, r) for p, (c, r) in seen.items() if p != ptr]
            if other:
                moved.append((name, ptr, ref, other))
        if not moved:
            continue
        done.add((graph.pid, rg.gid))
        name, ptr, ref, other = moved[0]
        drifted = sum(c for _, c, _ in other)
        first_ptr, _, first_ref = min(other, key=lambda o: o[2].seq)
        key = _key_text(model, graph)
        also = (f" (also moved: {', '.join(m[0] for m in moved[1:])})" if len(moved) > 1 else "")
        message = (f"buffer '{name}' was {_hex(ptr)} when graph {key} was captured, but "
                   f"{drifted} of {rg.replays.with_metadata} replays followed metadata with "
                   f"another pointer (first {_hex(first_ptr)}): the graph reads stale memory"
                   + also)
        fix = ("fill the captured static buffer in place (copy_ into it) instead of building "
               "a new tensor per step, or re-capture when the buffer moves")
        evidence = []
        for m_name, m_ptr, m_ref, m_other in moved[:2]:
            m_first = min(m_other, key=lambda o: o[2].seq)
            evidence += _ev(m_ref, f"'{m_name}'={_hex(m_ptr)} at capture")
            evidence += _ev(m_first[2], f"'{m_name}'={_hex(m_first[0])} before a replay")
        findings.append(make_finding(
            "MLT003", message, fix, evidence, pid=graph.pid, rank=model.rank_of(graph.pid),
            gid=rg.gid, details={"key": model.effective_key(graph), "buffer": name,
                                 "buffers": [m[0] for m in moved],
                                 "captured_ptr": ptr, "replay_ptrs": sorted(p for p, _, _ in other),
                                 "drifted_replays": drifted}))
    return findings


def _hex(value: Any) -> str:
    return hex(value) if isinstance(value, int) else str(value)


# -- MLT004 host-sync-in-decode ------------------------------------------------------
def host_sync_in_decode(model: TraceModel, config: Config) -> list[Finding]:
    """A device-to-host sync inside a capture or between replays on the decode step path."""
    findings = []
    fix = ("use the host copies the engine already has (e.g. seq_lens_cpu) or decide on device; "
           "a sync in the decode step stalls every step, and inside capture it fails or freezes")
    for graph in model.graphs.values():
        if not graph.syncs:
            continue
        site = graph.syncs[0]
        count = sum(s.count for s in graph.syncs)
        key = _key_text(model, graph)
        message = (f"{count} host sync(s) while capturing graph {key}: {site.op}"
                   + (f" at {_where(site.where)}" if site.where else ""))
        evidence = [e for s in graph.syncs[:3] for e in _ev(s.ref, f"{s.op} while capturing")]
        findings.append(make_finding(
            "MLT004", message, fix, evidence, pid=graph.pid, rank=model.rank_of(graph.pid),
            gid=graph.gid, details={"key": model.effective_key(graph), "op": site.op,
                                    "count": count, "capturing": True}))
    for (pid, op, _where_key), site in model.step_syncs.items():
        side = site.side
        what = {"input": "before a replay, after the step's set-up (an input-side sync)",
                "output": "right after a replay, before the next step's set-up (an output "
                          "readback of the step's results)",
                }.get(side, "between graph replays")
        message = (f"{site.count} host sync(s) {op} {what} on the decode step path"
                   + (f" at {_where(site.where)}" if site.where else ""))
        hint = {"input": fix, "output": _FIX_READBACK}.get(side, _FIX_EITHER)
        findings.append(make_finding(
            "MLT004", message, hint, _ev(site.ref, f"{op} after replays began ({side})"),
            pid=pid, rank=model.rank_of(pid), gid=None,
            details={"key": None, "op": op, "count": site.count, "capturing": False,
                     "side": side}))
    return findings


_FIX_READBACK = ("this reads the step's results back (the sampled tokens) right after its "
                 "replay, so the host waits for the GPU every step: overlap it (async "
                 "scheduling that prepares step N+1 while step N runs, a non_blocking copy "
                 "into pinned memory on a side stream with an event queried later); host "
                 "copies of the inputs would not remove it")
_FIX_EITHER = ("if it reads the step's inputs (sequence lengths, block tables), use the host "
               "copies the engine already has or decide on device; if it reads the step's "
               "results (sampled tokens), overlap the readback (async scheduling, a copy on a "
               "side stream with an event) instead")


def _where(where: Any) -> str:
    if isinstance(where, list):
        return " <- ".join(str(w) for w in where[:3])
    return str(where)


# -- MLT005 mixed-kernels-in-graph ---------------------------------------------------
def _positive(value: Any) -> bool:
    return type(value) is int and value > 0


def mixed_kernels_in_graph(model: TraceModel, config: Config) -> list[Finding]:
    """One FULL capture where an attention layer launches both a prefill and a decode kernel."""
    findings = []
    for graph in model.graphs.values():
        mode = model.effective_mode(graph) or ""
        if "FULL" not in mode.upper() or "PIECEWISE" in mode.upper():
            continue
        by_layer: dict[Any, dict[str, Any]] = {}
        for call in graph.calls:
            kind = classify_op(call.op)
            if kind:
                by_layer.setdefault(call.layer, {}).setdefault(kind, call)
        for call in graph.calls:
            if call.op == "forward" and _positive(call.extra.get("num_prefills")) \
                    and _positive(call.extra.get("num_decodes")):
                # a backend forward captured on a mixed batch: one of its kernels may be
                # invisible (a torch op), but both paths run inside this FULL graph
                ops = by_layer.setdefault(call.layer, {})
                ops.setdefault("prefill", call)
                ops.setdefault("decode", call)
        if not by_layer:
            for launch in graph.launches:
                kind = classify_op(launch.name)
                if kind:
                    by_layer.setdefault(None, {}).setdefault(kind, launch)
        mixed = {layer: ops for layer, ops in by_layer.items() if len(ops) == 2}
        if not mixed:
            found = _prefill_decision(model, graph, mode)
            if found is not None:
                findings.append(found)
            continue
        layer, ops = next(iter(mixed.items()))
        prefill, decode = ops["prefill"], ops["decode"]
        p_name = getattr(prefill, "op", None) or getattr(prefill, "name", "?")
        d_name = getattr(decode, "op", None) or getattr(decode, "name", "?")
        key = _key_text(model, graph)
        op_detail = f"{p_name}+{d_name}"
        if prefill is decode:
            p_name = d_name = f"{p_name}: num_prefills={prefill.extra.get('num_prefills')}, " \
                              f"num_decodes={prefill.extra.get('num_decodes')}"
            message = (f"FULL graph {key} captured attention layer {layer} on a mixed "
                       f"prefill+decode batch ({p_name}; {len(mixed)} layer(s))")
        else:
            message = (f"FULL graph {key} captured attention layer {layer} launching both "
                       f"prefill ({p_name}) and decode ({d_name}) kernels ({len(mixed)} layer(s))")
        fix = ("declare the backend decode-only for full graphs (UNIFORM_SINGLE_TOKEN_DECODE / "
               "PURE_DECODE_ONLY) and use FULL_AND_PIECEWISE so mixed batches run piecewise; "
               "make the prefill and decode paths exclusive")
        evidence = _ev(prefill.ref, f"prefill {p_name} (layer {layer}) while capturing")
        evidence += _ev(decode.ref, f"decode {d_name} (layer {layer}) while capturing")
        evidence += _ev(graph.begin, f"capture of gid {graph.gid} mode {mode}")
        findings.append(make_finding(
            "MLT005", message, fix, evidence, pid=graph.pid, rank=model.rank_of(graph.pid),
            gid=graph.gid, details={"key": model.effective_key(graph), "mode": mode,
                                    "op": op_detail, "layers": len(mixed)}))
    return findings


def _prefill_decision(model: TraceModel, graph: GraphModel, mode: str) -> Finding | None:
    """A prefill-path decision (num_prefills > 0) recorded inside a FULL (decode-only) capture."""
    for d in graph.decisions:
        prefill = (d.name.endswith(known.PREFILL_SUFFIXES) and type(d.value) is int
                   and d.value > 0) or d.value == "prefill"
        if not prefill:
            continue
        key = _key_text(model, graph)
        message = (f"FULL graph {key} was captured with {d.name}={d.value} "
                   f"({_inputs_text(d.inputs)}): the prefill branch is inside a decode graph "
                   "and every replay runs it")
        fix = ("classify the capture's padded requests as decodes (decode_threshold >= the "
               "query length the graph is captured for, e.g. 1 + num_speculative_tokens), or "
               "capture this batch shape PIECEWISE")
        evidence = _ev(d.ref, f"{d.name}={d.value} while capturing")
        evidence += _ev(graph.begin, f"capture of gid {graph.gid} mode {mode}")
        return make_finding("MLT005", message, fix, evidence, pid=graph.pid,
                            rank=model.rank_of(graph.pid), gid=graph.gid,
                            details={"key": model.effective_key(graph), "mode": mode,
                                     "op": d.name, "value": d.value})
    return None


# -- MLT006 frozen-host-decision -----------------------------------------------------
def frozen_host_decision(model: TraceModel, config: Config) -> list[Finding]:
    """Another captured host value (split count, length hint) far from what replays saw."""
    findings = []
    covered = _one_split_graphs(model, config)
    for graph, rg in _replayed_graphs(model):
        found = _frozen_decision(model, graph, rg, config, covered)
        if found is not None:
            findings.append(found)
            continue
        if rg.replays.seq_len_max is None:
            continue
        longest = rg.replays.seq_len_max
        if longest < config.far_min_len:
            continue
        key = _key_text(model, graph)
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
                _ev(d.ref, f"{d.op}: num_kv_splits={d.num_kv_splits} while capturing") +
                _replay_evidence(rg),
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
                    _ev(call.ref, f"{call.op} hints {name}={value} while capturing") +
                    _replay_evidence(rg),
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
    key = _key_text(model, graph)
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
    evidence = _ev(d.ref, f"{d.name}={d.value} while capturing ({_inputs_text(d.inputs)})")
    evidence += _ev(v.replay_ref, f"metadata before a replay: {v.input}={v.replay_input}")
    evidence += _ev(rg.replays.first, f"first replay of gid {rg.gid}")
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
    for graph, rg in _replayed_graphs(model):
        for d in graph.decisions:
            if _covered(graph, d, covered):
                continue
            verdict = judge(d, rg, config)
            if verdict.status != "mismatch":
                continue
            other = max(verdict.eager, key=lambda e: e.count)
            values = sorted({str(e.value) for e in verdict.eager})
            key = _key_text(model, graph)
            message = (f"graph {key} captured {d.name}={d.value} ({_inputs_text(d.inputs)}), "
                       f"but before its replays the host decided {d.name}="
                       f"{', '.join(values)} ({_inputs_text(other.inputs)}, {other.count} "
                       "replays): the graph runs what the host no longer intends")
            fix = ("make the captured value an upper bound passed at both capture and run time, "
                   "re-capture per value (one graph per bucket), or move the decision on device")
            evidence = _ev(d.ref, f"{d.name}={d.value} while capturing")
            evidence += _ev(other.ref, f"{d.name}={other.value} eagerly before a replay")
            evidence += _ev(rg.replays.first, f"first replay of gid {rg.gid}")
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


def frozen_underfilled_grid(model: TraceModel, config: Config) -> list[Finding]:
    """MLT008: generic, from kernel nodes, the SM count and replay times (analysis/kernels.py)."""
    from mlatrace.analysis.kernels import underfilled_grid

    return underfilled_grid(model, config.grid)


RULE_FUNCTIONS: dict[str, Callable[[TraceModel, Config], list[Finding]]] = {
    "MLT001": frozen_one_split,
    "MLT002": replay_beyond_capture,
    "MLT003": static_buffer_drift,
    "MLT004": host_sync_in_decode,
    "MLT005": mixed_kernels_in_graph,
    "MLT006": frozen_host_decision,
    "MLT007": decision_mismatch,
    "MLT008": frozen_underfilled_grid,
}
