"""Replay GPU time and what findings cost: real traces (H200 fixtures, a CPU run), report,
diff, the cost on findings, whatif's CPU behaviour, and bad timing records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from mlatrace.analysis import analyze
from mlatrace.analysis.model import ReplayStats
from mlatrace.record import DEFAULT_REPLAY_TIMING, parse_replay_timing
from mlatrace.trace import open_trace

LEGACY = REPO / "samples" / "gpu_serve_legacy_timed"
DEVICE = REPO / "samples" / "gpu_serve_device_timed"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def mlatrace(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlatrace", *args], env=ENV, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def report_json(path: Path) -> dict:
    run = mlatrace("report", "--json", str(path))
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for p in path.glob("p*.jsonl") for line in p.read_text().splitlines()]


# -- settings -------------------------------------------------------------------------

def test_replay_timing_setting():
    assert parse_replay_timing(None) == DEFAULT_REPLAY_TIMING == (8, 64)
    assert parse_replay_timing("") == DEFAULT_REPLAY_TIMING
    assert parse_replay_timing("4:16") == (4, 16)
    assert parse_replay_timing("0:1") == (0, 1)
    for off in ("off", "0", "4:0", "x:2", "4"):
        assert parse_replay_timing(off) is None


def test_run_rejects_bad_replay_timing(tmp_path):
    run = mlatrace("run", "--out", str(tmp_path / "t"), "--replay-timing", "8-64", "--",
                   sys.executable, "-c", "pass")
    assert run.returncode == 2
    assert "--replay-timing wants N:M" in run.stderr
    assert not (tmp_path / "t").exists()


# -- a CPU run: the reference HostGraph, timed with the host clock ---------------------

@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("timed") / "trace"
    run = mlatrace("run", "--out", str(out), "--replay-timing", "2:3", "--",
                   sys.executable, "-m", "mlatrace.reference.serve", "--device", "cpu",
                   "--ctx", "512", "--steps", "7", "--layers", "1", timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return out


def test_cpu_run_times_the_sampled_host_graph_replays(cpu_trace):
    recs = records(cpu_trace)
    host_gids = {r["gid"] for r in recs if r["k"] == "graph.capture.begin"
                 and r["src"] == "reference-host"}
    # the replay-time records, and those a fold held (steady `times`, read as records)
    timed = [r for r in recs if r["k"] == "graph.replay.time"] + [
        {"gid": int(gid), "n": n, "gpu_ns": gpu, "via": r["times_via"]}
        for r in recs if r["k"] == "steady" for gid, times in r.get("times", {}).items()
        for n, gpu, _dt in times]
    assert sorted(r["n"] for r in timed) == [1, 2, 3, 6]      # first 2, then 1 in 3
    assert {r["gid"] for r in timed} == host_gids
    assert all(r["via"] == "host" and r["gpu_ns"] > 0 for r in timed)
    data = report_json(cpu_trace)
    (graph,) = data["graphs"]
    gpu = graph["replays"]["gpu_ns"]
    assert gpu["samples"] == 4 and gpu["p50"] <= gpu["p90"] <= gpu["max"]
    (finding,) = [f for f in data["findings"] if f["id"] == "MLT001"]
    cost = finding["cost"]
    assert cost["replays"] == 7 and cost["timed"] == 4
    assert cost["replay_gpu_ns_p50"] == gpu["p50"]
    assert abs(cost["total_gpu_ns"] - gpu["mean"] * 7) <= 7      # mean is rounded down
    assert cost["estimate"] is None            # no whatif.json next to this trace


def test_whatif_without_gpu_says_which_gpu_and_exits_2(cpu_trace):
    run = mlatrace("whatif", str(cpu_trace))
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs an NVIDIA CUDA GPU" in lines[0] and "H200" in lines[0]


def test_whatif_cases_from_the_h200_trace():
    from mlatrace.output import whatif

    result = analyze(open_trace(LEGACY))
    (case,) = whatif.cases(result.model, result.findings)
    assert (case.batch, case.heads, case.dtype, case.layers, case.frozen_splits) == \
        (2, 16, "bf16", 4, 1)
    assert case.replay_len_max >= 32768
    assert whatif.lengths_of(case) == [case.replay_len_max]   # lengths within 10%


def test_whatif_finds_nothing_in_a_healthy_trace():
    run = mlatrace("whatif", str(DEVICE))
    assert run.returncode == 0 and "nothing to measure" in run.stdout


# -- the H200 fixtures -------------------------------------------------------------------

def test_h200_legacy_trace_graph_timing_and_cost():
    data = report_json(LEGACY)
    (graph,) = data["graphs"]
    gpu = graph["replays"]["gpu_ns"]
    assert gpu["samples"] >= 8 and 0 < gpu["p50"] <= gpu["p90"] <= gpu["max"]
    (finding,) = [f for f in data["findings"] if f["id"] == "MLT001"]
    cost = finding["cost"]
    assert cost["replays"] == graph["replays"]["count"] == 64
    assert cost["replay_gpu_ns_p50"] == gpu["p50"] and cost["replay_gpu_ns_p90"] == gpu["p90"]
    assert cost["total_gpu_ns"] > 60 * gpu["p50"] * 0.9
    est = cost["estimate"]                         # from the whatif.json saved on the H200
    assert est is not None and 0 < est["gpu_ns_p50"] < gpu["p50"]
    assert "reference mla_gluon" in est["how"] and "not the traced kernel" in est["how"]


def test_wrapper_graph_takes_the_time_of_its_torch_replays():
    model = analyze(open_trace(LEGACY)).model
    (wrapper,) = [g for g in model.graphs.values() if g.src == "reference"]
    (inner,) = model.children(wrapper)
    assert inner.src == "torch"
    assert wrapper.replays.percentiles() == inner.replays.percentiles()


def test_text_report_shows_timing_and_cost():
    run = mlatrace("report", str(LEGACY))
    assert run.returncode == 0
    assert "p50/p90/max" in run.stdout
    assert "cost (time of the graph's replays):" in run.stdout
    assert "MLT001 gid 1: 64 replays, GPU per replay p50" in run.stdout
    assert "with the fix about" in run.stdout


def test_diff_compares_replay_timing():
    run = mlatrace("diff", "--json", str(LEGACY), str(DEVICE))
    assert run.returncode == 0
    changes = {c["field"]: c for g in json.loads(run.stdout)["graphs"] for c in g["changes"]}
    for q in ("p50", "p90", "max"):
        assert changes[f"gpu {q} ns"]["b"] < changes[f"gpu {q} ns"]["a"]
    text = mlatrace("diff", str(LEGACY), str(DEVICE)).stdout
    assert "replay GPU time p50" in text and "(x0." in text and "gpu p50 ns" not in text


def test_perfetto_puts_timed_replays_on_a_gpu_track_at_their_replay(tmp_path):
    out = tmp_path / "t.json"
    assert mlatrace("export", str(LEGACY), "--perfetto", str(out)).returncode == 0
    data = json.loads(out.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    slices = [e for e in events if e.get("cat") == "graph.replay" and e.get("ph") == "X"]
    timed = [r for r in records(LEGACY) if r["k"] == "graph.replay.time"]
    assert len(slices) == len(timed) == 22
    assert all(e["dur"] > 1000 for e in slices)            # ms-long one-split replays, in us
    assert all(e["args"]["host_ts_us"] <= e["ts"] for e in slices)


def test_findings_without_timing_have_a_cost_with_null_times():
    data = report_json(REPO / "samples" / "gpu_serve_legacy")   # recorded before timing
    (finding,) = [f for f in data["findings"] if f["id"] == "MLT001"]
    assert finding["cost"]["timed"] == 0 and finding["cost"]["replay_gpu_ns_p50"] is None
    assert finding["cost"]["total_gpu_ns"] is None
    assert "none timed" in mlatrace("report", str(REPO / "samples" / "gpu_serve_legacy")).stdout
    assert all(f.get("cost") is None for f in data["findings"] if f["id"] == "MLT004")


# -- bad input never breaks the report -------------------------------------------------

def test_bad_gpu_ns_and_bad_whatif_never_break_the_report(tmp_path):
    trace = tmp_path / "legacy"
    shutil.copytree(LEGACY, trace)
    good = report_json(LEGACY)["graphs"][0]["replays"]["gpu_ns"]
    (path,) = trace.glob("p*.jsonl")
    lines = path.read_text().splitlines()
    end = lines.pop()                      # keep process.end last
    gid = next(r["gid"] for r in map(json.loads, lines) if r["k"] == "graph.replay.time")
    bad = [{"gpu_ns": "12"}, {"gpu_ns": -5}, {"gpu_ns": True}, {"gpu_ns": None}, {},
           {"gpu_ns": 1.5e30}, {"gpu_ns": 100, "n": "7"}, {"gpu_ns": 100, "gid": [1]}]
    seq = json.loads(lines[-1])["seq"]
    for i, extra in enumerate(bad):
        rec = {"k": "graph.replay.time", "t": 1, "seq": seq + 1 + i, "tid": 1, "gid": gid,
               "n": 10_000 + i, **extra}
        lines.append(json.dumps(rec))
    lines.append("{not json")
    lines.append(end)
    path.write_text("\n".join(lines) + "\n")
    (trace / "whatif.json").write_text("{broken")
    data = report_json(trace)
    assert data["graphs"][0]["replays"]["gpu_ns"] == good
    (finding,) = [f for f in data["findings"] if f["id"] == "MLT001"]
    assert finding["cost"]["replay_gpu_ns_p50"] == good["p50"]
    assert finding["cost"]["estimate"] is None
    assert any(p["file"] == "whatif.json" for p in data["problems"])
    assert mlatrace("report", str(trace)).returncode == 0


def test_fold_timed_leaves_out_replays_with_missing_segments():
    stats = ReplayStats()
    for n in (1, 2, 3):                    # a wrapper replay = two timed torch segments
        stats.add_timed(n, 1000)
        stats.add_timed(n, 3000)
    stats.add_timed(4, 1000)               # one segment untimed (pool busy): left out
    stats.fold_timed()
    pct = stats.percentiles()
    assert pct["samples"] == 3 and pct["p50"] == pct["max"] == 4000
    stats.fold_timed()                     # finish again (a live snapshot): the same histogram
    assert stats.percentiles() == pct
    stats.add_timed(4, 3000)               # the segment's time arrives after that snapshot
    stats.fold_timed()
    assert stats.percentiles()["samples"] == 4 and stats.gpu_sum == 16000


def test_closing_hook_records_reach_the_file_before_process_end(tmp_path):
    """Replay timing resolves its last events in the recorder's close hook."""
    from mlatrace import record

    recorder = record.start(str(tmp_path))
    recorder.add_close_hook(lambda: recorder.add("graph.replay.time",
                                                 {"gid": 1, "n": 1, "gpu_ns": 5, "via": "host"}))
    record.stop()
    kinds = [json.loads(line)["k"] for line in Path(recorder.path).read_text().splitlines()]
    assert kinds[-2:] == ["graph.replay.time", "process.end"]


def test_otlp_replay_spans_carry_the_timed_replays():
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    pytest.importorskip("opentelemetry.proto")
    from test_export_support import Receiver

    with Receiver() as rx:
        done = mlatrace("export", str(LEGACY), "--otlp", rx.url)
        spans = list(rx.spans)
    assert done.returncode == 0, done.stderr
    timed = [r for r in records(LEGACY) if r["k"] == "graph.replay.time"]
    replays = [s for s in spans if s["name"] == "graph.replay"]
    on_spans = sum(s["attrs"].get("mlatrace.replay.gpu_ns.timed", 0) for s in replays)
    assert on_spans == len(timed) == 22
    assert max(s["attrs"].get("mlatrace.replay.gpu_ns.max", 0) for s in replays) == \
        max(r["gpu_ns"] for r in timed)


def test_whatif_bad_arguments_exit_2():
    for lengths in ("8k", "0", ","):
        run = mlatrace("whatif", str(LEGACY), "--lengths", lengths)
        assert run.returncode == 2 and "--lengths" in run.stderr
    run = mlatrace("whatif", str(REPO / "no-such-trace"))
    assert run.returncode == 2 and run.stderr.startswith("mlatrace whatif: ")
