"""`mlatrace report` and `mlatrace diff` end to end through the CLI."""

from __future__ import annotations

import json

import synth
from click.testing import CliRunner
from conftest import FIXTURES

from mlatrace.cli import main


def run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_report_summary_first_then_tables():
    result = run("report", FIXTURES / "legacy_tp2")
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first == ("2 processes, 2 graphs captured, 6 replays, 2 error findings, "
                     "probe coverage not recorded")  # a trace older than coverage
    assert result.output.splitlines()[1].startswith("coverage: not recorded")
    assert "MLT001 frozen-one-split" in result.output
    assert "skipped" in result.output  # stage 2 skipped in the frozen topology
    assert "evidence" in result.output  # the -v pointer
    assert "p1000.jsonl:seq" not in result.output


def test_report_verbose_shows_evidence_and_fix():
    result = run("report", "-v", FIXTURES / "legacy_one_split")
    assert result.exit_code == 0
    assert "p1000.jsonl:seq 5 (kernel.split)" in result.output
    assert "fix: " in result.output


def test_report_json_schema_is_stable():
    result = run("report", "--json", FIXTURES / "legacy_one_split")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["schema"] == "mlatrace.report/1"
    assert set(data) == {"schema", "trace", "summary", "processes", "graphs", "attention",
                         "findings", "suppressed", "problems", "coverage", "marks", "kernels",
                         "graph_use"}
    calls = {(a["kind"], a["name"]): a for a in data["attention"]}
    assert calls[("attn.call", "forward_mqa")]["captured"] >= 1
    assert data["summary"] == {"processes": 1, "graphs": 1, "graphs_total": 2, "replays": 3,
                               "findings": {"error": 1, "warning": 0}, "suppressed": 0,
                               "problems": 0, "probes_attached": None, "probes_errored": 0,
                               "blind": False, "marks": 0, "exit_code": 0}
    assert set(data["coverage"]) == {"blind", "reasons", "notes", "probes_attached", "probes_errored",
                                     "engines", "ranks", "expect", "records", "probe_errors",
                                     "processes"}
    assert data["coverage"]["records"]["kernel.split"] >= 1
    [graph] = data["graphs"]
    assert graph["frozen"]["num_kv_splits"] == [1] and graph["frozen"]["stage2"] == "skipped"
    assert graph["replays"]["seq_len_max"] == 100003
    [finding] = data["findings"]
    assert set(finding) == {"id", "name", "severity", "message", "hint", "pid", "rank", "gid",
                            "evidence", "details", "cost"}
    assert set(finding["evidence"][0]) == {"file", "seq", "kind", "what"}


def test_report_bad_inputs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run("report", empty)
    assert result.exit_code == 2 and "no trace here" in result.output
    result = run("report", tmp_path / "missing")
    assert result.exit_code == 2
    result = run("report", FIXTURES / "all_garbage")
    assert result.exit_code == 2 and "p77.jsonl:1" in result.output
    result = run("report", FIXTURES / "truncated_last_line")
    assert result.exit_code == 0
    assert "warning: p1000.jsonl:28: truncated line" in result.output
    assert "MLT001" in result.output
    only_run = tmp_path / "only_run"
    only_run.mkdir()
    (only_run / "run.json").write_text('{"schema": "mlatrace/1", "argv": ["true"]}')
    result = run("report", only_run)
    assert result.exit_code == 2 and "no process files" in result.output
    result = run("report", FIXTURES / "missing_header")
    assert result.exit_code == 0
    assert "warning: p1000.jsonl:1: missing process header" in result.output
    result = run("report", "--json", FIXTURES / "newer_schema")
    assert result.exit_code == 0 and json.loads(result.stdout)["findings"][0]["id"] == "MLT001"
    result = run("report", "--json", FIXTURES / "garbage_line")
    assert result.exit_code == 0
    problems = json.loads(result.stdout)["problems"]
    assert [(p["file"], p["line"]) for p in problems] == [("p1000.jsonl", 11), ("p1000.jsonl", 13)]


def test_report_healthy_trace_has_no_findings():
    result = run("report", FIXTURES / "device_healthy")
    assert result.exit_code == 0
    assert "no findings" in result.output.splitlines()[0]


def test_diff_legacy_vs_device():
    result = run("diff", FIXTURES / "legacy_tp2", FIXTURES / "device_tp2")
    assert result.exit_code == 0, result.output
    assert "2 graphs matched, 2 changed" in result.output
    assert "findings: 2 removed, 0 added" in result.output
    result = run("diff", "--json", FIXTURES / "legacy_tp2", FIXTURES / "device_tp2")
    data = json.loads(result.stdout)
    assert data["schema"] == "mlatrace.diff/1"
    changes = {c["field"]: (c["a"], c["b"]) for c in data["graphs"][0]["changes"]}
    assert changes["num_kv_splits"] == ([1], [16])
    assert changes["_mla_stage1 NUM_KV_SPLITS"] == ([1], [16])
    assert changes["stage2"] == ("skipped", "present")
    assert changes["kernel _mla_stage2"] == (None, "launched")
    assert [f["id"] for f in data["findings"]["removed"]] == ["MLT001", "MLT001"]
    assert data["findings"]["added"] == []


def test_diff_identical_and_unmatched(tmp_path):
    result = run("diff", "--json", FIXTURES / "device_tp2", FIXTURES / "device_tp2")
    data = json.loads(result.stdout)
    assert data["summary"]["changed"] == 0 and data["summary"]["matched"] == 2
    result = run("diff", "--json", FIXTURES / "device_healthy", FIXTURES / "pa_v1_beyond")
    data = json.loads(result.stdout)
    assert data["summary"]["only_a"] == 1 and data["summary"]["only_b"] == 1
    assert [f["id"] for f in data["findings"]["added"]] == ["MLT002"]
    assert run("diff", FIXTURES / "device_healthy", tmp_path / "nope").exit_code == 2


def test_diff_shows_gpu_time_and_pointer_changes(tmp_path):
    a = synth.mla_decode(tmp_path / "a", policy="device", gpu_ns=True)
    b = synth.mla_decode(tmp_path / "b", policy="device", gpu_ns=True, ptr_drift=True)
    data = json.loads(run("diff", "--json", a, b).stdout)
    fields = {c["field"] for c in data["graphs"][0]["changes"]}
    assert "pointers at replay" in fields
    assert [f["id"] for f in data["findings"]["added"]] == ["MLT003"]
