"""triton_launch on real Triton kernels under TRITON_INTERPRET=1 (CPU): grid and constexprs.

TRITON_INTERPRET must be set before Triton is first imported, so the kernel tests
(marked `interpreted`) run in a fresh pytest process that has it from the start;
`test_interpreted_kernel_tests_in_a_fresh_process` starts that process.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from conftest import REPO

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from mlatrace import probe, record  # noqa: E402
from mlatrace.probe import graphs  # noqa: E402
from mlatrace.probe.packs import shipped_pack_dir  # noqa: E402

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(not INTERPRETING, reason="runs in the TRITON_INTERPRET=1 "
                                 "process started by test_interpreted_kernel_tests_...")

KERNELS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _split_kv_stage1_kernel(x_ptr, out_ptr, N, NUM_KV_SPLITS: tl.constexpr,
                            BLOCK_N: tl.constexpr = 16):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    offs = split * BLOCK_N + tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + pid * N + offs, mask=offs < N, other=0.0)
    tl.store(out_ptr + pid * NUM_KV_SPLITS + split, tl.sum(x, axis=0))


@triton.jit
def _copy_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


def split_sum(x, splits, callable_grid=False):
    batch, n = x.shape
    out = torch.zeros(batch, splits)
    if callable_grid:
        grid = lambda meta: (batch, meta["NUM_KV_SPLITS"])  # noqa: E731
        _split_kv_stage1_kernel[grid](x, out, n, NUM_KV_SPLITS=splits, BLOCK_N=n // splits)
    else:
        _split_kv_stage1_kernel[(batch, splits)](x, out, n, splits)
    return out


def copy(x):
    out = torch.empty_like(x)
    _copy_kernel[(1,)](x, out, BLOCK=x.numel())
    return out
'''


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"mt_kernels_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(KERNELS)
    importlib.invalidate_caches()
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def trace(tmp_path):
    out = tmp_path / "trace"
    record.start(str(out))
    graphs.reset()

    def records() -> list[dict]:
        record.stop()
        rows = [json.loads(line) for path in sorted(out.glob("p*.jsonl"))
                for line in path.read_text().splitlines()]
        return [r for r in rows if r["k"] not in ("process", "process.end")]

    yield records
    probe.uninstall()
    record.stop()
    graphs.reset()


def packs(*names: str) -> list[Path]:
    return [shipped_pack_dir() / f"{name}.toml" for name in names]


@interpreted
def test_interp_interpreted_launches_record_grid_and_constexprs(kernels, trace):
    probe.install(packs("triton_launch"))
    mod = importlib.import_module(kernels)
    x = torch.ones(2, 64)
    assert mod.split_sum(x, 4).tolist() == [[16.0] * 4] * 2
    assert mod.split_sum(x, 2, callable_grid=True).tolist() == [[32.0] * 2] * 2
    mod.copy(torch.arange(8.0))                       # name filter: not an attention kernel
    launches = [r for r in trace() if r["k"] == "kernel.launch"]
    assert [(r["name"], r["grid"], r["const"]) for r in launches] == [
        ("_split_kv_stage1_kernel", [2, 4, 1], {"NUM_KV_SPLITS": 4, "BLOCK_N": 16}),
        ("_split_kv_stage1_kernel", [2, 2, 1], {"NUM_KV_SPLITS": 2, "BLOCK_N": 32}),
    ]
    assert all(r["capturing"] is False and r["gid"] is None for r in launches)


@interpreted
def test_interp_launches_inside_a_capture_carry_its_gid(kernels, trace):
    probe.install(packs("triton_launch", "reference"))
    from mlatrace.reference.graph import HostGraph

    mod = importlib.import_module(kernels)
    graph = HostGraph()
    graph.capture_begin()
    mod.split_sum(torch.ones(1, 64), 1)               # launched eagerly while capturing
    graph.capture_end()
    graph.replay()
    graph.replay()
    records = trace()
    begin = next(r for r in records if r["k"] == "graph.capture.begin")
    launch = next(r for r in records if r["k"] == "kernel.launch")
    assert launch["capturing"] is True and launch["gid"] == begin["gid"]
    assert launch["const"]["NUM_KV_SPLITS"] == 1 and launch["grid"] == [1, 1, 1]
    replays = [r for r in records if r["k"] == "graph.replay"]
    assert [r["n"] for r in replays] == [1, 2] and {r["gid"] for r in replays} == {begin["gid"]}


@interpreted
def test_interp_kernel_filter_comes_from_the_environment(kernels, trace, monkeypatch):
    monkeypatch.setenv("MLATRACE_KERNELS", "copy")
    probe.install(packs("triton_launch"))
    mod = importlib.import_module(kernels)
    mod.split_sum(torch.ones(1, 16), 1)
    mod.copy(torch.arange(4.0))
    assert [r["name"] for r in trace() if r["k"] == "kernel.launch"] == ["_copy_kernel"]


@interpreted
def test_interp_uninstall_restores_the_launch_path(kernels, trace):
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    originals = (InterpretedFunction.__dict__["run"], JITFunction.__dict__["run"])
    probe.install(packs("triton_launch"))
    assert InterpretedFunction.__dict__["run"] is not originals[0]
    probe.uninstall()
    assert (InterpretedFunction.__dict__["run"], JITFunction.__dict__["run"]) == originals


def test_launch_hook_is_off_by_default(trace):
    """With any launch hook set Triton builds launch metadata for every launch: opt-in."""
    import triton.knobs as knobs

    from mlatrace.probe.triton_launch import LaunchHook

    probe.install(packs("triton_launch"))
    import triton.runtime.jit  # noqa: F401

    assert not [h for h in knobs.runtime.launch_enter_hook.calls if isinstance(h, LaunchHook)]
    probe.uninstall()


def test_launch_hook_is_added_to_the_hook_chain_and_removed(trace, monkeypatch):
    import triton.knobs as knobs

    from mlatrace.probe.triton_launch import LaunchHook

    monkeypatch.setenv("MLATRACE_TRITON_LAUNCH_HOOK", "1")
    probe.install(packs("triton_launch"))
    import triton.runtime.jit  # noqa: F401

    chain = knobs.runtime.launch_enter_hook
    hooks = [h for h in chain.calls if isinstance(h, LaunchHook)]
    assert len(hooks) == 1, "added to the HookChain, not replacing it"

    class Metadata:                               # what Triton hands the hook: .data only
        data = {"name": "_mla_decode_stage1_kernel", "function": 0, "stream": 0}

    def launcher(gridX, gridY, gridZ, hook):      # the frame layout of CudaLauncher.__call__
        hook(Metadata())

    launcher(1, 7, 1, hooks[0])
    probe.uninstall()
    assert not [h for h in chain.calls if isinstance(h, LaunchHook)]
    launches = [r for r in trace() if r["k"] == "kernel.launch"]
    assert [(r["name"], r["grid"]) for r in launches] == [("_mla_decode_stage1_kernel",
                                                           [1, 7, 1])]


@pytest.mark.skipif(INTERPRETING, reason="this is the outer process's job")
def test_interpreted_kernel_tests_in_a_fresh_process():
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          __file__, "-k", "interp_"], env=env, capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "6 passed" in run.stdout, run.stdout[-1000:]


def test_traced_subprocess_under_interpret_records_launches(tmp_path):
    """End to end: `mlatrace run` injects the probes into a fresh interpreter process."""
    program = tmp_path / "prog.py"
    program.write_text(KERNELS + textwrap.dedent('''
        if __name__ == "__main__":
            split_sum(torch.ones(2, 64), 4)
            split_sum(torch.ones(2, 64), 8, callable_grid=True)
    '''))
    out = tmp_path / "trace"
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(out), "--",
                          sys.executable, str(program)], env=env, capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for path in out.glob("p*.jsonl")
            for line in path.read_text().splitlines()]
    launches = [r for r in rows if r["k"] == "kernel.launch"]
    assert [(r["grid"], r["const"]["NUM_KV_SPLITS"]) for r in launches] == [
        ([2, 4, 1], 4), ([2, 8, 1], 8)]
    assert not [r for r in rows if r["k"] == "probe.error"]
    end = next(r for r in rows if r["k"] == "process.end")
    assert end["probe_errors"] == 0


@interpreted
def test_interp_repeated_eager_launches_are_sampled_with_exact_counts(kernels, tmp_path,
                                                                        monkeypatch):
    """A decode loop launches the same grid every step: the first 8 in a row, then one
    sample.run with the run's exact length when the shape changes."""
    monkeypatch.setenv("MLATRACE_LAUNCH_SAMPLE", "8")
    out = tmp_path / "sampled"
    record.start(str(out))
    graphs.reset()
    probe.install(packs("triton_launch"))
    try:
        mod = importlib.import_module(kernels)
        x = torch.ones(1, 16)
        for _ in range(20):
            mod.split_sum(x, 1)
        mod.split_sum(x, 2)                          # a new shape is always recorded
    finally:
        probe.uninstall()
        record.stop()
    rows = [json.loads(line) for path in out.glob("p*.jsonl")
            for line in path.read_text().splitlines()]
    launches = [r for r in rows if r["k"] == "kernel.launch"]
    assert [(r["const"]["NUM_KV_SPLITS"], r["repeat"]) for r in launches] == [
        *[(1, n) for n in range(1, 9)], (2, 1)]
    (run,) = [r for r in rows if r["k"] == "sample.run"]
    assert (run["of"], run["name"], run["repeat"], run["sampled"]) == (
        "kernel.launch", "_split_kv_stage1_kernel", 20, 12)
    assert run["seq"] < launches[-1]["seq"]          # written when the run ended
    (end,) = [r for r in rows if r["k"] == "process.end"]
    assert end["sampled"] == {"kernel.launch": 12}
    assert end["counts"]["kernel.launch"] == 21


@interpreted
def test_interp_a_stepped_aside_launch_path_is_taken_off_until_the_next_step(kernels, tmp_path,
                                                                              monkeypatch):
    """Steady steps (SETTLE 1): from the third step on, the first launch of a step puts
    Triton's own `run` back on its class, so the step's later launches run no wrapper at
    all; the next step (or a capture begin) puts the wrapper back, and a captured launch
    is recorded in full."""
    from triton.runtime.interpreter import InterpretedFunction

    from mlatrace.reference.graph import HostGraph

    monkeypatch.setenv("MLATRACE_STEP_ASIDE", "1,100")
    out = tmp_path / "aside"
    record.start(str(out))
    graphs.reset()
    original = InterpretedFunction.__dict__["run"]
    probe.install(packs("triton_launch", "reference"))
    wrapper = InterpretedFunction.__dict__["run"]
    held = []
    try:
        mod = importlib.import_module(kernels)
        x = torch.ones(1, 16)
        for _ in range(6):
            graphs.next_step()
            held.append(InterpretedFunction.__dict__["run"] is wrapper)
            for _ in range(3):
                mod.split_sum(x, 1)
            held.append(InterpretedFunction.__dict__["run"] is wrapper)
        graph = HostGraph()
        graph.capture_begin()                        # a capture puts the wrapper back
        mod.split_sum(x, 1)
        graph.capture_end()
    finally:
        probe.uninstall()
        record.stop()
    assert InterpretedFunction.__dict__["run"] is original
    # Put back at each step's start; taken off after the first launch from step 3 on.
    assert held == [True, True, True, True] + [True, False] * 4
    rows = [json.loads(line) for path in out.glob("p*.jsonl")
            for line in path.read_text().splitlines()]
    launches = [(r["repeat"] if "repeat" in r else None, r["capturing"]) for r in rows
                if r["k"] == "kernel.launch"]
    assert launches[0] == (1, False) and launches[-1] == (None, True)
    end = [r for r in rows if r["k"] == "process.end"][-1]
    assert end["steps_off"] == {"triton_launch.interpreted_run": 4}
