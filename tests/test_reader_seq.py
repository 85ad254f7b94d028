"""A record with a wild `seq` is that record's problem, never the rest's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mlatrace.trace import open_trace

FIXTURES = Path(__file__).parent / "fixtures"


def _with_wild_line(tmp_path: Path, at: int) -> tuple[Path, list[dict]]:
    src = FIXTURES / "legacy_one_split"
    dest = tmp_path / "wild"
    shutil.copytree(src, dest)
    path = dest / "p1000.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    good = [json.loads(line) for line in lines]
    stray = dict(good[at - 2], seq=999999)  # a valid record, its seq far ahead
    lines.insert(at - 1, json.dumps(stray) + "\n")
    path.write_text("".join(lines))
    return dest, good


def _read(dest: Path):
    proc = open_trace(dest).processes[0]
    return proc, list(proc.records())


def test_a_wild_seq_skips_one_record_and_keeps_the_rest(tmp_path):
    for at in (6, 20):
        dest, good = _with_wild_line(tmp_path / str(at), at)
        proc, records = _read(dest)
        assert [r["seq"] for r in records] == [r["seq"] for r in good]
        assert proc.end is not None and proc.end["k"] == "process.end"
        assert [str(p) for p in proc.problems] == [
            f"p1000.jsonl:{at}: seq 999999 out of order (the records after it go on from "
            f"seq {good[at - 2]['seq']}); record skipped"]
        assert proc.gaps == 0 and proc.dropped == 0


def test_a_wild_seq_read_piece_by_piece(tmp_path):
    """The tailing reader hands lines over in pieces: the wild record ends one piece."""
    dest, good = _with_wild_line(tmp_path, 10)
    proc = open_trace(dest).processes[0]
    raw = proc.path.read_bytes().splitlines(keepends=True)
    records = []
    records += list(proc.checked_lines(enumerate(raw[:10], start=1)))
    records += list(proc.checked_lines(enumerate(raw[10:], start=11)))
    seqs = [r["seq"] for r in records]
    assert seqs[-1] == good[-1]["seq"] and len(seqs) == len(good) + (999999 in seqs)
    assert proc.end is not None and proc.gaps == 0 and proc.dropped == 0
    assert "seq 999999 out of order" in str(proc.problems[0])


def test_replays_and_coverage_survive_a_wild_seq(tmp_path):
    from click.testing import CliRunner

    from mlatrace.cli import main

    base = json.loads(CliRunner().invoke(
        main, ["report", "--json", str(FIXTURES / "legacy_one_split")]).stdout)
    dest, _good = _with_wild_line(tmp_path, 8)
    data = json.loads(CliRunner().invoke(main, ["report", "--json", str(dest)]).stdout)
    assert data["summary"]["replays"] == base["summary"]["replays"]
    assert data["summary"]["problems"] == 1
