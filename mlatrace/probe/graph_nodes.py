"""Read a captured graph's kernel nodes from its DOT debug dump (cudaGraphDebugDotPrint).

torch.cuda.CUDAGraph.debug_dump(path) writes one DOT file per graph. With the
verbose flags torch uses, a kernel node's label carries the launch as
``name<<<{gx,gy,gz},{bx,by,bz},smem>>>`` (trailing dimensions of 1 may be left
out, e.g. ``_mla_decode_stage1_kernel<<<{1,7},128,0>>>``); on the H200 with torch
2.11 the label also holds the mangled and demangled names. This module turns
that text into ``[{name, grid[3], block[3], smem}]``; it is pure text parsing.
"""

from __future__ import annotations

import re
from bisect import bisect_right

_ESCAPED = re.compile(r"\\([<>{}|])")
# <<<grid, block, smem>>> after a kernel's name; grid/block are {a,b,c} or a bare number.
_LAUNCH_TAIL = re.compile(
    r"<<<\s*(?P<grid>\{[^}]*\}|\d+)\s*,\s*(?P<block>\{[^}]*\}|\d+)\s*,\s*(?P<smem>\d+)"
    r"(?:\s*,[^>]*)?>>>")
_NODE_STARTS = re.compile(r'(?m)^[ \t]*"(?P<id>[^"\n]+)"[ \t]*\[')
_NAME_STOP = re.compile(r'[|{}"\[\]=\n]')


def _dims(text: str) -> list[int]:
    values = [int(v) for v in re.findall(r"\d+", text)][:3]
    while len(values) < 3:
        values.append(1)
    return values


def _clean_name(name: str) -> str:
    # Demangled C++ names carry a return type, namespaces, template and argument
    # lists: keep the function's own name (Triton kernels are plain C names).
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    for stop in ("(", "<"):
        if stop in name:
            name = name.split(stop, 1)[0]
    return name.rsplit("::", 1)[-1].strip()


def parse_dot(text: str) -> list[dict]:
    """Kernel launches found in a DOT dump, in file order (one per kernel node).

    A node's label may span several lines (record labels); only its first launch
    text counts, so a label naming the kernel twice is still one kernel. The text is
    searched whole (a vLLM decode graph's dump is ~600 nodes, ~300 KB): one pass for the
    node starts, one for the launches, each launch's name read back to the delimiter
    before it.
    """
    # Record labels escape < > { } | with a backslash, HTML labels with entities.
    text = _ESCAPED.sub(r"\1", text.replace("&lt;", "<").replace("&gt;", ">"))
    starts = [(m.start(), m.group("id")) for m in _NODE_STARTS.finditer(text)]
    positions = [pos for pos, _id in starts]
    kernels: list[dict] = []
    counted: set[str] = set()
    seen: dict[tuple, dict] = {}   # a graph repeats few distinct launches many times
    for launch in _LAUNCH_TAIL.finditer(text):
        at = launch.start()
        i = bisect_right(positions, at) - 1
        if i >= 0:
            node = starts[i][1]
            if node in counted:
                continue
            counted.add(node)
        lo = positions[i] if i >= 0 else max(0, at - 4096)
        name = _NAME_STOP.split(text[lo:at])[-1].strip()
        if not name:
            continue
        key = (name, *launch.group("grid", "block", "smem"))
        node = seen.get(key)
        if node is None:
            node = seen[key] = {"name": _clean_name(name), "grid": _dims(key[1]),
                                "block": _dims(key[2]), "smem": int(key[3])}
        kernels.append({**node, "grid": list(node["grid"]), "block": list(node["block"])})
    return kernels
