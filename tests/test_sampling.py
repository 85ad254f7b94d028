"""Eager run-length sampling loses no rule input, and process.end counts stay exact.

Each reference program runs twice under `mlatrace run` (real subprocesses, CPU): with
sampling off (`--sample 0`, every record) and with the default. Both traces must give
the same findings, the same exact count of every record kind in `process.end`, and the
sampled trace must account for every call it left out (`sampled`, `sample.run`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, finding_keys

pytest.importorskip("torch")


SERVE = ["--device", "cpu", "--ctx", "2048", "--steps", "4", "--batch", "2", "--layers", "3",
         "--hidden", "64"]


def traced_serve(out: Path, sample: str | None, *args: str) -> list[dict]:
    options = ["--fold", "0"] + ([] if sample is None else ["--sample", sample])
    cmd = [sys.executable, "-m", "mlatrace", "run", "--out", str(out), *options, "--",
           sys.executable, "-m", "mlatrace.reference.serve", *SERVE, *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("MLATRACE_SAMPLE", None)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = out.glob("p*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("args, expected", [
    (("--policy", "legacy"), {"MLT001"}),                         # the seed-002 bug
    pytest.param(("--policy", "bucketed"), {"MLT001"},            # bucketed frozen at capture
                 marks=pytest.mark.slow),
    pytest.param(("--policy", "bucketed", "--graph", "breakable"), set(),  # eager MLA per layer
                 marks=pytest.mark.slow),
    pytest.param(("--policy", "device", "--graph", "none"), set(),         # all eager
                 marks=pytest.mark.slow),
])
def test_sampling_keeps_findings_and_exact_counts(tmp_path, args, expected):
    full = traced_serve(tmp_path / "all", "0", *args)
    sampled = traced_serve(tmp_path / "sampled", None, *args)

    assert finding_keys(tmp_path / "all") == finding_keys(tmp_path / "sampled")
    assert {f[0] for f in finding_keys(tmp_path / "sampled")} == expected

    end_all, end = full[-1], sampled[-1]
    assert end_all["k"] == end["k"] == "process.end"
    assert end["dropped"] == end_all["dropped"] == 0
    # Exact counts per kind, sampling or not (sample.run exists only when sampling).
    counts = {k: n for k, n in end["counts"].items() if k != "sample.run"}
    assert counts == end_all["counts"]
    written: dict[str, int] = {}
    for rec in sampled[1:-1]:
        written[rec["k"]] = written.get(rec["k"], 0) + 1
    for kind, n in end["counts"].items():
        assert written.get(kind, 0) + end["sampled"].get(kind, 0) == n, kind
    # What was left out is accounted for run by run.
    runs = [r for r in sampled if r["k"] == "sample.run"]
    for kind, n in end["sampled"].items():
        assert sum(r["sampled"] for r in runs if r["of"] == kind) == n, kind
    # Captures and replays are never sampled; eager paths are.
    for kind in ("graph.capture.begin", "graph.replay", "graph.nodes"):
        assert written.get(kind, 0) == end_all["counts"].get(kind, 0)
    assert all(not r["capturing"] for r in sampled if "repeat" in r and "capturing" in r)
    if "--graph" in args:
        assert end["sampled"], "the eager calls of a decode loop are sampled"
        assert len(sampled) < len(full)


def test_every_change_is_recorded_and_runs_are_exact(tmp_path, monkeypatch):
    """In-process: each change of a call's fields starts a recorded run; the rest of a
    run is counted; a capture beginning ends the runs."""
    from mlatrace import probe, record
    from mlatrace.probe import graphs
    from mlatrace.reference import policies

    monkeypatch.setenv("MLATRACE_SAMPLE", "2")
    out = tmp_path / "trace"
    record.start(str(out))
    probe.install([REPO / "probes" / "reference.toml"])
    try:
        calls = [1000] * 5 + [2000] * 3 + [1000] * 4
        for n in calls:
            policies.num_kv_splits("legacy", 4, 1, 16, n)
        gid = graphs.next_gid()
        graphs.push_capture(gid, "test")                      # a capture begins ...
        policies.num_kv_splits("legacy", 4, 1, 16, 1000)      # ... recorded, captured
        graphs.remove_capture(gid)
        policies.num_kv_splits("legacy", 4, 1, 16, 1000)      # a new eager run
    finally:
        probe.uninstall()
        record.stop()
    (path,) = out.glob("p*.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    splits = [(r["min_kv_seq_len"], r.get("repeat"), r["capturing"])
              for r in rows if r["k"] == "kernel.split"]
    assert splits == [(1000, 1, False), (1000, 2, False), (2000, 1, False), (2000, 2, False),
                      (1000, 1, False), (1000, 2, False), (1000, None, True), (1000, 1, False)]
    runs = [(r["repeat"], r["sampled"]) for r in rows if r["k"] == "sample.run"]
    assert runs == [(5, 3), (3, 1), (4, 2)]
    end = rows[-1]
    assert end["counts"]["kernel.split"] == len(calls) + 2
    assert end["sampled"] == {"kernel.split": 6}


KEYED_MODULE = '''
class Buf:
    """A tensor-like argument that counts the reads a probe makes of it."""

    def __init__(self, shape, dtype):
        self._shape, self.dtype, self.ptr_reads = tuple(shape), dtype, 0

    @property
    def shape(self):
        return self._shape

    def data_ptr(self):
        self.ptr_reads += 1
        return 4096


def attend(x, n, layer):
    return n
'''

KEYED_PACK = '''
[pack]
name = "keyed"
library = "none"

[[probe]]
name = "attend"
targets = ["keyed_mod:attend"]
params = ["x", "n", "layer"]
kind = "attn.call"
when = "call"
[probe.fields]
op = "'attend'"
layer = "args.layer"
capturing = "capturing()"
gid = "gid()"
dtype = "dtype(args.x)"
[probe.fields.hints]
n = "args.n"
[probe.fields.shapes]
x = "shape(args.x)"
[probe.fields.ptrs]
x = "ptr(args.x)"
'''



class KeyedRun:
    """keyed_probe's run: the probed module, and the trace's rows once it ended."""

    def __init__(self) -> None:
        self.module: Any = None
        self.rows: list[dict] = []


@contextlib.contextmanager
def keyed_probe(tmp_path: Path, monkeypatch: Any, module: str = KEYED_MODULE,
                pack: str = KEYED_PACK, **env: str) -> Iterator[KeyedRun]:
    """The keyed pack installed in this process with these MLATRACE_* settings, recording
    to tmp_path/trace; the rows are read when the block ends."""
    from mlatrace import probe, record

    sys.modules.pop("keyed_mod", None)
    (tmp_path / "keyed_mod.py").write_text(module)
    (tmp_path / "keyed.toml").write_text(pack)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "trace"
    record.start(str(out))
    probe.install([tmp_path / "keyed.toml"])
    run = KeyedRun()
    try:
        import keyed_mod

        run.module = keyed_mod
        yield run
    finally:
        probe.uninstall()
        record.stop()
    (path,) = out.glob("p*.jsonl")
    run.rows = [json.loads(line) for line in path.read_text().splitlines()]

def test_sampled_calls_are_compared_on_a_raw_key_and_not_extracted(tmp_path, monkeypatch):
    """A call whose key (shape, dtype, hints; not the pointers of an eager record)
    repeats is counted without being extracted: its pointer is never read. Each change
    of shape, dtype or hint is recorded in full, and the runs are exact, layers included."""
    import torch

    with keyed_probe(tmp_path, monkeypatch, MLATRACE_SAMPLE="1") as run:
        keyed_mod = run.module
        x = keyed_mod.Buf((4, 16, 512), torch.bfloat16)
        for layer in range(6):                        # one run over 6 layers
            keyed_mod.attend(x, 100, layer)
        reads_after_run = x.ptr_reads
        keyed_mod.attend(keyed_mod.Buf((4, 16, 512), torch.float32), 100, 0)   # dtype
        keyed_mod.attend(keyed_mod.Buf((8, 16, 512), torch.float32), 100, 0)   # shape
        keyed_mod.attend(keyed_mod.Buf((8, 16, 512), torch.float32), 200, 0)   # hint
        y = keyed_mod.Buf((8, 16, 512), torch.float32)
        keyed_mod.attend(y, 200, 1)                   # same key, new object: counted
    assert reads_after_run == 1            # only the first call of the run was extracted
    assert y.ptr_reads == 0
    rows = run.rows
    calls = [(r["dtype"], r["shapes"]["x"], r["hints"]["n"], r["layer"], r["repeat"],
              r["ptrs"]["x"]) for r in rows if r["k"] == "attn.call"]
    assert calls == [("torch.bfloat16", [4, 16, 512], 100, 0, 1, 4096),
                     ("torch.float32", [4, 16, 512], 100, 0, 1, 4096),
                     ("torch.float32", [8, 16, 512], 100, 0, 1, 4096),
                     ("torch.float32", [8, 16, 512], 200, 0, 1, 4096)]
    runs = [(r["repeat"], r["sampled"], r["layers"]) for r in rows if r["k"] == "sample.run"]
    assert runs == [(6, 5, [0, 1, 2, 3, 4, 5]), (2, 1, [0, 1])]
    end = rows[-1]
    assert end["counts"]["attn.call"] == 10
    assert end["sampled"] == {"attn.call": 6}


def test_launch_key_says_what_the_launch_record_says():
    """Equal launch keys mean equal (grid, constexprs) of the record; a change of grid or
    constexpr changes the key."""
    from mlatrace.probe import triton_launch

    class Const:
        def __init__(self, value):
            self.value = value

    meta = triton_launch.KernelMeta.__new__(triton_launch.KernelMeta)
    meta.const_slots = (("NUM_KV_SPLITS", 2, None), ("BLOCK_N", 1 << 30, 64))
    meta.arg_names, meta.defaults = ["q", "o", "NUM_KV_SPLITS", "BLOCK_N"], {"BLOCK_N": 64}
    cases = [((1, 2, 8), {}, (4, 8, 1)), ((1, 2, 8), {}, (4, 16, 1)),
             ((1, 2, 16), {}, (4, 16, 1)), ((1, 2, Const(16)), {}, (4, 16, 1)),
             ((1, 2, 16), {"BLOCK_N": 32}, (4, 16, 1)), ((1, 2, 16), {}, [4, 16, 1])]
    keys = [triton_launch.launch_key(meta, args, kwargs, grid) for args, kwargs, grid in cases]
    fields = [triton_launch.launch_fields(meta, args, kwargs, grid)
              for args, kwargs, grid in cases]
    for i in range(len(cases)):
        for j in range(len(cases)):
            if keys[i] == keys[j]:
                assert fields[i] == fields[j]
    assert len({repr(k) for k in keys[:3]}) == 3 and keys[4] != keys[2]


def test_replay_handler_counts_replays_and_lets_errors_through(tmp_path, monkeypatch):
    """The replay probe's handler (called without a CallView): each replay counted with
    its exact n, a replay that raises propagates unchanged, is not counted and does not
    disable the probe."""
    from mlatrace import probe, record
    from mlatrace.reference import graph

    monkeypatch.setenv("MLATRACE_REPLAY_TIMING", "off")
    out = tmp_path / "trace"
    record.start(str(out))
    probe.install([REPO / "probes" / "reference.toml"])
    fail = []

    def work() -> None:
        if fail:
            raise ValueError("device work failed")

    try:
        host_graph = graph.HostGraph()
        with graph.graph(host_graph):
            graph.launch(work)
        host_graph.replay()
        host_graph.replay()
        fail.append(True)
        with pytest.raises(ValueError, match="device work failed"):
            host_graph.replay()
        fail.clear()
        host_graph.replay()
    finally:
        probe.uninstall()
        record.stop()
    (path,) = out.glob("p*.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    (begin,) = [r for r in rows if r["k"] == "graph.capture.begin"]
    replays = [r["n"] for r in rows if r["k"] == "graph.replay" and r["gid"] == begin["gid"]]
    assert replays == [1, 2, 3]
    assert not [r for r in rows if r["k"] == "probe.error"]
    assert host_graph.replay_count == 3


def test_small_host_tensor_reductions_match_the_tensor_ones():
    """min/max/sum of a short host tensor (read through one tolist()) equal the tensor's
    own reductions; float tensors keep the tensor path."""
    import torch

    from mlatrace.probe.pathlang.values import reducer as _reduce

    for values in ([5, 1, 9, 3], [7], list(range(300))):
        tensor = torch.tensor(values, dtype=torch.int32)
        for name, builtin in (("min", min), ("max", max), ("sum", sum)):
            assert _reduce(name)(tensor) == builtin(values) == getattr(tensor, name)().item()
    floats = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    assert _reduce("sum")(floats) == floats.sum().item()
    assert _reduce("max")(torch.tensor([], dtype=torch.int32)) is None


@pytest.mark.parametrize("through", ["module", "alias"])
def test_a_steady_probe_steps_aside_after_the_first_call_of_each_step(tmp_path, monkeypatch,
                                                                       through):
    """Step-aside (SETTLE 2, VERIFY 4): 12 steps of 3 layers, the hint advancing each step.
    Steps 1-4 are inspected whole (not yet steady, then the 4th is a verify step), 5-7
    their first call only, 8 whole, 9-11 their first call, 12 whole: 12 of 36 calls pass
    uninspected, every step's first call (its new hint) is written, and a capture begun
    in a stepped-aside step is recorded in full. Called through the module, the
    wrapper is taken off for the rest of each such step (7 steps off, the original runs,
    nothing counts those calls); called through a reference to the wrapper that no module
    holds under its name, the wrapper passes those calls through, counted as unseen."""
    import torch

    from mlatrace.probe import graphs

    with keyed_probe(tmp_path, monkeypatch, MLATRACE_SAMPLE="1",
                     MLATRACE_STEP_ASIDE="2,4") as run:
        keyed_mod = run.module
        alias = keyed_mod.attend

        def attend(*args):
            return (keyed_mod.attend if through == "module" else alias)(*args)

        x = keyed_mod.Buf((4, 16, 512), torch.bfloat16)
        for step in range(1, 13):
            graphs.next_step()                      # what a dispatch or metadata call does
            for layer in range(3):
                attend(x, step, layer)
            if step in (5, 8):                      # taken off after the first call (5),
                assert (keyed_mod.attend is alias) is (step == 8)    # put back at a verify
        graphs.next_step()
        attend(x, 12, 0)                            # step 13: asleep after this call ...
        gid = graphs.next_gid()
        graphs.push_capture(gid, "test")            # ... until a capture begins
        assert keyed_mod.attend is alias
        attend(x, 12, 1)
        graphs.remove_capture(gid)
    rows = run.rows
    written = [(r["hints"]["n"], r["layer"], r["capturing"]) for r in rows
               if r["k"] == "attn.call"]
    assert written == [(n, 0, False) for n in range(1, 13)] + [(12, 1, True)]
    end = rows[-1]
    assert end["steps_off"] == {"keyed.attend": 7}
    assert end["unseen"] == ({} if through == "module" else {"keyed.attend": 12})
    assert end["coverage"]["probes"]["keyed.attend"]["hits"] == 36 + 2 - 12
    # Inspected calls after the first of their step (steps 1-4, 8, 12) are counted runs;
    # step 13's first call repeats step 12's and continues its run.
    assert end["sampled"] == {"attn.call": 13}
    runs = [(r["repeat"], r["sampled"]) for r in rows if r["k"] == "sample.run"]
    assert runs == [(3, 2)] * 5 + [(4, 3)]


def test_without_step_marks_nothing_steps_aside(tmp_path, monkeypatch):
    """A program with no step-marking calls (no metadata, dispatch or capture probe hit)
    has one endless step: its calls are never judged steady, so all are inspected."""
    import torch

    with keyed_probe(tmp_path, monkeypatch, MLATRACE_STEP_ASIDE="1,1000") as run:
        keyed_mod = run.module
        x = keyed_mod.Buf((4, 16, 512), torch.bfloat16)
        for call in range(500):
            keyed_mod.attend(x, call // 50, call % 5)
    end = run.rows[-1]
    assert end["unseen"] == {}
    assert end["coverage"]["probes"]["keyed.attend"]["hits"] == 500


def traced_serve_with(out: Path, options: list[str], *args: str) -> list[dict]:
    cmd = [sys.executable, "-m", "mlatrace", "run", "--out", str(out), *options, "--",
           sys.executable, "-m", "mlatrace.reference.serve", "--device", "cpu", "--ctx",
           "2048", "--steps", "24", "--batch", "2", "--layers", "3", "--hidden", "64", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = out.glob("p*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("args, expected, steps_aside", [
    pytest.param(("--policy", "legacy"), {"MLT001"}, False, marks=pytest.mark.slow),
    pytest.param(("--policy", "bucketed"), {"MLT001"}, False, marks=pytest.mark.slow),
    pytest.param(("--policy", "bucketed", "--graph", "breakable"), set(), True,
                 marks=pytest.mark.slow),
    pytest.param(("--policy", "device", "--graph", "none"), set(), True, marks=pytest.mark.slow),
    (("--policy", "legacy", "--graph", "breakable"), set(), True),
])
def test_step_aside_keeps_findings_and_accounts_for_every_call(tmp_path, args, expected,
                                                               steps_aside):
    """The reference programs with step-aside on (SETTLE 2, VERIFY 8) and off give the
    same findings; every call is accounted for (inspected + unseen = all, per probe),
    replays stay exact per graph, and the eager modes do step aside."""
    every = traced_serve_with(tmp_path / "all", ["--step-aside", "0"], *args)
    aside = traced_serve_with(tmp_path / "aside", ["--step-aside", "2,8"], *args)

    assert finding_keys(tmp_path / "all") == finding_keys(tmp_path / "aside")
    assert {f[0] for f in finding_keys(tmp_path / "aside")} == expected
    end_all, end = every[-1], aside[-1]
    assert end_all["unseen"] == {}
    assert bool(end["unseen"] or end["steps_off"]) is steps_aside
    hits_all = {q: p.get("hits") for q, p in end_all["coverage"]["probes"].items()}
    hits = {q: p.get("hits") for q, p in end["coverage"]["probes"].items()}
    for name, n in hits_all.items():
        if name.endswith("replay") or n is None:
            continue     # a replay stepped aside is counted in `replays`, checked below
        # A step with the wrapper taken off after its first call runs the original for
        # that call's target on the other 2 layers: those calls are the only ones
        # neither inspected nor counted unseen (mla_gluon's wrapper is also taken off in
        # the reference engine's module, which imported it by name).
        uncounted = 2 * end["steps_off"].get(name, 0)
        assert (hits[name] or 0) + end["unseen"].get(name, 0) + uncounted == n, name
    assert end["replays"] == end_all["replays"]
    for kind in ("attn.metadata", "dispatch", "graph.capture.begin", "graph.replay"):
        assert end["counts"].get(kind) == end_all["counts"].get(kind), kind
    if steps_aside:
        assert len(aside) < len(every)


def test_run_rejects_a_bad_step_aside_and_parses_good_ones(tmp_path):
    from mlatrace.record import DEFAULT_STEP_ASIDE, parse_step_aside

    assert parse_step_aside(None) == parse_step_aside("") == DEFAULT_STEP_ASIDE
    assert parse_step_aside("3,16") == (3, 16)
    assert parse_step_aside("0") is parse_step_aside("off") is parse_step_aside("3,1") is None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out",
                           str(tmp_path / "t"), "--step-aside", "8", "--", sys.executable,
                           "-c", "pass"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--step-aside wants SETTLE,VERIFY" in done.stderr
    assert not (tmp_path / "t").exists()


FAILING_META_MODULE = KEYED_MODULE + '''

class Spec:
    def __init__(self, n, boom=False):
        self._n, self.boom = n, boom

    @property
    def n(self):
        if self.boom:
            raise RuntimeError("metadata probe broken")
        return self._n


def build(spec):
    return spec
'''

FAILING_META_PACK = KEYED_PACK + '''
[[probe]]
name = "meta"
targets = ["keyed_mod:build"]
params = ["spec"]
kind = "attn.metadata"
when = "call"
[probe.fields]
n = "args.spec.n"
'''


def test_a_failed_step_marking_probe_wakes_every_probe_for_good(tmp_path, monkeypatch):
    """Steps advance only through step-marking calls: when that probe fails, no probe may
    stay asleep (it would be blind from then on). SETTLE 1: steps 3-10 inspect only their
    first call (16 calls unseen); the metadata probe breaks at step 11, and every later
    call is inspected."""
    import torch

    with keyed_probe(tmp_path, monkeypatch, FAILING_META_MODULE, FAILING_META_PACK,
                     MLATRACE_STEP_ASIDE="1,100") as run:
        keyed_mod = run.module
        x = keyed_mod.Buf((4, 16, 512), torch.bfloat16)
        for step in range(1, 13):
            keyed_mod.build(keyed_mod.Spec(step, boom=step == 11))
            for layer in range(3):
                keyed_mod.attend(x, 7, layer)
    end = run.rows[-1]
    assert [r["probe"] for r in run.rows if r["k"] == "probe.error"] == ["keyed.meta"]
    assert end["steps_off"] == {"keyed.attend": 8}      # 2 calls a step ran unwrapped
    assert end["unseen"] == {}
    assert end["coverage"]["probes"]["keyed.attend"]["hits"] == 36 - 16
