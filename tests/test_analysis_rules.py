"""The rules on hand-made traces: each rule's positive and negative case."""

from __future__ import annotations

from pathlib import Path

import pytest
import synth
from conftest import FIXTURES

from mlatrace.analysis import Config, analyze
from mlatrace.decisions import bucketed_splits, legacy_splits
from mlatrace.trace import open_trace


def findings_of(path: Path, config: Config | None = None) -> list:
    return analyze(open_trace(path), config).findings


def ids(path: Path, config: Config | None = None) -> list[str]:
    return [f.id for f in findings_of(path, config)]


def evidence_ok(finding, root: Path) -> None:
    """Every evidence item names a real line of the trace with that seq and kind."""
    assert finding.evidence, finding
    for ev in finding.evidence:
        lines = (root / ev.file).read_text().splitlines()
        hits = [line for line in lines if f'"seq":{ev.seq},' in line]
        assert hits, (ev, finding.id)
        assert f'"k":"{ev.kind}"' in hits[0]


# -- MLT001 -------------------------------------------------------------------------
def test_mlt001_seed002_legacy_capture_at_dummy_length(tmp_path):
    root = synth.mla_decode(tmp_path / "t", policy="legacy")
    found = findings_of(root)
    assert [f.id for f in found] == ["MLT001"]
    f = found[0]
    assert f.severity == "error" and f.name == "frozen-one-split"
    assert f.details["replays"] == 3
    assert f.details["replay_seq_len_max"] == 100003
    assert f.details["hint_min_kv_seq_len"] == 1
    assert f.details["policies_at_replay_len"] == {
        "legacy": legacy_splits(100003, nhead=16), "bucketed": bucketed_splits(100003)}
    assert "replayed 3 times" in f.message and "100003" in f.message
    assert "min_kv_seq_len=1" in f.message and "bucketed 128" in f.message
    assert f.gid == 1 and f.details["captured_gid"] == 2 and f.rank == 0
    kinds = {e.kind for e in f.evidence}
    assert {"kernel.split", "kernel.launch", "kernel.skip", "graph.replay", "attn.metadata"} <= kinds
    evidence_ok(f, root)


@pytest.mark.parametrize("scenario", ["mla_device", "mla_bucketed_long", "mla_legacy_short",
                                      "mla_bucketed_breakable"])
def test_mlt001_quiet_on_healthy_traces(tmp_path, scenario):
    root = synth.SCENARIOS[scenario](tmp_path / scenario)
    assert ids(root) == []


def test_mlt001_from_launch_constexpr_alone(tmp_path):
    """No kernel.split probe (e.g. a Triton launch hook only): NUM_KV_SPLITS=1 is enough."""
    root = synth.mla_decode(tmp_path / "t", policy="legacy")
    path = root / "p1000.jsonl"
    path.write_text("\n".join(line for line in path.read_text().splitlines()
                              if '"k":"kernel.split"' not in line and '"k":"kernel.skip"' not in line)
                    + "\n")
    found = findings_of(root)
    assert [f.id for f in found] == ["MLT001"]
    assert found[0].details["block_n"] == 64


def test_mlt001_threshold_is_configurable(tmp_path):
    root = synth.mla_decode(tmp_path / "t", policy="legacy", replay_lens=(1000, 1100))
    assert ids(root) == ["MLT001"]  # 1100 >= 8 x 64
    assert ids(root, Config(long_len_factor=32)) == []  # 1100 < 32 x 64


def test_mlt001_one_finding_per_rank(tmp_path):
    root = synth.mla_decode(tmp_path / "t", policy="legacy", ranks=2)
    found = findings_of(root)
    assert [(f.id, f.rank) for f in found] == [("MLT001", 0), ("MLT001", 1)]


# -- MLT002 -------------------------------------------------------------------------
def test_mlt002_pa_v1_replayed_past_capture(tmp_path):
    root = synth.pa_v1(tmp_path / "t", capture_max=1024)
    found = findings_of(root)
    assert [f.id for f in found] == ["MLT002"]
    f = found[0]
    assert f.details["captured_max_seq_len"] == 1024 and f.details["replay_seq_len_max"] == 4096
    assert "paged_attention_v1" in f.message
    evidence_ok(f, root)


def test_mlt002_one_finding_per_graph_naming_the_kernel(tmp_path):
    """A backend forward and its PA v1 call carry the same hint: one finding, the kernel named."""
    root = synth.mixed_full(tmp_path / "t", mode="PIECEWISE", both=False)
    path = root / "p3000.jsonl"
    path.write_text(path.read_text().replace('"seq_len_max":200', '"seq_len_max":20000'))
    found = findings_of(root)
    assert [f.id for f in found] == ["MLT002"]
    assert found[0].details["op"] == "paged_attention_v1"
    assert found[0].details["ops"] == ["forward", "paged_attention_v1"]


def test_mlt002_quiet_when_captured_at_max(tmp_path):
    assert ids(synth.pa_v1(tmp_path / "t", capture_max=8192)) == []


# -- MLT003 -------------------------------------------------------------------------
def test_mlt003_pointer_drift(tmp_path):
    root = synth.mla_decode(tmp_path / "t", policy="device", ptr_drift=True)
    found = findings_of(root)
    assert [f.id for f in found] == ["MLT003"]
    f = found[0]
    assert f.details["buffer"] == "seq_info" and f.details["drifted_replays"] == 2
    evidence_ok(f, root)


def test_mlt003_quiet_when_static_buffer_is_reused(tmp_path):
    assert ids(synth.mla_decode(tmp_path / "t", policy="device")) == []


# -- MLT004 -------------------------------------------------------------------------
def test_mlt004_sync_in_capture_and_in_decode_step(tmp_path):
    root = synth.host_syncs(tmp_path / "t")
    found = findings_of(root)
    assert [f.id for f in found] == ["MLT004", "MLT004"]
    assert all(f.severity == "warning" for f in found)
    assert {f.details["capturing"] for f in found} == {True, False}
    for f in found:
        evidence_ok(f, root)


def test_mlt004_quiet_without_syncs_on_the_decode_path(tmp_path):
    assert ids(synth.host_syncs(tmp_path / "t", in_capture=False, in_step=False)) == []


# -- MLT005 -------------------------------------------------------------------------
def test_mlt005_prefill_and_decode_in_one_full_graph(tmp_path):
    root = synth.mixed_full(tmp_path / "t")
    found = findings_of(root)
    assert [f.id for f in found] == ["MLT005"]
    f = found[0]
    assert f.details["layers"] == 3
    assert "flash_attn_varlen_func" in f.message and "paged_attention_v1" in f.message
    evidence_ok(f, root)


def test_mlt005_mixed_batch_forward_with_invisible_decode_kernel(tmp_path):
    """vllm_rocm_fa: paged_attention_v1 is a torch op no probe sees; the forward's counts say."""
    root = synth.mixed_full(tmp_path / "t", both=False, decode_visible=False, num_prefills=2)
    found = findings_of(root)
    assert [f.id for f in found] == ["MLT005"]
    assert "mixed prefill+decode batch" in found[0].message
    evidence_ok(found[0], root)
    quiet = synth.mixed_full(tmp_path / "q", both=False, decode_visible=False, num_prefills=0)
    assert ids(quiet) == []


@pytest.mark.parametrize("kwargs", [{"mode": "PIECEWISE"}, {"both": False}])
def test_mlt005_quiet_on_piecewise_or_decode_only(tmp_path, kwargs):
    assert ids(synth.mixed_full(tmp_path / "t", **kwargs)) == []


# -- MLT006 -------------------------------------------------------------------------
def test_mlt006_length_hint_captured_far_from_replays(tmp_path):
    root = synth.hint_only(tmp_path / "t", hint=1, replay_len=2000)
    found = findings_of(root)
    assert [f.id for f in found] == ["MLT006"]
    assert found[0].details["value"] == "min_kv_seq_len"
    evidence_ok(found[0], root)


def test_mlt006_split_count_far_below_its_policy_at_replay(tmp_path):
    root = synth.mla_decode(tmp_path / "t", policy="legacy", capture_len=128)
    found = findings_of(root)
    assert [f.id for f in found] == ["MLT006"]
    assert found[0].details["captured"] == 2


def test_mlt006_quiet_when_hint_matches_replays(tmp_path):
    assert ids(synth.hint_only(tmp_path / "t", hint=2000, replay_len=2000)) == []


def test_mlt006_not_on_top_of_mlt001(tmp_path):
    """The legacy trace has a min_kv_seq_len=1 hint too: MLT001 covers it, MLT006 stays quiet."""
    assert ids(synth.mla_decode(tmp_path / "t", policy="legacy")) == ["MLT001"]


# -- config: disable / allow --------------------------------------------------------
def test_disable_and_allow(tmp_path):
    root = synth.host_syncs(tmp_path / "t")
    assert ids(root, Config(disable={"MLT004"})) == []
    result = analyze(open_trace(synth.mla_decode(tmp_path / "l", policy="legacy")),
                     Config(allow=[{"rule": "MLT001", "key": "FULL(*"}]))
    assert result.findings == [] and [f.id for f in result.suppressed] == ["MLT001"]
    result = analyze(open_trace(tmp_path / "l"), Config(allow=[{"rule": "MLT001", "key": "other"}]))
    assert [f.id for f in result.findings] == ["MLT001"]


def test_every_scenario_finding_has_evidence(tmp_path):
    for name, make in synth.SCENARIOS.items():
        root = make(tmp_path / name)
        for f in findings_of(root):
            evidence_ok(f, root)
            assert f.hint and f.message


def test_checked_in_fixtures():
    assert ids(FIXTURES / "legacy_one_split") == ["MLT001"]
    assert ids(FIXTURES / "device_healthy") == []
    assert ids(FIXTURES / "legacy_tp2") == ["MLT001", "MLT001"]
    assert ids(FIXTURES / "device_tp2") == []
    assert ids(FIXTURES / "pa_v1_beyond") == ["MLT002"]
    assert ids(FIXTURES / "mixed_full") == ["MLT005"]


def test_decision_seen_in_wrapper_and_nested_graph_is_one_finding(tmp_path):
    import json

    root = synth.mla_decode(tmp_path / "t", policy="legacy")
    path = root / "p1000.jsonl"
    records = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        records.append(record)
        if record["k"] == "kernel.split" and record.get("gid") == 2:
            records.append({**record, "gid": 1})  # the wrapper's probe saw it too
    for seq, record in enumerate(records):
        record["seq"] = seq
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert ids(root) == ["MLT001"]
