"""`mlatrace export --perfetto`: Chrome trace-event JSON, checked event by event and by counts."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from test_export_support import PYTHON, WALL_NS, env_with_repo, records_of, write_fixture

from mlatrace.output.export.perfetto import GPU_TID_BASE

PHASES = {"X", "i", "M", "C"}


def export_perfetto(trace: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "mlatrace.cli", "export", str(trace), "--perfetto",
                           str(out)], capture_output=True, text=True, env=env_with_repo(),
                          timeout=60)


def check_well_formed(events: list[dict]) -> None:
    """Every event has what the trace-event format requires; every track is monotonic."""
    last: dict[tuple, float] = {}
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["name"], str) and e["name"], e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index"), e
            assert isinstance(e["args"], dict), e
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] == "i":
            assert e["s"] in ("t", "p", "g"), e
        if "args" in e:
            assert isinstance(e["args"], dict), e
        track = "global" if e.get("s") == "g" else (e["pid"], e["tid"], e["ph"] == "C")
        assert e["ts"] >= last.get(track, 0.0), f"track {track} goes back in time at {e}"
        last[track] = e["ts"]


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, str]:
    root = tmp_path_factory.mktemp("perfetto")
    fixture = write_fixture(root / "trace")
    done = export_perfetto(root / "trace", root / "out.json")
    assert done.returncode == 0, done.stderr
    return fixture, json.loads((root / "out.json").read_text()), done.stdout


def test_well_formed_and_monotonic(doc: tuple) -> None:
    _, data, stdout = doc
    events = data["traceEvents"]
    check_well_formed(events)
    assert f"wrote {len(events)} events" in stdout
    assert data["otherData"]["origin_wall_ns"] == WALL_NS


def test_tracks_per_process_and_thread(doc: tuple) -> None:
    fixture, data, _ = doc
    meta = [e for e in data["traceEvents"] if e["ph"] == "M"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert set(names) == {1000, 1001}
    assert names[1001].startswith("rank 0 · pid 1001 python")
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    # Tracks are numbered per process in order of appearance; the recorded ident is in the name.
    assert threads == {(1000, 1): "main", (1001, 1): "main", (1001, 2): "thread 12",
                       (1001, GPU_TID_BASE + 1): "replays of gid 1 (GPU time)",
                       (1001, GPU_TID_BASE + 2): "replays of gid 2 (GPU time)"}
    used = {(e["pid"], e["tid"]) for e in data["traceEvents"] if e["ph"] in ("X", "i")}
    assert used <= set(threads)


def test_counts_match_the_trace(doc: tuple) -> None:
    fixture, data, _ = doc
    events = [e for e in data["traceEvents"] if e["ph"] != "M"]
    cats = Counter(e.get("cat") for e in events)
    for kind in ("kernel.launch", "kernel.split", "kernel.skip", "attn.call", "attn.metadata",
                 "dispatch", "sync", "graph.nodes", "mark", "process.end"):
        assert cats[kind] == len(records_of(fixture, kind)), kind
    assert cats["graph.replay"] == len(records_of(fixture, "graph.replay"))
    captures = [e for e in events if e.get("cat") == "graph.capture"]
    assert len(captures) == len(records_of(fixture, "graph.capture.begin"))
    assert all(e["ph"] == "X" for e in captures)
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == len(records_of(fixture, "attn.metadata"))


def test_captures_nest_and_replays_carry_gpu_time(doc: tuple) -> None:
    fixture, data, _ = doc
    events = data["traceEvents"]
    captures = {e["args"]["gid"]: e for e in events if e.get("cat") == "graph.capture"}
    outer, inner = captures[1], captures[2]
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    assert outer["tid"] == inner["tid"] == 1
    assert inner["args"]["segments"] == 1 and outer["args"]["mode"] == "FULL"
    replays = [e for e in events if e.get("cat") == "graph.replay"]
    assert all(e["ph"] == "X" for e in replays)
    assert {e["tid"] for e in replays} == {GPU_TID_BASE + 1, GPU_TID_BASE + 2}  # one per graph
    gpu = records_of(fixture, "graph.replay")[0]["gpu_ns"]
    assert replays[0]["dur"] == pytest.approx(gpu / 1000)
    split = next(e for e in events if e.get("cat") == "kernel.split")
    assert split["ph"] == "i" and split["args"]["num_kv_splits"] == 1
    assert split["name"] == "split mla_gluon = 1"


def test_replays_without_gpu_time_are_instants(tmp_path: Path) -> None:
    fixture = write_fixture(tmp_path / "t", gpu_ns=False)
    assert export_perfetto(tmp_path / "t", tmp_path / "o.json").returncode == 0
    events = json.loads((tmp_path / "o.json").read_text())["traceEvents"]
    check_well_formed(events)
    replays = [e for e in events if e.get("cat") == "graph.replay"]
    assert len(replays) == len(records_of(fixture, "graph.replay"))
    assert all(e["ph"] == "i" and e["tid"] == 1 for e in replays)


def test_findings_are_global_markers(doc: tuple, tmp_path: Path) -> None:
    pytest.importorskip("mlatrace.analysis")
    from mlatrace.analysis import analyze
    from mlatrace.trace import open_trace

    write_fixture(tmp_path / "t")
    findings = analyze(open_trace(tmp_path / "t")).findings
    assert findings
    _, data, _ = doc
    markers = [e for e in data["traceEvents"] if e.get("cat") == "finding"]
    assert sorted(m["name"].split()[0] for m in markers) == sorted(f.id for f in findings)
    assert all(m["ph"] == "i" and m["s"] == "g" for m in markers)
    mlt001 = next(m for m in markers if m["name"] == "MLT001 frozen-one-split")
    assert mlt001["args"]["severity"] == "error" and mlt001["args"]["hint"]
    assert mlt001["pid"] == 1001  # placed at its first evidence record


def test_truncated_trace_still_exports(tmp_path: Path) -> None:
    write_fixture(tmp_path / "t")
    path = tmp_path / "t" / "p1001.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:12]) + lines[12][:20])  # killed mid-capture, mid-line
    done = export_perfetto(tmp_path / "t", tmp_path / "o.json")
    assert done.returncode == 0, done.stderr
    assert "unreadable lines skipped" in done.stderr
    events = json.loads((tmp_path / "o.json").read_text())["traceEvents"]
    check_well_formed(events)
    open_capture = [e for e in events if e.get("cat") == "graph.capture"]
    assert open_capture and all(e["args"].get("incomplete") for e in open_capture)
