"""Graph use: which steps replayed a graph, which ran eagerly and why, what padding cost.

Per process, from records the trace already holds: each `dispatch` (the engine's runtime
choice: a graph mode and batch descriptor, or NONE) is one step, with its real token count
and the captured size it was padded to (the descriptor's); `runner.dummy_run` marks the
warm-up and capture runs, which are not steps. The captures (root graphs, with the size of
their key) and their replays come from the graph model. A process with no dispatch probed
(SGLang's runner, HF transformers, bare torch graphs) counts its steps from the replays of
its captures: real sizes, hence padding, are then unknown.

`GraphUseStats` is what the builder accumulates (bounded: one entry per distinct size);
`graph_use(model, rule)` the view `report`, `--json`, the HTML page and `diff` show; and
`graph_underused` is MLT009.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mlatrace.analysis.findings import Evidence, Finding, make_finding
from mlatrace.analysis.model import GraphModel, Ref, TraceModel, Unpickled, _int

MAX_SIZES = 512            # distinct (mode, size) entries kept per process; beyond: "other"
GIB = 1 << 30
OTHER = -1                 # the size of the entry that takes the rest

_SIZE_RE = re.compile(r"\b(num_tokens|batch_size|bs|num_reqs)\s*[=:]\s*\"?(\d+)")
_UNIFORM_RE = re.compile(r"\buniform(?:_decode)?\s*[=:]\s*\"?(true|false)", re.IGNORECASE)
_SIZE_PREFERENCE = ("num_tokens", "batch_size", "bs", "num_reqs")


@dataclass(frozen=True)
class GraphUseRule:
    """MLT009's thresholds (config keys `graph_eager_share`, `graph_padding_share`,
    `graph_min_steps`)."""

    eager_share: float = 0.2     # more decode steps than this share ran eagerly ...
    padding_share: float = 0.3   # ... or padding took more than this share of replayed tokens
    min_steps: int = 10          # fewer decode steps (replayed tokens: steps) judge nothing


@dataclass(slots=True)
class SizeUse:
    """Steps dispatched at one (mode, size): how many, how many decode, their real sizes."""

    first: Ref | None = None
    steps: int = 0
    decode: int = 0
    real_steps: int = 0          # steps whose real token count is known
    real_sum: int = 0
    real_min: int | None = None
    real_max: int | None = None

    def add(self, steps: int, decode: bool, real_lo: int | None, real_hi: int | None,
            real_sum: int | None) -> None:
        self.steps += steps
        if decode:
            self.decode += steps
        if real_lo is None or real_hi is None or real_sum is None:
            return
        self.real_steps += steps
        self.real_sum += real_sum
        if self.real_min is None or real_lo < self.real_min:
            self.real_min = real_lo
        if self.real_max is None or real_hi > self.real_max:
            self.real_max = real_hi


@dataclass
class GraphUseStats(Unpickled):
    """One process's dispatched steps, by (mode, captured size); eager ones have mode NONE
    and their own (real) size."""

    sizes: dict[tuple[str, int | None], SizeUse] = field(default_factory=dict)
    dummy: int = 0               # dispatches of warm-up and capture runs (not steps)
    estimated: int = 0           # folded steps whose real sizes were summed from a range

    def add(self, mode: str, size: int | None, ref: Ref, steps: int, decode: bool,
            real_lo: int | None, real_hi: int | None, real_sum: int | None) -> None:
        key = (mode, size)
        entry = self.sizes.get(key)
        if entry is None:
            if len(self.sizes) >= MAX_SIZES:
                key = (mode, OTHER)
                entry = self.sizes.get(key)
            if entry is None:
                entry = self.sizes[key] = SizeUse(first=ref)
        entry.add(steps, decode, real_lo, real_hi, real_sum)


def key_size(key: Any) -> int | None:
    """The batch size a batch descriptor names: its num_tokens (else batch_size, bs or
    num_reqs), an int key itself; None when it names none."""
    if key is None or isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key
    if isinstance(key, dict):
        for name in _SIZE_PREFERENCE:
            value = key.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None
    found = dict((name, int(value)) for name, value in reversed(_SIZE_RE.findall(str(key))))
    for name in _SIZE_PREFERENCE:
        if name in found:
            return found[name]
    return None


def key_uniform(key: Any) -> bool | None:
    """A descriptor's `uniform` flag (uniform decode), where it has one."""
    if isinstance(key, dict):
        value = key.get("uniform", key.get("uniform_decode"))
        return value if isinstance(value, bool) else None
    if isinstance(key, str):
        match = _UNIFORM_RE.search(key)
        if match:
            return match.group(1).lower() == "true"
    return None


def step_is_decode(uniform: Any, key: Any, num_reqs: Any, real: Any, md: Any) -> bool:
    """Whether a dispatched step is a decode step: the dispatch's `uniform` flag, else its
    descriptor's, else one token per request (num_reqs == num_tokens), else the latest
    metadata's max_query_len; a step none of them tells about counts as decode."""
    if isinstance(uniform, bool):
        return uniform
    if key_uniform(key) is True:
        return True
    if type(num_reqs) is int and type(real) is int:
        return num_reqs == real
    if md is not None:
        max_query_len = md.get("max_query_len")
        if type(max_query_len) is int:
            return max_query_len <= 1
    return True


# ---------------------------------------------------------------------------------------
# The view
# ---------------------------------------------------------------------------------------


def _roots(model: TraceModel, pid: int | None) -> list[GraphModel]:
    return sorted((g for g in model.graphs.values()
                   if g.pid == pid and model.graph(g.pid, g.parent) is None),
                  key=lambda g: g.gid)


def _unit_replays(model: TraceModel, pid: int | None, roots: list[GraphModel]) -> dict[int, int]:
    """Replays of each capture unit: its root's, else the most of a graph nested in it
    (the wrapper's replays not probed), as `TraceModel.replay_graph` picks; one pass
    over the process's graphs, not one per root."""
    kids: dict[int, list[GraphModel]] = {}
    for g in model.graphs.values():
        if g.pid == pid and g.parent is not None:
            kids.setdefault(g.parent, []).append(g)
    out: dict[int, int] = {}
    for root in roots:
        best, stack, seen = root.replays.count, list(kids.get(root.gid, ())), {root.gid}
        while stack and not root.replays.count:
            g = stack.pop()
            if g.gid in seen:
                continue
            seen.add(g.gid)
            best = max(best, g.replays.count)
            stack.extend(kids.get(g.gid, ()))
        out[root.gid] = best
    return out


def _unit_pools(model: TraceModel, pid: int | None, roots: list[GraphModel],
                t_end: int | None) -> dict[int, tuple[int | None, float | None, bool]]:
    """Per capture unit: the reserved bytes its captures added (`pool_bytes` of the root,
    else of the graphs nested in it, summed: a reading holds the captures inside it),
    the GiB-seconds they have held from each capture's end to `t_end` (None: unknown)
    and whether any of them allocated from a shared pool."""
    kids: dict[int, list[GraphModel]] = {}
    for g in model.graphs.values():
        if g.pid == pid and g.parent is not None:
            kids.setdefault(g.parent, []).append(g)
    out: dict[int, tuple[int | None, float | None, bool]] = {}
    for root in roots:
        measured, stack, seen = [], [root], set()
        while stack:
            g = stack.pop()
            if g.gid in seen:
                continue
            seen.add(g.gid)
            if g.pool_bytes is not None:
                measured.append(g)
            else:
                stack.extend(kids.get(g.gid, ()))
        if not measured:
            out[root.gid] = (None, None, False)
            continue
        held: float | None = 0.0
        for g in measured:
            if t_end is None or g.end_t is None:
                held = None
                break
            held += g.pool_bytes * max(0, t_end - g.end_t) / 1e9 / GIB
        out[root.gid] = (sum(g.pool_bytes for g in measured),
                         None if held is None else round(held, 3),
                         any(g.pool_shared for g in measured))
    return out


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def process_graph_use(model: TraceModel, proc: Any) -> dict[str, Any] | None:
    """One process's graph use (None: it captured nothing and dispatched nothing)."""
    stats: GraphUseStats | None = getattr(proc, "graph_use", None)
    roots = [g for g in _roots(model, proc.pid) if g.capture_error is None]
    if not roots and (stats is None or not stats.sizes):
        return None
    # captures by the size their key names; one without a size (a bare torch graph) is
    # its own row, keyed by its gid
    captures: dict[Any, list[GraphModel]] = {}
    for root in roots:
        size = key_size(model.effective_key(root))
        captures.setdefault(size if size is not None else ("gid", root.gid), []).append(root)
    captured_sizes = sorted(s for s in captures if isinstance(s, int))
    unit_replays = _unit_replays(model, proc.pid, roots)
    t_end = proc.t_last if proc.t_last is not None else (
        _int(proc.end.get("t")) if isinstance(proc.end, dict) else None)
    pools = _unit_pools(model, proc.pid, roots, t_end)
    largest = captured_sizes[-1] if captured_sizes else None
    dispatched = stats is not None and bool(stats.sizes)
    graphs_on = bool(roots) or (dispatched and any(m != "NONE" for m, _ in stats.sizes))

    sizes: dict[Any, dict[str, Any]] = {}

    def size_row(size: Any) -> dict[str, Any]:
        row = sizes.get(size)
        if row is None:
            row = sizes[size] = {
                "size": size if isinstance(size, int) else None, "modes": [], "captures": [], "replays": 0, "steps": 0,
                "decode_steps": 0, "real_steps": 0, "real_min": None, "real_max": None,
                "real_mean": None, "tokens": 0, "padding_tokens": None, "padding_share": None,
                "pool_bytes": None, "first": None}
        return row

    for size, graphs in captures.items():
        row = size_row(size)
        by_key: dict[str, int] = {}
        for g in graphs:
            key = str(model.effective_key(g))
            by_key[key] = max(by_key.get(key, 0), unit_replays[g.gid])
            mode = model.effective_mode(g)
            if mode and mode not in row["modes"]:
                row["modes"].append(mode)
            pool = pools[g.gid][0]
            row["captures"].append({"gid": g.gid, "key": model.effective_key(g),
                                    "mode": mode, "replays": unit_replays[g.gid],
                                    "pool_bytes": pool})
            if pool is not None:
                row["pool_bytes"] = (row["pool_bytes"] or 0) + pool
        row["replays"] = sum(by_key.values())

    eager: list[dict[str, Any]] = []
    eager_sizes: list[dict[str, Any]] = []
    steps = replayed = decode = decode_eager = 0
    padding = replayed_tokens = 0
    padding_known = False
    if dispatched:
        for (mode, size), use in sorted(stats.sizes.items(),
                                        key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            steps += use.steps
            decode += use.decode
            if mode == "NONE":
                decode_eager += use.decode
                eager.append(_eager_entry(size, use, graphs_on, largest))
                if size != OTHER:
                    eager_sizes.append({"size": size, "steps": use.steps,
                                        "decode_steps": use.decode,
                                        "reason": eager[-1]["reason"]})
                continue
            replayed += use.steps
            row = size_row(size)
            if mode not in row["modes"]:
                row["modes"].append(mode)
            row["steps"] += use.steps
            row["decode_steps"] += use.decode
            if row["first"] is None and use.first is not None:
                row["first"] = {"file": use.first.file, "seq": use.first.seq}
            if use.real_steps and size is not None and size != OTHER:
                row["real_steps"] += use.real_steps
                row["_real_sum"] = row.get("_real_sum", 0) + use.real_sum
                row["real_min"] = use.real_min if row["real_min"] is None else min(
                    row["real_min"], use.real_min)
                row["real_max"] = use.real_max if row["real_max"] is None else max(
                    row["real_max"], use.real_max)
    else:   # steps are the replays of the captures: real sizes unknown
        for row in sizes.values():
            row["steps"] = row["decode_steps"] = row["replays"]
        steps = replayed = decode = sum(row["steps"] for row in sizes.values())
    for row in sizes.values():
        real_sum = row.pop("_real_sum", None)
        if real_sum is None or not row["real_steps"] or row["size"] is None:
            continue
        row["tokens"] = row["size"] * row["real_steps"]
        row["real_mean"] = round(real_sum / row["real_steps"], 2)
        row["padding_tokens"] = max(0, row["tokens"] - real_sum)
        row["padding_share"] = _share(row["padding_tokens"], row["tokens"])
        padding += row["padding_tokens"]
        replayed_tokens += row["tokens"]
        padding_known = True

    never = [{"gid": g.gid, "size": size if isinstance(size, int) else None,
              "key": model.effective_key(g),
              "mode": model.effective_mode(g),
              "pool_bytes": pools[g.gid][0], "pool_shared": pools[g.gid][2],
              "held_s": _held_s(g, t_end) if pools[g.gid][0] is not None else None,
              "gib_s": pools[g.gid][1]}
             for size, graphs in captures.items() for g in graphs
             if unit_replays[g.gid] == 0]
    measured = [p for p in pools.values() if p[0] is not None]
    never_measured = [n for n in never if n["pool_bytes"] is not None]
    breakable = [{"gid": g.gid, "size": key_size(model.effective_key(g)),
                  "eager_breaks": g.eager_breaks, "replays": unit_replays[g.gid],
                  "eager_pieces": g.eager_breaks * unit_replays[g.gid]}
                 for g in roots if g.eager_breaks]
    rows = sorted(sizes.values(), key=lambda r: (r["size"] is None, r["size"] or 0,
                                                 r["captures"][0]["gid"] if r["captures"] else 0))
    return {
        "file": proc.file, "pid": proc.pid, "rank": proc.rank, "role": proc.role,
        "graphs_on": graphs_on,
        "steps_from": "dispatch" if dispatched else "replays",
        "steps": steps, "replayed": replayed, "eager": steps - replayed,
        "decode_steps": decode, "decode_eager": decode_eager,
        "eager_share": _share(decode_eager, decode) if dispatched else None,
        "warmup_dispatches": stats.dummy if stats is not None else 0,
        "captured_sizes": captured_sizes, "largest_captured": largest,
        "sizes": rows,
        "eager_steps": _merge_eager(eager),
        "eager_sizes": sorted(eager_sizes, key=lambda r: r["size"] if r["size"] is not None
                              else -1),
        "never_replayed": never,
        "pool_bytes": sum(p[0] for p in measured) if measured else None,
        "never_replayed_pool_bytes": (sum(n["pool_bytes"] for n in never_measured)
                                      if never_measured else None),
        "never_replayed_gib_s": _sum_known(n["gib_s"] for n in never_measured),
        "breakable": breakable,
        "replayed_tokens": replayed_tokens if padding_known else None,
        "padding_tokens": padding if padding_known else None,
        "padding_share": _share(padding, replayed_tokens) if padding_known else None,
        "estimated_steps": stats.estimated if stats is not None else 0,
    }


def _held_s(graph: GraphModel, t_end: int | None) -> float | None:
    """Seconds from a capture's end to the process's last record."""
    if t_end is None or graph.end_t is None:
        return None
    return round(max(0, t_end - graph.end_t) / 1e9, 3)


def _sum_known(values: Any) -> float | None:
    """The sum, None when any value (or every value: none given) is unknown."""
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return round(sum(values), 3)


def _eager_entry(size: int | None, use: SizeUse, graphs_on: bool,
                 largest: int | None) -> dict[str, Any]:
    real = use.real_max if use.real_max is not None else size
    if not graphs_on:
        reason = "graphs off"
    elif largest is not None and real is not None and real > largest:
        reason = "above largest capture"
    elif largest is None:
        reason = "no capture with a size"
    else:
        reason = "no capture for its key"
    return {"reason": reason, "size": size, "use": use}


def _merge_eager(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Eager steps by reason: how many (decode among them), real sizes seen, first record."""
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        use: SizeUse = entry["use"]
        row = out.get(entry["reason"])
        if row is None:
            row = out[entry["reason"]] = {
                "reason": entry["reason"], "steps": 0, "decode_steps": 0, "real_min": None,
                "real_max": None, "sizes": [], "first": None}
        row["steps"] += use.steps
        row["decode_steps"] += use.decode
        lo = use.real_min if use.real_min is not None else entry["size"]
        hi = use.real_max if use.real_max is not None else entry["size"]
        if lo is not None and lo != OTHER:
            row["real_min"] = lo if row["real_min"] is None else min(row["real_min"], lo)
        if hi is not None and hi != OTHER:
            row["real_max"] = hi if row["real_max"] is None else max(row["real_max"], hi)
        if entry["size"] is not None and entry["size"] != OTHER \
                and entry["size"] not in row["sizes"] and len(row["sizes"]) < 64:
            row["sizes"].append(entry["size"])
        if use.first is not None and (row["first"] is None or use.first.seq < row["first"]["seq"]):
            row["first"] = {"file": use.first.file, "seq": use.first.seq}
    for row in out.values():
        row["sizes"].sort()
    return sorted(out.values(), key=lambda r: -r["steps"])


def graph_use(model: TraceModel) -> dict[str, Any]:
    """The run's graph use: one entry per process that captured or dispatched, and totals."""
    processes = [entry for proc in model.processes
                 if (entry := process_graph_use(model, proc)) is not None]
    total: dict[str, Any] = {"processes": len(processes)}
    for name in ("steps", "replayed", "eager", "decode_steps", "decode_eager"):
        total[name] = sum(p[name] for p in processes)
    known = [p for p in processes if p["replayed_tokens"] is not None]
    total["replayed_tokens"] = sum(p["replayed_tokens"] for p in known) if known else None
    total["padding_tokens"] = sum(p["padding_tokens"] for p in known) if known else None
    total["padding_share"] = (_share(total["padding_tokens"], total["replayed_tokens"])
                              if known else None)
    total["eager_share"] = _share(total["decode_eager"], total["decode_steps"])
    total["never_replayed"] = sum(len(p["never_replayed"]) for p in processes)
    for name in ("pool_bytes", "never_replayed_pool_bytes"):
        known_bytes = [p[name] for p in processes if p[name] is not None]
        total[name] = sum(known_bytes) if known_bytes else None
    total["never_replayed_gib_s"] = _sum_known(
        p["never_replayed_gib_s"] for p in processes if p["never_replayed_pool_bytes"] is not None)
    total["captures"] = sum(len(r["captures"]) for p in processes for r in p["sizes"])
    return {"run": total, "processes": processes}


# ---------------------------------------------------------------------------------------
# MLT009 graph-underused
# ---------------------------------------------------------------------------------------


def _round_up(value: int) -> int:
    """A capture size holding `value`: itself up to 8, then the next multiple of 8 (as
    vLLM's default capture sizes step)."""
    return value if value <= 8 else -(-value // 8) * 8


def suggest_sizes(entry: dict[str, Any]) -> tuple[list[str], list[int]]:
    """What to change, from the real sizes seen: phrases for the message, sizes to add."""
    advice: list[str] = []
    add: list[int] = []
    for row in entry["eager_steps"]:
        if row["reason"] == "above largest capture" and row["real_max"] is not None:
            top = _round_up(row["real_max"])
            add.append(top)
            advice.append(f"capture sizes above {entry['largest_captured']} up to {top} "
                          f"(eager real sizes {_range(row)})")
        elif row["reason"] == "no capture for its key":
            advice.append(f"capture the descriptors of the eager sizes {_range(row)} "
                          "(their key matched no capture)")
    wasteful = sorted((r for r in entry["sizes"] if r["padding_share"]),
                      key=lambda r: -(r["padding_tokens"] or 0))
    captured = entry["captured_sizes"]
    for row in wasteful[:3]:
        if row["padding_share"] < 0.05 or row["real_max"] is None:
            continue
        below = max((s for s in captured if s < row["size"]), default=0)
        edges = [row["real_max"]]
        if row["real_min"] is not None and row["real_max"] > 2 * max(row["real_min"], 1):
            edges.insert(0, int(round(row["real_mean"])))
        edges = sorted({e for e in edges if below < e < row["size"]})
        if not edges:
            continue
        add.extend(edges)
        advice.append(f"size {row['size']} replayed real sizes {row['real_min']}..{row['real_max']} "
                      f"(mean {row['real_mean']:g}, {row['padding_share']:.0%} padding): add "
                      f"{', '.join(map(str, edges))} (move the edge {row['size']} -> "
                      f"{edges[-1]} where {row['size']} is not needed)")
    return advice, sorted(set(add))


def _range(row: dict[str, Any]) -> str:
    lo, hi = row["real_min"], row["real_max"]
    return f"{lo}" if lo == hi else f"{lo}..{hi}"


def graph_underused(model: TraceModel, rule: GraphUseRule) -> list[Finding]:
    """MLT009: per process, too many decode steps eager while graphs are on, or padding
    wasting too much of the replayed tokens."""
    out: list[Finding] = []
    for entry in graph_use(model)["processes"]:
        eager_share, padding_share = entry["eager_share"], entry["padding_share"]
        too_eager = (entry["graphs_on"] and entry["decode_steps"] >= rule.min_steps
                     and eager_share is not None and eager_share > rule.eager_share)
        too_padded = (padding_share is not None and padding_share > rule.padding_share
                      and sum(r["real_steps"] for r in entry["sizes"]) >= rule.min_steps)
        if not (too_eager or too_padded):
            continue
        parts = []
        if too_eager:
            parts.append(f"{entry['decode_eager']} of {entry['decode_steps']} decode steps "
                         f"({eager_share:.0%}) ran eagerly with graphs on")
        if too_padded:
            parts.append(f"padding took {entry['padding_tokens']} of "
                         f"{entry['replayed_tokens']} replayed tokens ({padding_share:.0%})")
        advice, add = suggest_sizes(entry)
        captured = ",".join(map(str, entry["captured_sizes"])) or "none"
        message = "; ".join(parts) + f" (captured sizes {captured})"
        if advice:
            message += ": " + "; ".join(advice)
        evidence = []
        for row in entry["eager_steps"][:2] if too_eager else []:
            if row["first"]:
                evidence.append(Evidence(row["first"]["file"], row["first"]["seq"], "dispatch",
                                         f"first of {row['steps']} eager steps ({row['reason']})"))
        if too_padded:
            for row in sorted(entry["sizes"], key=lambda r: -(r["padding_tokens"] or 0))[:2]:
                if row["first"] and row["padding_tokens"]:
                    evidence.append(Evidence(
                        row["first"]["file"], row["first"]["seq"], "dispatch",
                        f"first step padded to {row['size']} ({row['padding_share']:.0%} of its "
                        "tokens padding)"))
        hint = ("add the captured sizes the real batches need (vLLM: "
                "compilation_config.cudagraph_capture_sizes / max_cudagraph_capture_size; "
                "SGLang: --cuda-graph-bs / --cuda-graph-max-bs)"
                + (f": {', '.join(map(str, add))}" if add else "")
                + "; each size costs a capture and its memory, so add where steps land")
        out.append(make_finding(
            "MLT009", message, hint, evidence, pid=entry["pid"], rank=entry["rank"], gid=None,
            details={"eager_share": eager_share, "padding_share": padding_share,
                     "decode_steps": entry["decode_steps"], "decode_eager": entry["decode_eager"],
                     "captured_sizes": entry["captured_sizes"], "add_sizes": add,
                     "key": None}))
    return out
