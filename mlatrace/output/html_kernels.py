"""The kernel view of a capture unit: the kernels its graph froze, from `graph.nodes`.

Works with no engine pack: `graph.nodes` is read from the CUDA graph itself. Each kernel
gets a short name (C++ names demangled enough to read), its grid, its CTAs (blocks
launched) and, where the trace knows the device's streaming multiprocessors, CTAs
against SMs: an attention kernel frozen at fewer CTAs than a quarter of the SMs leaves
most of the GPU idle at long lengths whatever the replay needs.

SMs come from the process's `device` record ({index, name, arch, sms}) when the trace has
one, else from a host decision made with an `sm_count` input (vLLM's Triton MLA split
rule takes it), else they are unknown.
"""

from __future__ import annotations

from typing import Any

from mlatrace.analysis.kernels import (
    GridRule,
    attention_launches,
    attention_like,
    ctas,
    device_sms,
    full_name,
)

_BY_NAME = GridRule()  # the page marks attention-like kernels as MLT008 does by default
UNDERFILLED = _BY_NAME.underfill_fraction   # CTAs below this share of the SMs: mostly idle


def kernel_rows(model: Any, unit: dict[str, Any]) -> dict[str, Any] | None:
    """The kernels the unit's graphs froze, with CTAs and CTAs/SMs; None without nodes.

    {"sms": int|None, "sms_from": str, "total": nodes, "shown": [row], "largest": row|None,
     "smallest": row|None}
    row: {"gid", "name", "short", "grid", "block", "smem", "ctas", "share", "attention",
    "underfilled"}; `largest` is the attention-like kernel launching the most CTAs (the
    underfill test reads it), `smallest` the one launching the fewest (named first).
    """
    if model is None:
        return None
    root = model.graph(unit["pid"], unit["gid"])
    if root is None:
        return None
    graphs = sorted(model.subtree(root), key=lambda g: g.gid)
    sms, sms_from = device_sms(model, unit["pid"], graphs)
    rows, total = [], 0
    for g in graphs:
        total += g.nodes_total
        launched = attention_launches(model, g)
        for node in g.nodes:
            name = str(node.get("name", "?"))
            n = ctas(node.get("grid"))
            attn = attention_like(name, launched, _BY_NAME) is not None
            share = n / sms if (n is not None and sms) else None
            rows.append({"gid": g.gid, "name": name, "short": full_name(name),
                         "grid": node.get("grid"), "block": node.get("block"),
                         "smem": node.get("smem"), "ctas": n, "share": share,
                         "attention": attn,
                         "underfilled": bool(attn and share is not None and share < UNDERFILLED)})
    if not rows:
        return None
    attn_rows = [r for r in rows if r["attention"] and r["ctas"] is not None]
    largest = max(attn_rows, key=lambda r: r["ctas"]) if attn_rows else None
    smallest = min(attn_rows, key=lambda r: r["ctas"]) if attn_rows else None
    return {"sms": sms, "sms_from": sms_from, "total": total, "shown": rows, "largest": largest,
            "smallest": smallest}


def explained_by_pack(model: Any, unit: dict[str, Any]) -> bool:
    """Whether an engine pack recorded anything of the unit's capture (splits, launches,
    attention calls, host decisions): else only the kernel view says what it froze."""
    root = model.graph(unit["pid"], unit["gid"]) if model is not None else None
    if root is None:
        return False
    return any(g.splits or g.launches or g.calls or g.decisions for g in model.subtree(root))
