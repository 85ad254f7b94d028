"""The reference decode engine: what a graph captured at a dummy length freezes, and what it doesn't.

CPU tests use graph.HostGraph; the `gpu` test repeats the key one with torch.cuda.CUDAGraph.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

torch = pytest.importorskip("torch")

from mlatrace.reference import graph, policies  # noqa: E402
from mlatrace.reference.engine import (  # noqa: E402
    EngineConfig,
    ReferenceMLAMetadataBuilder,
    ReferenceModelRunner,
)

LONG = 2048


def make_runner(policy: str = "legacy", graph_mode: str = "full", *, batch: int = 2,
                max_seq_len: int = LONG + 16, device: str = "cpu", **kw) -> ReferenceModelRunner:
    config = EngineConfig(batch_sizes=(batch,), num_heads=16, num_layers=2, hidden_size=64,
                          max_seq_len=max_seq_len, policy=policy, graph_mode=graph_mode,
                          device=device, seed=3, **kw)
    runner = ReferenceModelRunner(config)
    runner.capture_model()
    return runner


def step_inputs(batch: int, step: int, device: str = "cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(batch, 64, generator=gen).to(device)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).abs().max() / ref.double().abs().max())


# -- HostGraph ---------------------------------------------------------------------------


def test_host_graph_records_without_running_and_replays_current_buffers():
    src, dst = torch.zeros(4), torch.zeros(4)

    def add_one(x, out):
        out.copy_(x + 1)

    host_graph = graph.HostGraph()
    with graph.graph(host_graph):
        assert graph.current_host_graph() is host_graph
        assert graph.launch(add_one, src, out=dst) is None
    assert graph.current_host_graph() is None
    assert torch.equal(dst, torch.zeros(4))          # capture ran nothing
    assert host_graph.launch_names() == ["add_one"]
    src.fill_(41)
    host_graph.replay()
    assert torch.equal(dst, torch.full((4,), 42.0))  # replay read the buffer's current value
    graph.launch(add_one, torch.ones(4), out=dst)    # not capturing: runs at once
    assert torch.equal(dst, torch.full((4,), 2.0))


def test_host_graph_misuse_raises():
    host_graph = graph.HostGraph()
    with pytest.raises(RuntimeError):
        host_graph.replay()
    with pytest.raises(RuntimeError):
        host_graph.capture_end()
    with graph.graph(host_graph):
        pass
    with pytest.raises(RuntimeError):
        host_graph.capture_begin()
    host_graph.reset()
    with graph.graph(host_graph):
        pass


# -- metadata builder --------------------------------------------------------------------


def test_builder_fills_static_buffers_and_sets_the_host_hint():
    builder = ReferenceMLAMetadataBuilder(4, 32, torch.device("cpu"))
    dummy = builder.build(torch.ones(2, dtype=torch.int32), dummy=True)
    real = builder.build(torch.tensor([20, 17], dtype=torch.int32))
    assert dummy.min_kv_seq_len == 1 and dummy.dummy
    assert real.min_kv_seq_len == 17 and real.max_seq_len == 20 and real.num_reqs == 2
    assert real.seq_info.data_ptr() == dummy.seq_info.data_ptr() == builder.seq_info.data_ptr()
    assert builder.seq_info[:2].tolist() == [20, 17]
    hinted = ReferenceMLAMetadataBuilder(4, 32, torch.device("cpu"), capture_hint=16384)
    assert hinted.build([1, 1], dummy=True).min_kv_seq_len == 16384
    assert hinted.build([5, 9]).min_kv_seq_len == 5


# -- full graph: frozen split, correct output --------------------------------------------


def test_legacy_full_graph_freezes_one_split_but_stays_correct():
    graphed = make_runner("legacy", "full")
    eager = make_runner("legacy", "none")
    assert graphed.captured_num_kv_splits(2) == {0: 1, 1: 1}
    calls_after_capture = graphed.impl.num_calls
    for step in range(2):
        hidden = step_inputs(2, step)
        lens = [LONG + step, LONG - 300 + step]
        out = graphed.execute_model(hidden, lens).clone()
        eager_out = eager.execute_model(hidden, lens)
        ref = graphed.reference_output(hidden, lens)
        assert rel_err(out, ref) < 1e-4
        assert rel_err(out, eager_out) < 1e-4
    # Replays never re-entered the Python wrapper: the split stayed the captured one.
    assert graphed.impl.num_calls == calls_after_capture
    assert graphed.captured_entry(2).replay_count == 2
    assert eager.impl.last_num_kv_splits == {0: 28, 1: 28}   # cdiv(1749, 64) at this length
    assert min(eager.impl.last_num_kv_splits.values()) > 1


def test_graph_captured_with_no_stage2_launch_has_fewer_launches():
    """The one-split capture has no stage-2 node at all; the long eager call would need one."""
    one_split = make_runner("legacy", "full")
    hinted = make_runner("legacy", "full", capture_hint=16384)
    assert hinted.captured_num_kv_splits(2) == {0: 128, 1: 128}
    assert len(hinted.captured_launch_names(2)) == len(one_split.captured_launch_names(2)) + 2


def test_device_policy_is_the_same_captured_and_eager():
    graphed = make_runner("device", "full")
    eager = make_runner("device", "none")
    hidden = step_inputs(2, 0)
    lens = [LONG, 33]
    out = graphed.execute_model(hidden, lens).clone()
    eager.execute_model(hidden, lens)
    budget = policies.device(2, 1, 16)  # the device policy's fixed launch budget
    assert budget > 1
    assert graphed.captured_num_kv_splits(2) == eager.impl.last_num_kv_splits == {0: budget,
                                                                                  1: budget}
    assert rel_err(out, graphed.reference_output(hidden, lens)) < 1e-4


def test_static_input_and_seq_info_pointers_do_not_move():
    runner = make_runner("legacy", "full")
    entry = runner.captured_entry(2)
    assert entry.input_addresses == [runner.input_hidden.data_ptr()]
    seq_info_ptr = runner.attn_metadata_builder.seq_info.data_ptr()
    runner.execute_model(step_inputs(2, 0), [LONG, LONG])
    assert runner.attn_metadata_builder.seq_info.data_ptr() == seq_info_ptr


def test_a_batch_above_the_largest_captured_size_runs_eagerly():
    runner = make_runner("legacy", "full", max_num_reqs=3)
    calls = runner.impl.num_calls
    hidden = step_inputs(3, 0)
    out = runner.execute_model(hidden, [LONG] * 3)
    assert runner.impl.num_calls == calls + 2                  # forward_mqa ran, per layer
    assert runner.impl.last_num_kv_splits == {0: 32, 1: 32}
    assert runner.captured_entry(3) is None
    assert rel_err(out, runner.reference_output(hidden, [LONG] * 3)) < 1e-4


def test_a_smaller_batch_pads_up_to_the_captured_size_and_replays_its_graph():
    """As vLLM pads: batch 1 runs the graph of 2 (a padding request of length 1), and
    its one output row is the eager answer."""
    runner = make_runner("legacy", "full")
    calls = runner.impl.num_calls
    entry = runner.captured_entry(2)
    hidden = step_inputs(1, 0)
    out = runner.execute_model(hidden, [LONG])
    assert runner.impl.num_calls == calls                       # replayed, nothing eager
    assert entry.replay_count == 1 and out.shape[0] == 1
    assert rel_err(out, runner.reference_output(hidden, [LONG])) < 1e-4


# -- breakable: eager MLA between graph segments -----------------------------------------


def test_breakable_capture_rechooses_splits_every_step():
    runner = make_runner("bucketed", "breakable", batch=1, max_seq_len=5100)
    capture = runner.captured_entry(1).capture
    assert capture.num_eager_breaks == 2 and capture.num_graphs == 3
    assert runner.captured_num_kv_splits(1) == {0: 1, 1: 1}      # captured at length 1
    seen = []
    for step, length in enumerate([40, 2048, 5000]):
        hidden = step_inputs(1, step)
        out = runner.execute_model(hidden, [length])
        seen.append(runner.impl.last_num_kv_splits[0])
        assert rel_err(out, runner.reference_output(hidden, [length])) < 1e-4
    assert seen == [1, 16, 48]
    assert runner.captured_entry(1).replay_count == 3


def test_bucketed_full_graph_freezes_like_legacy():
    runner = make_runner("bucketed", "full", batch=1, max_seq_len=5100)
    calls = runner.impl.num_calls
    hidden = step_inputs(1, 0)
    out = runner.execute_model(hidden, [5000])
    assert runner.captured_num_kv_splits(1) == {0: 1, 1: 1}
    assert runner.impl.num_calls == calls
    assert rel_err(out, runner.reference_output(hidden, [5000])) < 1e-4


# -- serve program -----------------------------------------------------------------------


def run_serve(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "mlatrace.reference.serve", "--device", "cpu",
                           *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def test_serve_cli_checks_a_frozen_legacy_graph():
    result = run_serve("--steps", "3", "--check")
    assert result.returncode == 0, result.stderr
    assert "NUM_KV_SPLITS frozen per layer: {0: 1, 1: 1}" in result.stdout
    assert "splits used   1 (the real length needs  32)" in result.stdout
    assert "check: all steps match the float64 reference" in result.stdout


def test_serve_cli_bench_prints_one_json_line():
    result = run_serve("--bench", "--steps", "3", "--warmup", "1", "--policy", "device",
                       "--ctx", "256", "--layers", "1")
    assert result.returncode == 0, result.stderr
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["device"] == "cpu" and line["policy"] == "device" and line["steps"] == 3
    assert line["median_step_us"] > 0
    assert line["frozen_num_kv_splits"] == policies.device(line["batch"], 1, line["heads"])


def test_serve_rejects_unknown_policy():
    result = run_serve("--policy", "nope")
    assert result.returncode == 2 and "unknown --policy" in result.stderr


def test_serve_cli_breakable_chooses_splits_per_step():
    result = run_serve("--steps", "2", "--graph", "breakable", "--check")
    assert result.returncode == 0, result.stderr
    assert "3 graph segments + 2 eager MLA calls" in result.stdout
    assert "splits used  32 (the real length needs  32)" in result.stdout


# -- GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy,graph_mode", [("legacy", "full"), ("device", "full"),
                                               ("bucketed", "breakable")])
def test_cuda_graph_replay_matches_reference(policy, graph_mode):
    runner = make_runner(policy, graph_mode, device="cuda", dtype=torch.bfloat16,
                         max_seq_len=8200)
    for step, length in enumerate([8000, 4100]):
        hidden = step_inputs(2, step, "cuda").bfloat16()
        lens = [length, length - 7]
        out = runner.execute_model(hidden, lens).clone()
        torch.cuda.synchronize()
        assert rel_err(out, runner.reference_output(hidden, lens)) < 5e-2
    if graph_mode == "full" and policy == "legacy":
        assert runner.captured_num_kv_splits(2) == {0: 1, 1: 1}
