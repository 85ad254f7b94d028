"""The graph model: nesting, replays linked to host state, sampling, ranks, bad input."""

from __future__ import annotations

import json

import synth
from conftest import FIXTURES

from mlatrace.analysis import analyze, build_model
from mlatrace.analysis.model import ReplayStats
from mlatrace.analysis.summary import units
from mlatrace.trace import open_trace


def test_nested_capture_and_replays(tmp_path):
    model = build_model(open_trace(synth.mla_decode(tmp_path / "t", policy="legacy", gpu_ns=True)))
    wrapper, torch_graph = model.graphs[(1000, 1)], model.graphs[(1000, 2)]
    assert (wrapper.src, wrapper.key, wrapper.mode, wrapper.parent) == (
        "vllm", "FULL(num_tokens=1)", "FULL", None)
    assert torch_graph.parent == 1 and model.effective_key(torch_graph) == "FULL(num_tokens=1)"
    assert [d.num_kv_splits for d in torch_graph.splits] == [1]
    assert torch_graph.splits[0].count == 2  # two layers, one distinct decision
    assert torch_graph.capture_ptrs["seq_info"][0] == synth.SEQ_INFO_PTR
    assert wrapper.capture_metadata.get("seq_len_max") == 1  # the dummy metadata before capture
    assert wrapper.replays.count == torch_graph.replays.count == 3
    assert wrapper.replays.seq_len_max == 100003 and wrapper.replays.seq_len_min_min == 100001
    assert model.total_replays() == 3  # the nested replay is the same step
    assert model.replay_graph(torch_graph) is wrapper
    pct = wrapper.replays.percentiles()
    assert pct["samples"] == 3 and 19_900_000 <= pct["p50"] <= 20_002_000


def test_unit_summary_shows_frozen_topology(tmp_path):
    model = build_model(open_trace(synth.mla_decode(tmp_path / "t", policy="device")))
    [unit] = units(model)
    assert unit["nested_gids"] == [2]
    assert unit["frozen"]["num_kv_splits"] == [16]
    assert unit["frozen"]["stage2"] == "present"
    assert unit["frozen"]["kernels"]["_mla_stage1"]["grids"] == [[1, 1, 16]]
    assert unit["replays"]["ptrs_stable"] is True
    legacy = units(build_model(open_trace(synth.mla_decode(tmp_path / "l", policy="legacy"))))[0]
    assert legacy["frozen"]["stage2"] == "skipped" and legacy["frozen"]["num_kv_splits"] == [1]


def test_sampled_replays_use_exact_counts_from_process_end(tmp_path):
    root = synth.mla_decode(tmp_path / "t", policy="legacy")
    path = root / "p1000.jsonl"
    lines = path.read_text().splitlines()
    # keep only the first replay record of each gid, as --replay-sample would, and say 500
    kept, seen = [], set()
    for line in lines:
        rec = json.loads(line)
        if rec["k"] == "graph.replay":
            if rec["gid"] in seen:
                continue
            seen.add(rec["gid"])
        if rec["k"] == "process.end":
            rec["replays"] = {"1": 500, "2": 500}
        kept.append(json.dumps(rec))
    path.write_text("\n".join(kept) + "\n")
    result = analyze(open_trace(root))
    assert result.model.graphs[(1000, 1)].replays.count == 500
    assert result.findings[0].details["replays"] == 500


def test_rank_learned_later_and_unknown_kinds(tmp_path):
    proc = synth.SynthProcess(tmp_path, 9, rank=None)
    proc.emit("process.rank", rank=3, world_size=8)
    proc.emit("some.future.kind", payload=[1, 2, 3])
    proc.emit("mark", name="hello", attrs={})
    proc.write()
    synth.write_run(tmp_path)
    model = build_model(open_trace(tmp_path))
    assert (model.processes[0].rank, model.processes[0].world_size) == (3, 8)
    assert model.problems == []


def test_records_with_wrong_field_types_are_skipped_not_fatal(tmp_path):
    proc = synth.SynthProcess(tmp_path, 9)
    proc.emit("graph.capture.begin", gid=[1], parent="x", src=5, key={"a": 1}, mode=None)
    proc.emit("graph.replay", gid={"x": 1}, n="many", gpu_ns="slow")
    proc.emit("attn.metadata", seq_len_max="long", ptrs=[1, 2], capturing="yes")
    proc.emit("attn.call", op=None, layer=[0], hints="none", ptrs=None, capturing=True, gid=1)
    proc.emit("kernel.launch", name=None, grid="1x1", const=[], capturing=True, gid=1)
    proc.emit("process.end", replays={"x": "y", "1": 2})
    proc.write(end=False)
    result = analyze(open_trace(tmp_path))
    assert result.findings == []


def test_parallel_build_matches_serial(tmp_path):
    root = synth.mla_decode(tmp_path / "t", policy="legacy", ranks=3, gpu_ns=True)
    serial = analyze(open_trace(root))
    from mlatrace.analysis import analyze_model
    from mlatrace.analysis import parallel as model_mod

    trace = open_trace(root)
    parts = model_mod.build_parallel(trace, model_mod.pid_groups(trace.processes), 2)
    assert parts is not None and len(parts) == 2  # the workers really ran
    parallel = analyze_model(build_model(open_trace(root), workers=2))
    assert [f.to_dict() for f in parallel.findings] == [f.to_dict() for f in serial.findings]
    assert units(parallel.model) == units(serial.model)
    assert [p.file for p in parallel.model.processes] == [p.file for p in serial.model.processes]


def test_bad_inputs_keep_what_is_readable():
    for name in ("truncated_last_line", "garbage_line", "missing_header", "newer_schema"):
        result = analyze(open_trace(FIXTURES / name))
        assert [f.id for f in result.findings] == ["MLT001"], name
    problems = analyze(open_trace(FIXTURES / "garbage_line")).problems
    assert [str(p).split(": ")[0] for p in problems] == ["p1000.jsonl:11", "p1000.jsonl:13"]


def test_gpu_histogram_percentiles():
    stats = ReplayStats()
    for v in range(1, 1001):
        stats.add_gpu_ns(v * 1000)
    pct = stats.percentiles()
    assert abs(pct["p50"] - 500_000) / 500_000 < 0.01
    assert abs(pct["p99"] - 990_000) / 990_000 < 0.01
    assert pct["samples"] == 1000 and len(stats.gpu_hist) <= 1000
