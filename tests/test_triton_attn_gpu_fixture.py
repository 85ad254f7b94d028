"""vLLM TRITON_ATTN's 2D/3D choice on the H200 (samples/gpu_backends/vllm_triton_attn_2d_frozen,
made by samples/gpu_backends/triton_attn.py with vLLM 0.33's own unified-attention kernels):
the graph captured at batch 32 above the threshold froze the 2D kernel (one KV split) and is
MLT001 at long context; the 3D graph of the same batch is clean."""

from __future__ import annotations

import json
from pathlib import Path

from mlatrace import decisions
from mlatrace.analysis import analyze
from mlatrace.trace import open_trace

TRACE = Path(__file__).resolve().parents[1] / "samples" / "gpu_backends" / "vllm_triton_attn_2d_frozen"


def _records() -> list[dict]:
    path = next(TRACE.glob("p*.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_2d_graph_is_mlt001_and_the_3d_graph_is_clean():
    found = analyze(open_trace(TRACE)).findings
    by_id = {f.id: f for f in found}
    assert set(by_id) == {"MLT001", "MLT004"}  # MLT004: the driver's own .item() check
    f = by_id["MLT001"]
    assert f.details["decision"] == "vllm.triton_attn.num_kv_splits"
    assert f.gid == 1 and not [x for x in found if x.gid == 2]


def test_recorded_decisions_and_grids_match_the_formula():
    records = _records()
    captured = {r["gid"]: r for r in records if r["k"] == "host.decision" and r["capturing"]}
    assert {g: r["value"] for g, r in captured.items()} == {1: 1, 2: 16}
    for record in captured.values():
        assert decisions.value_at(record["name"], record["inputs"]) == record["value"]
    grids = {r["gid"]: [k["grid"] for k in r["kernels"] if k["name"] == "kernel_unified_attention"]
             for r in records if r["k"] == "graph.nodes"}
    assert grids == {1: [[40, 8, 1]], 2: [[40, 8, 16]]}
    assert captured[2]["valid"] == {"num_reqs": [0, 32]}
