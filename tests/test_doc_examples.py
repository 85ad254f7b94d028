"""Example output in the docs is what the documented command prints today.

A fenced block in docs/*.md or README.md preceded by an `<!-- example ... -->` line is
made by its first line's command (`$ mlatrace ...`, run from the repository root on the
shipped traces, COLUMNS=160). The marker may narrow the output:

- `grep="REGEX"`: only the lines matching it, `...` where lines were left out;
- `saved="FILE"`: the command needs a GPU; its output is printed from FILE, the result
  it saved in the trace (`mlatrace whatif --save` writes `whatif.json`).

The tests re-make every marked block and compare it with the doc, and require a marker
on every `$ mlatrace` block that runs on a trace shipped in the repository. When an
output changes on purpose, re-make the blocks with

    python tests/test_doc_examples.py --write
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
WIDTH = "160"
MARKER = re.compile(r"^<!-- example(?P<opts>(?: \w+=\"[^\"]*\")*) -->$")
OPTION = re.compile(r"(\w+)=\"([^\"]*)\"")


@dataclass
class Example:
    doc: Path
    marker_line: int        # 0-based index of the marker line
    start: int              # index of the first line inside the fence
    end: int                # index of the closing fence
    options: dict[str, str]
    text: list[str]         # the block's lines as the doc has them

    @property
    def command(self) -> str:
        return self.text[0].removeprefix("$ ")

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.marker_line + 1}"


def examples(doc: Path) -> list[Example]:
    lines = doc.read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        assert i + 1 < len(lines) and lines[i + 1].startswith("```"), \
            f"{doc.name}:{i + 1}: an example marker must stand right before a fenced block"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        found.append(Example(doc, i, i + 2, end, dict(OPTION.findall(m["opts"])),
                             lines[i + 2:end]))
    return found


def _env() -> dict[str, str]:
    env = dict(os.environ, COLUMNS=WIDTH, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    for name in [n for n in env if n.startswith("MLATRACE_")]:
        env.pop(name)
    return env


def output_of(example: Example) -> list[str]:
    """What the example's command prints (or, with `saved`, printed when it was run)."""
    argv = shlex.split(example.command)
    assert argv[0] == "mlatrace", example.where()
    saved = example.options.get("saved")
    if saved:
        from mlatrace.output import whatif

        assert argv[1] == "whatif", f"{example.where()}: saved output is whatif's only"
        out = io.StringIO()
        whatif.render(json.loads((ROOT / argv[2] / saved).read_text()), out)
        text = out.getvalue()
    else:
        done = subprocess.run([sys.executable, "-m", "mlatrace", *argv[1:]], cwd=ROOT,
                              env=_env(), capture_output=True, text=True, timeout=300)
        text = done.stdout
    return [line.rstrip() for line in text.splitlines()]


def made(example: Example) -> list[str]:
    """The block as the command makes it: `$ command`, then its output (or the lines
    `grep` selects, `...` for each run of lines left out)."""
    lines = output_of(example)
    pattern = example.options.get("grep")
    if pattern is None:
        return [example.text[0], *lines]
    out = [example.text[0]]
    regex = re.compile(pattern)
    skipped = False
    for line in lines:
        if regex.search(line):
            if skipped and len(out) > 1:
                out.append("...")
            out.append(line)
            skipped = False
        else:
            skipped = True
    return out


ALL = [e for doc in DOCS for e in examples(doc)]


@pytest.mark.parametrize("example", ALL, ids=[e.where() for e in ALL])
def test_a_documented_example_is_what_its_command_prints(example):
    assert example.text == made(example), (
        f"{example.where()}: the example is stale; re-make it with "
        "`python tests/test_doc_examples.py --write`")


def test_every_example_on_a_shipped_trace_is_made_by_its_command():
    """A `$ mlatrace ...` block naming a trace of samples/ or tests/fixtures/ carries
    a marker, so that its output is checked."""
    marked = {(e.doc, e.start) for e in ALL}
    unmarked = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("```") or i + 1 >= len(lines):
                continue
            first = lines[i + 1]
            if not first.startswith("$ mlatrace "):
                continue
            paths = [a for a in shlex.split(first[2:]) if "/" in a and (ROOT / a).exists()]
            if paths and (doc, i + 1) not in marked:
                unmarked.append(f"{doc.relative_to(ROOT)}:{i + 2}: {first}")
    assert not unmarked, unmarked
    assert any(e.doc.name == "cost-whatif.md" for e in ALL)


def _case_rows() -> list[tuple[str, str, list[Path]]]:
    """docs/backends.md's cases shown by a shipped GPU trace: (case, rule cell, traces)."""
    rows = []
    for line in (ROOT / "docs" / "backends.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not cells[0].isdigit():
            continue
        traces: list[Path] = []
        base = None
        for name in re.findall(r"`([^`]+)`", cells[4]):
            if name.startswith("samples/"):
                base = name.rstrip("*")
                found = sorted(p for p in ROOT.glob(name) if (p / "run.json").exists())
            elif name.startswith("..._") and base:
                found = [ROOT / (base + name[3:])]
            else:
                continue
            traces += found
        if traces:
            rows.append((f"case {cells[0]}", cells[3], traces))
    return rows


def test_each_backend_case_shown_by_a_trace_names_the_findings_its_trace_gives():
    """A case's rule cell names every finding its traces give (MLT004, the drivers' own
    accuracy check, is said once below the table), and a case it calls "none" gives none."""
    rows = _case_rows()
    assert any("sglang_triton_device_splits" in str(t) for _, _, ts in rows for t in ts)
    wrong = []
    for case, rule, traces in rows:
        for trace in traces:
            done = subprocess.run([sys.executable, "-m", "mlatrace", "report", "--json",
                                   str(trace)], cwd=ROOT, env=_env(), capture_output=True,
                                  text=True, timeout=300)
            ids = {f["id"] for f in json.loads(done.stdout)["findings"]} - {"MLT004"}
            if rule.startswith("none") and ids:
                wrong.append(f"{case}: says none, {trace.name} gives {sorted(ids)}")
            wrong += [f"{case}: {trace.name} gives {i}, the rule cell does not name it"
                      for i in sorted(ids) if i not in rule]
    assert not wrong, wrong


def test_the_testing_page_says_how_long_the_default_run_takes():
    text = (ROOT / "docs" / "testing.md").read_text()
    m = re.search(r"default run \(`time pytest -q`\) took (\d+) s, (\d+) passed", text)
    assert m, "docs/testing.md: how long the default test run takes, and on what machine"
    assert "2-core" in text[max(0, m.start() - 200):m.end()]


def write() -> None:
    """Re-make every marked block in place."""
    for doc in DOCS:
        found = examples(doc)
        if not found:
            continue
        lines = doc.read_text().splitlines()
        for e in reversed(found):
            lines[e.start:e.end] = made(e)
        doc.write_text("\n".join(lines) + "\n")
        print(f"{doc.relative_to(ROOT)}: {len(found)} example(s) re-made")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_doc_examples.py --write")
    sys.path.insert(0, str(ROOT))
    write()
