"""Every committed trace (tests/fixtures/*, samples/**) keeps its default `check` verdict.

A rule change that turns a healthy fixture red, or lets a bad one pass, fails here with
the fixture's name. A trace added without a row fails too: its verdict is what a reviewer
must see kept. Rows: (path, exit code of `mlatrace check` with default settings, the
rule ids of its error findings).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from mlatrace.exitcodes import MlatraceError
from mlatrace.output import check

ROOT = Path(__file__).resolve().parents[1]

VERDICTS = [
    ("samples/capture_triton", 0, ()),
    ("samples/gpu_backends/reference_device_lengths", 0, ()),
    ("samples/gpu_backends/reference_legacy_lengths", 1, ("MLT001",)),
    # batch 1, the grid capped at max_kv_splits = 16 CTAs, 45x growth: MLT008 error
    ("samples/gpu_backends/sglang_triton_device_splits", 1, ("MLT008",)),
    ("samples/gpu_backends/sglang_triton_device_splits_b16", 0, ()),
    ("samples/gpu_backends/vllm_triton_attn_2d_frozen", 1, ("MLT001",)),
    ("samples/gpu_backends/vllm_triton_mla_bucketed", 0, ()),
    ("samples/gpu_backends/vllm_triton_mla_frozen_max", 1, ("MLT006",)),
    ("samples/gpu_backends/vllm_triton_mla_frozen_one", 1, ("MLT001",)),
    # the same without the vLLM pack: MLT001 from the Triton launch probe, carrying MLT008
    ("samples/gpu_backends/vllm_triton_mla_frozen_one_nopack", 1, ("MLT001",)),
    ("samples/gpu_backends/vllm_triton_mla_own_bucketed", 0, ()),
    ("samples/gpu_backends/vllm_triton_mla_own_one", 1, ("MLT001",)),
    ("samples/hf_cb/transformers_cb_h200", 0, ()),
    ("samples/gpu_serve_bucketed_breakable", 0, ()),
    ("samples/gpu_serve_device", 0, ()),
    ("samples/gpu_serve_device_timed", 0, ()),
    ("samples/gpu_serve_legacy", 1, ("MLT001",)),
    ("samples/gpu_serve_legacy_8k", 1, ("MLT001",)),
    ("samples/gpu_serve_legacy_timed", 1, ("MLT001",)),
    ("samples/pypi_engine/gpuopt_runtime", 0, ()),
    ("samples/vllm_cpu_coverage", 3, ()),
    ("tests/fixtures/aiter_3773_topk_decode_one_block", 0, ()),
    ("tests/fixtures/aiter_3773_topk_decode_stride_full_width", 0, ()),
    ("tests/fixtures/aiter_4555_mla_gluon_bh16_batch_fills_budget", 0, ()),
    ("tests/fixtures/aiter_4555_mla_gluon_bh16_fixed_budget", 0, ()),
    ("tests/fixtures/aiter_4555_mla_gluon_bh64_asserts", 0, ()),
    ("tests/fixtures/all_garbage", 2, ()),
    ("tests/fixtures/device_healthy", 0, ()),
    ("tests/fixtures/device_tp2", 0, ()),
    ("tests/fixtures/flashinfer_187_vllm_decode_replan", 0, ()),
    ("tests/fixtures/flashinfer_4002_fa2_no_split_exact_grid", 0, ()),
    ("tests/fixtures/flashinfer_4002_fa2_no_split_padded_grid", 0, ()),
    ("tests/fixtures/flashinfer_4390_mla_decode_explicit_backend", 0, ()),
    ("tests/fixtures/flashinfer_4390_mla_decode_runner_per_graph", 0, ()),
    ("tests/fixtures/flashinfer_4647_trtllm_decode_max_model_len", 0, ()),
    ("tests/fixtures/flashinfer_4647_trtllm_decode_representative", 0, ()),
    ("tests/fixtures/flashinfer_641_prefill_padded_batch_bounded", 0, ()),
    ("tests/fixtures/flashinfer_641_prefill_padded_batch_distribution", 1, ("MLT007",)),
    ("tests/fixtures/garbage_line", 1, ("MLT001",)),
    ("tests/fixtures/legacy_one_split", 1, ("MLT001",)),
    ("tests/fixtures/legacy_tp2", 1, ("MLT001",)),
    ("tests/fixtures/missing_header", 1, ("MLT001",)),
    ("tests/fixtures/mixed_full", 1, ("MLT005",)),
    ("tests/fixtures/newer_schema", 1, ("MLT001",)),
    ("tests/fixtures/pa_v1_beyond", 1, ("MLT002",)),
    ("tests/fixtures/sglang_22800_fa3_scheduler_metadata_fits", 0, ()),
    ("tests/fixtures/sglang_22800_fa3_scheduler_metadata_too_small", 0, ()),
    ("tests/fixtures/sglang_26019_triton_splits_not_refreshed", 1, ("MLT006",)),
    ("tests/fixtures/sglang_26019_triton_splits_per_replay", 0, ()),
    ("tests/fixtures/sglang_34580_aiter_mla_capture_at_max", 0, ()),
    ("tests/fixtures/sglang_34580_aiter_mla_one_split", 1, ("MLT001",)),
    ("tests/fixtures/sglang_37975_flashinfer_mla_graph_kv_indptr", 0, ()),
    ("tests/fixtures/sglang_37975_flashinfer_mla_kv_indptr", 1, ("MLT003",)),
    ("tests/fixtures/sglang_40441_dsv4_decode_width_1m", 0, ()),
    ("tests/fixtures/sglang_40442_dsv4_decode_width_phase", 0, ()),
    ("tests/fixtures/sglang_gfx950_mla_launch_plan_budget", 0, ()),
    ("tests/fixtures/sglang_gfx950_mla_launch_plan_one_split", 1, ("MLT001",)),
    ("tests/fixtures/trtllm_15556_flashinfer_plan_num_blocks_frozen", 0, ()),
    ("tests/fixtures/trtllm_15556_flashinfer_plan_num_blocks_representative", 0, ()),
    ("tests/fixtures/trtllm_16706_t5_bias_from_capture", 1, ("MLT006",)),
    ("tests/fixtures/trtllm_16706_t5_bias_rebuilt", 0, ()),
    ("tests/fixtures/trtllm_7285_autotuner_fallback_in_capture", 0, ()),
    ("tests/fixtures/trtllm_7285_autotuner_tuned_graph_sizes", 0, ()),
    ("tests/fixtures/truncated_last_line", 1, ("MLT001",)),
    ("tests/fixtures/vllm_20301_fa3_num_splits", 1, ("MLT007",)),
    ("tests/fixtures/vllm_25274_fa3_split_cap_16", 0, ()),
    ("tests/fixtures/vllm_25495_fa3_split_cap_32", 0, ()),
    ("tests/fixtures/vllm_28015_mla_mtp_decode", 0, ()),
    ("tests/fixtures/vllm_28015_mla_mtp_prefill", 1, ("MLT005",)),
    ("tests/fixtures/vllm_35175_flashmla_fp8_persistent", 0, ()),
    ("tests/fixtures/vllm_35175_flashmla_fp8_scheduler", 1, ("MLT003",)),
    ("tests/fixtures/vllm_36611_flashmla_fp8_sched_meta_persistent", 0, ()),
    ("tests/fixtures/vllm_36611_flashmla_fp8_sched_meta_outside_graph", 1, ("MLT003",)),
    ("tests/fixtures/vllm_38719_aiter_mla_fp8_plan_bf16", 1, ("MLT007",)),
    ("tests/fixtures/vllm_38719_aiter_mla_fp8_plan_fp8", 0, ()),
    ("tests/fixtures/vllm_53658_dummy_seq_lens_bounded_sizes", 0, ()),
    ("tests/fixtures/vllm_53658_dummy_seq_lens_past_max_model_len", 0, ()),
    ("tests/fixtures/vllm_runner_v2_breakable_piecewise", 0, ()),
    ("tests/fixtures/vllm_runner_v2_full_device_splits", 0, ()),
    ("tests/fixtures/vllm_runner_v2_full_frozen_one_split", 1, ("MLT001",)),
]


def committed_traces() -> set[str]:
    """Folders holding a trace (a run.json or a p<pid>.jsonl) under the two fixture roots."""
    found = set()
    for pattern in ("tests/fixtures/*/*", "samples/**/run.json", "samples/**/p*.jsonl"):
        for path in ROOT.glob(pattern):
            if path.is_file() and (path.name == "run.json" or path.suffix == ".jsonl"):
                found.add(str(path.parent.relative_to(ROOT)))
    return found


def verdict(path: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[int, tuple]:
    monkeypatch.chdir(tmp_path)   # default settings: no mlatrace.toml / pyproject picked up
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = check.main(str(ROOT / path))
        except MlatraceError as error:   # an unusable trace: the CLI turns it into exit 2
            code = error.code
    errors = sorted({line.split()[0] for line in out.getvalue().splitlines()
                     if line.startswith("MLT") and line.split()[1:2] == ["error"]})
    return code, tuple(errors)


@pytest.mark.parametrize(("path", "code", "errors"), VERDICTS, ids=[v[0] for v in VERDICTS])
def test_fixture_keeps_its_verdict(path, code, errors, monkeypatch, tmp_path):
    if not (ROOT / path).is_dir():
        pytest.fail(f"{path}: a committed trace is gone (drop its row only on purpose)")
    assert verdict(path, monkeypatch, tmp_path) == (code, errors)


def test_every_committed_trace_has_a_verdict_row(monkeypatch, tmp_path):
    missing = sorted(committed_traces() - {v[0] for v in VERDICTS})
    rows = [f'    ("{p}", *{verdict(p, monkeypatch, tmp_path)!r}),' for p in missing]
    assert not missing, "traces without a verdict row (their verdict now):\n" + "\n".join(rows)
