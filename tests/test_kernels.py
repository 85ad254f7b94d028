"""MLT008 frozen-underfilled-grid, the `device` record and the kernel view, on hand-made
traces (both sides) and on the real H200 traces of samples/gpu_backends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from synth import SynthProcess

from mlatrace.analysis import Config, analyze
from mlatrace.analysis.config import ConfigError, config_from_dict
from mlatrace.analysis.kernels import GridRule, short_name
from mlatrace.trace import open_trace

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "samples" / "gpu_backends"

RMS = {"name": "rms_norm_kernel", "grid": [1, 1, 1], "block": [256, 1, 1], "smem": 0}
ROPE = {"name": "_ZN4vllm23rotary_embedding_kernelIN3c108BFloat16ELb1EEEvPKlPT_S6_PKS5_iiiiii",
        "grid": [1, 1, 1], "block": [128, 1, 1], "smem": 0}
GEMM = {"name": "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_"
                "128x1_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_"
                "tn_align8::Params)", "grid": [1, 1, 1], "block": [128, 1, 1], "smem": 0}


def attn(grid: list[int], name: str = "_fwd_grouped_kernel") -> dict:
    return {"name": name, "grid": grid, "block": [128, 1, 1], "smem": 63488}


def write_trace(root: Path, nodes: list[dict], times_us: list[float], *, sms: int | None = 132,
                attn_call: bool = True, launches: tuple[str, ...] = ("_fwd_grouped_kernel",),
                pid: int = 101) -> Path:
    """One process: a device record, one torch capture with these kernel nodes, replays
    timed at these GPU times (n = 1 first: the rule leaves it out)."""
    p = SynthProcess(root, pid, argv=["python", "engine.py"])
    if sms is not None:
        p.emit("device", index=0, name="NVIDIA H200", arch="sm_90", sms=sms)
    p.emit("graph.capture.begin", gid=1, parent=None, src="torch", key=None, mode=None, device=0)
    if attn_call:
        p.emit("attn.call", op="decode_attention_fwd", backend="x", capturing=True, gid=1,
               hints={}, ptrs={})
    for name in launches:
        p.emit("kernel.launch", name=name, grid=[1, 1, 1], const={}, capturing=True, gid=1)
    p.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1000)
    p.emit("graph.nodes", gid=1, kernels=nodes, dump_ns=1000)
    for i, us in enumerate([times_us[0]] + list(times_us), start=1):
        p.emit("attn.metadata", backend="x", num_reqs=1, seq_len_min=1000 * i,
               seq_len_max=1000 * i, seq_len_sum=1000 * i, capturing=False, ptrs={})
        p.replay(1)
        p.emit("graph.replay.time", gid=1, n=i, gpu_ns=int(us * 1000), via="cuda-event")
    p.write()
    return root


GROWING = [95, 400, 730, 3300, 10700]
FLAT = [95, 96, 94, 97, 95]


def ids(root: Path, config: Config | None = None) -> list[str]:
    return [f.id for f in analyze(open_trace(root), config).findings]


# -- flagged ----------------------------------------------------------------------
def test_one_cta_attention_kernel_with_growing_replays_is_mlt008(tmp_path):
    root = write_trace(tmp_path, [RMS, attn([1, 1, 1]), attn([1, 16, 1], "_fwd_kernel_stage2")],
                       GROWING, launches=("_fwd_grouped_kernel", "_fwd_kernel_stage2"))
    result = analyze(open_trace(root))
    assert [f.id for f in result.findings] == ["MLT008"]
    f = result.findings[0]
    # 10700 / 95 = 113x >= error_growth_factor (10): an error, so a default check fails
    assert f.severity == "error" and f.name == "frozen-underfilled-grid"
    d = f.details
    # the trigger reads the largest attention-like kernel (the combine, 16 CTAs < 33); the
    # finding names the one frozen smallest (stage 1, 1 CTA) first, the combine after it
    assert d["ctas"] == 1 and d["sms"] == 132 and d["grid"] == [1, 1, 1]
    assert d["kernel"] == "_fwd_grouped_kernel"
    assert d["largest"] == {"kernel": "_fwd_kernel_stage2", "grid": [1, 16, 1], "ctas": 16}
    assert d["other_kernels"] == [{"kernel": "_fwd_kernel_stage2", "grid": [1, 16, 1],
                                   "ctas": 16}]
    assert d["replay_gpu_ns_min"] == pytest.approx(95_000, rel=0.01)
    assert d["replay_gpu_ns_max"] == pytest.approx(10_700_000, rel=0.01)
    assert f.message.startswith("graph gid 1 froze _fwd_grouped_kernel at grid (1,1,1): 1 CTA "
                                "on 132 SMs")
    assert "95 us" in f.message and "10.7 ms" in f.message
    assert f.message.index("_fwd_grouped_kernel") < f.message.index("_fwd_kernel_stage2 (1,16,1)")
    kinds = {e.kind for e in f.evidence}
    assert {"graph.nodes", "device", "graph.replay.time"} <= kinds
    lines = (root / "p101.jsonl").read_text().splitlines()
    for e in f.evidence:   # every evidence record is where it says
        assert f'"k":"{e.kind}"' in next(x for x in lines if f'"seq":{e.seq},' in x)
    assert f.cost is not None and f.cost["timed"] == 6
    # one count: the message's timed replays are the cost line's, the first (upload) is
    # only left out of the range
    assert d["timed_replays"] == 6
    assert "its 6 timed replays (the first, which uploads the graph, left out) grew" in f.message


def test_severity_error_from_10x_growth_warning_from_4x_configurable(tmp_path):
    nodes = [attn([1, 1, 1]), attn([1, 16, 1], "_fwd_kernel_stage2")]
    launches = ("_fwd_grouped_kernel", "_fwd_kernel_stage2")
    six = write_trace(tmp_path / "6x", nodes, [100, 200, 400, 600], launches=launches)
    found = analyze(open_trace(six)).findings
    assert [(f.id, f.severity) for f in found] == [("MLT008", "warning")]
    assert found[0].details["growth"] == pytest.approx(6.0)
    ten = write_trace(tmp_path / "10x", nodes, [100, 200, 400, 1000], launches=launches)
    assert [f.severity for f in analyze(open_trace(ten)).findings] == ["error"]
    cfg = config_from_dict({"error_growth_factor": 5})
    assert [f.severity for f in analyze(open_trace(six), cfg).findings] == ["error"]
    cfg = config_from_dict({"error_growth_factor": 200})
    assert [f.severity for f in analyze(open_trace(ten), cfg).findings] == ["warning"]
    with pytest.raises(ConfigError):
        config_from_dict({"error_growth_factor": 0})
    # the default check fails on the error, passes (exit 0) on the warning
    for root, code in ((ten, 1), (six, 0)):
        out = subprocess.run([sys.executable, "-m", "mlatrace", "check", str(root)],
                             capture_output=True, text=True)
        assert out.returncode == code, out.stdout
        assert out.stdout.startswith("MLT008 ") and "_fwd_grouped_kernel at grid (1,1,1)" \
            in out.stdout.splitlines()[0]


def test_a_kernel_launched_with_a_split_constexpr_is_attention_like(tmp_path):
    # vLLM's Triton MLA kernels carry no attention word in their names; without an engine
    # pack (no attn.call) their NUM_KV_SPLITS constexpr says what they are
    p = SynthProcess(tmp_path, 3, argv=["python", "engine.py"])
    p.emit("device", index=0, name="NVIDIA H200", arch="sm_90", sms=132)
    p.emit("graph.capture.begin", gid=1, parent=None, src="torch", key=None, mode=None, device=0)
    for name, grid in (("_fwd_grouped_kernel_stage1", [1, 1, 1]),
                       ("_fwd_kernel_stage2", [1, 16, 1])):
        p.emit("kernel.launch", name=name, grid=grid, const={"NUM_KV_SPLITS": 1, "BLOCK_N": 32},
               capturing=True, gid=1)
    p.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
    p.emit("graph.nodes", gid=1, kernels=[RMS, attn([1, 1, 1], "_fwd_grouped_kernel_stage1"),
                                          attn([1, 16, 1], "_fwd_kernel_stage2")], dump_ns=1)
    for i, us in enumerate([80, 80, 300, 2000, 10000], start=1):
        p.replay(1)
        p.emit("graph.replay.time", gid=1, n=i, gpu_ns=us * 1000, via="cuda-event")
    p.write()
    found = analyze(open_trace(tmp_path)).findings
    assert [(f.id, f.severity) for f in found] == [("MLT008", "error")]
    assert found[0].details["kernel"] == "_fwd_grouped_kernel_stage1"
    assert found[0].details["attention_like"] == "kernel.launch"


def test_attention_like_by_name_without_any_probe(tmp_path):
    node = attn([1, 4, 1], "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, "
                           "64, 128, 4, false, cutlass::bfloat16_t>, true>(Flash_fwd_params)")
    root = write_trace(tmp_path, [GEMM, node], GROWING, attn_call=False, launches=())
    found = analyze(open_trace(root)).findings
    assert [f.id for f in found] == ["MLT008"]
    assert found[0].details["op"] == "flash::flash_fwd_splitkv_kernel"
    assert found[0].details["attention_like"] == "name"


def test_thresholds_are_configuration(tmp_path):
    root = write_trace(tmp_path, [attn([1, 1, 40])], GROWING)   # 40 CTAs >= 33
    assert ids(root) == []
    cfg = config_from_dict({"underfill_fraction": 0.5})        # 40 < 66
    assert ids(root, cfg) == ["MLT008"]
    assert ids(root, config_from_dict({"underfill_fraction": 0.5, "growth_factor": 200})) == []
    assert ids(root, config_from_dict({"disable": ["MLT008"], "underfill_fraction": 0.5})) == []
    named = write_trace(tmp_path / "named", [attn([1, 1, 1], "my_odd_kernel")], GROWING,
                        attn_call=False, launches=())
    assert ids(named) == []
    assert ids(named, config_from_dict({"attention_names": ["odd"]})) == ["MLT008"]
    for bad in ({"underfill_fraction": 2}, {"growth_factor": 0}, {"min_timed_replays": 1},
                {"attention_names": []}, {"attention_names": "attn"}):
        with pytest.raises(ConfigError):
            config_from_dict(bad)
    assert GridRule().underfill_fraction == 0.25 and "decode" in GridRule().attention_names


# -- clean --------------------------------------------------------------------------
def test_norms_rotary_gemms_on_one_cta_never_trigger(tmp_path):
    root = write_trace(tmp_path, [RMS, ROPE, GEMM], GROWING, attn_call=False, launches=())
    assert ids(root) == []


def test_split_kv_kernel_filling_the_gpu_beside_a_small_combine_is_clean(tmp_path):
    root = write_trace(tmp_path, [attn([1, 1, 256]), attn([1, 16, 1], "_fwd_kernel_stage2")],
                       GROWING)
    assert ids(root) == []


def test_flat_replays_and_too_few_timed_replays_are_clean(tmp_path):
    assert ids(write_trace(tmp_path / "flat", [attn([1, 1, 1])], FLAT)) == []
    assert ids(write_trace(tmp_path / "few", [attn([1, 1, 1])], [95, 10700])) == []


def test_no_device_record_no_mlt008_and_coverage_says_why(tmp_path):
    root = write_trace(tmp_path, [attn([1, 1, 1])], GROWING, sms=None)
    result = analyze(open_trace(root))
    assert result.findings == []
    assert any("MLT008 not applied" in n and "device" in n for n in result.coverage.notes)
    assert not result.coverage.blind
    out = subprocess.run([sys.executable, "-m", "mlatrace", "check", str(root)],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "note: MLT008 not applied" in out.stdout


# -- bad input -------------------------------------------------------------------------
def test_malformed_device_and_nodes_are_problems_with_file_line(tmp_path):
    root = write_trace(tmp_path, [attn([1, 1, 1])], GROWING)
    path = root / "p101.jsonl"
    lines = path.read_text().splitlines()
    dev = next(i for i, x in enumerate(lines) if '"k":"device"' in x)
    nodes = next(i for i, x in enumerate(lines) if '"k":"graph.nodes"' in x)
    lines[dev] = lines[dev].replace('"sms":132', '"sms":"many"')
    lines[nodes] = lines[nodes].replace('"grid":[1,1,1]', '"grid":[1,"x"]')
    path.write_text("\n".join(lines) + "\n")
    result = analyze(open_trace(root))
    where = {(p.file, p.line) for p in result.problems}
    assert ("p101.jsonl", dev + 1) in where and ("p101.jsonl", nodes + 1) in where
    assert any("sms must be a positive integer" in p.reason for p in result.problems)
    assert result.findings == []          # no grid, no SM count: nothing made up
    assert result.model.total_replays() == 6   # the rest is kept


# -- merged into a pack-based finding ---------------------------------------------------
def test_mlt008_is_evidence_of_mlt001_on_the_same_graph(tmp_path):
    p = SynthProcess(tmp_path, 7, argv=["python", "serve.py"])
    p.emit("device", index=0, name="NVIDIA H200", arch="sm_90", sms=132)
    p.emit("graph.capture.begin", gid=1, parent=None, src="reference", key="b1", mode="FULL")
    p.emit("graph.capture.begin", gid=2, parent=1, src="torch", key=None, mode=None, device=0)
    p.emit("kernel.split", op="mla_gluon", num_kv_splits=1, block_n=64, policy="legacy",
           batch=1, qlen=1, nhead=16, min_kv_seq_len=1, capturing=True, gid=2)
    p.emit("graph.capture.end", gid=2, segments=1, eager_breaks=0, dur_ns=1)
    p.emit("graph.nodes", gid=2, kernels=[attn([1, 1, 1], "_mla_gluon_stage1")], dump_ns=1)
    p.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
    for i, us in enumerate([30, 30, 120, 900, 2700], start=1):
        p.emit("attn.metadata", backend="x", num_reqs=1, seq_len_min=25000 * i,
               seq_len_max=25000 * i, seq_len_sum=1, capturing=False, ptrs={})
        p.replay(1)
        p.replay(2)
        p.emit("graph.replay.time", gid=2, n=i, gpu_ns=us * 1000, via="cuda-event")
    p.write()
    found = analyze(open_trace(tmp_path)).findings
    assert [f.id for f in found] == ["MLT001"]
    f = found[0]
    assert f.details["underfilled_grid"]["ctas"] == 1
    assert "MLT008: _mla_gluon_stage1 grid (1,1,1) = 1 CTA(s) on 132 SMs" in f.message
    assert any(e.kind == "graph.nodes" for e in f.evidence)
    assert any(e.kind == "device" for e in f.evidence)
    without = analyze(open_trace(tmp_path), config_from_dict({"disable": ["MLT001"]})).findings
    assert [f.id for f in without] == ["MLT008"]


def test_merged_into_an_mlt006_warning_the_finding_keeps_mlt008s_error(tmp_path):
    p = SynthProcess(tmp_path, 8, argv=["python", "engine.py"])
    p.emit("device", index=0, name="NVIDIA H200", arch="sm_90", sms=132)
    p.emit("graph.capture.begin", gid=1, parent=None, src="torch", key=None, mode=None, device=0)
    p.emit("host.decision", name="engine.decode_rows", value=64,
           inputs={"seq_len_max": 1}, capturing=True, gid=1)
    p.emit("attn.call", op="decode_attention_fwd", capturing=True, gid=1, hints={}, ptrs={})
    p.emit("kernel.launch", name="_fwd_grouped_kernel", grid=[1, 1, 1], const={},
           capturing=True, gid=1)
    p.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
    p.emit("graph.nodes", gid=1, kernels=[attn([1, 1, 1])], dump_ns=1)
    for i, us in enumerate([30, 30, 120, 900, 2700], start=1):
        p.emit("attn.metadata", backend="x", num_reqs=1, seq_len_min=25000 * i,
               seq_len_max=25000 * i, seq_len_sum=1, capturing=False, ptrs={})
        p.replay(1)
        p.emit("graph.replay.time", gid=1, n=i, gpu_ns=us * 1000, via="cuda-event")
    p.write()
    found = analyze(open_trace(tmp_path)).findings
    assert [f.id for f in found] == ["MLT006"]
    assert found[0].severity == "error", "MLT008 alone would be an error: merging keeps it"
    assert found[0].details["underfilled_grid"]["growth"] == pytest.approx(90.0)
    alone = analyze(open_trace(tmp_path), config_from_dict({"disable": ["MLT008"]})).findings
    assert [(f.id, f.severity) for f in alone] == [("MLT006", "warning")]


# -- names and the kernel view -------------------------------------------------------------
def test_short_names():
    assert short_name("_fwd_grouped_kernel_stage1") == "_fwd_grouped_kernel_stage1"
    assert short_name("_ZN2at6native29vectorized_elementwise_kernelILi8ENS0_11FillFunctorIN3c10"
                      "8BFloat16EEESt5arrayIPcLm1EEEEviT0_T1_") == \
        "native::vectorized_elementwise_kernel"
    assert short_name("void flash::flash_fwd_splitkv_kernel<T<1, 2>, true>(Params)") == \
        "flash::flash_fwd_splitkv_kernel"
    assert short_name("_Z9my_kernelPf") == "my_kernel"
    assert short_name("_Zgarbage") == "_Zgarbage"


def test_report_shows_kernels_and_which_grids_differ(tmp_path):
    root = write_trace(tmp_path / "a", [attn([1, 1, 1])], GROWING)
    p = SynthProcess(tmp_path / "b", 5, argv=["python", "x.py"])
    p.emit("device", index=0, name="NVIDIA H200", arch="sm_90", sms=132)
    for gid, grid in ((1, [1, 1, 2]), (2, [1, 1, 256])):
        p.emit("graph.capture.begin", gid=gid, parent=None, src="torch", key=None, mode=None)
        p.emit("attn.call", op="decode", capturing=True, gid=gid, hints={}, ptrs={})
        p.emit("kernel.launch", name="_fwd_grouped_kernel", grid=grid, const={},
               capturing=True, gid=gid)
        p.emit("graph.capture.end", gid=gid, segments=1, eager_breaks=0, dur_ns=1)
        p.emit("graph.nodes", gid=gid, kernels=[attn(grid), RMS], dump_ns=1)
    p.write()
    out = subprocess.run([sys.executable, "-m", "mlatrace", "report", str(root)],
                         capture_output=True, text=True, env={"COLUMNS": "200", "PATH": ""})
    assert out.returncode == 0
    assert "_fwd_grouped_kernel" in out.stdout and "1/132" in out.stdout
    assert "95 us..10.7 ms" in out.stdout
    data = json.loads(subprocess.run([sys.executable, "-m", "mlatrace", "report", "--json",
                                      str(tmp_path / "b")], capture_output=True,
                                     text=True).stdout)
    differ = data["kernels"]["grids_differ"]
    assert differ == [{"kernel": "_fwd_grouped_kernel", "grids": [
        {"grid": [1, 1, 2], "graphs": ["5:1"]}, {"grid": [1, 1, 256], "graphs": ["5:2"]}]}]
    verbose = subprocess.run([sys.executable, "-m", "mlatrace", "report", "-v",
                              str(tmp_path / "b")], capture_output=True, text=True,
                             env={"COLUMNS": "200", "PATH": ""}).stdout
    assert "grids differ: _fwd_grouped_kernel: (1,1,2) in gid(s) 1; (1,1,256)" in verbose
    diff = subprocess.run([sys.executable, "-m", "mlatrace", "diff", str(root),
                           str(tmp_path / "b")], capture_output=True, text=True,
                          env={"COLUMNS": "200", "PATH": ""})
    assert "kernel grids differ: _fwd_grouped_kernel" in diff.stdout
    assert "(1,1,256)" in diff.stdout


# -- MLT004's hint fits the sync ------------------------------------------------------------
def test_mlt004_output_readback_and_input_side_hints(tmp_path):
    p = SynthProcess(tmp_path, 9, argv=["python", "x.py"])
    p.emit("graph.capture.begin", gid=1, parent=None, src="torch", key=None, mode=None)
    p.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
    for _ in range(3):
        p.emit("attn.metadata", backend="x", num_reqs=1, seq_len_min=5, seq_len_max=5,
               seq_len_sum=5, capturing=False, ptrs={})
        p.emit("sync", op="item", capturing=False, gid=None, where="engine.py:10")
        p.replay(1)
        p.emit("sync", op="tolist", capturing=False, gid=None, where="engine.py:20")
    p.write()
    found = {f.details["op"]: f for f in analyze(open_trace(tmp_path)).findings}
    assert found["item"].details["side"] == "input" and "host copies" in found["item"].hint
    assert found["tolist"].details["side"] == "output"
    assert "overlap" in found["tolist"].hint and "output readback" in found["tolist"].message


def test_mlt004_a_timing_synchronize_after_a_replay_is_a_wait_not_a_readback(tmp_path):
    # the reference serve loop's per-step torch.cuda.synchronize(device), on the H200
    p = SynthProcess(tmp_path, 9, argv=["python", "-m", "mlatrace.reference.serve"])
    p.emit("graph.capture.begin", gid=1, parent=None, src="torch", key=None, mode=None)
    p.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
    for _ in range(3):
        p.emit("attn.metadata", backend="x", num_reqs=1, seq_len_min=5, seq_len_max=5,
               seq_len_sum=5, capturing=False, ptrs={})
        p.replay(1)
        p.emit("sync", op="synchronize", capturing=False, gid=None,
               where="mlatrace/reference/serve.py:216")
    p.write()
    [f] = analyze(open_trace(tmp_path)).findings
    assert f.details["side"] == "wait" and "readback" not in f.message
    assert "reads nothing back" in f.message and "CUDA events" in f.hint
    real = GPU / "reference_device_lengths"
    if real.is_dir():   # the H200 trace: the same site, the same words
        sites = [f for f in analyze(open_trace(real)).findings if f.id == "MLT004"]
        assert sites and all(f.details["side"] == "wait" for f in sites)
        assert all("output readback" not in f.message for f in sites)


def test_mlt004_reading_a_graph_output_right_after_its_replay_is_a_readback_in_any_engine(
        tmp_path):
    # HF transformers continuous batching: `new_tokens = self.output_ids[...].tolist()` right
    # after each replay, and no pack records the engine's set-up (no attn.metadata at all)
    p = SynthProcess(tmp_path, 9, argv=["python", "hf_cb.py"])
    p.emit("graph.capture.begin", gid=1, parent=None, src="torch", key=None, mode=None)
    p.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
    for _ in range(3):
        p.replay(1)
        p.emit("sync", op="tolist", capturing=False, gid=None,
               where="transformers/generation/continuous_batching/continuous_api.py:812")
    p.write()
    [f] = analyze(open_trace(tmp_path)).findings
    assert f.details["side"] == "output"
    assert "output readback" in f.message and "whatever the engine" in f.hint
    assert "overlap" in f.hint


# -- the real H200 traces (samples/gpu_backends) keep their verdicts -------------------------
def _gpu(name: str) -> Path:
    root = GPU / name
    if not root.is_dir():
        pytest.skip(f"{name}: GPU fixture not recorded")
    return root


def test_gpu_vllm_own_split_at_one_is_mlt001_carrying_mlt008_with_the_numbers():
    # no host.decision: the split came from the driver's own code. The Triton launch probe
    # still records the captured NUM_KV_SPLITS=1, so MLT001 explains the graph and MLT008
    # is its evidence; without MLT001 (a kernel whose constexprs no probe reads) MLT008
    # stands alone with the same numbers
    root = _gpu("vllm_triton_mla_own_one")
    text = "".join(p.read_text() for p in root.glob("p*.jsonl"))
    assert '"k":"host.decision"' not in text
    found = [f for f in analyze(open_trace(root)).findings if f.id != "MLT004"]
    assert [f.id for f in found] == ["MLT001"]
    grid = found[0].details["underfilled_grid"]
    assert grid["sms"] == 132 and grid["ctas"] == 1 and grid["grid"] == [1, 1, 1]
    assert grid["kernel"] == "_fwd_grouped_kernel_stage1"
    assert grid["other_kernels"] == [{"kernel": "_fwd_kernel_stage2",
                                      "grid": [1, 16, 1], "ctas": 16}]
    # measured_h200.txt: 85 us at 824 tokens .. 10.77 ms at 100K, 20 replays a length
    assert 70_000 < grid["replay_gpu_ns_min"] < 100_000
    assert 10_000_000 < grid["replay_gpu_ns_max"] < 12_000_000
    assert "MLT008: _fwd_grouped_kernel_stage1 grid (1,1,1) = 1 CTA(s), _fwd_kernel_stage2 " \
           "(1,16,1) = 16 on 132 SMs" in found[0].message
    # a vLLM kernel seen only through its launch: no doubled gid, no "?" mode, no hint it
    # does not take, no reference-engine policy names
    message = found[0].message
    assert message.startswith("graph gid 1 froze _fwd_grouped_kernel_stage1 at 1 KV split "
                              "(NUM_KV_SPLITS=1, grid (1,1,1))")
    for wrong in ("(gid 1", "?", "min_kv_seq_len=None", "legacy", "bucketed"):
        assert wrong not in message, wrong
    assert found[0].details["policies_at_replay_len"] is None
    alone = analyze(open_trace(root), config_from_dict({"disable": ["MLT001"]})).findings
    alone = [f for f in alone if f.id != "MLT004"]
    assert [(f.id, f.severity) for f in alone] == [("MLT008", "error")]
    assert alone[0].details["growth"] > 100 and alone[0].cost["timed"] >= 150
    assert alone[0].details["timed_replays"] == alone[0].cost["timed"]
    assert alone[0].message.startswith("graph gid 1 froze _fwd_grouped_kernel_stage1 at grid "
                                       "(1,1,1): 1 CTA on 132 SMs")


def test_gpu_vllm_own_split_per_bucket_is_clean():
    result = analyze(open_trace(_gpu("vllm_triton_mla_own_bucketed")))
    assert [f.id for f in result.findings if f.id != "MLT004"] == []


def test_gpu_sglang_cap_at_batch_1_is_mlt008_and_batch_16_clean():
    b1 = analyze(open_trace(_gpu("sglang_triton_device_splits"))).findings
    flagged = [f for f in b1 if f.id == "MLT008"]
    assert len(flagged) == 1 and flagged[0].details["ctas"] == 16
    assert flagged[0].details["grid"] == [1, 1, 16]
    assert flagged[0].severity == "error"    # 15 us to 677 us: 45x >= 10x
    b16 = analyze(open_trace(_gpu("sglang_triton_device_splits_b16"))).findings
    assert [f.id for f in b16 if f.id != "MLT004"] == []


def test_gpu_reference_legacy_across_lengths_is_mlt001_carrying_mlt008():
    found = analyze(open_trace(_gpu("reference_legacy_lengths"))).findings
    errors = [f for f in found if f.id != "MLT004"]
    assert [f.id for f in errors] == ["MLT001"]
    grid = errors[0].details["underfilled_grid"]
    assert grid["sms"] == 132 and grid["ctas"] < 33 and grid["growth"] >= 4
    assert grid["kernel"] == "_mla_stage1_wgmma_kernel" and grid["ctas"] == 1


def test_gpu_reference_device_policy_is_clean():
    found = analyze(open_trace(_gpu("reference_device_lengths"))).findings
    assert [f.id for f in found if f.id != "MLT004"] == []


def test_gpu_traces_carry_the_device_record():
    trace = open_trace(_gpu("vllm_triton_mla_own_one"))
    records = [r for proc in trace.processes for r in proc.records() if r["k"] == "device"]
    assert len(records) == 1 and records[0]["sms"] == 132 and records[0]["arch"] == "sm_90"


# -- the probe side: the device record ---------------------------------------------------
class _Props:
    name, major, minor, multi_processor_count, gcnArchName = "NVIDIA H200", 9, 0, 132, ""


class _Cuda:
    def __init__(self, initialised: bool) -> None:
        self.initialised, self.props_calls = initialised, 0

    def is_initialized(self) -> bool:
        return self.initialised

    def current_device(self) -> int:
        if not self.initialised:
            raise AssertionError("would initialise CUDA")
        return 0

    def get_device_properties(self, index: int) -> _Props:
        self.props_calls += 1
        return _Props()


def test_device_record_once_per_process_and_never_initialising_cuda(monkeypatch):
    import types

    from mlatrace.probe import device

    emitted = []
    monkeypatch.setattr(device.record, "emit", lambda kind, **f: emitted.append((kind, f)))
    monkeypatch.setattr(device, "_written", set())
    cold = types.SimpleNamespace(cuda=_Cuda(False), version=types.SimpleNamespace(hip=None))
    monkeypatch.setitem(sys.modules, "torch", cold)
    assert device.note_device() is None and emitted == []   # CUDA not initialised: nothing
    warm = types.SimpleNamespace(cuda=_Cuda(True), version=types.SimpleNamespace(hip=None))
    monkeypatch.setitem(sys.modules, "torch", warm)
    assert device.note_device() == 0 and device.note_device() == 0
    assert emitted == [("device", {"index": 0, "name": "NVIDIA H200", "arch": "sm_90",
                                   "sms": 132})]
    assert warm.cuda.props_calls == 1


def test_cpu_capture_writes_no_device_record(tmp_path):
    out = tmp_path / "t"
    subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(out), "--",
                    sys.executable, "-m", "mlatrace.reference.serve", "--device", "cpu",
                    "--steps", "2", "--layers", "1", "--hidden", "32", "--ctx", "64"],
                   check=True, capture_output=True)
    text = "".join(p.read_text() for p in out.glob("p*.jsonl"))
    assert '"k":"graph.capture.begin"' in text and '"k":"device"' not in text


def test_gpu_pypi_engine_no_pack_knows_has_no_false_mlt008():
    # gpuopt-runtime 0.1.1 (PyPI): one graph per power-of-two cache capacity, SDPA (cuDNN)
    # over the whole static cache: each graph's replays flat, 5.7x apart across graphs
    root = ROOT / "samples" / "pypi_engine" / "gpuopt_runtime"
    if not root.is_dir():
        pytest.skip("gpuopt_runtime: GPU fixture not recorded")
    result = analyze(open_trace(root))
    assert {f.id for f in result.findings} == {"MLT004"}
    assert not result.coverage.blind and result.coverage.notes == []
    from mlatrace.analysis.kernels import kernel_view

    view = kernel_view(result.model, GridRule())
    spans = [g["replay_gpu_ns"] for g in view["graphs"]]
    assert len(spans) == 5 and all(s["timed"] >= 3 for s in spans)
    assert all(s["max"] < 1.5 * s["min"] for s in spans)           # flat inside a graph
    assert max(s["max"] for s in spans) > 4 * min(s["min"] for s in spans)   # not across
    assert all(g["largest"] and "sdpa" in g["largest"]["short"] for g in view["graphs"])


@pytest.mark.parametrize("name", ["vllm_triton_mla_frozen_one",
                                  "vllm_triton_mla_frozen_one_nopack"])
def test_gpu_frozen_vllm_mla_fails_a_default_check_naming_stage1(name, tmp_path):
    # with the vLLM pack (MLT001 from its decision probe) and without it (only the Triton
    # launch probe and the graph see the split): exit 1, and the first line sends the user
    # to the kernel frozen at one CTA
    root = _gpu(name)
    out = subprocess.run([sys.executable, "-m", "mlatrace", "check", str(root)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1, out.stdout
    first = out.stdout.splitlines()[0]
    assert first.split()[1] == "error"
    assert "_fwd_grouped_kernel_stage1" in first and "(1,1,1)" in first, first


def test_gpu_frozen_vllm_mla_without_the_vllm_pack_mlt008_alone_is_an_error():
    root = _gpu("vllm_triton_mla_frozen_one_nopack")
    text = "".join(p.read_text() for p in root.glob("p*.jsonl"))
    assert '"k":"attn.call"' not in text and '"k":"host.decision"' not in text
    alone = analyze(open_trace(root), config_from_dict({"disable": ["MLT001"]})).findings
    assert [(f.id, f.severity) for f in alone] == [("MLT008", "error")]
    f = alone[0]
    assert f.details["kernel"] == "_fwd_grouped_kernel_stage1" and f.details["grid"] == [1, 1, 1]
    assert f.details["attention_like"] == "kernel.launch" and f.details["growth"] > 100
    # the H200's torch 2.11 has no get_graph_data: the record says DOT, and why
    nodes = [r for p in open_trace(root).processes for r in p.records()
             if r["k"] == "graph.nodes"]
    assert [(n["source"], n["source_why"]) for n in nodes] == [
        ("dot", "this torch has no CUDAGraph.get_graph_data (pytorch#183165)")]
