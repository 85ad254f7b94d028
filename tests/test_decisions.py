"""host.decision: decision functions, rules MLT001/002/003/005/006/007 over real GPU traces
(samples/gpu_backends) and over the hand-made fixtures named after their upstream threads,
the MLT004 capture set-up, decision probes through a real traced process, and
`probes doctor --source` with the vLLM 0.33.0 / SGLang 0.5.23 signature snapshot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO
from synth import SynthProcess, write_run

from mlatrace import decisions
from mlatrace.analysis import Config, analyze
from mlatrace.probe import default_pack_paths
from mlatrace.probe.commands import check_static
from mlatrace.probe.packs import load_pack
from mlatrace.probe.source import compare, signatures
from mlatrace.probe.triton_launch import DEFAULT_KERNEL_FILTER
from mlatrace.reference import policies
from mlatrace.trace import open_trace

GPU = REPO / "samples" / "gpu_backends"


def findings(path: Path, config: Config | None = None) -> list:
    return analyze(open_trace(path), config).findings


def evidence_ok(finding, root: Path) -> None:
    assert finding.evidence
    for ev in finding.evidence:
        lines = (root / ev.file).read_text().splitlines()
        hit = [line for line in lines if f'"seq":{ev.seq},' in line]
        assert hit and f'"k":"{ev.kind}"' in hit[0], (ev, finding.id)


# -- decision functions -------------------------------------------------------------
def test_triton_mla_splits_match_the_gpu_run():
    # samples/gpu_backends/measured_h200.txt: vLLM 0.33's own _compute_num_kv_splits on 132 SMs
    log = (GPU / "measured_h200.txt").read_text()
    seen = {int(m[1]): int(m[2]) for m in re.finditer(r"capture=bucket decide=host len=(\d+) splits=(\d+)", log)}
    assert len(seen) == 8
    for length, splits in seen.items():
        assert decisions.triton_mla_splits(length, 132) == splits


@pytest.mark.parametrize("sm", [132, 80, 100])
def test_triton_mla_range_is_exactly_where_the_value_holds(sm):
    for length in list(range(0, 5000, 7)) + [65535, 66047, 66048, 131583, 131584, 10**6]:
        value = decisions.triton_mla_splits(length, sm)
        lo, hi = decisions.triton_mla_range(value, sm)
        assert lo <= length and (hi is None or length <= hi), (length, value, lo, hi)
        for edge in (lo - 1, (hi + 1) if hi is not None else None):
            if edge is not None and edge >= 0:
                assert decisions.triton_mla_splits(edge, sm) != value


def test_bucketed_range_and_legacy_are_the_reference_policies():
    for length in (0, 1, 64, 65, 4096, 4097, 16384, 65536, 65537, 10**6):
        value = decisions.bucketed_splits(length)
        lo, hi = decisions.bucketed_range(value)
        assert lo <= length and (hi is None or length <= hi)
        assert policies.num_kv_splits("bucketed", 1, 1, 16, length) == value
        for batch, nhead in ((1, 16), (8, 16), (4, 128)):
            assert policies.num_kv_splits("legacy", batch, 1, nhead, length) == \
                decisions.legacy_splits(length, batch=batch, nhead=nhead)
    assert policies.num_kv_splits("legacy", 1, 1, 16, 1) == 1  # seed 002's frozen pin


def test_fa3_heuristic_bounds():
    assert decisions.fa3_splits(100000, num_reqs=32, num_heads_kv=8) == 1  # SMs already full
    assert decisions.fa3_splits(256, num_reqs=1, num_heads_kv=8) == 1      # <= 4 KV blocks
    for cap in (1, 16, 32):
        assert decisions.fa3_splits(131072, num_heads_kv=1, max_num_splits=cap) <= cap
    assert decisions.fa3_splits(131072, num_heads_kv=4) == 29  # vllm#25274's cap 16 binds
    assert decisions.fa3_splits(131072, num_heads_kv=4, max_num_splits=32) == 28  # within 85%


def test_analysis_policies_have_one_home():
    assert not (REPO / "mlatrace" / "analysis" / "policies.py").exists()
    assert policies.BUCKETS is decisions.BUCKETS


# -- real GPU traces: vLLM 0.33 and SGLang 0.5.23 Triton decode on the H200 ----------
def test_gpu_vllm_frozen_at_one_is_mlt001():
    root = GPU / "vllm_triton_mla_frozen_one"
    found = findings(root)
    assert [f.id for f in found] == ["MLT001"]
    f = found[0]
    assert f.details["decision"] == "vllm.triton_mla.num_kv_splits"
    assert f.details["decision_at_replay"]["hi"] == 256
    evidence_ok(f, root)


def test_gpu_vllm_frozen_at_max_model_len_is_mlt006_error():
    root = GPU / "vllm_triton_mla_frozen_max"
    found = findings(root)
    assert [(f.id, f.severity) for f in found] == [("MLT006", "error")]
    f = found[0]
    assert f.details["captured"] == 256 and f.details["valid"] == {"seq_len_max": [66048, 131583]}
    assert f.details["replay_input"] == 824 and f.details["decision_at_replay"]["lo"] == 1
    evidence_ok(f, root)


def test_gpu_vllm_one_graph_per_bucket_is_clean():
    # five captures, four of them after earlier replays: torch.cuda.graph's own
    # synchronize and the driver's pre-capture synchronize are capture set-up (MLT004 not)
    root = GPU / "vllm_triton_mla_bucketed"
    text = (root / next(p.name for p in root.glob("p*.jsonl"))).read_text()
    assert "torch/cuda/graphs.py" in text
    assert findings(root) == []


def test_gpu_sglang_device_side_splits_stay_clean_of_decision_rules():
    root = GPU / "sglang_triton_device_splits"
    found = findings(root)
    # no pack-based rule: the split is chosen on device (its own accuracy check, .item()
    # between replays, is MLT004); at batch 1 the grid is capped at max_kv_splits = 16
    # CTAs on 132 SMs and the replays grow with the length: MLT008 (tests/test_kernels.py)
    # (MLT008 is an error there: 45x growth; errors are listed first)
    assert [f.id for f in found] == ["MLT008", "MLT004"]
    assert "drive.py" in found[1].message and "item" in found[1].message


def test_gpu_traces_have_the_triton_decode_launches():
    pattern = re.compile(DEFAULT_KERNEL_FILTER)
    for name in ("_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2"):
        assert pattern.search(name)
    for trace in ("vllm_triton_mla_frozen_max", "sglang_triton_device_splits"):
        root = GPU / trace
        kinds = [json.loads(line) for p in root.glob("p*.jsonl") for line in p.read_text().splitlines()]
        names = {r.get("name") for r in kinds if r["k"] == "kernel.launch"}
        assert {"_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2"} <= names, names


# -- hand-made fixtures, named after their upstream threads ---------------------------
EXPECTED = {
    "vllm_20301_fa3_num_splits": [("MLT007", "error")],
    "vllm_25274_fa3_split_cap_16": [("MLT002", "warning")],
    "vllm_25495_fa3_split_cap_32": [],
    "vllm_35175_flashmla_fp8_scheduler": [("MLT003", "error")],
    "vllm_35175_flashmla_fp8_persistent": [],
    "vllm_28015_mla_mtp_prefill": [("MLT005", "error")],
    "vllm_28015_mla_mtp_decode": [],
    "sglang_34580_aiter_mla_one_split": [("MLT001", "error")],
    "sglang_34580_aiter_mla_capture_at_max": [],
    "aiter_4555_mla_gluon_bh16_fixed_budget": [],
    "aiter_4555_mla_gluon_bh16_batch_fills_budget": [],
    "aiter_4555_mla_gluon_bh64_asserts": [],
    "flashinfer_187_vllm_decode_replan": [],
    "flashinfer_641_prefill_padded_batch_distribution": [("MLT007", "error")],
    "flashinfer_641_prefill_padded_batch_bounded": [],
    "sglang_37975_flashinfer_mla_kv_indptr": [("MLT003", "error")],
    "sglang_37975_flashinfer_mla_graph_kv_indptr": [],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_upstream_thread_fixtures(name):
    root = FIXTURES / name
    found = findings(root)
    assert [(f.id, f.severity) for f in found] == EXPECTED[name]
    for f in found:
        evidence_ok(f, root)


def test_aiter_4555_fixed_budget_and_the_bh64_bound():
    # ROCm/aiter @e4048607 mla_gluon.py: bh16 from the budget alone, bh64 still bounded
    assert decisions.fixed_budget_splits(batch=8, nhead=16) == 32
    assert decisions.fixed_budget_splits(batch=8, nhead=96, qlen=2) == 2
    assert decisions.fixed_budget_splits(batch=256, nhead=16) == 1
    assert decisions.legacy_splits(1, batch=8, nhead=16) == 1  # the pre-#4555 pin
    assert decisions.gluon_bh64_splits(64, 64) == 4     # base grid 64 -> 4 splits
    assert decisions.gluon_bh64_splits(64, 128) == 2    # two head blocks -> 128
    assert decisions.gluon_bh64_splits(128, 128) == 1
    assert decisions.gluon_bh64_min_kv_seq_len(4) == 784
    assert decisions.gluon_bh64_min_kv_seq_len(2) == 388
    # the healthy bh16 capture launched the budget's splits although min_kv_seq_len was 1
    root = FIXTURES / "aiter_4555_mla_gluon_bh16_fixed_budget"
    recs = [json.loads(line) for line in (root / "p3500.jsonl").read_text().splitlines()]
    launch = next(r for r in recs if r["k"] == "kernel.launch" and r["name"] == "_mla_gluon")
    assert launch["const"]["NUM_KV_SPLITS"] == 32 and launch["grid"] == [8, 32, 1]
    # bh64: the capture raised on the assertion, nothing was replayed
    root = FIXTURES / "aiter_4555_mla_gluon_bh64_asserts"
    recs = [json.loads(line) for line in (root / "p3500.jsonl").read_text().splitlines()]
    ends = [r for r in recs if r["k"] == "graph.capture.end"]
    assert ends and all("min_kv_seq_len > 388" in r["error"] for r in ends)
    assert not any(r["k"] in ("graph.replay", "kernel.launch") for r in recs)
    # and the report says so: --json carries the capture's error, the text names it
    done = subprocess.run([sys.executable, "-m", "mlatrace", "report", "--json", str(root)],
                          capture_output=True, text=True, timeout=120)
    [unit] = json.loads(done.stdout)["graphs"]
    assert "requires min_kv_seq_len > 388" in unit["capture_error"]
    done = subprocess.run([sys.executable, "-m", "mlatrace", "report", str(root)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert "capture failed: rank 0 pid 3500 gid 1" in done.stdout, done.stdout
    assert "mla_gluon[bh64] requires" in done.stdout


def test_flashinfer_graph_padded_batch_size():
    # scheduler.cuh: max(2 * SMs // kv_heads, query tiles); sglang#31349's H100 case: 2 KV
    # heads -> grid x 132 although two requests need 2 tiles
    assert decisions.flashinfer_split_budget(2, 66) == 66
    assert decisions.flashinfer_graph_padded_batch_size([1, 1], num_kv_heads=2, group=8,
                                                        cta_tile_q=16, num_sms=132) == 132
    # flashinfer#641's example: 128 rows over 2 requests, cta_tile_q 64
    ragged = decisions.flashinfer_tiles_q([63, 65], group=1, cta_tile_q=64, bounded=False)
    even = decisions.flashinfer_tiles_q([64, 64], group=1, cta_tile_q=64, bounded=False)
    assert (ragged, even) == (3, 2)
    bound = decisions.flashinfer_tiles_q([64, 64], group=1, cta_tile_q=64, bounded=True)
    assert bound == decisions.flashinfer_tiles_q([1, 127], group=1, cta_tile_q=64, bounded=True)
    assert bound >= max(ragged, even)
    (f,) = findings(FIXTURES / "flashinfer_641_prefill_padded_batch_distribution")
    assert f.details["captured"] == 32 and f.details["eager"] and 32 not in f.details["eager"]


def test_sglang_flashinfer_mla_drift_names_kv_indptr():
    (f,) = findings(FIXTURES / "sglang_37975_flashinfer_mla_kv_indptr")
    assert f.details["buffers"] == ["kv_indptr"] and f.details["drifted_replays"] == 12


def test_one_split_that_the_batch_alone_explains_is_not_mlt001():
    # the same trace at batch 8 with one split launched is MLT001: only the budget excuses it
    root = FIXTURES / "sglang_34580_aiter_mla_one_split"
    assert [f.id for f in findings(root)] == ["MLT001"]
    assert findings(FIXTURES / "aiter_4555_mla_gluon_bh16_batch_fills_budget") == []


def test_flashmla_scheduler_drift_names_both_buffers_in_one_finding():
    (f,) = findings(FIXTURES / "vllm_35175_flashmla_fp8_scheduler")
    assert f.details["buffers"] == ["tile_scheduler_metadata", "num_splits"]


# -- rules on small traces ---------------------------------------------------------
def _decision_trace(root: Path, *, captured: dict, eager: dict | None = None,
                    replay_lens=(100000,), valid=None) -> Path:
    write_run(root)
    proc = SynthProcess(root, 4000)
    proc.emit("attn.metadata", backend="b", num_reqs=1, seq_len_min=1, seq_len_max=1,
              capturing=False, ptrs={})
    proc.emit("graph.capture.begin", gid=1, parent=None, src="torch", key=None, mode=None)
    extra = {"valid": valid} if valid else {}
    proc.emit("host.decision", capturing=True, gid=1, **captured, **extra)
    proc.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
    for length in replay_lens:
        proc.emit("attn.metadata", backend="b", num_reqs=1, seq_len_min=length,
                  seq_len_max=length, capturing=False, ptrs={})
        if eager:
            proc.emit("host.decision", capturing=False, gid=None, **eager)
        proc.replay(1)
    proc.write()
    return root


def test_mlt006_factor_warning_is_configurable(tmp_path):
    root = _decision_trace(tmp_path / "t", captured={
        "name": "x.workspace_rows", "value": 64, "inputs": {"seq_len_max": 1}})
    (f,) = findings(root)
    assert (f.id, f.severity) == ("MLT006", "warning")
    assert findings(root, Config(far_factor=10**6)) == []


def test_mlt006_valid_range_error_whatever_the_factor(tmp_path):
    root = _decision_trace(tmp_path / "t", replay_lens=(2049,), captured={
        "name": "x.bucket", "value": 16, "inputs": {"seq_len_max": 1024}},
        valid={"seq_len_max": [1024, 2048]})
    assert [(f.id, f.severity) for f in findings(root)] == [("MLT006", "error")]
    inside = _decision_trace(tmp_path / "u", replay_lens=(2048,), captured={
        "name": "x.bucket", "value": 16, "inputs": {"seq_len_max": 1024}},
        valid={"seq_len_max": [1024, 2048]})
    assert findings(inside) == []


def test_eager_same_value_holds_and_other_value_is_mlt007(tmp_path):
    captured = {"name": "x.num_kv_splits", "value": 4, "inputs": {"seq_len_max": 1}}
    same = _decision_trace(tmp_path / "same", captured=captured, eager=dict(captured))
    assert findings(same) == []
    other = _decision_trace(tmp_path / "other", captured=captured,
                            eager={**captured, "value": 64, "inputs": {"seq_len_max": 100000}})
    assert [f.id for f in findings(other)] == ["MLT007"]


def test_a_decision_just_before_a_capture_is_the_captures(tmp_path):
    def trace(root: Path, *, replay_between: bool) -> Path:
        write_run(root)
        proc = SynthProcess(root, 4100)
        proc.emit("host.decision", name="x.plan", value=32, inputs={"num_reqs": 8},
                  capturing=False, gid=None)
        if replay_between:  # an older graph replayed after that plan: not this capture's
            proc.emit("graph.capture.begin", gid=9, parent=None, src="torch", key=None, mode=None)
            proc.emit("graph.capture.end", gid=9, segments=1, eager_breaks=0, dur_ns=1)
            proc.replay(9)
        proc.emit("graph.capture.begin", gid=1, parent=None, src="torch", key=None, mode=None)
        proc.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
        for _ in range(3):
            proc.emit("host.decision", name="x.plan", value=48, inputs={"num_reqs": 8},
                      capturing=False, gid=None)
            proc.replay(1)
        proc.write()
        return root

    (f,) = findings(trace(tmp_path / "a", replay_between=False))
    assert f.id == "MLT007" and f.details["captured"] == 32
    assert [x.id for x in findings(trace(tmp_path / "b", replay_between=True))] == []


def test_split_decision_of_one_is_mlt001_not_mlt006(tmp_path):
    root = _decision_trace(tmp_path / "t", captured={
        "name": "engine.attn.num_splits", "value": 1, "inputs": {"seq_len_max": 1}})
    f, = findings(root)
    assert f.id == "MLT001" and f.details["block_n"] == 64  # block_n 64 when not recorded


def test_mlt004_step_sync_still_counted_without_a_capture_after(tmp_path):
    write_run(tmp_path / "t")
    proc = SynthProcess(tmp_path / "t", 4100)
    proc.emit("graph.capture.begin", gid=1, parent=None, src="torch", key=None, mode=None)
    proc.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
    proc.replay(1)
    proc.emit("sync", op="item", capturing=False, gid=None, where="engine.py:10")
    proc.replay(1)
    proc.emit("sync", op="synchronize", capturing=False, gid=None,
              where="/x/site-packages/torch/cuda/graphs.py:239")
    proc.emit("sync", op="synchronize", capturing=False, gid=None, where="runner.py:5")
    proc.emit("graph.capture.begin", gid=2, parent=None, src="torch", key=None, mode=None)
    proc.emit("graph.capture.end", gid=2, segments=1, eager_breaks=0, dur_ns=1)
    proc.replay(2)
    proc.write()
    found = findings(tmp_path / "t")
    assert [f.id for f in found] == ["MLT004"] and "engine.py:10" in found[0].message


# -- decision probes in a real traced process -------------------------------------
def test_decision_probes_record_host_decision(tmp_path):
    (tmp_path / "backend_mod.py").write_text(textwrap.dedent("""
        def compute_num_kv_splits(max_seq_len, sm_count):
            return 7

        def plan(max_seq_len, sm_count):
            return None
    """))
    pack = tmp_path / "p.toml"
    pack.write_text(textwrap.dedent("""
        [pack]
        name = "t"
        library = "mlatrace"
        checked = ["test"]

        [[probe]]
        name = "declared"
        targets = ["backend_mod:compute_num_kv_splits"]
        params = ["max_seq_len", "sm_count"]
        kind = "host.decision"
        when = "return"
        [probe.fields]
        name = "'t.num_kv_splits'"
        value = "result"
        inputs.seq_len_max = "args.max_seq_len"
        capturing = "capturing()"

        [[probe]]
        name = "formula"
        targets = ["backend_mod:plan"]
        params = ["max_seq_len", "sm_count"]
        handler = "mlatrace.probe.handlers.decision:Decision"
        [probe.options]
        formula = "vllm.triton_mla.num_kv_splits"
        [probe.fields]
        inputs.seq_len_max = "args.max_seq_len"
        inputs.sm_count = "args.sm_count"
        capturing = "capturing()"
    """))
    out = tmp_path / "trace"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(out), "--probes",
                    str(pack), "--", sys.executable, "-c",
                    "import backend_mod; backend_mod.compute_num_kv_splits(9000, 132); "
                    "backend_mod.plan(9000, 132)"], check=True, env=env, cwd=tmp_path,
                   capture_output=True, timeout=120)
    records = [json.loads(line) for p in out.glob("p*.jsonl") for line in p.read_text().splitlines()]
    got = {r["name"]: r for r in records if r["k"] == "host.decision"}
    assert got["t.num_kv_splits"]["value"] == 7
    assert got["t.num_kv_splits"]["inputs"] == {"seq_len_max": 9000}
    formula = got["vllm.triton_mla.num_kv_splits"]
    assert formula["value"] == 32 and formula["valid"] == {"seq_len_max": [8704, 16895]}
    assert not [r for r in records if r["k"] == "probe.error"]


# -- probes doctor --source and the signature snapshot -------------------------------
def test_static_signatures_and_drift(tmp_path):
    pkg = tmp_path / "src" / "lib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(textwrap.dedent("""
        import os
        class Base:
            def run(self, a, *, b=1, **kw): ...
        class Child(Base):
            pass
        def free(x, y, *rest): ...
    """))
    found = signatures(tmp_path / "src", ["lib.mod:Base.run", "lib.mod:Child.run",
                                          "lib.mod:free", "lib.mod:gone", "lib.other:f"])
    assert found["lib.mod:Base.run"]["params"] == ["self", "a", "b", "**kw"]
    assert found["lib.mod:Child.run"]["status"] == "inherited"
    assert found["lib.mod:gone"]["status"] == "absent"
    assert found["lib.other:f"]["status"] == "absent"
    assert compare(["x", "y"], ["y"], found["lib.mod:free"])[0] == "ok"
    assert compare(["x", "z"], [], found["lib.mod:free"])[0] == "drift"
    pack = tmp_path / "p.toml"
    pack.write_text('[pack]\nname = "t"\nlibrary = "lib"\nchecked = ["x"]\n\n'
                    '[[probe]]\nname = "p"\ntargets = ["lib.mod:free"]\nparams = ["x", "z"]\n'
                    'kind = "attn.call"\n')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "mlatrace", "probes", "doctor", "--probes",
                           str(pack), "--source", str(tmp_path / "src")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "DRIFT" in proc.stdout and "lib.mod:free" in proc.stdout


def test_static_check_leaves_out_a_pack_for_another_version(tmp_path):
    from mlatrace.probe.source import source_versions

    (tmp_path / "sglang-0.5.13.dist-info").mkdir()
    (tmp_path / "flashinfer_python-0.7.4.dist-info").mkdir()
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    assert source_versions(tmp_path) == {"sglang": "0.5.13", "flashinfer": "0.7.4"}
    packs = {p.name: p for p in map(load_pack, default_pack_paths())}
    found = signatures(tmp_path, [t for n in ("sglang", "sglang_legacy_runner")
                                  for s in packs[n].probes for t in s.targets])
    results = check_static([packs["sglang"], packs["sglang_legacy_runner"]], found,
                           source_versions(tmp_path))
    assert {r.status for r in results if r.pack == "sglang"} == {"other version"}
    assert {r.status for r in results if r.pack == "sglang_legacy_runner"} == {"drift"}


def test_shipped_packs_match_vllm_033_and_sglang_0523_snapshot():
    snapshot = json.loads((Path(__file__).parent / "probe_signatures.json").read_text())
    assert snapshot["releases"] == {"vllm": "0.33.0", "sglang": "0.5.23", "flashinfer": "0.7.4"}
    packs = [load_pack(p) for p in default_pack_paths()]
    results = check_static(packs, snapshot["targets"], snapshot["releases"])
    by_pack: dict[str, list] = {}
    for r in results:
        by_pack.setdefault(r.pack, []).append(r)
    for name in ("vllm_triton_mla", "vllm_flash_attn", "sglang_triton", "sglang_aiter",
                 "vllm_mla", "vllm_cudagraph", "sglang", "flashinfer", "sglang_flashinfer", "vllm_flashinfer"):
        drift = [r for r in by_pack[name] if r.status == "drift"]
        assert not drift, drift
        assert any(r.status == "ok" for r in by_pack[name])
    # the CudaGraphRunner names are gone in 0.5.23: that pack's range leaves them unchecked
    assert {r.status for r in by_pack["sglang_legacy_runner"]} == {"other version"}
    assert not [r for r in results if r.status == "drift"]
    for target in ("vllm.v1.attention.backends.mla.triton_mla:_compute_num_kv_splits",
                   "vllm.v1.attention.backends.flash_attn:FlashAttentionMetadataBuilder."
                   "_get_scheduler_metadata",
                   "sglang.srt.layers.attention.triton_backend:TritonAttnBackend.get_num_kv_splits"):
        assert "params" in snapshot["targets"][target], target
