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
    r"(?P<name>[A-Za-z_][\w:.$<>~]*?)\s*<<<\s*(?P<grid>\{[^}]*\}|\d+)\s*,\s*"
    r"(?P<block>\{[^}]*\}|\d+)\s*,\s*(?P<smem>\d+)(?:\s*,[^>]*)?>>>")
_ESCAPED = re.compile(r"\\([<>{}|])")
_NODE = re.compile(r'^\s*"?(?P<id>[^"\s\[]+)"?\s*\[(?P<attrs>.*)\]\s*;?\s*$')


def _dims(text: str) -> list[int]:
    values = [int(v) for v in re.findall(r"\d+", text)][:3]
    while len(values) < 3:
        values.append(1)
    return values


def _clean_name(name: str) -> str:
    # Demangled C++ names may carry a template/argument list; keep the function name.
    name = name.strip()
    if "(" in name:
        name = name.split("(", 1)[0]
    if name.startswith("void "):
        name = name[5:]
    return name.rsplit("::", 1)[-1]


def parse_dot(text: str) -> list[dict]:
    """Kernel launches found in a DOT dump, in file order (one per kernel node)."""
    kernels: list[dict] = []
    for line in text.splitlines():
        match = _NODE.match(line)
        body = match.group("attrs") if match else line
        if "<<<" not in body and "\\<\\<\\<" not in body:
            continue
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
