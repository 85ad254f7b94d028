"""`mlatrace bench analyze` smoke test: a small generated trace, report timed in a subprocess."""

from __future__ import annotations

from pathlib import Path

from mlatrace.analysis import analyze
from mlatrace.bench import analyze_bench
from mlatrace.trace import open_trace


def test_generated_trace_is_valid_and_finds_the_frozen_split(tmp_path: Path):
    written = analyze_bench.write_trace(tmp_path / "t", 4000)
    assert 3900 <= written <= 4100
    result = analyze(open_trace(tmp_path / "t"))
    assert result.problems == []
    assert {f.id for f in result.findings} == {"MLT001"}
    assert len(result.findings) == analyze_bench.RANKS * len(analyze_bench.BATCH_SIZES)
    graph = result.model.graphs[(4242, 1)]
    assert graph.replays.percentiles() is not None and graph.replays.count > 0


def test_bench_command_prints_its_numbers(capsys):
    analyze_bench.main(events=4000, repeat=1)
    out = capsys.readouterr().out
    assert "report --json, best of 1:" in out and "peak RSS: report" in out


def test_incremental_bench_follows_every_record(capsys):
    analyze_bench.main_incremental(events=4000, repeat=1, idle_s=0.5)
    out = capsys.readouterr().out
    assert "follow (tail + incremental model" in out and "idle follow loop:" in out
    assert "records, 16 findings" in out  # one MLT001 per captured batch size and rank
