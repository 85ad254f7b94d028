"""Reference MLA / PA-v1 decode kernels and split policies against float64 naive attention.

Random inputs (never zeros), scattered page tables, outputs poisoned with NaN before every
run so unwritten elements fail. Triton runs under TRITON_INTERPRET=1 on the CPU at small
shapes; the `gpu` tests run the compiled kernels at full size and inside CUDA graphs.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlatrace.reference import policies
from mlatrace.reference.kernel_config import DEFAULT, MlaConfig, Stage1Config, Stage2Config

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from mlatrace.reference import mla  # noqa: E402
from mlatrace.reference.mla import mla_gluon, mla_reference  # noqa: E402
from mlatrace.reference.paged_attention import (  # noqa: E402
    paged_attention_reference,
    paged_attention_v1,
)

HAS_CUDA = torch.cuda.is_available()
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
SM_SCALE = 1.0 / math.sqrt(576)


# ---------------------------------------------------------------------------------------
# policies (pure)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch,nhead", [(1, 16), (1, 128), (4, 16), (8, 128), (64, 16)])
def test_legacy_collapses_to_one_split_at_capture_hint_1(batch, nhead):
    assert policies.legacy(batch, 1, nhead, 1) == 1
    assert policies.num_kv_splits("legacy", batch, 1, nhead, 1) == 1


def test_legacy_formula():
    assert policies.legacy(1, 1, 16, 16384) == 256            # cdiv(16384, 64) = 256 = budget
    assert policies.legacy(1, 1, 16, 100_000) == 256
    assert policies.legacy(1, 1, 128, 100_000) == 32          # 256 // 8 head blocks
    assert policies.legacy(1, 1, 16, 65) == 2
    assert policies.legacy(4, 1, 16, 1000) == 16              # min(64, 16)
    assert policies.legacy(300, 1, 16, 100_000) == 1          # budget exhausted


@pytest.mark.parametrize("length,splits", [
    (0, 1), (1, 1), (64, 1), (65, 16), (4096, 16), (4097, 48), (16384, 48), (16385, 64),
    (65536, 64), (65537, 128), (100_000, 128), (10**7, 128)])
def test_bucketed_buckets(length, splits):
    assert policies.bucketed(length) == splits
    assert policies.num_kv_splits("bucketed", 3, 1, 16, length) == splits


@pytest.mark.parametrize("batch,nhead", [(1, 16), (1, 128), (2, 16), (8, 128), (512, 128)])
def test_device_policy_is_constant_in_length(batch, nhead):
    values = {policies.num_kv_splits("device", batch, 1, nhead, n) for n in
              (0, 1, 63, 64, 65, 1000, 4096, 16384, 100_000, 10**6)}
    assert len(values) == 1
    (splits,) = values
    assert 1 <= splits <= policies.MAX_KV_SPLITS
    assert splits == max(1, min(policies.MAX_KV_SPLITS, policies.DEVICE_PROGRAM_BUDGET
                                // (batch * policies.head_blocks(nhead))))


def test_num_kv_splits_fixed_and_errors():
    assert policies.num_kv_splits("fixed:128", 1, 1, 16, 1) == 128
    with pytest.raises(ValueError):
        policies.num_kv_splits("fixed:0", 1, 1, 16, 1)
    with pytest.raises(ValueError):
        policies.num_kv_splits("nope", 1, 1, 16, 1)


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 16, 48, 128, 256])
def test_partitions_cover_each_position_once(splits):
    for length in (0, 1, 2, 63, 64, 65, 127, 1000, 4097, 100_000):
        for rng in (policies.kv_split_range, policies.device_split_range):
            covered = 0
            previous_end = 0
            for s in range(splits):
                start, end = rng(length, s, splits)
                assert start <= end
                if end > start:
                    assert start == previous_end
                    previous_end = end
                covered += end - start
            assert covered == length and previous_end == length


def test_device_partition_uses_whole_tiles_and_only_nonempty_splits():
    for length in (1, 64, 65, 1000, 100_000):
        for splits in (1, 5, 128, 256):
            for min_tiles in (1, 2, 4):
                active, chunk = policies.device_partition(length, splits, 64, min_tiles)
                assert chunk % policies.BLOCK_N == 0 and chunk >= 64 * min_tiles
                assert 1 <= active <= splits
                ranges = [policies.device_split_range(length, s, splits, 64, min_tiles)
                          for s in range(splits)]
                assert all(end > start for start, end in ranges[:active])
                assert sum(end - start for start, end in ranges) == length
    assert policies.device_partition(1, 256) == (1, 64)
    assert policies.device_partition(100_000, 256)[0] == 224     # 7 tiles per split


def test_torch_split_bounds_match_the_pure_partition():
    lengths = [0, 1, 63, 64, 65, 500, 4097, 100_000]
    seq = torch.tensor(lengths, dtype=torch.int32)
    for splits in (1, 3, 128, 256):
        for min_tiles in (1, 4):
            chunk, active, _ = mla.split_bounds(seq, splits, 64, True, min_tiles)
            for i, n in enumerate(lengths):
                expected = policies.device_partition(n, splits, 64, min_tiles)
                assert (int(active[i]), int(chunk[i])) == expected
        chunk, active, _ = mla.split_bounds(seq, splits, 64, device_partition=False)
        for i, n in enumerate(lengths):
            assert int(chunk[i]) == policies.cdiv(n, splits) and int(active[i]) == splits


# ---------------------------------------------------------------------------------------
# MLA decode
# ---------------------------------------------------------------------------------------


def make_mla_inputs(batch, nhead, lengths, dtype, device="cpu", seed=0, max_pages=None):
    """Random q/kv, a permuted (scattered) page table, int32 seq_info; page size 1."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    max_pages = max_pages or max(lengths) + 5
    num_slots = batch * max_pages + 17
    kv_c = torch.randn(num_slots, 576, generator=gen).to(dtype)
    page_table = torch.randperm(num_slots, generator=gen)[: batch * max_pages]
    page_table = page_table.reshape(batch, max_pages).to(torch.int32)
    q_nope = torch.randn(batch, nhead, 512, generator=gen).to(dtype)
    q_pe = torch.randn(batch, nhead, 64, generator=gen).to(dtype)
    seq_info = torch.tensor(lengths, dtype=torch.int32)
    return [t.to(device) for t in (q_nope, q_pe, kv_c, page_table, seq_info)]


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def check_mla(batch, nhead, lengths, dtype, policy, backend, hint=None, device="cpu", seed=0,
              config=None):
    q_nope, q_pe, kv_c, page_table, seq_info = make_mla_inputs(batch, nhead, lengths, dtype,
                                                               device, seed)
    o = torch.full((batch, nhead, 512), float("nan"), dtype=dtype, device=device)
    hint = min(lengths) if hint is None else hint
    out, lse = mla_gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, SM_SCALE,
                         min_kv_seq_len=hint, policy=policy, return_lse=True, backend=backend,
                         config=config)
    assert out is o
    ref, ref_lse = mla_reference(q_nope, q_pe, kv_c, page_table, lengths, SM_SCALE)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert rel_err(o, ref) < TOL[dtype], (policy, lengths, rel_err(o, ref))
    assert (lse.double() - ref_lse).abs().max().item() < 1e-4


MLA_CASES = [  # (batch, nhead, lengths)
    (1, 16, [1]),
    (1, 16, [2000]),
    (3, 16, [1, 64, 65]),
    (8, 16, [5, 300, 64, 129, 1, 700, 63, 2]),
    (2, 128, [1500, 33]),
    (4, 20, [90, 3, 257, 64]),                   # heads not a multiple of 16
]


@pytest.mark.parametrize("policy", ["legacy", "bucketed", "device", "fixed:5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,nhead,lengths", MLA_CASES)
def test_mla_torch_matches_float64(batch, nhead, lengths, dtype, policy):
    check_mla(batch, nhead, lengths, dtype, policy, "torch")


@pytest.mark.parametrize("batch,nhead,lengths", [MLA_CASES[2], MLA_CASES[4]])
def test_mla_torch_more_splits_than_tokens(batch, nhead, lengths):
    check_mla(batch, nhead, lengths, torch.bfloat16, "fixed:128", "torch")


@pytest.mark.parametrize("policy", ["legacy", "bucketed", "device"])
def test_mla_torch_long_context_replayed_with_capture_hint_1(policy):
    # What a FULL graph replay does: host decisions from the capture hint, lengths from seq_info.
    check_mla(2, 16, [4096, 3000], torch.bfloat16, policy, "torch", hint=1)


def test_mla_without_return_lse_and_separate_k_pe():
    q_nope, q_pe, kv_c, page_table, seq_info = make_mla_inputs(2, 16, [100, 7], torch.float32)
    k_pe = torch.randn(kv_c.shape[0], 64)
    o = torch.full((2, 16, 512), float("nan"))
    out, lse = mla_gluon(q_nope, q_pe, kv_c[:, :512].contiguous(), o, page_table, seq_info,
                         SM_SCALE, k_pe=k_pe, policy="device", backend="torch")
    assert lse is None
    ref, _ = mla_reference(q_nope, q_pe, kv_c, page_table, [100, 7], SM_SCALE, k_pe=k_pe)
    assert rel_err(out, ref) < 1e-5


def test_launches_are_what_the_probes_see(monkeypatch):
    """Grid 3-tuples and upper-case constexpr keywords; one split skips stage 2."""
    seen = []
    real1, real2, real_skip = mla.launch_stage1, mla.launch_stage2, mla.skip_stage2

    def spy(kind, real):
        def wrapper(name, *args, **kwargs):
            seen.append((kind, name, args, {k: v for k, v in kwargs.items() if k.isupper()}))
            return real(name, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(mla, "launch_stage1", spy("stage1", real1))
    monkeypatch.setattr(mla, "launch_stage2", spy("stage2", real2))
    monkeypatch.setattr(mla, "skip_stage2", spy("skip", real_skip))
    q_nope, q_pe, kv_c, page_table, seq_info = make_mla_inputs(1, 16, [3000], torch.float32)
    o = torch.empty(1, 16, 512)
    mla_gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, SM_SCALE, min_kv_seq_len=1)
    assert [s[0] for s in seen] == ["stage1", "skip"]
    assert seen[0][2] == ((1, 1, 1),) and seen[0][3]["NUM_KV_SPLITS"] == 1
    assert seen[0][3]["BLOCK_N"] == 64
    seen.clear()
    mla_gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, SM_SCALE, policy="device")
    assert [s[0] for s in seen] == ["stage1", "stage2"]
    assert seen[0][2] == ((1, policies.DEVICE_PROGRAM_BUDGET, 1),)
    assert seen[1][2] == ((1, 16, 512 // DEFAULT.stage2.block_dv),)
    for fn in (real1, real2):
        params = inspect.signature(fn).parameters
        assert params["NUM_KV_SPLITS"].kind is inspect.Parameter.KEYWORD_ONLY
        assert params["BLOCK_N"].kind is inspect.Parameter.KEYWORD_ONLY


# ---------------------------------------------------------------------------------------
# Triton under the CPU interpreter (small shapes)
# ---------------------------------------------------------------------------------------


# TRITON_INTERPRET must be set before triton is first imported (Triton's own helpers such as
# tl.cdiv and tl.sum are decorated at import), so on a CPU the Triton cases run together in
# one child process started with it, and the tests below check that child's results.
TRITON_MLA_CASES = {  # id: (policy, hint, lengths, nhead, dtype)
    "legacy-1split": ("legacy", 1, [130], 16, "float32"),          # stage 2 skipped
    "legacy-4splits": ("legacy", 200, [200, 5, 64], 16, "bfloat16"),
    "fixed5-empty-splits-masked-heads": ("fixed:5", 1, [1, 77], 20, "float32"),
    "device-direct-and-merged": ("device", 1, [1, 300], 16, "bfloat16"),
    "device-4heads": ("device", 1, [65], 4, "float32"),
    "bucketed-16splits-bf16": ("bucketed", 100, [100, 2], 16, "bfloat16"),
    "stage2-several-loads": ("fixed:5", 1, [300, 77], 16, "float32"),   # MAX_BLOCK_S = 2
    "device-stage2-several-loads": ("device", 1, [400, 1], 16, "float32"),
    "device-stage2-tiers": ("device", 1, [130, 300, 600], 16, "float32"),  # 3, 5, 10 active
    "legacy-4splits-int64-offsets": ("legacy", 200, [200, 5, 64], 16, "bfloat16"),
}
INT64_OFFSETS = ("legacy-4splits-int64-offsets",)   # the path of caches past 2**31 elements
SMALL_STAGE2_BLOCK = ("stage2-several-loads", "device-stage2-several-loads")
STAGE2_TIERS = {"device-stage2-tiers": (4, 8)}   # small tier, mid tier, then the wide tile
TRITON_PA_CASES = {  # id: (lengths, captured max, dtype)
    "pa-shorter-fp32": ([1, 100, 33, 256], 256, "float32"),
    "pa-shorter-bf16": ([1, 100, 33, 256], 256, "bfloat16"),
    "pa-longer": ([300, 17, 64], 64, "float32"),
}


def case_config(case_id: str) -> MlaConfig:
    """The shipped config, but for the cases that take another path of the kernels."""
    stage1, stage2 = DEFAULT.stage1, DEFAULT.stage2
    if case_id in INT64_OFFSETS:
        stage1 = replace(stage1, offsets_32=False)
    if case_id in SMALL_STAGE2_BLOCK:
        stage2 = replace(stage2, max_block_s=2)
    if case_id in STAGE2_TIERS:
        small_s, mid_s = STAGE2_TIERS[case_id]
        stage2 = replace(stage2, small_s=small_s, mid_s=mid_s)
    return replace(DEFAULT, stage1=stage1, stage2=stage2)


def run_triton_cases(device: str) -> dict[str, list[float]]:
    """Relative errors (per sequence for PA) of every Triton case; raises on NaN output."""
    results = {}
    for case_id, (policy, hint, lengths, nhead, dtype) in TRITON_MLA_CASES.items():
        dt = getattr(torch, dtype)
        q_nope, q_pe, kv_c, page_table, seq_info = make_mla_inputs(len(lengths), nhead, lengths,
                                                                   dt, device)
        o = torch.full((len(lengths), nhead, 512), float("nan"), dtype=dt, device=device)
        _, lse = mla_gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, SM_SCALE,
                           min_kv_seq_len=hint, policy=policy, return_lse=True,
                           backend="triton", config=case_config(case_id))
        ref, ref_lse = mla_reference(q_nope, q_pe, kv_c, page_table, lengths, SM_SCALE)
        lse_err = (lse.double() - ref_lse).abs().max().item()
        results[case_id] = [rel_err(o, ref), lse_err]
    for case_id, (lengths, captured_max, dtype) in TRITON_PA_CASES.items():
        results[case_id] = run_pa(lengths, captured_max, getattr(torch, dtype), "triton", device)
    return results


@pytest.fixture(scope="module")
def triton_results() -> dict[str, list[float]]:
    if HAS_CUDA:
        return run_triton_cases("cuda")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return run_triton_cases("cpu")
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    child = subprocess.run([sys.executable, __file__, "--triton-cases"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.mark.slow      # the Triton cases run under TRITON_INTERPRET=1 on CPU: minutes
@pytest.mark.parametrize("case_id", list(TRITON_MLA_CASES))
def test_mla_triton_matches_float64(triton_results, case_id):
    dtype = TRITON_MLA_CASES[case_id][4]
    err, lse_err = triton_results[case_id]
    assert err < TOL[getattr(torch, dtype)], err
    assert lse_err < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("case_id", ["pa-shorter-fp32", "pa-shorter-bf16"])
def test_pa_v1_triton_shorter_than_captured_is_correct(triton_results, case_id):
    assert max(triton_results[case_id]) < TOL[getattr(torch, TRITON_PA_CASES[case_id][2])]


@pytest.mark.slow
def test_pa_v1_triton_longer_than_captured_is_wrong(triton_results):
    errors = triton_results["pa-longer"]
    assert errors[0] > 0.1 and max(errors[1:]) < 1e-5


# ---------------------------------------------------------------------------------------
# PA v1: capture-at-max contract
# ---------------------------------------------------------------------------------------


def make_pa_inputs(lengths, dtype, device="cpu", num_heads=8, num_kv_heads=2, head_size=64,
                   block_size=16, seed=0, table_tokens=None):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    table_tokens = table_tokens or max(lengths)
    blocks_per_seq = policies.cdiv(table_tokens, block_size) + 1
    num_blocks = len(lengths) * blocks_per_seq + 3
    shape = (num_blocks, num_kv_heads, block_size, head_size)
    key_cache = torch.randn(shape, generator=gen).to(dtype)
    value_cache = torch.randn(shape, generator=gen).to(dtype)
    tables = torch.randperm(num_blocks, generator=gen)[: len(lengths) * blocks_per_seq]
    tables = tables.reshape(len(lengths), blocks_per_seq).to(torch.int32)
    query = torch.randn(len(lengths), num_heads, head_size, generator=gen).to(dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    return [t.to(device) for t in (query, key_cache, value_cache, tables, seq_lens)]


def run_pa(lengths, captured_max, dtype, backend, device="cpu"):
    query, key_cache, value_cache, tables, seq_lens = make_pa_inputs(
        lengths, dtype, device, table_tokens=max(max(lengths), captured_max))
    out = torch.full_like(query, float("nan"))
    paged_attention_v1(out, query, key_cache, value_cache, 2, 0.125, tables, seq_lens, 16,
                       captured_max, backend=backend)
    ref = paged_attention_reference(query, key_cache, value_cache, 2, 0.125, tables, lengths, 16)
    assert not torch.isnan(out).any()
    return [rel_err(out[i], ref[i]) for i in range(len(lengths))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pa_v1_shorter_than_captured_is_correct(dtype):
    errors = run_pa([1, 100, 33, 256], 256, dtype, "torch")
    assert max(errors) < TOL[dtype]


def test_pa_v1_longer_than_captured_is_wrong():
    errors = run_pa([300, 17, 64], 64, torch.float32, "torch")
    assert errors[0] > 0.1                       # tokens past the captured max never read
    assert max(errors[1:]) < 1e-5                # within the captured max: still right


# ---------------------------------------------------------------------------------------
# the split benchmark's plumbing (torch backend on the CPU; the real run needs CUDA)
# ---------------------------------------------------------------------------------------


def test_splits_bench_writes_table_json_and_plot(tmp_path):
    from mlatrace.bench import splits_bench

    cfg = splits_bench.Config(lengths=(1, 130), sweep=(1, 2), min_replays=1, max_replays=1,
                              seconds_per_point=0.0, tune=False, device="cpu", sets=2)
    res = splits_bench.run_bench(cfg, tmp_path, log=lambda line: None)
    splits_bench.write_outputs(tmp_path, res)
    table = (tmp_path / "splits.md").read_text()
    assert "| 1 |" in table and "| 130 |" in table
    data = json.loads((tmp_path / "splits.json").read_text())
    assert [row["length"] for row in data["rows"]] == [1, 130]
    assert set(data["rows"][0]["columns"]) == {"legacy@1", "fixed128", "bucketed", "device"}
    assert (tmp_path / "splits.png").stat().st_size > 1000


def test_splits_bench_tuning_names_each_rows_config_and_times_the_shipped_one_after():
    """The stage-1 sweep times each of its configs (no fallback, so a config that does not
    fit is an error, never another config's time); every row after it times the shipped
    stage 1, and the stage-2, PDL, tier and min-tile rows differ from DEFAULT only in
    what they measure."""
    from mlatrace.bench import splits_bench

    seen = []
    cfg = splits_bench.Config(lengths=(1, 100_000), sweep=(1,), min_replays=1, max_replays=1,
                              seconds_per_point=0.0, tune=True, device="cpu", sets=1)
    res = splits_bench.Results()
    sets = lambda length, nhead, device: [  # noqa: E731
        {"page_table": torch.zeros(1, 4, dtype=torch.int32),
         "kv_c": torch.zeros(1, 576, dtype=torch.bfloat16)}]
    calls = lambda sets, policy, hint, backend, config=None: [  # noqa: E731
        lambda: seen.append(config or DEFAULT)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(splits_bench, "make_sets", sets)
        mp.setattr(splits_bench, "mla_calls", calls)
        splits_bench.tune(cfg, splits_bench.Timer(cfg), res, log=lambda line: None)
    per_timing = 1 + cfg.min_replays            # the CPU timer: a warm-up call, then replays
    triton_rows = [c for c in splits_bench.tune_configs() if not c.stage1.gluon]
    assert len(res.tuning) == len(triton_rows)   # no Gluon on a CPU: its rows are skipped
    swept = seen[:len(res.tuning) * per_timing:per_timing]
    assert swept == list(triton_rows) and not any(c.stage1.fallback for c in swept)
    after_sweep = seen[len(res.tuning) * per_timing:]
    assert res.pdl and res.min_tiles and res.short and res.stage2_tuning and after_sweep
    assert all(c.stage1 == DEFAULT.stage1 for c in after_sweep)
    assert {c.min_tiles for c in after_sweep} == {1, 2, 4}
    assert {c.pdl for c in after_sweep} == {"off", "all", "device"}


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU exit")
def test_splits_bench_needs_cuda(tmp_path, capsys):
    from mlatrace.bench import splits_bench

    assert splits_bench.main(str(tmp_path), quick=True) == 2
    assert "CUDA" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# GPU: compiled Triton at full size, eager and replayed from CUDA graphs
# ---------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("policy", ["legacy", "bucketed", "device", "fixed:128"])
@pytest.mark.parametrize("nhead", [16, 128])
def test_mla_triton_gpu_full_size(policy, nhead):
    for lengths in ([1], [64, 4097], [30_000]):
        for dtype in (torch.bfloat16, torch.float32):
            check_mla(len(lengths), nhead, lengths, dtype, policy, "triton", device="cuda",
                      hint=1)
            check_mla(len(lengths), nhead, lengths, dtype, policy, "triton", device="cuda")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("policy", ["legacy", "bucketed", "device"])
def test_mla_graph_replay_at_longer_lengths_gpu(policy):
    check_graph_replays(policy, [[1, 1], [5000, 20_000], [64, 65], [19_999, 1]], 20_000)


def check_graph_replays(policy, replays, max_pages, config=None):
    """A bf16 batch of 2 captured at length 1 (hint 1), replayed at each of `replays`
    into a poisoned `o`, against float64."""
    batch, nhead = 2, 16
    q_nope, q_pe, kv_c, page_table, seq_info = make_mla_inputs(
        batch, nhead, [1, 1], torch.bfloat16, "cuda", max_pages=max_pages)
    o = torch.empty(batch, nhead, 512, dtype=torch.bfloat16, device="cuda")
    call = lambda: mla_gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, SM_SCALE,  # noqa: E731
                             min_kv_seq_len=1, policy=policy, backend="triton",
                             config=config)
    call()                                        # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for lengths in replays:
        seq_info.copy_(torch.tensor(lengths, dtype=torch.int32))
        o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = mla_reference(q_nope, q_pe, kv_c, page_table, lengths, SM_SCALE)
        assert rel_err(o, ref) < 1e-2, (policy, lengths)


def skip_without_gluon() -> None:
    from mlatrace.reference import gluon_mla

    if not gluon_mla.available(torch.empty(1, 576, dtype=torch.bfloat16, device="cuda")):
        pytest.skip("the Gluon stage 1 serves Hopper GPUs under Triton "
                    f"{gluon_mla.GLUON_TRITON} only")


def count_gluon_launches(monkeypatch) -> list:
    """A list that gets one entry per launch of the Gluon stage 1 (none without Gluon)."""
    from mlatrace.reference import gluon_mla

    launches = []
    if gluon_mla.gluon is not None:
        kernel = gluon_mla._mla_stage1_wgmma_kernel
        run = kernel.run
        monkeypatch.setattr(kernel, "run", lambda *a, **k: launches.append(1) or run(*a, **k))
    return launches


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("policy", ["legacy", "bucketed", "device", "fixed:5"])
def test_gluon_stage1_on_hopper_matches_float64_like_triton_stage1_gpu(policy, monkeypatch):
    """bf16 stage 1 on a Hopper GPU runs the Gluon kernel (counted), and both it and the
    Triton kernel it replaces match float64 on the CPU cases (heads not a multiple of 16,
    lengths off the 64-row tile) plus long ones, one split (direct `o`) included."""
    skip_without_gluon()
    launches = count_gluon_launches(monkeypatch)
    cases = MLA_CASES + [(2, 16, [100_000, 4095]), (1, 128, [30_001])]
    for gluon_on in (True, False):
        config = replace(DEFAULT, stage1=replace(DEFAULT.stage1, gluon=gluon_on))
        launches.clear()
        for batch, nhead, lengths in cases:
            check_mla(batch, nhead, lengths, torch.bfloat16, policy, "triton", device="cuda",
                      hint=1, config=config)
            check_mla(batch, nhead, lengths, torch.bfloat16, policy, "triton", device="cuda",
                      config=config)
        assert bool(launches) == gluon_on


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("columns", [1, 2, 4, 8])
def test_one_tile_sequences_split_value_columns_over_idle_programs_gpu(columns, monkeypatch):
    """Device partition on the Gluon stage 1: a sequence within one tile has its value
    columns written by up to `columns` programs (`gluon_mla._one_tile_columns`). Every
    launch shape (1, 2, 4 and 8 such programs: batch and heads set the splits), mixed with
    longer sequences in the batch, matches float64 with LSE, eagerly and replayed from a
    graph captured at length 1, into a poisoned `o`."""
    skip_without_gluon()
    config = replace(DEFAULT, stage1=replace(DEFAULT.stage1, column_splits=columns))
    for batch, nhead, lengths in [(1, 16, [1]), (1, 16, [64]), (3, 128, [2, 64, 65]),
                                  (8, 128, [63, 1, 9000, 64, 5, 17, 2, 40]),
                                  (4, 20, [3, 64, 257, 1])]:
        check_mla(batch, nhead, lengths, torch.bfloat16, "device", "triton", device="cuda",
                  hint=1, config=config)
    check_graph_replays("device", [[1, 1], [64, 4999], [3000, 33], [64, 64]], 5000, config)
    # Splits of at least two partition tiles: one active split may then hold 65-128 rows,
    # which the loop must take, not the one-tile path.
    check_mla(4, 16, [100, 64, 128, 129], torch.bfloat16, "device", "triton", device="cuda",
              hint=1, config=replace(config, min_tiles=2))


@pytest.mark.gpu
@gpu
def test_caches_past_int32_offsets_take_the_64_bit_triton_stage1_gpu(monkeypatch):
    """A 2.3e9-element cache (rows read past 2**31 elements): the Gluon kernel's offsets
    are 32-bit, so stage 1 must run the Triton kernel with 64-bit offsets, and be right."""
    batch, nhead, lengths, dtype = 2, 16, [3000, 65], torch.bfloat16
    q_nope, q_pe, kv_small, page_table, seq_info = make_mla_inputs(batch, nhead, lengths, dtype,
                                                                   "cuda")
    kv_big = torch.zeros(4_000_000, 576, dtype=dtype, device="cuda")
    base = kv_big.shape[0] - kv_small.shape[0]
    kv_big[base:] = kv_small
    launches = count_gluon_launches(monkeypatch)
    for policy in ("device", "fixed:1"):
        o = torch.full((batch, nhead, 512), float("nan"), dtype=dtype, device="cuda")
        mla_gluon(q_nope, q_pe, kv_big, o, page_table + base, seq_info, SM_SCALE,
                  policy=policy, backend="triton")
        ref, _ = mla_reference(q_nope, q_pe, kv_small, page_table, lengths, SM_SCALE)
        assert rel_err(o, ref) < 1e-2, policy
    assert not launches


@pytest.mark.gpu
@gpu
def test_pa_v1_graph_replay_contract_gpu():
    lengths_capture, captured_max = [64, 64], 1024
    query, key_cache, value_cache, tables, seq_lens = make_pa_inputs(
        lengths_capture, torch.bfloat16, "cuda", table_tokens=4096)
    out = torch.empty_like(query)
    call = lambda: paged_attention_v1(out, query, key_cache, value_cache, 2, 0.125, tables,  # noqa: E731
                                      seq_lens, 16, captured_max, backend="triton")
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for lengths, ok in (([1000, 3], True), ([4000, 1024], False)):
        seq_lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_attention_reference(query, key_cache, value_cache, 2, 0.125, tables, lengths,
                                        16)
        assert (rel_err(out, ref) < 1e-2) == ok


if __name__ == "__main__" and sys.argv[1:] == ["--triton-cases"]:
    print(json.dumps(run_triton_cases("cuda" if HAS_CUDA else "cpu")))


def test_stage1_offsets_are_32_bit_only_while_the_caches_fit():
    from mlatrace.reference.triton_mla import offsets_fit_int32

    small = torch.empty((100_000, 576), dtype=torch.bfloat16, device="meta")
    big = torch.empty((4_000_000, 576), dtype=torch.bfloat16, device="meta")  # 2.3e9 elements
    assert offsets_fit_int32(small, small[:, 512:])
    assert not offsets_fit_int32(big, big[:, 512:])
    assert not offsets_fit_int32(small, big[:, 512:])


def test_one_tile_column_programs_are_a_power_of_2_within_the_launch():
    """The programs sharing a one-tile sequence's value columns must exist in the launch
    (at most NUM_KV_SPLITS) and divide 512 columns evenly (a power of 2 up to the config's)."""
    from mlatrace.reference import triton_mla

    assert [triton_mla.column_splits(n, 4) for n in (1, 2, 3, 4, 5, 132)] == [1, 2, 2, 4, 4, 4]
    assert triton_mla.column_splits(132, 6) == 4
    assert triton_mla.column_splits(132, 1) == 1


def test_kernel_configs_are_frozen_and_checked():
    """Configs are values: no field changes in place, and a bad one fails when it is made."""
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.stage1.num_warps = 4
    for bad in (lambda: MlaConfig(pdl="sometimes"), lambda: Stage1Config(tile_n=48),
                lambda: Stage2Config(block_dv=48), lambda: MlaConfig(min_tiles=0)):
        with pytest.raises(ValueError):
            bad()
