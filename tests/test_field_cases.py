"""Field cases of the bug class (docs/backends.md): real traces of programs calling stand-ins
of the upstream modules under `mlatrace run` with the shipped packs
(tests/progs/field_cases/make_fixtures.py). Each fixture keeps its verdict, and a fresh run of
its program gives the same findings, so the packs still record what the rules need."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlatrace.analysis import analyze
from mlatrace.trace import open_trace

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tests" / "progs" / "field_cases"))
from make_fixtures import CASES, run_case  # noqa: E402

VERDICTS = {
    "sglang_26019_triton_splits_not_refreshed": [("MLT006", "error")],
    "sglang_26019_triton_splits_per_replay": [],
    "vllm_53658_dummy_seq_lens_past_max_model_len": [],
    "vllm_53658_dummy_seq_lens_clamped": [],
    "aiter_3773_topk_decode_stride_full_width": [("MLT006", "warning")],
    "aiter_3773_topk_decode_one_block": [],
    "vllm_36611_flashmla_fp8_sched_meta_outside_graph": [("MLT003", "error")],
    "vllm_36611_flashmla_fp8_sched_meta_in_graph": [],
    "flashinfer_4002_fa2_no_split_padded_grid": [],     # recorded; no rule judges it
    "flashinfer_4002_fa2_no_split_exact_grid": [],
    "trtllm_7285_autotuner_fallback_in_capture": [],    # recorded; no rule judges it
    "trtllm_7285_autotuner_tuned_graph_sizes": [],
    "flashinfer_4390_mla_decode_runner_per_graph": [("MLT006", "warning")],
    "flashinfer_4390_mla_decode_explicit_backend": [],
    "trtllm_16706_t5_bias_from_capture": [("MLT006", "error")],
    "trtllm_16706_t5_bias_rebuilt": [],
}
SUBJECTS = {  # the decision a finding names
    "sglang_26019_triton_splits_not_refreshed": "sglang.triton.kv_splits_static",
    "aiter_3773_topk_decode_stride_full_width": "aiter.topk_decode.multi_block=True from "
                                                "seq_len_max=262144",
    "vllm_36611_flashmla_fp8_sched_meta_outside_graph": "buffer 'tile_scheduler_metadata'",
    "flashinfer_4390_mla_decode_runner_per_graph": "flashinfer.mla_decode.runner="
                                                   "TrtllmGenMLARunner from seq_len_max=1",
    "trtllm_16706_t5_bias_from_capture": "trtllm.t5.relative_position_bias=64, which holds for "
                                         "seq_len_max in [64, 64], but a replay ran at "
                                         "seq_len_max=37",
}


def _verdict(path: Path) -> list[tuple[str, str]]:
    return [(f.id, f.severity) for f in analyze(open_trace(path)).findings]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(path.glob("p*.jsonl"))
            for line in p.read_text().splitlines()]


def test_every_case_has_a_verdict():
    assert {c.name for c in CASES} == set(VERDICTS)


@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_fixture_verdict(name):
    found = analyze(open_trace(FIXTURES / name)).findings
    assert [(f.id, f.severity) for f in found] == VERDICTS[name]
    if name in SUBJECTS:
        assert SUBJECTS[name] in found[0].message, found[0].message


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fresh_run_gives_the_fixture_verdict(case, tmp_path):
    run_case(case, tmp_path / "trace")
    assert _verdict(tmp_path / "trace") == VERDICTS[case.name]


def test_sglang_26019_splits_are_re_decided_only_when_the_replay_path_calls_them():
    bad = _records(FIXTURES / "sglang_26019_triton_splits_not_refreshed")
    good = _records(FIXTURES / "sglang_26019_triton_splits_per_replay")

    def decisions(records):
        return [r for r in records if r["k"] == "host.decision"
                and r["name"] == "sglang.triton.kv_splits_static"]

    # one at capture, with the capture's fill length as its valid range
    assert [d["inputs"]["seq_len_max"] for d in decisions(bad)] == [1]
    assert decisions(bad)[0]["valid"] == {"seq_len_max": [1, 1]}
    outer = next(r["gid"] for r in good if r["k"] == "graph.capture.begin" and r["src"] == "sglang")
    replays = sum(r["k"] == "graph.replay" and r["gid"] == outer for r in good)
    assert len(decisions(good)) == 1 + replays
    assert [d["inputs"]["seq_len_max"] for d in decisions(good)][1:] == list(range(4096, 4102))


def test_vllm_53658_failed_capture_keeps_its_sizes_and_reason():
    path = FIXTURES / "vllm_53658_dummy_seq_lens_past_max_model_len"
    records = _records(path)
    ends = [r for r in records if r["k"] == "graph.capture.end" and "error" in r]
    assert ends and "block_table row holds 1 pages, seq_len 32 needs 2" in ends[0]["error"]
    report = subprocess.run([sys.executable, "-m", "mlatrace", "report", str(path)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    line = " ".join(report.stdout.split())
    assert ("capture failed: rank - pid" in line and "num_tokens=32" in line
            and "(captured with num_reqs=32, num_tokens=32, seq_len_max=32, max_model_len=16)"
            in line), report.stdout
    unit = json.loads(subprocess.run(
        [sys.executable, "-m", "mlatrace", "report", "--json", str(path)], capture_output=True,
        text=True, timeout=120, cwd=ROOT).stdout)["graphs"][0]
    assert unit["capture_error"].startswith("RuntimeError: block_table row holds")
    assert unit["frozen"]["capture_sizes"]["max_model_len"] == 16
    # bounded by max_model_len, every size captures and the 8-token graph serves the steps
    clamped = _records(FIXTURES / "vllm_53658_dummy_seq_lens_clamped")
    assert not [r for r in clamped if r["k"] == "graph.capture.end" and "error" in r]
    dummy = [r for r in clamped if r["k"] == "attn.metadata" and r.get("dummy")]
    assert dummy and max(r["seq_len_max"] for r in dummy) == 16


def test_flashinfer_4002_plan_records_the_padded_grid_beside_the_work():
    # 32 query heads on 2 KV heads: one 16-row query tile per request, 2 initialized entries
    def plans(name):
        return [r for r in _records(FIXTURES / name) if r["k"] == "host.decision"
                and r["name"] == "flashinfer.decode.padded_batch_size"]

    padded = plans("flashinfer_4002_fa2_no_split_padded_grid")
    exact = plans("flashinfer_4002_fa2_no_split_exact_grid")
    assert len(padded) >= 2 and len(exact) >= 2     # the capture's plan and re-plans
    for d in padded + exact:
        assert d["inputs"]["disable_split_kv"] is True and d["inputs"]["cuda_graph"] is True
        assert d["inputs"]["num_reqs"] == 2
    assert {d["value"] for d in padded} == {2 * 132 // 2}   # the split-KV bound, 130 CTAs over
    assert {d["value"] for d in exact} == {2}


def test_trtllm_7285_each_graph_keeps_the_tactic_it_captured():
    def captured(name):
        return {d["inputs"]["num_tokens"]: d["value"] for d in _records(FIXTURES / name)
                if d["k"] == "host.decision" and d["name"] == "trtllm.autotuner.tactic"}

    # recorded while capturing only: the warm-up's tuning calls are other shapes'
    assert captured("trtllm_7285_autotuner_fallback_in_capture") == {1: -1, 8: -1}
    tuned = captured("trtllm_7285_autotuner_tuned_graph_sizes")
    assert set(tuned) == {1, 8} and -1 not in tuned.values()


def test_aiter_3773_records_the_decode_query_only():
    def queries(name):
        return [r for r in _records(FIXTURES / name) if r["k"] == "host.decision"
                and r["name"] == "aiter.topk_decode.multi_block"]

    # the eager prefill's query (same function, outside top_k_per_row_decode) is not recorded
    bad = queries("aiter_3773_topk_decode_stride_full_width")
    assert [(d["value"], d["inputs"], d["capturing"]) for d in bad] == [
        (True, {"num_reqs": 8, "seq_len_max": 262144}, True)]
    assert queries("aiter_3773_topk_decode_one_block") == []
