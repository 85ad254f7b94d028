"""Fixtures and constants shared by several test modules (`from conftest import REPO`)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mlatrace import probe, record
from mlatrace.probe import graphs

REPO = Path(__file__).resolve().parent.parent      # the checkout under test
SAMPLES = REPO / "samples"
FIXTURES = REPO / "tests" / "fixtures"
PROGS = REPO / "tests" / "progs"                   # small programs the tests trace
MLATRACE = [sys.executable, "-m", "mlatrace"]      # the CLI, run by this interpreter


def run_env(**extra: str) -> dict[str, str]:
    """The environment of a traced subprocess: this checkout first on PYTHONPATH, one
    thread, and mlatrace's defaults (no MLATRACE_FOLD / MLATRACE_MAX_MB from outside)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    for name in ("MLATRACE_FOLD", "MLATRACE_MAX_MB"):
        env.pop(name, None)
    return env


@pytest.fixture
def traced_with(tmp_path: Path) -> Iterator[Callable[[list], Callable[[], list[dict]]]]:
    """`traced_with(packs)` starts the recorder in this process with those packs installed
    and returns `records()`, which uninstalls the probes, stops the recorder and returns
    every record written (headers included). Whatever a test left running is undone."""
    out = tmp_path / "trace"

    def start(packs: list) -> Callable[[], list[dict]]:
        record.start(str(out))
        graphs.reset()
        probe.install(packs)

        def records() -> list[dict]:
            probe.uninstall()
            record.stop()
            return [json.loads(line) for path in sorted(out.glob("p*.jsonl"))
                    for line in path.read_text().splitlines()]
        return records

    yield start
    probe.uninstall()
    record.stop()


def finding_keys(trace: Path) -> list[tuple]:
    """A trace's findings as sorted (id, severity, gid, message): what two runs compare."""
    from mlatrace.analysis import analyze
    from mlatrace.trace import open_trace

    result = analyze(open_trace(trace))
    return sorted((f.id, f.severity, f.gid, f.message) for f in result.findings)
