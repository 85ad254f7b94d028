"""MLT001 frozen-one-split and MLT002 replay-beyond-capture: the KV split count a
capture froze against the lengths its replays saw."""

from __future__ import annotations

from mlatrace import decisions as known
from mlatrace.analysis.config import Config
from mlatrace.analysis.findings import Evidence, Finding, make_finding
from mlatrace.analysis.model import GraphModel, TraceModel
from mlatrace.analysis.rules.common import (
    chain_hint,
    decision_at_replay,
    ev,
    inputs_text,
    judge,
    key_text,
    replay_evidence,
    rerun_eagerly,
    split_decisions,
    stage1_without_stage2,
)
from mlatrace.common import plural
from mlatrace.decisions import bucketed_splits, legacy_splits


# -- MLT001 frozen-one-split ---------------------------------------------------------
def graph_label(model: TraceModel, graph: GraphModel, replayed: GraphModel) -> str:
    """`graph KEY (gid N, MODE)`; without a key `graph gid N (MODE)`; no mode, no "?"."""
    key = model.effective_key(graph)
    mode = model.effective_mode(graph)
    inner = [] if key is None else [f"gid {replayed.gid}"]
    if mode:
        inner.append(str(mode))
    head = f"graph {key}" if key is not None else f"graph gid {replayed.gid}"
    return head + (f" ({', '.join(inner)})" if inner else "")


def frozen_one_split(model: TraceModel, config: Config) -> list[Finding]:
    """One KV split captured inside graph G, and G replayed at long KV lengths."""
    findings = []
    for graph in model.graphs.values():
        one_split_refs: list[Evidence] = []
        decision = None
        for d in graph.splits:
            if d.num_kv_splits == 1 and d.policy != "device":
                decision = decision or d
                one_split_refs += ev(d.ref, f"{d.op}: num_kv_splits=1 (min_kv_seq_len="
                                             f"{d.min_kv_seq_len}, block_n={d.block_n}, policy={d.policy})")
        launch = next((la for la in graph.launches if la.num_kv_splits == 1), None)
        if launch is not None:
            one_split_refs += ev(launch.ref, f"{launch.name}: NUM_KV_SPLITS=1 grid={list(launch.grid or ())}")
        for ref, name, reason in graph.skips[:1]:
            one_split_refs += ev(ref, f"{name} skipped while capturing ({reason})")
        rg = model.replay_graph(graph)
        one_decisions = [d for d in split_decisions(graph) if d.value == 1]
        if one_decisions and rg is not None:
            verdicts = [(d, judge(d, rg, config).status) for d in one_decisions]
            open_ = [d for d, status in verdicts if status not in ("holds", "mismatch")]
            if not open_:
                # 1 is right at the replayed lengths, or the host re-decided it eagerly with
                # another value before the replays: MLT007 says the graph runs a stale value
                continue
            decided = open_[0]
            one_split_refs = ev(decided.ref, f"{decided.name}=1 while capturing "
                                               f"({inputs_text(decided.inputs)})") + one_split_refs
        else:
            decided = None
        if not one_split_refs and stage1_without_stage2(graph.nodes):
            one_split_refs += ev(graph.nodes_ref, "graph nodes: a stage-1 kernel and no stage-2 "
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
        if decided is None and rerun_eagerly(model, graph.pid, names):
            continue
        hint = decision.min_kv_seq_len if decision else None
        hint_ref = None
        if hint is None:
            hint, hint_ref = chain_hint(model, graph, "min_kv_seq_len")
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
        count = rg.replays.count
        at_replay = decision_at_replay(decided, rg) if decided is not None else {}
        label = graph_label(model, graph, rg)
        long_text = (f"(>= {config.long_len_factor * block_n} = {config.long_len_factor} x "
                     f"BLOCK_N {block_n})")
        # the reference engine's policies (AITER's host-hint formula and the seed's buckets)
        # say what an AITER-style kernel would pick: only for a split that policy decides
        # (a kernel.split record, or the min_kv_seq_len hint it takes), never for another
        # engine's kernel whose split only a launch's constexpr shows
        aiter_style = decision is not None or hint is not None
        if decided is not None:
            captured = inputs_text(decided.inputs) or "no inputs recorded"
            would = (f"; {known.known(decided.name).formula} gives {at_replay.get('hi')} at the "
                     "longest replay" if at_replay.get("hi") else "")
            message = (f"{label} froze {decided.name} at 1 ({captured}) and was replayed "
                       f"{plural(count, 'time')} up to seq_len {longest} {long_text}{would}")
        elif aiter_style:
            message = (f"{label} froze {op or 'the split-KV decode'} at 1 KV split (host hint "
                       f"min_kv_seq_len={hint}) and was replayed {plural(count, 'time')} up to "
                       f"seq_len {longest} {long_text}; given the real min_kv_seq_len {real_min} "
                       f"the legacy policy would pick {legacy} splits, bucketed {bucketed}")
        else:
            grid = (f", grid {'(' + ','.join(map(str, launch.grid)) + ')'}"
                    if launch is not None and launch.grid else "")
            tiles = -(-longest // block_n)
            message = (f"{label} froze {op or 'the split-KV decode'} at 1 KV split "
                       f"(NUM_KV_SPLITS=1{grid}) and was replayed {plural(count, 'time')} up to "
                       f"seq_len {longest} {long_text}: each of its CTAs walks all {tiles} KV "
                       f"tiles of the longest replay alone")
        fix = ("pass a representative capture hint (e.g. min_kv_seq_len=16384), pick the split on "
               "device from the runtime length, or run the split-deciding call eagerly between "
               "graph segments / capture one graph per length bucket")
        evidence = one_split_refs[:3] + (ev(hint_ref, f"host hint min_kv_seq_len={hint}")
                                         if hint is not None else [])
        if graph.gid == rg.gid or rg.begin is None:
            evidence += ev(graph.begin, f"capture of gid {graph.gid} begins")
        else:  # the finding is on the replayed unit: its capture, and where the split froze
            evidence += ev(rg.begin, f"capture of gid {rg.gid} begins (the split froze in "
                                     f"gid {graph.gid}, captured inside it)")
        evidence += replay_evidence(rg)
        findings.append(make_finding(
            "MLT001", message, fix, evidence, pid=graph.pid, rank=model.rank_of(graph.pid),
            gid=rg.gid, details={
                "key": model.effective_key(graph), "captured_gid": graph.gid, "op": op,
                "num_kv_splits": 1, "block_n": block_n, "hint_min_kv_seq_len": hint,
                "replays": count, "replay_seq_len_max": longest,
                "threshold": config.long_len_factor * block_n,
                "replay_min_kv_seq_len": real_min,
                "policies_at_replay_len": ({"legacy": legacy, "bucketed": bucketed}
                                           if aiter_style else None),
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
        key = key_text(model, graph)
        message = (f"{call.op} was captured in graph {key} with max_seq_len={cap} and "
                   f"replayed {plural(rg.replays.count, 'time')} up to seq_len {longest}")
        fix = ("capture at the maximum sequence length (max_model_len), or keep this kernel "
               "out of the graph / fall back to eager beyond the captured length")
        evidence = []
        for c in beyond[:2]:
            evidence += ev(c.ref, f"{c.op} hints max_seq_len={c.hints['max_seq_len']} while capturing")
        evidence += replay_evidence(rg)
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
        key = key_text(model, graph)
        base = {"key": model.effective_key(graph), "captured_gid": graph.gid, "op": d.name,
                "cap": cap, "replays": rg.replays.count}
        if over:
            worst = max(over, key=lambda e: e.value)
            message = (f"graph {key} was captured with {d.name}={cap} (the split workspace is "
                       f"sized then), but before a replay the host chose {split_name}="
                       f"{worst.value} ({inputs_text(worst.inputs)}): the kernel writes past "
                       "the captured workspace")
            evidence = ev(d.ref, f"{d.name}={cap} while capturing") + \
                ev(worst.ref, f"{split_name}={worst.value} before a replay")
            return make_finding("MLT002", message, _FIX_CAP, evidence + replay_evidence(rg),
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
        evidence = ev(d.ref, f"{d.name}={cap} while capturing ({inputs_text(d.inputs)})")
        evidence += ev(entry[3], f"metadata before a replay: seq_len_max={entry[2]}")
        return make_finding("MLT002", message, _FIX_CAP, evidence + replay_evidence(rg)[:1],
                            pid=graph.pid, rank=model.rank_of(graph.pid), gid=rg.gid,
                            severity="warning", details={**base, "wanted": uncapped,
                                                         "replay_seq_len_max": entry[2]})
    return None


_FIX_CAP = ("size the split workspace for the largest split count any replay can pick and pass "
            "that bound at both capture and run time (vLLM: "
            "attention_config.flash_attn_max_num_splits_for_cuda_graph)")
