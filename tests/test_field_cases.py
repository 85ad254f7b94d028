"""Field cases of the bug class (docs/backends.md): real traces of programs under `mlatrace run`
with the shipped packs (tests/progs/field_cases/make_fixtures.py): where vLLM is in the path
they drive the real vLLM CPU build (the vLLM venv of tests/e2e_vllm); libraries that do not
install here are stand-ins. Each fixture keeps its verdict (read from the trace: the default run), and a
fresh run of its program gives the same findings, so the packs still record what the rules
need (the vLLM cases' fresh runs are `vllm`-marked: they need the venv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlatrace.analysis import analyze
from mlatrace.trace import open_trace

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tests" / "progs" / "field_cases"))
from make_fixtures import CASES, VLLM_VENV, run_case  # noqa: E402

TINY_MODEL = Path(os.environ.get("MLATRACE_TINY_MODEL",
                                 Path.home() / ".cache" / "mlatrace" / "tiny-deepseek-v2-mla"))

VERDICTS = {
    "sglang_26019_triton_splits_not_refreshed": [("MLT006", "error")],
    "sglang_26019_triton_splits_per_replay": [],
    "vllm_53658_dummy_seq_lens_past_max_model_len": [],
    "vllm_53658_dummy_seq_lens_bounded_sizes": [],
    "aiter_3773_topk_decode_stride_full_width": [("MLT006", "warning")],
    "aiter_3773_topk_decode_one_block": [],
    "vllm_36611_flashmla_fp8_sched_meta_outside_graph": [("MLT003", "error")],
    "vllm_36611_flashmla_fp8_sched_meta_persistent": [],
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
@pytest.mark.parametrize("case", [c for c in CASES if not c.vllm], ids=lambda c: c.name)
def test_fresh_run_gives_the_fixture_verdict(case, tmp_path):
    run_case(case, tmp_path / "trace")
    assert _verdict(tmp_path / "trace") == VERDICTS[case.name]


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    """The tiny DeepSeek-V2 MLA model the vLLM cases load, built in the vLLM venv."""
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM venv at {VLLM_VENV} (build it: bash tests/e2e_vllm/setup_env.sh "
                    f"{VLLM_VENV}; or set MLATRACE_VLLM_VENV)")
    subprocess.run([str(python), str(ROOT / "tests" / "e2e_vllm" / "make_tiny_model.py"),
                    str(TINY_MODEL)], check=True, timeout=600)
    return TINY_MODEL


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c.vllm], ids=lambda c: c.name)
def test_fresh_vllm_run_gives_the_fixture_verdict(case, tiny_model, tmp_path):
    run_case(case, tmp_path / "trace")
    assert _verdict(tmp_path / "trace") == VERDICTS[case.name]
    fresh, kept = _records(tmp_path / "trace"), _records(FIXTURES / case.name)
    assert fresh[0]["argv"][-1].endswith(case.program)
    assert _dummy_sizes(fresh) == _dummy_sizes(kept)


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


def _dummy_sizes(records: list[dict]) -> list[tuple]:
    """(seq_len_max, max_model_len, block-table shape) of each dummy run's metadata build."""
    return [(r["seq_len_max"], r.get("max_model_len"), r.get("block_table"))
            for r in records if r["k"] == "attn.metadata" and r.get("dummy")]


def test_vllm_53658_dummy_runs_keep_seq_lens_past_max_model_len_beside_the_block_table():
    bad = _records(FIXTURES / "vllm_53658_dummy_seq_lens_past_max_model_len")
    assert {r["versions"]["vllm"] for r in bad if r["k"] == "process"} == {"0.32.0+cpu"}
    # the real CPUModelRunner's dummy runs, largest size first, as capture_model walks them
    assert [r["num_tokens"] for r in bad if r["k"] == "runner.dummy_run"] == [32, 16, 8]
    # every dummy request's seq_len is the run's num_tokens (32 requests of one token each),
    # the 32-token run's past max_model_len; the CPU runner's rows hold 8 pages of 16 tokens
    assert _dummy_sizes(bad) == [(32, 16, [32, 8]), (16, 16, [16, 8]), (8, 16, [8, 8])]
    assert [s for s, max_model_len, _ in _dummy_sizes(bad) if s > max_model_len] == [32]
    good = _records(FIXTURES / "vllm_53658_dummy_seq_lens_bounded_sizes")
    assert _dummy_sizes(good) == [(16, 16, [16, 8]), (8, 16, [8, 8])]
    # both then serve real decode steps, within max_model_len
    for records in (bad, good):
        steps = [r for r in records if r["k"] == "attn.metadata" and not r.get("dummy")]
        assert steps and max(r["seq_len_max"] for r in steps) <= 16


def test_vllm_36611_builds_hand_the_graph_fresh_or_persistent_scheduler_metadata():
    def tile_ptrs(name):
        records = _records(FIXTURES / name)
        assert {r["versions"]["vllm"] for r in records if r["k"] == "process"} == {"0.32.0+cpu"}
        return [r["ptrs"]["tile_scheduler_metadata"] for r in records
                if r["k"] == "attn.metadata" and r["backend"] == "FlashMLAMetadataBuilder"]

    fresh = tile_ptrs("vllm_36611_flashmla_fp8_sched_meta_outside_graph")
    persistent = tile_ptrs("vllm_36611_flashmla_fp8_sched_meta_persistent")
    # the capture's build, then 4 decode steps (repeats of an unchanged build are folded)
    assert len(fresh) == 5 and 2 <= len(persistent) <= 5
    assert len(set(persistent)) == 1            # copied into cg_buf_tile_scheduler_metadata
    assert len(set(fresh)) > 1                  # get_mla_metadata_dense_fp8's own tensors


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
