"""The README's command table and the CLI agree.

Every command and option the table names exists (`mlatrace --help` would list it), every
command of the CLI has a row, and `bench --help` points at the page with the figures.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click

from mlatrace.cli import main

ROOT = Path(__file__).resolve().parents[1]


def leaf_commands(cmd: click.Command = main, path: tuple[str, ...] = ()) -> dict:
    """(name, ...) -> click command, for every command that runs (groups opened)."""
    if isinstance(cmd, click.Group):
        out = {}
        for name, sub in cmd.commands.items():
            if not sub.hidden:
                out.update(leaf_commands(sub, (*path, name)))
        return out
    return {path: cmd}


def table_rows() -> list[str]:
    """The first cell of each row of the README's "Commands and exit codes" table."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Commands and exit codes", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `mlatrace "):
            cell = re.split(r"(?<!\\)\|", line)[1]
            rows.append(cell.replace("\\|", "|").strip())
    return rows


def mentioned(cell: str) -> list[tuple[tuple[str, ...], list[str]]]:
    """The commands a cell names, each with the options written after it."""
    out = []
    commands = leaf_commands()
    for code in re.findall(r"`([^`]+)`", cell):
        words = code.split()
        if words[0] != "mlatrace":
            continue
        first = words[1]
        subs = []
        if (first,) in commands:
            subs = [(first,)]
            rest = words[2:]
        else:  # a group: `mlatrace bench record | probes | ...`
            rest = words[2:]
            names, i = [], 0
            while i < len(rest) and re.fullmatch(r"[a-z]+", rest[i]):
                names.append(rest[i])
                i += 1
                if i < len(rest) and rest[i] == "|":
                    i += 1
            subs = [(first, n) for n in names] or [(first,)]
            rest = rest[i:]
        options = re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", " ".join(rest))
        out += [(sub, options) for sub in subs]
    return out


def test_every_command_and_option_in_the_readme_table_is_real():
    commands = leaf_commands()
    wrong = []
    for cell in table_rows():
        for path, options in mentioned(cell):
            cmd = commands.get(path)
            if cmd is None:
                wrong.append(f"`mlatrace {' '.join(path)}`: no such command")
                continue
            known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
            wrong += [f"`mlatrace {' '.join(path)}`: no option {o}"
                      for o in options if o not in known]
    assert not wrong, wrong


def readme_commands() -> list[str]:
    """Every `mlatrace ...` the README shows: in inline code and in code blocks, each cut
    at ` -- ` (what follows is the traced command's) and at a `#` comment."""
    text = (ROOT / "README.md").read_text()
    spans = re.findall(r"`(mlatrace [^`]+)`", text)
    spans += [m.group(1) for m in re.finditer(r"^(?:\$ )?(mlatrace [^\n]+)$", text, re.M)]
    # the run options listed in the tour ("Options: `--out DIR`, ... (`mlatrace run --help`")
    listed = text.split("Options: `--out DIR`", 1)[1].split("(`mlatrace run --help`", 1)[0]
    spans += [f"mlatrace run {opt}" for opt in ["--out", *re.findall(r"`(--[\w-]+)", listed)]]
    out = []
    for span in spans:
        span = span.replace("\\|", "|").split(" -- ", 1)[0].split("  #", 1)[0]
        out.append(span.rstrip("\\ ").strip())
    return out


def test_every_command_and_option_the_readme_shows_is_real():
    commands = leaf_commands()
    groups = {path[0] for path in commands if len(path) > 1}
    wrong = []
    for shown in readme_commands():
        words = shown.split()
        path = tuple(words[1:3]) if words[1] in groups and len(words) > 2 else (words[1],)
        cmd = commands.get(path)
        if cmd is None:
            if path[0] not in groups:
                wrong.append(f"`{shown}`: no command {' '.join(path)}")
            continue
        known = {"-h", "--help"} | {opt for p in cmd.params
                                   for opt in (*p.opts, *p.secondary_opts)}
        wrong += [f"`{shown}`: {' '.join(path)} has no option {o}"
                  for o in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", shown) if o not in known]
    assert not wrong, wrong


def test_every_command_has_a_row_in_the_readme_table():
    named = {path for cell in table_rows() for path, _ in mentioned(cell)}
    missing = [" ".join(path) for path in leaf_commands() if path not in named]
    assert not missing, missing


def test_the_readme_table_names_the_html_pages():
    cells = {tuple(p): o for cell in table_rows() for p, o in mentioned(cell)}
    for command in (("report",), ("check",), ("watch",)):
        assert "--html" in cells[command], command


def test_bench_help_points_at_the_benchmarks_page():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = subprocess.run([sys.executable, "-m", "mlatrace", "bench", "--help"], env=env,
                         capture_output=True, text=True, timeout=120).stdout
    assert "docs/benchmarks.md" in out and "README" not in out, out
