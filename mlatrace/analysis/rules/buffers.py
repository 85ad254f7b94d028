"""MLT003 static-buffer-drift, MLT004 host-sync-in-decode and MLT005
mixed-kernels-in-graph: what a graph reads, syncs on and mixes."""

from __future__ import annotations

from typing import Any

from mlatrace import decisions as known
from mlatrace.analysis.config import Config
from mlatrace.analysis.findings import Finding, make_finding
from mlatrace.analysis.model import GraphModel, TraceModel, classify_op
from mlatrace.analysis.rules.common import (
    ev,
    inputs_text,
    key_text,
    replayed_graphs,
)
from mlatrace.common import plural


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
    for graph, rg in replayed_graphs(model):
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
        key = key_text(model, graph)
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
            evidence += ev(m_ref, f"'{m_name}'={_hex(m_ptr)} at capture")
            evidence += ev(m_first[2], f"'{m_name}'={_hex(m_first[0])} before a replay")
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
def sync_call(op: object) -> str:
    """A `sync` record's op as the call a user reads in the code: `Tensor.item()`,
    `torch.cuda.synchronize()`."""
    name = str(op)
    if name == "synchronize":
        return "torch.cuda.synchronize()"
    return f"Tensor.{name}()" if name.isidentifier() else name


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
        key = key_text(model, graph)
        message = (f"{plural(count, 'host sync')} while capturing graph {key}: "
                   f"{sync_call(site.op)}"
                   + (f" at {_where(site.where)}" if site.where else ""))
        evidence = [e for s in graph.syncs[:3]
                    for e in ev(s.ref, f"{sync_call(s.op)} while capturing")]
        findings.append(make_finding(
            "MLT004", message, fix, evidence, pid=graph.pid, rank=model.rank_of(graph.pid),
            gid=graph.gid, details={"key": model.effective_key(graph), "op": site.op,
                                    "count": count, "capturing": True}))
    for (pid, op, _where_key), site in model.step_syncs.items():
        side = site.side
        what = {"input": "before a replay, after the step's set-up (an input-side sync)",
                "output": "right after a replay, before the next step's set-up (an output "
                          "readback: it reads what the graph wrote, e.g. the sampled tokens)",
                "wait": "right after a replay, before the next step's set-up (a device-wide "
                        "wait that reads nothing back: a step timer or a barrier)",
                }.get(side, "between graph replays")
        message = (f"{plural(site.count, 'host sync')} by {sync_call(op)} {what} on the "
                   "decode step path"
                   + (f" at {_where(site.where)}" if site.where else ""))
        hint = {"input": fix, "output": _FIX_READBACK, "wait": _FIX_WAIT}.get(side, _FIX_EITHER)
        findings.append(make_finding(
            "MLT004", message, hint,
            ev(site.ref, f"{sync_call(op)} after replays began ({side})"),
            pid=pid, rank=model.rank_of(pid), gid=None,
            details={"key": None, "op": op, "count": site.count, "capturing": False,
                     "side": side}))
    return findings


_FIX_READBACK = ("this reads the step's results back (a graph's output buffer, e.g. the "
                 "sampled tokens) right after its replay, whatever the engine, so the host "
                 "waits for the GPU every step: overlap it (async "
                 "scheduling that prepares step N+1 while step N runs, a non_blocking copy "
                 "into pinned memory on a side stream with an event queried later); host "
                 "copies of the inputs would not remove it")
_FIX_WAIT = ("a synchronize every step drains the GPU's queue, so the host cannot prepare the "
             "next step while this one runs: time steps with CUDA events recorded around them "
             "and read after the loop (Event.query, elapsed_time), and drop the barrier; if a "
             "read of the results follows it, that read is the readback to overlap")
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
        key = key_text(model, graph)
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
        evidence = ev(prefill.ref, f"prefill {p_name} (layer {layer}) while capturing")
        evidence += ev(decode.ref, f"decode {d_name} (layer {layer}) while capturing")
        evidence += ev(graph.begin, f"capture of gid {graph.gid} mode {mode}")
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
        key = key_text(model, graph)
        message = (f"FULL graph {key} was captured with {d.name}={d.value} "
                   f"({inputs_text(d.inputs)}): the prefill branch is inside a decode graph "
                   "and every replay runs it")
        fix = ("classify the capture's padded requests as decodes (decode_threshold >= the "
               "query length the graph is captured for, e.g. 1 + num_speculative_tokens), or "
               "capture this batch shape PIECEWISE")
        evidence = ev(d.ref, f"{d.name}={d.value} while capturing")
        evidence += ev(graph.begin, f"capture of gid {graph.gid} mode {mode}")
        return make_finding("MLT005", message, fix, evidence, pid=graph.pid,
                            rank=model.rank_of(graph.pid), gid=graph.gid,
                            details={"key": model.effective_key(graph), "mode": mode,
                                     "op": d.name, "value": d.value})
    return None
