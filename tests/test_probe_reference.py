"""The shipped packs on the reference decode engine (CPU): what a capture froze, what replayed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mlatrace.probe import graphs  # noqa: E402
from mlatrace.probe.packs import shipped_pack_paths  # noqa: E402


@pytest.fixture
def traced(traced_with):
    return traced_with(shipped_pack_paths())
    graphs.reset()


def run_engine(graph_mode: str, steps: int = 3, ctx: int = 600):
    from mlatrace.reference.engine import EngineConfig, ReferenceModelRunner

    config = EngineConfig(batch_sizes=(2,), num_heads=16, num_layers=2, hidden_size=64,
                          max_seq_len=ctx + steps + 8, backend="torch", graph_mode=graph_mode)
    runner = ReferenceModelRunner(config)
    runner.capture_model()
    hidden = torch.zeros(2, config.hidden_size)
    for step in range(steps):
        runner.execute_model(hidden, [ctx + step, ctx - 1 + step])
    return runner


def by_kind(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r["k"] == kind]


def test_full_capture_freezes_one_split_and_replays_without_launches(traced):
    run_engine("full")
    records = traced()
    assert not by_kind(records, "probe.error")
    begins = by_kind(records, "graph.capture.begin")
    wrapper = next(b for b in begins if b["src"] == "reference")
    host = next(b for b in begins if b["src"] == "reference-host")
    assert wrapper["mode"] == "FULL" and wrapper["key"] == {"num_tokens": 2, "uniform": True}
    assert host["parent"] == wrapper["gid"]

    captured = [r for r in by_kind(records, "kernel.split") if r["capturing"]]
    assert captured and {r["num_kv_splits"] for r in captured} == {1}
    assert {r["gid"] for r in captured} == {host["gid"]}
    calls = [r for r in by_kind(records, "attn.call") if r["op"] == "forward_mqa"]
    assert {c["hints"]["min_kv_seq_len"] for c in calls if c["capturing"]} == {1}
    assert {c["layer"] for c in calls} == {0, 1}

    end = next(e for e in by_kind(records, "graph.capture.end") if e["gid"] == wrapper["gid"])
    after = [r for r in records if r["seq"] > end["seq"]]
    replays = by_kind(after, "graph.replay")
    assert {r["gid"] for r in replays} == {wrapper["gid"], host["gid"]}
    assert max(r["n"] for r in replays if r["gid"] == wrapper["gid"]) == 3
    assert not by_kind(after, "kernel.launch") and not by_kind(after, "attn.call"), \
        "a FULL replay re-enters no Python"

    metadata = by_kind(records, "attn.metadata")
    assert metadata[0]["dummy"] is True and metadata[0]["seq_len_max"] == 1
    assert [m["seq_len_max"] for m in metadata if not m["dummy"]] == [600, 601, 602]
    assert len({m["ptrs"]["seq_info"] for m in metadata}) == 1, "one static seq_info buffer"
    assert by_kind(records, "runner.dummy_run")
    dispatches = by_kind(records, "dispatch")
    assert [(d["mode"], d["key"], d["num_tokens"]) for d in dispatches] == [
        ("FULL", {"num_tokens": 2, "uniform": True}, 2)] * 3


def test_breakable_capture_runs_attention_eagerly_at_every_replay(traced):
    run_engine("breakable", steps=2)
    records = traced()
    assert not by_kind(records, "probe.error")
    wrapper = next(b for b in by_kind(records, "graph.capture.begin") if b["src"] == "reference")
    segments = [b for b in by_kind(records, "graph.capture.begin")
                if b["src"] == "reference-host"]
    assert len(segments) == 3 and {s["parent"] for s in segments} == {wrapper["gid"]}
    breaks = by_kind(records, "graph.eager_break")
    assert len(breaks) == 2 and {b["gid"] for b in breaks} == {wrapper["gid"]}
    assert all(b["fn"] and "unified_mla_attention" in b["fn"] for b in breaks)
    end = next(e for e in by_kind(records, "graph.capture.end") if e["gid"] == wrapper["gid"])
    assert (end["segments"], end["eager_breaks"]) == (5, 2)

    during = [r for r in by_kind(records, "kernel.split") if r["seq"] < end["seq"]
              and r["seq"] > wrapper["seq"]]
    assert during and not any(r["capturing"] for r in during), "eager breaks do not capture"
    replayed = [r for r in by_kind(records, "attn.call")
                if r["seq"] > end["seq"] and r["op"] == "forward_mqa"]
    # Eager calls are sampled: the first of each run of identical calls (all fields but
    # the layer) is recorded, the rest counted in the run's sample.run.
    runs = [r for r in by_kind(records, "sample.run") if r["seq"] > end["seq"]
            and r["name"].endswith("ReferenceMLAImpl.forward_mqa")]
    assert len(replayed) + sum(r["sampled"] for r in runs) == 4
    assert {r["hints"]["min_kv_seq_len"] for r in replayed} == {599, 600}
    assert all(set(r["layers"]) == {0, 1} for r in runs)
