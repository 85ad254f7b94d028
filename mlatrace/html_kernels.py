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

ATTENTION_MARKERS = ("attn", "attention", "mla", "fmha", "flash", "splitkv", "paged", "decode")
UNDERFILLED = 0.25   # CTAs below this share of the SMs: the grid leaves the GPU mostly idle


def short_name(name: str, limit: int = 80) -> str:
    """`at::native::vectorized_elementwise_kernel<...>` for an Itanium-mangled `_ZN...`
    name; other names (Triton's) as they are; at most `limit` characters."""
    out = _demangle(name) if name.startswith("_Z") else None
    text = out or name
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _demangle(name: str) -> str | None:
    """The qualified name of a mangled function, template arguments shown as <...>."""
    s, i, parts, templated = name, 2, [], False
    nested = i < len(s) and s[i] == "N"
    if nested:
        i += 1
        while i < len(s) and s[i] in "KVr":
            i += 1
    while i < len(s):
        c = s[i]
        if c.isdigit():
            j = i
            while j < len(s) and s[j].isdigit():
                j += 1
            length = int(s[i:j])
            if length <= 0 or j + length > len(s):
                return None
            parts.append(s[j:j + length])
            i = j + length
            if not nested:
                break
        elif c == "I":
            templated = True
            i = _skip_args(s, i + 1)
            if i < 0:
                return None
            if not nested:
                break
        elif c == "E" or not nested:
            break
        else:  # a substitution, operator or constructor name: stop at what we have
            break
    if not parts:
        return None
    return "::".join(parts) + ("<...>" if templated else "")


def _skip_args(s: str, i: int) -> int:
    """The index after the `E` closing template arguments opened before `i` (-1: none)."""
    depth = 1
    while i < len(s):
        c = s[i]
        if c.isdigit():
            j = i
            while j < len(s) and s[j].isdigit():
                j += 1
            i = j + int(s[i:j])
            continue
        if c in "INL":
            depth += 1
        elif c == "E":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def ctas(grid: Any) -> int | None:
    """Blocks a launch grid starts (x*y*z), None when the grid is not three ints."""
    if isinstance(grid, (list, tuple)) and grid and all(type(v) is int and v > 0 for v in grid):
        out = 1
        for v in grid:
            out *= v
        return out
    return None


def attention_like(name: str) -> bool:
    lowered = name.lower()
    return any(m in lowered for m in ATTENTION_MARKERS)


def device_sms(model: Any, pid: Any, graphs: list[Any]) -> tuple[int | None, str]:
    """(SMs, where the figure comes from) for the graphs of process `pid`."""
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


def kernel_rows(model: Any, unit: dict[str, Any]) -> dict[str, Any] | None:
    """The kernels the unit's graphs froze, with CTAs and CTAs/SMs; None without nodes.

    {"sms": int|None, "sms_from": str, "total": nodes, "shown": [row], "largest": row|None}
    row: {"gid", "name", "short", "grid", "block", "smem", "ctas", "share", "attention",
    "underfilled"}; `largest` is the attention-like kernel launching the most CTAs.
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
        for node in g.nodes:
            name = str(node.get("name", "?"))
            n = ctas(node.get("grid"))
            attn = attention_like(name)
            share = n / sms if (n is not None and sms) else None
            rows.append({"gid": g.gid, "name": name, "short": short_name(name),
                         "grid": node.get("grid"), "block": node.get("block"),
                         "smem": node.get("smem"), "ctas": n, "share": share,
                         "attention": attn,
                         "underfilled": bool(attn and share is not None and share < UNDERFILLED)})
    if not rows:
        return None
    attn_rows = [r for r in rows if r["attention"] and r["ctas"] is not None]
    largest = max(attn_rows, key=lambda r: r["ctas"]) if attn_rows else None
    return {"sms": sms, "sms_from": sms_from, "total": total, "shown": rows, "largest": largest}


def explained_by_pack(model: Any, unit: dict[str, Any]) -> bool:
    """Whether an engine pack recorded anything of the unit's capture (splits, launches,
    attention calls, host decisions): else only the kernel view says what it froze."""
    root = model.graph(unit["pid"], unit["gid"]) if model is not None else None
    if root is None:
        return False
    return any(g.splits or g.launches or g.calls or g.decisions for g in model.subtree(root))
