"""Docs and help say what the product does and how to reproduce a figure, not who
measured it where: no "we", no session or call of a measurement, no seed numbers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click

from mlatrace.cli import main

ROOT = Path(__file__).resolve().parents[1]
LAB_VOICE = re.compile(
    r"\b(we|our)\b|how we|in this call|an earlier call|the next lead|seed \d{3}"
    r"|the seed\b|seed's|stored copy|wheel here|on the way|other jobs|this box|"
    r"no machine here", re.IGNORECASE)
"""Phrases of a lab notebook."""


def _hits(name: str, text: str) -> list[str]:
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if LAB_VOICE.search(line):
            out.append(f"{name}:{lineno}: {line.strip()[:100]}")
    return out


def _commands(cmd: click.Command, path: list[str]):
    if isinstance(cmd, click.Group):
        yield path, cmd
        for name, sub in cmd.commands.items():
            yield from _commands(sub, [*path, name])
    else:
        yield path, cmd


def test_no_doc_speaks_in_a_lab_voice():
    hits = []
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        hits += _hits(str(doc.relative_to(ROOT)), doc.read_text())
    assert not hits, "\n".join(hits)


def test_no_help_speaks_in_a_lab_voice():
    hits = []
    for path, cmd in _commands(main, ["mlatrace"]):
        with click.Context(cmd, info_name=" ".join(path)) as ctx:
            hits += _hits(" ".join(path) + " --help", cmd.get_help(ctx))
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    serve = subprocess.run([sys.executable, "-m", "mlatrace.reference.serve", "--help"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert serve.returncode == 0, serve.stderr
    hits += _hits("python -m mlatrace.reference.serve --help", serve.stdout)
    assert not hits, "\n".join(hits)
