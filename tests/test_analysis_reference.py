"""Real traces of the reference decode program (CPU), recorded in-process, and GPU samples.

legacy captured at the dummy length finds MLT001; the device policy, bucketed captured
with a long hint, and the breakable capture (eager MLA between segments) do not.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from conftest import SAMPLES

pytest.importorskip("torch")

from mlatrace.pytest_plugin import MlaTrace  # noqa: E402

SERVE = ["--device", "cpu", "--steps", "3", "--ctx", "4096", "--layers", "2"]


def trace_serve(tmp_path: Path, *args: str) -> MlaTrace:
    from mlatrace.reference import serve

    tracer = MlaTrace(tmp_path / "trace").start()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            assert serve.main([*args, *SERVE]) == 0
    finally:
        tracer.stop()
    return tracer


@pytest.mark.parametrize("args, expected", [
    (("--policy", "legacy"), ["MLT001"]),
    (("--policy", "device"), []),
    (("--policy", "bucketed", "--capture-hint", "16384"), []),
    (("--policy", "bucketed"), ["MLT001"]),          # bucketed captured once at a dummy length
    (("--policy", "legacy", "--graph", "breakable"), []),
])
def test_reference_serve(tmp_path, args, expected):
    tracer = trace_serve(tmp_path, *args)
    found = tracer.findings
    assert [f.id for f in found] == expected, [f.message for f in found]
    model = tracer.analysis.model
    assert model.graphs and model.total_replays() == 3
    for f in found:
        assert f.details["num_kv_splits"] == 1 and f.details["replay_seq_len_max"] >= 4096
        assert {e.kind for e in f.evidence} >= {"kernel.split", "graph.replay"}


def _sample_traces(policy: str) -> list[Path]:
    return sorted({p.parent for p in SAMPLES.glob(f"**/*serve_{policy}*/p*.jsonl")})


@pytest.mark.parametrize("policy, expected", [("legacy", {"MLT001"}), ("device", set()),
                                              ("bucketed_breakable", set())])
def test_gpu_samples(policy, expected):
    """Traces recorded on the H200 by samples/gpu_run.sh: legacy in a FULL graph (the bug),
    device in a FULL graph, bucketed in a breakable capture (the seed's final design)."""
    from mlatrace.analysis import analyze
    from mlatrace.trace import open_trace

    traces = _sample_traces(policy)
    assert traces, f"samples/**/*serve_{policy}*/ is committed: a missing trace is a lost fixture"
    for trace in traces:
        result = analyze(open_trace(trace))
        assert {f.id for f in result.findings if f.severity == "error"} == expected, trace
        assert result.model.total_replays() > 0
        for f in result.findings:
            assert f.evidence
            if f.id == "MLT001":
                assert f.details["replay_seq_len_max"] >= 8 * 64
            else:
                # The serve program's own per-step timing (torch.cuda.synchronize after each
                # step) is a real host sync between replays: reported, as a warning.
                assert f.id == "MLT004" and f.severity == "warning", f
                assert "reference/serve.py" in f.message, f.message


def test_gpu_capture_triton_sample_has_no_length_evidence():
    """Bare torch graphs of one-split Triton launches, replayed without attention metadata:
    the one split is visible in the topology, but no finding without long replays."""
    from mlatrace.analysis import analyze
    from mlatrace.analysis.summary import units
    from mlatrace.trace import open_trace

    trace = SAMPLES / "capture_triton"
    assert (trace / "run.json").exists(), "samples/capture_triton is a committed fixture"
    result = analyze(open_trace(trace))
    assert result.findings == []
    assert all(u["frozen"]["num_kv_splits"] for u in units(result.model))
