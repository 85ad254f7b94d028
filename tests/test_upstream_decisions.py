"""The frozen decisions reported upstream, as the shipped packs record them: each hand-made
fixture (tests/fixtures/make_upstream_fixtures.py, folders named after the thread) keeps its
verdict, the packs' targets exist in the vllm 0.33.0 / sglang 0.5.23 / flashinfer 0.7.4
snapshot, and the decision handlers work in a real traced process (a decision whose inputs
cannot be read is reported once, and the coverage says so)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlatrace import decisions
from mlatrace.analysis import analyze
from mlatrace.trace import open_trace

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name, verdict", [
    ("flashinfer_4647_trtllm_decode_max_model_len", [("MLT006", "warning")]),
    ("flashinfer_4647_trtllm_decode_representative", []),
    ("sglang_40441_dsv4_decode_width_1m", [("MLT006", "warning")]),
    ("sglang_40442_dsv4_decode_width_phase", []),
    ("vllm_38719_aiter_mla_fp8_plan_bf16", [("MLT007", "error")]),
    ("vllm_38719_aiter_mla_fp8_plan_fp8", []),
    ("sglang_22800_fa3_scheduler_metadata_too_small", []),
    ("sglang_22800_fa3_scheduler_metadata_fits", []),
    ("trtllm_15556_flashinfer_plan_num_blocks_frozen", [("MLT006", "warning")]),
    ("trtllm_15556_flashinfer_plan_num_blocks_representative", []),
    ("sglang_gfx950_mla_launch_plan_one_split", [("MLT001", "error")]),
    ("sglang_gfx950_mla_launch_plan_budget", []),
])
def test_upstream_fixture_verdicts(name, verdict):
    found = analyze(open_trace(FIXTURES / name)).findings
    assert [(f.id, f.severity) for f in found] == verdict


def test_named_decisions_are_the_findings_subject():
    by_name = {
        "flashinfer_4647_trtllm_decode_max_model_len": "flashinfer.trtllm_decode.max_seq_len",
        "sglang_40441_dsv4_decode_width_1m": "sglang.dsv4.decode_graph_max_seq_len",
        "vllm_38719_aiter_mla_fp8_plan_bf16": "aiter.mla.kv_dtype",
        "sglang_gfx950_mla_launch_plan_one_split": "sglang.triton.mla_num_kv_splits",
    }
    for name, decision in by_name.items():
        finding = analyze(open_trace(FIXTURES / name)).findings[0]
        assert decision in finding.message, (name, finding.message)


def test_fa3_capture_failure_names_the_sizes():
    # sglang#22800 fails at capture: no replay to judge, the trace keeps the decision's sizes
    model = analyze(open_trace(FIXTURES / "sglang_22800_fa3_scheduler_metadata_too_small"))
    assert not model.findings
    path = next((FIXTURES / "sglang_22800_fa3_scheduler_metadata_too_small").glob("p*.jsonl"))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    decision = next(r for r in records if r["k"] == "host.decision")
    assert decision["value"] > decision["inputs"]["buffer_size"]
    assert all("metadata_size" in r["error"] for r in records if r["k"] == "graph.capture.end")


def test_triton_attn_formula_follows_the_threshold():
    base = {"max_query_len": 1, "nhead": 32, "num_kv_heads": 8, "seq_threshold_3D": 16,
            "num_par_softmax_segments": 16, "scratch_rows": 16}
    assert decisions.value_at("vllm.triton_attn.num_kv_splits", {**base, "num_reqs": 16,
                                                                 "num_tokens": 16}) == 16
    assert decisions.value_at("vllm.triton_attn.num_kv_splits", {**base, "num_reqs": 17,
                                                                 "num_tokens": 17}) == 1
    # scratch rows fewer than the query tokens: 2D whatever the batch
    assert decisions.value_at("vllm.triton_attn.num_kv_splits", {**base, "num_reqs": 8,
                                                                 "num_tokens": 32}) == 1
    # speculative decode (q_len 4, BLOCK_Q 4): one Q block per request
    assert decisions.value_at("vllm.triton_attn.num_kv_splits",
                              {**base, "max_query_len": 4, "num_reqs": 16, "num_tokens": 64,
                               "scratch_rows": 64}) == 16


PACK = """
[pack]
name = "t"
library = "mlatrace"
checked = ["test"]

[[probe]]
name = "unified"
targets = ["kern_mod:unified_attention"]
params = ["q", "k", "v", "out", "cu_seqlens_q", "max_seqlen_q", "seqused_k", "max_seqlen_k"]
handler = "mlatrace.probe.handlers.decision:Decision"
[probe.options]
formula = "vllm.triton_attn.num_kv_splits"
require = ["num_reqs", "num_tokens", "nhead", "num_kv_heads"]
[probe.fields]
inputs.num_reqs = "len(args.seqused_k)"
inputs.max_query_len = "args.max_seqlen_q"
inputs.num_tokens = "args.q.shape[0]"
inputs.nhead = "args.q.shape[1]"
inputs.num_kv_heads = "args.k.shape[2]"
inputs.seq_threshold_3D = "args.seq_threshold_3D"
inputs.num_par_softmax_segments = "args.num_par_softmax_segments"
capturing = "capturing()"

[[probe]]
name = "dtype"
targets = ["kern_mod:plan"]
params = ["indptr"]
handler = "mlatrace.probe.handlers.upstream:HostDecision"
[probe.options]
name = "t.kv_dtype"
value = "args.dtype_kv"
text = true
default = "torch.bfloat16"
[probe.fields]
capturing = "capturing()"
"""

MODULE = """
class T:
    def __init__(self, *shape):
        self.shape = shape

def unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k,
                      seq_threshold_3D=None, num_par_softmax_segments=None):
    return None

def plan(indptr, dtype_kv=None):
    return None
"""


def _trace(tmp_path: Path, program: str) -> tuple[list[dict], subprocess.CompletedProcess]:
    (tmp_path / "kern_mod.py").write_text(textwrap.dedent(MODULE))
    (tmp_path / "p.toml").write_text(PACK)
    out = tmp_path / "trace"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(out), "--probes",
                    str(tmp_path / "p.toml"), "--", sys.executable, "-c", program],
                   check=True, env=env, cwd=tmp_path, capture_output=True, timeout=120)
    records = [json.loads(line) for p in out.glob("p*.jsonl") for line in p.read_text().splitlines()]
    check = subprocess.run([sys.executable, "-m", "mlatrace", "check", str(out)], env=env,
                           capture_output=True, text=True, timeout=120)
    return records, check


def test_decision_handlers_record_in_a_traced_process(tmp_path):
    records, _ = _trace(tmp_path, textwrap.dedent("""
        import kern_mod as m
        q, k = m.T(32, 32, 128), m.T(100, 16, 8, 128)
        m.unified_attention(q, k, k, q, None, 1, [0] * 32, 1, seq_threshold_3D=16,
                            num_par_softmax_segments=16)
        m.unified_attention(q, k, k, q, None, 1, [0] * 8, 1, seq_threshold_3D=16,
                            num_par_softmax_segments=16)
        m.plan(None)
        m.plan(None, dtype_kv="torch.float8_e4m3fn")
    """))
    got = [(r["name"], r["value"]) for r in records if r["k"] == "host.decision"]
    assert got == [("vllm.triton_attn.num_kv_splits", 1), ("vllm.triton_attn.num_kv_splits", 16),
                   ("t.kv_dtype", "torch.bfloat16"), ("t.kv_dtype", "torch.float8_e4m3fn")]
    assert not [r for r in records if r["k"] == "probe.error"]


def test_unreadable_decision_inputs_are_reported_once_and_blind_the_check(tmp_path):
    # q lost its .shape (an attribute renamed upstream): the decision cannot be evaluated
    records, check = _trace(tmp_path, textwrap.dedent("""
        import kern_mod as m
        q, k = object(), m.T(100, 16, 8, 128)
        for _ in range(3):
            m.unified_attention(q, k, k, q, None, 1, [0] * 32, 1)
    """))
    errors = [r for r in records if r["k"] == "probe.error"]
    assert len(errors) == 1 and "inputs not readable: num_tokens, nhead" in errors[0]["error"]
    assert not [r for r in records if r["k"] == "host.decision"]
    assert check.returncode == 3 and "inputs not readable" in check.stdout
