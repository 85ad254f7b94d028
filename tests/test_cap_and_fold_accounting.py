"""What the size cap and folding say about themselves is true.

Real `mlatrace run` traces of the reference serve program (CPU), read back through the
`mlatrace` CLI in subprocesses: a `steady` record of a graph never captured, a malformed
fold range, the cap's line under `--fold 0`, a cap that left out what rules read, and
the record counts of one program traced with folding on and off.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_env

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SERVE = ["--device", "cpu", "--ctx", "2048", "--steps", "14", "--batch", "2", "--layers", "2",
         "--hidden", "32", "--heads", "2"]


def _env() -> dict[str, str]:
    return run_env(COLUMNS="200")


def traced(out: Path, options: list[str], *args: str) -> Path:
    cmd = [sys.executable, "-m", "mlatrace", "run", "--out", str(out), *options, "--",
           sys.executable, "-m", "mlatrace.reference.serve", *SERVE, *args]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = out.glob("p*.jsonl")
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlatrace", *args], env=_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def folded_and_not(tmp_path_factory) -> tuple[Path, Path]:
    """The legacy program traced with folding on (the default) and off (`--fold 0`)."""
    root = tmp_path_factory.mktemp("fold")
    traced(root / "on", [], "--policy", "legacy")
    traced(root / "off", ["--fold", "0"], "--policy", "legacy")
    return root / "on", root / "off"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _copy_with(src: Path, dst: Path, edit) -> tuple[Path, int]:
    """A copy of trace `src` whose one process file `edit(rows)` changed; the line edited."""
    dst.mkdir()
    (path,) = src.glob("p*.jsonl")
    rows = _rows(path)
    index = edit(rows)
    out = dst / path.name
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out, index + 1


def test_a_steady_record_of_a_graph_never_captured_is_a_file_line_problem_and_skipped(
        folded_and_not, tmp_path):
    on, _ = folded_and_not
    before = json.loads(cli("report", "--json", str(on)).stdout)

    def phantom(rows: list[dict]) -> int:
        index = max(i for i, r in enumerate(rows) if r["k"] == "steady" and r.get("gid"))
        rows[index]["gid"] = 99
        return index

    path, line = _copy_with(on, tmp_path / "t", phantom)
    done = cli("report", "--json", str(tmp_path / "t"))
    data = json.loads(done.stdout)
    reasons = [f"{p['file']}:{p['line']}: {p['reason']}" for p in data["problems"]]
    assert any(r.startswith(f"{path.name}:{line}: steady record") and "names gid 99" in r
               and r.endswith("record skipped") for r in reasons), reasons
    assert data["summary"]["graphs_total"] == before["summary"]["graphs_total"]
    assert data["summary"]["graphs"] == before["summary"]["graphs"]
    assert 99 not in {g["gid"] for g in data["graphs"]}
    assert [f["id"] for f in data["findings"]] == [f["id"] for f in before["findings"]]


def test_a_malformed_fold_range_is_said_in_whole_words(folded_and_not, tmp_path):
    on, _ = folded_and_not

    def bad_range(rows: list[dict]) -> int:
        index = next(i for i, r in enumerate(rows) if r["k"] == "steady" and r.get("pattern"))
        entry = next(e for e in rows[index]["pattern"] if e["k"] == "attn.metadata")
        entry.setdefault("range", {})["seq_len_max"] = [30256]
        return index

    path, line = _copy_with(on, tmp_path / "t", bad_range)
    for command in ("check", "report"):
        out = cli(command, str(tmp_path / "t")).stdout
        assert (f"warning: {path.name}:{line}: malformed steady record (seq "
                in out), out
        assert "range of attn.metadata.seq_len_max is not [lo, hi]: [30256]; record skipped" \
            in out, out


def test_the_cap_line_under_fold_0_says_only_what_it_kept(tmp_path):
    traced(tmp_path / "cap", ["--fold", "0", "--max-mb", "0"], "--policy", "device")
    out = cli("report", str(tmp_path / "cap")).stdout
    line = next(s for s in out.splitlines() if "size cap of 0.0 MB reached" in s)
    kept = line.rsplit("); ", 1)[1]
    assert kept.startswith("captures, syncs, eager breaks, marks and errors kept (no folding"), line
    assert "folds" not in kept and "changes" not in kept, line


def test_a_cap_that_left_out_replays_makes_the_run_blind_unless_a_finding_stands(tmp_path):
    path = traced(tmp_path / "cap", ["--fold", "0", "--max-mb", "0"], "--policy", "device")
    left = _rows(path)[-1]["cap"]["left_out"]
    assert left.get("graph.replay") and left.get("attn.metadata")
    done = cli("check", str(tmp_path / "cap"))
    assert done.returncode == 3, done.stdout
    blind = [s for s in done.stdout.splitlines() if s.startswith("  blind: ")]
    (cap_line,) = [s for s in blind if "size cap of 0.0 MB reached" in s]
    for kind in ("graph.replay", "attn.metadata", "dispatch"):
        assert f"{kind} {left[kind]}" in cap_line, cap_line
    assert "graph.replay.time" not in cap_line
    assert done.stdout.splitlines()[-1].startswith("BLIND:")
    # a finding stands over the blindness: the frozen graph's replays before a cap that
    # is reached after them (the first replay ends within the first 7 KB of the file; 80
    # steps so that replays still come after the cap)
    traced(tmp_path / "late", ["--fold", "0", "--max-mb", "0.01"], "--policy", "legacy",
           "--steps", "80")
    found = cli("check", str(tmp_path / "late"))
    assert found.returncode == 1, found.stdout
    assert found.stdout.startswith("warning: ") and "MLT001 error" in found.stdout
    assert any(s.startswith("  blind: ") and "size cap of 0.01 MB reached" in s
               for s in found.stdout.splitlines()), found.stdout


def _records_line(text: str) -> str:
    """The coverage's `records:` line, its wrapped continuation joined."""
    lines = text.splitlines()
    start = next(i for i, s in enumerate(lines) if s.startswith("  records: "))
    joined = lines[start]
    for more in lines[start + 1:]:
        if not more.startswith("    "):
            break
        joined += " " + more.strip()
    return joined


def test_the_records_column_and_the_records_line_are_the_same_with_folding_on_and_off(
        folded_and_not):
    on, off = folded_and_not
    data = {name: json.loads(cli("report", "--json", str(d)).stdout)
            for name, d in (("on", on), ("off", off))}
    (p_on,), (p_off,) = data["on"]["processes"], data["off"]["processes"]
    assert p_on["records"] == p_off["records"]
    assert p_on["written"] < p_off["written"] == p_off["records"]
    text = {name: cli("report", str(d)).stdout for name, d in (("on", on), ("off", off))}
    assert _records_line(text["on"]) == _records_line(text["off"])
    counts = dict(re.findall(r"([\w.]+) (\d+)", _records_line(text["off"])[len("  records: "):]))
    assert sum(map(int, counts.values())) + 2 == p_off["records"]   # + process, process.end
    folded = next(s for s in text["on"].splitlines() if s.startswith("  folded: "))
    steady = data["on"]["coverage"]["records"]["steady"]
    assert folded.startswith(f"  folded: {steady} steady record")
    assert f"the files hold {p_on['written']} records" in folded
    assert "folded:" not in text["off"]


def test_each_graphs_replays_are_the_same_written_or_folded(folded_and_not):
    """Every replay is a graph.replay record or inside a steady record's count (`replays`,
    `steps` the steps it folded): per graph the same total as with folding off."""
    on, off = folded_and_not

    def replays(path: Path) -> dict[int, int]:
        (file,) = path.glob("p*.jsonl")
        counts: dict[int, int] = {}
        for row in _rows(file):
            if row["k"] == "graph.replay":
                counts[row["gid"]] = counts.get(row["gid"], 0) + 1
            elif row["k"] == "steady" and "gid" in row:
                counts[row["gid"]] = counts.get(row["gid"], 0) + row["replays"]
        return counts

    folded = [r for r in _rows(next(on.glob("p*.jsonl"))) if r["k"] == "steady"]
    assert folded and all(r["steps"] > 1 for r in folded if "steps" in r), folded
    assert replays(on) == replays(off)
