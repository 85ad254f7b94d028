"""Traces name files the same on every machine: no path of the machine that made them.

The shipped traces (samples/, tests/fixtures/) hold repository-relative paths, and
`mlatrace run` records a path below the working directory relative to it (the header's
environment, a sync's call site).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"/work/|/tmp/|/root/|/home/|\.devtree/|\.gpu/i\d+")
"""A checkout's build folder (.devtree/..., .gpu/iNN/...) or a home, scratch or work
directory of the machine that recorded the trace."""


def test_no_shipped_trace_holds_a_path_of_the_machine_that_made_it():
    found = []
    for top in ("samples", "tests/fixtures"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".json", ".jsonl") or not path.is_file():
                continue
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                m = MACHINE_PATH.search(line)
                if m:
                    start = max(0, m.start() - 40)
                    found.append(f"{path.relative_to(ROOT)}:{lineno}: ...{line[start:m.end() + 40]}")
    assert not found, "\n".join(found[:20]) + f"\n({len(found)} lines)"


PROGRAM = """\
import torch

def step():
    try:
        torch.cuda.synchronize()   # recorded as a sync (CPU-only torch raises after it)
    except (AssertionError, RuntimeError):
        pass

step()
"""


def test_run_records_paths_below_the_working_directory_relative_to_it(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "pack.toml").write_text(  # a user pack: its path is recorded too
        '[pack]\nname = "mine"\n\n[[probe]]\nname = "plan"\ntargets = ["mine_mod:plan"]\n'
        'params = ["n"]\nkind = "mark"\n[probe.fields]\nname = "\'mine.plan\'"\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    for name in [n for n in env if n.startswith("MLATRACE_")]:
        env.pop(name)
    done = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", "trace",
                           "--probes", "pack.toml", "--", sys.executable, "prog.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (trace,) = (tmp_path / "trace").glob("p*.jsonl")
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    # the call site of the sync: relative to the working directory
    assert [r["where"] for r in rows if r["k"] == "sync"] == ["prog.py:5"]
    header = rows[0]
    assert header["env"]["MLATRACE_OUT"] == "trace"
    assert header["env"]["MLATRACE_PROBES"] == "pack.toml"
    assert str(tmp_path) not in json.dumps(header)
    run = json.loads((tmp_path / "trace" / "run.json").read_text())
    assert run["cwd"] == str(tmp_path.resolve())   # the one absolute path: what they are relative to
