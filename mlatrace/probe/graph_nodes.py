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

# name<<<grid, block, smem>>> where grid/block are {a,b,c} or a bare number.
_LAUNCH = re.compile(
    r"(?P<name>[^|{}\"\[\]=]+?)\s*<<<\s*(?P<grid>\{[^}]*\}|\d+)\s*,\s*"
    r"(?P<block>\{[^}]*\}|\d+)\s*,\s*(?P<smem>\d+)(?:\s*,[^>]*)?>>>")
_ESCAPED = re.compile(r"\\([<>{}|])")
_NODE_START = re.compile(r'^\s*"(?P<id>[^"]+)"\s*\[')
_NODE = re.compile(r'^\s*"?(?P<id>[^"\s\[]+)"?\s*\[(?P<attrs>.*)\]\s*;?\s*$')


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
    text counts, so a label naming the kernel twice is still one kernel.
    """
    kernels: list[dict] = []
    node: str | None = None
    counted: set[str] = set()
    for line in text.splitlines():
        start = _NODE_START.match(line)
        if start:
            node = start.group("id")
        match = _NODE.match(line)
        body = match.group("attrs") if match else line
        if "<<<" not in body and "\\<\\<\\<" not in body:
            continue
        if node is not None:
            if node in counted:
                continue
            counted.add(node)
        # Record labels escape < > { } | with a backslash, HTML labels with entities.
        body = _ESCAPED.sub(r"\1", body.replace("&lt;", "<").replace("&gt;", ">"))
        launch = _LAUNCH.search(body)
        if launch is None:
            continue
        kernels.append({
            "name": _clean_name(launch.group("name")),
            "grid": _dims(launch.group("grid")),
            "block": _dims(launch.group("block")),
            "smem": int(launch.group("smem")),
        })
    return kernels
