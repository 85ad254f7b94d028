"""The kernel view of a trace: what grid each graph froze for its attention-like kernels.

Every CUDA graph exposes its kernel nodes (`graph.nodes`, from the capture's debug
dump), and the process its GPU (`device`: the SM count). With the replays' GPU times
(`graph.replay.time`) that is enough to see the commonest shape of the frozen-split bug
in an engine no probe pack knows: an attention kernel captured on a handful of CTAs
whose replays grow with the work (rule MLT008, `underfilled_grid`), and it is what
`report` shows for each graph and `diff` compares between two traces.

Pure functions over the TraceModel; the thresholds and the attention-like names are
`GridRule` (configuration: `[tool.mlatrace]` keys, see analysis/config.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mlatrace.analysis.findings import SEVERITY_ORDER, Evidence, Finding, make_finding
from mlatrace.analysis.model import GraphModel, Ref, TraceModel
from mlatrace.kinds import ATTN_CALL, ATTN_METADATA, DEVICE, GRAPH_NODES, KERNEL_LAUNCH

ATTENTION_NAMES = ("attn", "attention", "mla", "fmha", "flash", "splitkv", "paged", "decode")


@dataclass(frozen=True)
class GridRule:
    """MLT008's thresholds and the names that make a kernel attention-like.

    underfill_fraction: the largest attention-like kernel launches fewer CTAs than this
      fraction of the device's SMs (0.25: a quarter);
    growth_factor: the slowest timed replay is at least this many times the fastest;
    error_growth_factor: from this growth on the finding is an error, not a warning (a
      graph whose replays grew 10x is a broken deployment, not a tuning hint: the default
      `check`, which fails on errors, must fail on it);
    min_timed_replays: fewer timed replays than this say nothing about growth;
    attention_names: case-insensitive substrings of a kernel's name (besides kernels the
      trace saw launched inside a probed attention call of the capture).
    """

    underfill_fraction: float = 0.25
    growth_factor: float = 4.0
    error_growth_factor: float = 10.0
    min_timed_replays: int = 3
    attention_names: tuple[str, ...] = ATTENTION_NAMES


# -- names ---------------------------------------------------------------------------
_SOURCE = re.compile(r"(\d+)")


def _demangle_prefix(name: str) -> str | None:
    """The qualified function name of an Itanium-mangled symbol (`_ZN2at6native4funcI...`
    -> `at::native::func`), without its template and argument lists; None if unparsable."""
    demangled = _demangle(name)
    return demangled[0] if demangled else None


def _demangle(name: str) -> tuple[str, bool] | None:
    """(_demangle_prefix's name, whether a template argument list follows it in a nested
    name); None if unparsable."""
    if not name.startswith("_Z"):
        return None
    i, parts = 2, []
    nested = name.startswith("_ZN")
    if nested:
        i = 3
        while i < len(name) and name[i] in "rVKRLO":
            i += 1
    while i < len(name):
        if name.startswith("St", i):
            parts.append("std")
            i += 2
            continue
        match = _SOURCE.match(name, i)
        if match is None:
            break
        length = int(match.group(1))
        start = match.end()
        if length <= 0 or start + length > len(name):
            return None
        parts.append(name[start:start + length])
        i = start + length
        if not nested:
            break
    if not parts:
        return None
    return "::".join(parts), nested and name.startswith("I", i)


def _strip_brackets(text: str, open_: str, close: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == open_:
            depth += 1
        elif ch == close and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out)


def short_name(name: str, keep: int = 2) -> str:
    """A kernel's name as a person reads it: Triton and C names as they are; mangled or
    demangled C++ names as their last `keep` qualified components, without return type,
    template or argument lists (`void flash::flash_fwd_splitkv_kernel<...>(...)` ->
    `flash::flash_fwd_splitkv_kernel`)."""
    text = str(name).strip()
    qualified = _demangle_prefix(text)
    if qualified is None:
        if "(" in text or "<" in text:
            text = _strip_brackets(_strip_brackets(text, "(", ")"), "<", ">").strip()
            if " " in text:
                text = text.rsplit(" ", 1)[-1]   # the return type goes
        qualified = text
    parts = [p for p in qualified.split("::") if p]
    return "::".join(parts[-keep:]) if parts else str(name)


def full_name(name: str, limit: int = 80) -> str:
    """A mangled C++ name as its whole qualified name, template arguments shown as <...>
    (`at::native::vectorized_elementwise_kernel<...>`); other names (Triton's) as they are;
    at most `limit` characters (the HTML page's kernel table)."""
    demangled = _demangle(name)
    text = demangled[0] + ("<...>" if demangled[1] else "") if demangled else name
    return text if len(text) <= limit else text[:limit - 1] + "…"


def ctas(grid: Any) -> int | None:
    """CTAs (thread blocks) a launch grid starts: x * y * z."""
    if not isinstance(grid, (list, tuple)) or len(grid) != 3:
        return None
    if not all(type(v) is int and v >= 0 for v in grid):
        return None
    return grid[0] * grid[1] * grid[2]


def device_sms(model: Any, pid: Any, graphs: list[Any]) -> tuple[int | None, str]:
    """(SMs, where the figure comes from) for the graphs of process `pid`, as the HTML
    page's kernel table labels them: the process's first `device` record with SMs, else
    the `sm_count` input of one of the graphs' host decisions (vLLM's Triton MLA split
    rule takes it). MLT008 and the report's kernel view use `TraceModel.device_of`, the
    device a graph was captured on, and never an input."""
    proc = model.process(pid) if model is not None else None
    for source in (getattr(proc, "devices", None), getattr(proc, "device", None)):
        records = source.values() if isinstance(source, dict) and "sms" not in source else (
            source if isinstance(source, list) else [source])
        for rec in records:
            if isinstance(rec, dict) and type(rec.get("sms")) is int and rec["sms"] > 0:
                label = rec.get("name") or "the device"
                return rec["sms"], f"{label} (device record)"
    for g in graphs:
        for d in getattr(g, "decisions", ()):
            sm = (d.inputs or {}).get("sm_count") if isinstance(d.inputs, dict) else None
            if type(sm) is int and sm > 0:
                return sm, f"input sm_count of the host decision {d.name}"
    return None, "unknown (the trace has no device record)"


# -- the view ------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelNode:
    """One distinct kernel node of a graph, as the kernel view shows it."""

    name: str
    short: str
    grid: tuple[int, int, int]
    ctas: int
    attention: bool          # attention-like (see GridRule / attention_like)
    why: str                 # "name" (GridRule.attention_names), "attn.call", "kernel.launch"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "short": self.short, "grid": list(self.grid),
                "ctas": self.ctas, "attention": self.attention, "why": self.why}


def attention_launches(model: TraceModel, graph: GraphModel) -> dict[str, str]:
    """Kernels the launch probes recorded inside this capture that are attention by what
    the trace saw: {name: why}. "attn.call": launched after one of the capture's probed
    attention calls; "kernel.launch": launched with a KV-split constexpr (NUM_KV_SPLITS),
    which only a split-KV attention kernel has (vLLM's Triton MLA stage 1 and its combine,
    whatever their names)."""
    calls = [c.ref.seq for g in model.ancestors(graph) for c in g.calls]
    first = min(calls) if calls else None
    out: dict[str, str] = {}
    for g in model.subtree(graph):
        for la in g.launches:
            if first is not None and la.ref.seq > first:
                out[la.name] = ATTN_CALL
            elif la.num_kv_splits is not None:
                out.setdefault(la.name, KERNEL_LAUNCH)
    return out


def attention_like(name: str, launched: Any, rule: GridRule) -> str | None:
    """Why a kernel counts as attention-like ("name", "attn.call" or "kernel.launch"), or
    None; `launched` is attention_launches' map (a plain set counts as "attn.call")."""
    lowered = name.lower()
    if any(word.lower() in lowered for word in rule.attention_names):
        return "name"
    for key in (name, short_name(name, keep=1)):
        if key in launched:
            return launched[key] if isinstance(launched, dict) else ATTN_CALL
    return None


def graph_kernels(model: TraceModel, graph: GraphModel, rule: GridRule) -> list[KernelNode]:
    """The graph's distinct kernel nodes (name, grid), attention-like ones marked."""
    launched = attention_launches(model, graph)
    out = []
    for node in graph.nodes:
        name, grid = str(node.get("name")), node.get("grid")
        count = ctas(grid)
        if count is None:
            continue
        why = attention_like(name, launched, rule)
        out.append(KernelNode(name, short_name(name), tuple(grid), count, why is not None,
                              why or ""))
    return out


def largest_attention(kernels: list[KernelNode]) -> KernelNode | None:
    """The attention-like kernel launching the most CTAs (the one doing the KV work, not
    its combine or reduce step); ties go to the first node."""
    best = None
    for k in kernels:
        if k.attention and (best is None or k.ctas > best.ctas):
            best = k
    return best


def smallest_attention(kernels: list[KernelNode]) -> KernelNode | None:
    """The attention-like kernel launching the fewest CTAs: the grid the capture froze
    smallest (vLLM's Triton MLA stage 1 at one split: 1 CTA, beside its 16-CTA combine),
    the kernel MLT008 names first; ties go to the first node."""
    best = None
    for k in kernels:
        if k.attention and (best is None or k.ctas < best.ctas):
            best = k
    return best


@dataclass(frozen=True)
class ReplayRange:
    """The fastest and slowest timed replays of a graph (ns, as the histogram keeps them).

    `timed` counts every timed replay of the graph (the figure the cost line gives);
    `first_left_out` says the range leaves the first of them out (it uploads the graph)."""

    timed: int
    fastest: int | None
    slowest: int | None
    fastest_ref: Ref | None = None
    slowest_ref: Ref | None = None
    first_left_out: bool = False

    @property
    def ranged(self) -> int:
        """Timed replays the range is taken over."""
        return self.timed - self.first_left_out

    @property
    def growth(self) -> float | None:
        if not self.fastest or self.slowest is None:
            return None
        return self.slowest / self.fastest


def replay_range(graph: GraphModel) -> ReplayRange:
    """Timed replays of `graph` itself: first replay left out when the trace says which
    replay it was (its time holds the graph's upload, not the work)."""
    stats = graph.replays
    by_n = stats.gpu_by_n
    first_out = False
    if by_n:
        most = max(count for _ns, count in by_n.values())
        values = [ns for n, (ns, count) in by_n.items() if count == most and n != 1]
        first_out = any(n == 1 and count == most and ns > 0
                        for n, (ns, count) in by_n.items())
        if not values:
            values = [ns for ns, count in by_n.values() if count == most]
            first_out = False
    else:
        values = [value for value, count in stats.gpu_hist.items() for _ in range(count)]
    values = [v for v in values if v > 0]
    if not values:
        return ReplayRange(0, None, None)
    lo_ref, hi_ref = stats.gpu_fastest_ref, stats.gpu_slowest_ref
    return ReplayRange(len(values) + first_out, min(values), max(values), lo_ref, hi_ref,
                       first_out)


def timed_graph(model: TraceModel, graph: GraphModel) -> GraphModel | None:
    """The graph whose timed replays stand for `graph`'s: itself when timed, else the
    graph around it whose replays ran it."""
    if graph.replays.gpu_by_n or graph.replays.gpu_hist:
        return graph
    replayed = model.replay_graph(graph)
    if replayed is not None and (replayed.replays.gpu_by_n or replayed.replays.gpu_hist):
        return replayed
    return None


def kernel_view(model: TraceModel, rule: GridRule) -> dict[str, Any]:
    """Per graph with kernel nodes: its attention-like kernels (short name, grid, CTAs
    against the SMs) and replay-time range; and the kernel grids that differ between
    the graphs of the trace. The `kernels` object of `report --json`."""
    graphs = []
    order = {id(p): i for i, p in enumerate(model.processes)}   # the report's process order
    for graph in sorted(model.graphs.values(), key=lambda g: (
            order.get(id(model.process(g.pid)), len(order)), g.gid)):
        if not graph.nodes:
            continue
        kernels = graph_kernels(model, graph, rule)
        device = model.device_of(graph)
        timed = timed_graph(model, graph)
        span = replay_range(timed) if timed is not None else ReplayRange(0, None, None)
        graphs.append({
            "pid": graph.pid, "rank": model.rank_of(graph.pid), "gid": graph.gid,
            "key": model.effective_key(graph), "nodes": graph.nodes_total,
            "sms": device["sms"] if device else None,
            "device": device["name"] if device else None,
            # smallest grid first: the kernel a frozen split starves (as MLT008 names it)
            "attention": [k.to_dict() for k in sorted(
                (k for k in kernels if k.attention), key=lambda k: k.ctas)],
            "largest": (largest.to_dict() if (largest := largest_attention(kernels)) else None),
            "smallest": (small.to_dict() if (small := smallest_attention(kernels)) else None),
            "replay_gpu_ns": {"timed": span.timed, "min": span.fastest, "max": span.slowest},
        })
    return {"graphs": graphs, "grids_differ": grids_differ(
        [(f"{g['pid']}:{g['gid']}", g) for g in graphs])}


def grids_differ(graphs: list[tuple[str, dict]]) -> list[dict[str, Any]]:
    """Attention-like kernels (by short name) launched with more than one grid among
    `graphs` ((label, kernel-view graph) pairs): [{kernel, grids: [{grid, graphs}]}]."""
    by_kernel: dict[str, dict[tuple, list[str]]] = {}
    for label, g in graphs:
        for k in g["attention"]:
            by_kernel.setdefault(k["short"], {}).setdefault(tuple(k["grid"]), []).append(label)
    out = []
    for name, grids in sorted(by_kernel.items()):
        if len(grids) > 1:
            out.append({"kernel": name, "grids": [
                {"grid": list(grid), "graphs": sorted(set(labels))}
                for grid, labels in sorted(grids.items())]})
    return out


# -- MLT008 frozen-underfilled-grid --------------------------------------------------
def underfilled_grid(model: TraceModel, rule: GridRule) -> list[Finding]:
    """A graph whose largest attention-like kernel launches < underfill_fraction x SMs
    CTAs while its timed replays grew growth_factor x or more (see docs).

    The trigger reads the largest kernel (a small combine beside a split-KV kernel that
    fills the GPU is healthy); the message names the smallest first (the frozen one), and
    the finding is an error once the replays grew error_growth_factor x."""
    findings = []
    for graph in model.graphs.values():
        if not graph.nodes:
            continue
        device = model.device_of(graph)
        if device is None or not device.get("sms"):
            continue   # no SM count: coverage says MLT008 could not run (never a guess)
        sms = device["sms"]
        kernels = graph_kernels(model, graph, rule)
        largest = largest_attention(kernels)
        if largest is None or largest.ctas >= rule.underfill_fraction * sms:
            continue
        timed = timed_graph(model, graph)
        if timed is None:
            continue
        span = replay_range(timed)
        if span.ranged < rule.min_timed_replays or span.growth is None \
                or span.growth < rule.growth_factor:
            continue
        frozen = smallest_attention(kernels) or largest
        others = sorted((k for k in kernels if k.attention and k is not frozen),
                        key=lambda k: k.ctas)
        findings.append(_finding(model, graph, timed, frozen, device, span, rule, others,
                                 largest))
    return findings


def severity(span: ReplayRange, frozen: KernelNode, sms: int, rule: GridRule) -> str:
    """error when the frozen (smallest) grid is under the underfill fraction of the SMs
    and the replays grew error_growth_factor x or more; else warning."""
    under = frozen.ctas < rule.underfill_fraction * sms
    grown = span.growth is not None and span.growth >= rule.error_growth_factor
    return "error" if under and grown else "warning"


def _ns(ns: int | None) -> str:
    if ns is None:
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e3:.3g} us"


def _grid_text(grid: tuple) -> str:
    return "(" + ",".join(map(str, grid)) + ")"


def _finding(model: TraceModel, graph: GraphModel, timed: GraphModel, k: KernelNode,
             device: dict, span: ReplayRange, rule: GridRule,
             others: list[KernelNode], largest: KernelNode) -> Finding:
    sms = device["sms"]
    key = model.effective_key(graph)
    where = f"graph {key} (gid {graph.gid})" if key is not None else f"graph gid {graph.gid}"
    first = " (the first, which uploads the graph, left out)" if span.first_left_out else ""
    message = (f"{where} froze {k.short} at grid {_grid_text(k.grid)}: {k.ctas} "
               f"CTA{'s' if k.ctas != 1 else ''} on {sms} SMs (< {rule.underfill_fraction:g} "
               f"x SMs = {rule.underfill_fraction * sms:g}), while its {span.timed} timed "
               f"replays{first} grew {span.growth:.1f}x, from {_ns(span.fastest)} to "
               f"{_ns(span.slowest)}: the capture froze a parallelism that does not grow "
               "with the work")
    if others:
        message += "; its other attention-like kernels: " + ", ".join(
            f"{o.short} {_grid_text(o.grid)} = {o.ctas} CTA{'s' if o.ctas != 1 else ''}"
            for o in others[:4])
    hint = ("size the grid from the length the replay runs at: pick the KV split on device "
            "from the runtime length (a fixed launch budget that fills the SMs), capture one "
            "graph per length bucket, or run the split-deciding call eagerly between graph "
            "segments; capturing at a representative length (max_model_len) instead of a "
            "dummy one at least fills the GPU")
    evidence = []
    if graph.nodes_ref is not None:
        evidence.append(Evidence(graph.nodes_ref.file, graph.nodes_ref.seq, GRAPH_NODES,
                                 f"{k.short} grid {_grid_text(k.grid)} = {k.ctas} CTA(s)"))
    ref = device.get("ref")
    if isinstance(ref, Ref):
        evidence.append(Evidence(ref.file, ref.seq, DEVICE,
                                 f"{device.get('name') or 'device'} {device['index']}: "
                                 f"{sms} SMs"))
    for r, what in ((span.fastest_ref, f"fastest timed replay {_ns(span.fastest)}"),
                    (span.slowest_ref, f"slowest timed replay {_ns(span.slowest)}")):
        if r is not None:
            evidence.append(Evidence(r.file, r.seq, r.kind, what))
    if graph.begin is not None:
        evidence.append(Evidence(graph.begin.file, graph.begin.seq, graph.begin.kind,
                                 f"capture of gid {graph.gid} begins"))
    stats = timed.replays
    if stats.seq_len_max_ref is not None:
        evidence.append(Evidence(stats.seq_len_max_ref.file, stats.seq_len_max_ref.seq,
                                 ATTN_METADATA, f"metadata before a replay: seq_len_max="
                                 f"{stats.seq_len_max}"))
    return make_finding(
        "MLT008", message, hint, evidence, pid=graph.pid, rank=model.rank_of(graph.pid),
        gid=graph.gid, severity=severity(span, k, sms, rule), details={
            "key": key, "captured_gid": graph.gid, "op": k.short, "kernel": k.name,
            "grid": list(k.grid), "ctas": k.ctas, "sms": sms, "device": device.get("name"),
            "attention_like": k.why, "timed_replays": span.timed,
            "largest": {"kernel": largest.name, "grid": list(largest.grid),
                        "ctas": largest.ctas},
            "other_kernels": [{"kernel": o.name, "grid": list(o.grid), "ctas": o.ctas}
                              for o in others],
            "replay_gpu_ns_min": span.fastest, "replay_gpu_ns_max": span.slowest,
            "growth": round(span.growth or 0.0, 2),
            "replay_seq_len_max": stats.seq_len_max})


EXPLAINING_RULES = ("MLT001", "MLT006")


def merge_into_explaining(model: TraceModel, findings: list[Finding]) -> list[Finding]:
    """MLT008 findings whose graph an MLT001/MLT006 finding already explains become
    evidence of that finding (details `underfilled_grid`, its evidence appended, one
    clause added to its message); the others are returned as they are."""
    explaining = [f for f in findings if f.id in EXPLAINING_RULES]
    out = []
    for f in findings:
        if f.id != "MLT008":
            out.append(f)
            continue
        graph = model.graph(f.pid, f.gid)
        family = set()
        if graph is not None:
            family = {g.gid for g in model.ancestors(graph)} | \
                {g.gid for g in model.subtree(graph)}
        host = next((e for e in explaining if e.pid == f.pid and (
            e.gid in family or e.details.get("captured_gid") in family)), None)
        if host is None:
            out.append(f)
            continue
        d = f.details
        if SEVERITY_ORDER[f.severity] > SEVERITY_ORDER.get(host.severity, 0):
            host.severity = f.severity   # merging never lowers what MLT008 alone would say
        host.details["underfilled_grid"] = {k: d[k] for k in (
            "kernel", "grid", "ctas", "sms", "timed_replays", "replay_gpu_ns_min",
            "replay_gpu_ns_max", "growth")}
        host.evidence.extend(f.evidence[:4])
        host.details["underfilled_grid"]["other_kernels"] = d["other_kernels"]
        also = "".join(f", {short_name(o['kernel'])} {_grid_text(tuple(o['grid']))} = "
                       f"{o['ctas']}" for o in d["other_kernels"][:2])
        host.message += (f"; MLT008: {d['op']} grid {_grid_text(tuple(d['grid']))} = "
                         f"{d['ctas']} CTA(s){also} on {d['sms']} SMs, replays "
                         f"{_ns(d['replay_gpu_ns_min'])} to {_ns(d['replay_gpu_ns_max'])}")
    return out


def unavailable(model: TraceModel) -> str | None:
    """Why MLT008 could not judge some graph with kernel nodes (no SM count), or None."""
    without = [g for g in model.graphs.values() if g.nodes and model.device_of(g) is None]
    if not without:
        return None
    return (f"MLT008 not applied to {len(without)} graph(s) with kernel nodes: no `device` "
            "record gives their GPU's SM count (a trace of an older mlatrace, or CUDA not "
            "initialised when the capture began)")
