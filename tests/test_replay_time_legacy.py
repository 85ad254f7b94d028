"""Older traces' gpu_ns on the inner graph's replay, and exact quantiles of few samples."""

from __future__ import annotations

import json
from pathlib import Path

import synth

from mlatrace.analysis import analyze
from mlatrace.analysis.model import GPU_EXACT_TIMES, ReplayStats
from mlatrace.trace import open_trace

TIMES = (4_690_000, 4_700_000, 4_710_000)


def legacy_inner_gpu_ns(root: Path) -> Path:
    """The reference MLT001 trace with gpu_ns on the torch graph's (gid 2) replays only."""
    synth.mla_decode(root)
    [path] = root.glob("p*.jsonl")
    out, i = [], 0
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["k"] == "graph.replay" and rec["gid"] == 2:
            rec["gpu_ns"] = TIMES[i]
            i += 1
        out.append(json.dumps(rec))
    path.write_text("\n".join(out) + "\n")
    return root


def test_the_wrapper_takes_its_inner_graphs_legacy_gpu_ns(tmp_path: Path) -> None:
    result = analyze(open_trace(legacy_inner_gpu_ns(tmp_path / "t")))
    [finding] = [f for f in result.findings if f.id == "MLT001"]
    assert finding.cost["timed"] == 3, finding.cost
    assert finding.cost["replay_gpu_ns_p50"] == 4_700_000   # the middle one, exactly
    assert finding.cost["replay_gpu_ns_p90"] == 4_710_000
    assert finding.cost["total_gpu_ns"] == 3 * 4_700_000


def test_quantiles_are_exact_while_few_then_within_the_sketch_error() -> None:
    stats = ReplayStats()
    for value in TIMES:
        stats.add_gpu_ns(value)
    pct = stats.percentiles()
    assert (pct["p50"], pct["max"], pct["mean"]) == (4_700_000, 4_710_000, 4_700_000)
    many = [1_000_000 + 997 * i for i in range(4 * GPU_EXACT_TIMES)]
    for value in many:
        stats.add_gpu_ns(value)
    values = sorted([*many, *TIMES])
    exact_p50 = values[(len(values) + 1) // 2 - 1]
    p50 = stats.percentiles()["p50"]
    assert stats.gpu_rounded and p50 <= exact_p50 and (exact_p50 - p50) / exact_p50 < 1 / 128
    assert stats.percentiles()["samples"] == len(values)
