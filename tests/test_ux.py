"""What a new user meets first: errors, widths, wording, help, shutdown."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import FIXTURES, MLATRACE, PROGS, REPO, SAMPLES

from mlatrace.cli import main
from mlatrace.output.tables import Column, fit_columns
from mlatrace.trace import open_trace

GPU_TRACES = sorted([*SAMPLES.glob("gpu_serve_*"), SAMPLES / "capture_triton"])
WIDTHS = (80, 100, 120, 160)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RULES = "│┃━╇─┼"


def cli(*args: object, columns: int | None = None):
    env = {"COLUMNS": str(columns)} if columns else {}
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


# ------------------------------------------------------------ run --out


@pytest.mark.parametrize("out", ["/proc/x", "{file}", "{file}/sub", ""])
def test_run_with_an_unusable_out_dir_says_one_line_and_exits_2(tmp_path: Path, out: str) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    proc = subprocess.run([*MLATRACE, "run", "--out", out.format(file=a_file), "--",
                           sys.executable, "-c", "pass"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("mlatrace run: ")


# ------------------------------------------------------------ table widths


def _table_tokens(text: str) -> set[str]:
    """The words inside table cells: lines with column rules, split on rules and spaces."""
    words: set[str] = set()
    for line in text.splitlines():
        if any(r in line for r in "│┃"):
            words.update(re.split(r"[\s" + RULES + "]+", line))
    return words - {""}


def _assert_fits(narrow: str, wide: str, width: int, what: str) -> None:
    for line in narrow.splitlines():
        assert len(line) <= width, f"{what}: a line of {len(line)} > {width}: {line!r}"
    split = _table_tokens(narrow) - _table_tokens(wide)
    assert not split, f"{what} at {width}: words split inside cells: {sorted(split)[:10]}"


@pytest.mark.parametrize("trace", GPU_TRACES, ids=lambda p: p.name)
def test_report_tables_never_split_a_word_when_not_a_tty(trace: Path) -> None:
    wide = cli("report", trace, columns=1000)
    assert wide.exit_code == 0, wide.output
    for width in WIDTHS:
        narrow = cli("report", trace, columns=width)
        assert narrow.exit_code == 0
        _assert_fits(narrow.output, wide.output, width, trace.name)
        # the columns that carry the story stay at every width
        assert "max" in narrow.output and "splits" in narrow.output and "gid" in narrow.output


def test_diff_table_never_splits_a_word() -> None:
    args = ("diff", SAMPLES / "gpu_serve_legacy", SAMPLES / "gpu_serve_bucketed_breakable")
    wide = cli(*args, columns=1000).output
    for width in WIDTHS:
        narrow = cli(*args, columns=width)
        assert narrow.exit_code == 0
        table = [line for line in narrow.output.splitlines() if "│" in line or "┃" in line]
        _assert_fits("\n".join(table), wide, width, "diff")
        assert "num_kv_splits" in narrow.output


TTY_CHILD = """
import fcntl, struct, sys, termios
from mlatrace.output import report
for width in map(int, sys.argv[2:]):
    fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 50, width, 0, 0))
    print(f"=== {width}", flush=True)
    report.main(sys.argv[1])
    sys.stdout.flush()
"""


def _report_in_pty(trace: Path, widths: tuple[int, ...]) -> dict[int, str]:
    """`mlatrace report TRACE` on a pseudo-terminal resized to each width (no COLUMNS)."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm"
    proc = subprocess.Popen([sys.executable, "-c", TTY_CHILD, str(trace), *map(str, widths)],
                            stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(master)
    text = ANSI.sub("", b"".join(chunks).decode(errors="replace")).replace("\r\n", "\n")
    parts = re.split(r"^=== (\d+)$", text, flags=re.M)
    return {int(w): body for w, body in zip(parts[1::2], parts[2::2], strict=True)}


@pytest.mark.parametrize("trace", GPU_TRACES, ids=lambda p: p.name)
def test_report_tables_fit_a_real_terminal(trace: Path) -> None:
    wide = cli("report", trace, columns=1000).output
    rendered = _report_in_pty(trace, WIDTHS)
    assert sorted(rendered) == list(WIDTHS), rendered
    for width, narrow in rendered.items():
        assert "graphs" in narrow, narrow
        _assert_fits(narrow, wide, width, f"tty {trace.name}")
        widest = max(len(line) for line in narrow.splitlines())
        assert widest > min(width, 100) - 10  # rendered at the terminal's width, not 80


def test_fit_columns_drops_the_least_important_first_and_never_below_a_word() -> None:
    columns = [Column("id"), Column("message", wrap=True, want=20), Column("extra", priority=5),
               Column("count", priority=1)]
    rows = [["MLT001", "a long message about what capture froze", "something wide here",
             "12"]]
    dropped, widths = fit_columns(columns, rows, 40)
    assert dropped == [2]                      # priority 5 goes before priority 1
    assert widths[1] >= len("capture") and widths[0] == len("MLT001")
    dropped, widths = fit_columns(columns, rows, 200)
    assert dropped == [] and widths[1] == len(rows[0][1])


def test_check_lines_are_never_wrapped() -> None:
    result = cli("check", SAMPLES / "gpu_serve_legacy", columns=80)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    # note: that H200 trace predates the `device` record, so MLT008 says why it did not run
    assert [line.split()[0] for line in lines] == ["MLT001", "at", "MLT004", "at", "coverage:",
                                                   "note:", "FAILED:"]
    assert len(lines[0]) > 80  # one line per finding, however long


# ------------------------------------------------------------ wording


def test_rank_is_printed_one_way() -> None:
    legacy, breakable = SAMPLES / "gpu_serve_legacy", SAMPLES / "gpu_serve_bucketed_breakable"
    outputs = [cli("report", "-v", legacy).output, cli("check", legacy).output,
               cli("diff", legacy, breakable).output]
    for text in outputs:
        assert "rank None" not in text and "proc0" not in text and "pid 717 │" not in text
    assert "MLT001 error rank -:" in outputs[1]
    data = json.loads(cli("diff", "--json", legacy, breakable).stdout)
    assert [g["rank"] for g in data["graphs"]] == [None]
    ranked = cli("check", FIXTURES / "legacy_tp2").output
    assert "MLT001 error rank 0:" in ranked and "MLT001 error rank 1:" in ranked


def test_gid_notation_and_graph_counts_are_explained() -> None:
    text = cli("report", SAMPLES / "gpu_serve_bucketed_breakable").output
    assert "1>2-6" in text and "gid 1>2-6: capture unit 1" in text   # its own nesting
    assert "graphs_total 6 counts every graph" in text
    help_text = cli("report", "--help").output
    assert "graphs_total" in help_text and "1>2-4" in help_text
    data = json.loads(cli("report", "--json", SAMPLES / "gpu_serve_bucketed_breakable").stdout)
    assert data["summary"]["graphs"] == 1 and data["summary"]["graphs_total"] == 6


def test_grammar_and_missing_paths(tmp_path: Path) -> None:
    assert cli("check", FIXTURES / "legacy_one_split").output.splitlines()[-1].startswith(
        "FAILED: 1 finding at or above error (1 process, 1 graph, 3 replays;")
    diff = cli("diff", SAMPLES / "gpu_serve_legacy", SAMPLES / "gpu_serve_device").output
    assert diff.startswith("1 graph matched")
    for command in ("report", "check"):
        result = cli(command, tmp_path / "nothing")
        assert result.exit_code == 2 and "does not exist" in result.output
    result = cli("diff", tmp_path / "nothing", SAMPLES / "gpu_serve_legacy")
    assert result.exit_code == 2 and "does not exist" in result.output


def test_a_failed_run_shows_its_exit_code(tmp_path: Path) -> None:
    out = tmp_path / "t"
    proc = subprocess.run([*MLATRACE, "run", "--out", str(out), "--", sys.executable, "-c",
                           "import sys; sys.exit(5)"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5
    assert "exited with code 5; trace of 1 process in" in proc.stderr
    first = cli("report", out).output.splitlines()[0]
    assert first.endswith("the traced command exited with code 5"), first


# ------------------------------------------------------------ problems, schema, marks


def test_problems_are_the_same_in_every_output() -> None:
    trace = FIXTURES / "truncated_last_line"
    text = cli("report", trace).output
    data = json.loads(CliRunner().invoke(main, ["report", "--json", str(trace)]).stdout)
    check = subprocess.run([*MLATRACE, "check", str(trace)], capture_output=True, text=True,
                           timeout=60)
    warnings = [line for line in text.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "2 problems" in text.splitlines()[0]
    assert data["summary"]["problems"] == len(data["problems"]) == 2
    assert [f"warning: {p['file']}" + (f":{p['line']}" if p["line"] else "") + f": {p['reason']}"
            for p in data["problems"]] == warnings
    check_warnings = [line for line in check.stdout.splitlines() if line.startswith("warning:")]
    assert check_warnings == warnings and check.stderr == ""  # one stream, with the verdict
    assert "2 problems" in check.stdout.splitlines()[-1]


def test_unknown_schema_gets_no_verdict(tmp_path: Path) -> None:
    trace = tmp_path / "t"
    shutil.copytree(FIXTURES / "legacy_one_split", trace)
    path = trace / "p1000.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace('"mlatrace/1"', '"mlatrace/9"')
    path.write_text("".join(lines))
    result = subprocess.run([*MLATRACE, "check", str(trace)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert "schema 'mlatrace/9'" in result.stderr and "no verdict" in result.stderr
    report = cli("report", trace)
    assert report.exit_code == 0 and "MLT001" in report.output  # best effort
    assert "schema 'mlatrace/9'" in report.output


def test_marks_show_in_verbose_report_and_json(tmp_path: Path) -> None:
    out = tmp_path / "t"
    subprocess.run([*MLATRACE, "run", "--out", str(out), "--", sys.executable, "-c",
                    "import mlatrace; mlatrace.mark('warmup_done', step=3); "
                    "mlatrace.mark('bench', ctx=32768)"], check=True, timeout=60)
    data = json.loads(CliRunner().invoke(main, ["report", "--json", str(out)]).stdout)
    assert [(m["name"], m["attrs"]) for m in data["marks"]] == [
        ("warmup_done", {"step": 3}), ("bench", {"ctx": 32768})]
    assert data["summary"]["marks"] == 2
    verbose = cli("report", "-v", out).output
    assert "warmup_done step=3" in verbose and "bench ctx=32768" in verbose
    assert "2 marks" in cli("report", out).output


def test_diff_shows_what_a_breakable_run_chose_at_run_time() -> None:
    a, b = SAMPLES / "gpu_serve_legacy", SAMPLES / "gpu_serve_bucketed_breakable"
    data = json.loads(cli("diff", "--json", a, b).stdout)
    [graph] = data["graphs"]
    change = next(c for c in graph["changes"] if c["field"] == "num_kv_splits")
    assert change == {"field": "num_kv_splits", "a": [1], "b": {"eager": [64]}}
    text = cli("diff", a, b, columns=160).output
    assert "64 (chosen eagerly at run time)" in text and "[]" not in text


# ------------------------------------------------------------ demo, help


def test_demo_without_torch_says_what_to_install(tmp_path: Path) -> None:
    """torch made unimportable the way a missing install is: ModuleNotFoundError on import."""
    blocker = tmp_path / "no-torch" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(blocker.parent), str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([*MLATRACE, "demo", "--out", str(tmp_path / "t")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "mlatrace[reference]" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def _commands(cmd: click.Command, path: list[str]):
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, [*path, name])
    else:
        yield path, cmd


def test_every_option_has_help() -> None:
    missing = [f"{' '.join(path)} {param.opts[0]}" for path, cmd in _commands(main, [])
               for param in cmd.params if isinstance(param, click.Option) and not param.help]
    assert not missing
    run_help = " ".join(cli("run", "--help").output.split())
    assert "[default: (keep every replay record); x>=1]" in run_help
    export = cli("export", "--help").output
    assert "OTLP transport" in export and "service.name" in export


# ------------------------------------------------------------ shutdown


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_writes_process_end_before_a_sigkill(tmp_path: Path, signum: int) -> None:
    """A parent SIGKILLs the process while its own SIGTERM (or Ctrl-C) handler is still
    shutting down (vLLM's API server does that to its Worker): process.end is on disk."""
    out = tmp_path / "t"
    launcher = subprocess.Popen([*MLATRACE, "run", "--out", str(out), "--", sys.executable,
                                 str(PROGS / "sleeper.py")], stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, SLEEPER_SIGTERM="slow"))
    child = int(launcher.stdout.readline())
    time.sleep(0.5)
    os.kill(child, signum)
    time.sleep(0.3)
    os.kill(child, signal.SIGKILL)
    assert launcher.wait(timeout=30) == 128 + signal.SIGKILL
    trace = open_trace(out)
    (proc,) = trace.processes
    records = list(proc.records())
    assert not trace.problems, [str(p) for p in trace.problems]
    assert proc.end is not None and proc.end["reason"] == signal.Signals(signum).name
    ticks = [r for r in records if r["k"] == "mark" and r["name"] == "tick"]
    assert len(ticks) >= 10 and proc.end["events"] >= ticks[-1]["seq"]


def test_a_process_that_lives_on_after_sigterm_ends_with_its_exit(tmp_path: Path) -> None:
    out = tmp_path / "t"
    launcher = subprocess.Popen([*MLATRACE, "run", "--out", str(out), "--", sys.executable,
                                 str(PROGS / "sleeper.py")], stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, SLEEPER_SIGTERM="handler"))
    child = int(launcher.stdout.readline())
    time.sleep(0.5)
    os.kill(child, signal.SIGTERM)
    assert launcher.wait(timeout=30) == 0
    (proc,) = open_trace(out).processes
    records = list(proc.records())
    ends = [r["reason"] for r in records if r["k"] == "process.end"]
    assert ends == ["SIGTERM", "exit"] and proc.end["reason"] == "exit"
    assert any(r.get("name") == "own_handler_ran" for r in records)
    data = json.loads(CliRunner().invoke(main, ["report", "--json", str(out)]).stdout)
    assert data["summary"]["problems"] == 0 and data["processes"][0]["end_reason"] == "exit"
