"""The pytest plugin: fixture, marker and --mlatrace-fail-on, run in a child pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO

INNER = textwrap.dedent('''
    import pytest
    from mlatrace import record

    def frozen_one_split(length):
        """What the probes record for seed 002: one split captured, replayed at `length`."""
        record.emit("graph.capture.begin", gid=1, parent=None, src="reference",
                    key="FULL(num_tokens=1)", mode="FULL")
        record.emit("kernel.split", op="mla_gluon", num_kv_splits=1, block_n=64, batch=1,
                    qlen=1, nhead=16, min_kv_seq_len=1, policy="legacy", capturing=True, gid=1)
        record.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
        for i in range(3):
            record.emit("attn.metadata", backend="ref", num_reqs=1, seq_len_min=length + i,
                        seq_len_max=length + i, seq_len_sum=length + i, dummy=False,
                        capturing=False, ptrs={})
            record.emit_replay(1)

    def test_fixture_exposes_findings(mlatrace_trace):
        frozen_one_split(100000)
        assert [f.id for f in mlatrace_trace.findings] == ["MLT001"]
        assert mlatrace_trace.findings[0].details["replays"] == 3

    def test_fixture_healthy(mlatrace_trace):
        frozen_one_split(100)
        assert mlatrace_trace.findings == []

    @pytest.mark.mlatrace(fail_on="error")
    def test_marker_fails_on_findings():
        frozen_one_split(100000)

    @pytest.mark.mlatrace(fail_on=None)
    def test_marker_record_only():
        frozen_one_split(100000)

    @pytest.mark.mlatrace(rules=["MLT002"])
    def test_marker_rule_selection():
        frozen_one_split(100000)

    def test_option_fails_fixture_users(mlatrace_trace):
        frozen_one_split(100000)

    def test_untraced():
        assert not record.active()
''')


def run_inner(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(INNER)
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MLATRACE_OUT", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "mlatrace.pytest_plugin",
                           "-p", "no:cacheprovider", "-q", "-rA", "test_inner.py", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def outcomes(proc: subprocess.CompletedProcess) -> dict[str, str]:
    found = {}
    for line in proc.stdout.splitlines():
        for word in ("PASSED", "FAILED"):
            if line.startswith(word + " "):
                found[line.split("::")[1].split(" ")[0]] = word
    return found


def test_plugin_fixture_marker_and_option(tmp_path):
    proc = run_inner(tmp_path)
    got = outcomes(proc)
    assert got == {
        "test_fixture_exposes_findings": "PASSED",
        "test_fixture_healthy": "PASSED",
        "test_marker_fails_on_findings": "FAILED",
        "test_marker_record_only": "PASSED",
        "test_marker_rule_selection": "PASSED",
        "test_option_fails_fixture_users": "PASSED",
        "test_untraced": "PASSED",
    }, proc.stdout + proc.stderr
    assert "MLT001 frozen-one-split [error]" in proc.stdout
    assert "fix: " in proc.stdout

    proc = run_inner(tmp_path, "--mlatrace-fail-on", "error", "-k", "option or healthy")
    got = outcomes(proc)
    assert got == {"test_fixture_healthy": "PASSED",
                   "test_option_fails_fixture_users": "FAILED"}, proc.stdout + proc.stderr


def test_plugin_is_inert_and_torch_free():
    code = ("import sys, mlatrace.pytest_plugin; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'mlatrace.record' not in sys.modules; "
            "import mlatrace.analysis, mlatrace.output.report, mlatrace.output.check, mlatrace.output.diff; "
            "assert 'torch' not in sys.modules, 'torch imported by analysis'")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_plugin_under_mlatrace_run_keeps_the_outer_recording(tmp_path):
    """pytest traced by `mlatrace run`: each test's trace is a copy, the run goes on."""
    (tmp_path / "test_inner.py").write_text(INNER + textwrap.dedent('''
        def test_zz_after():
            record.emit("mark", name="after_the_traced_tests", attrs={})
    '''))
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    outer = tmp_path / "outer"
    proc = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(outer), "--",
                           sys.executable, "-m", "pytest", "-p", "mlatrace.pytest_plugin",
                           "-p", "no:cacheprovider", "-q", "-rA", "test_inner.py",
                           "-k", "fixture_exposes or fixture_healthy or zz_after"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert outcomes(proc) == {"test_fixture_exposes_findings": "PASSED",
                              "test_fixture_healthy": "PASSED",
                              "test_zz_after": "PASSED"}, proc.stdout + proc.stderr
    from mlatrace.trace import open_trace

    (pytest_proc,) = [p for p in open_trace(outer).processes
                      if "pytest" in " ".join(p.header["argv"])]
    records = list(pytest_proc.records())
    replays = sum(r["k"] == "graph.replay" for r in records)
    replays += sum(r["replays"] for r in records if r["k"] == "steady")   # folded ones
    assert replays == 6   # both tests' replays
    assert any(r.get("name") == "after_the_traced_tests" for r in records)
    assert pytest_proc.end is not None
