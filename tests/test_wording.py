"""Outputs say what they mean, in words a user reads without the source.

Each case runs the `mlatrace` CLI in a subprocess on a shipped trace, or on a run it
makes: a sync named by its call, no `gid None`, the watch's graphs named by their
process, `probes doctor` on a pack without a library or with an absent one, and
`report --list` keeping the arguments where runs differ.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SGLANG = "samples/gpu_backends/sglang_triton_device_splits"


def _env() -> dict[str, str]:
    env = dict(os.environ, COLUMNS="160", PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    for name in [n for n in env if n.startswith("MLATRACE_")]:
        env.pop(name)
    return env


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlatrace", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=300)


def test_a_host_sync_is_named_by_its_call():
    out = cli("check", SGLANG).stdout
    (line,) = [s for s in out.splitlines() if s.startswith("MLT004 ")]
    assert "4 host syncs by Tensor.item() right after a replay" in line, line
    assert "sync(s)" not in out
    legacy = cli("check", "samples/gpu_serve_legacy_timed").stdout
    assert "64 host syncs by torch.cuda.synchronize() right after a replay" in legacy


def test_a_finding_of_no_graph_never_says_gid_none(tmp_path):
    junit, page = tmp_path / "out.xml", tmp_path / "page.html"
    cli("check", SGLANG, "--junit", str(junit), "--html", str(page))
    for text in (junit.read_text(), page.read_text(), cli("report", "-v", SGLANG).stdout):
        assert "gid None" not in text and "rank None" not in text
    assert "pid 619 rank -\n" in junit.read_text()   # MLT004: the decode step path, no graph


def test_the_watch_names_each_graph_by_its_process():
    out = cli("watch", "--once", SGLANG).stdout
    lines = out.splitlines()
    at = next(i for i, s in enumerate(lines) if s.startswith("graphs captured"))
    header, row = lines[at + 1], lines[at + 3]
    assert header.split()[0] == "process" and "rank" not in header, header
    assert row.split("│")[0].strip() == "pid 619", row


PACK_WITHOUT_LIBRARY = """\
[pack]
name = "mykv"

[[probe]]
name = "plan"
targets = ["mykv_mod:plan"]
params = ["n"]
kind = "mark"
[probe.fields]
name = "'mykv.plan'"
"""

PACK_OF_AN_ABSENT_LIBRARY = """\
[pack]
name = "mylib_pack"
library = "mylib_absent"
versions = ">=1.0"

[[probe]]
name = "plan"
targets = ["mylib_absent.ops:plan"]
params = ["n"]
kind = "mark"
[probe.fields]
name = "'mylib.plan'"
"""


def test_doctor_says_what_it_knows_of_a_pack_without_a_library_or_an_absent_one(tmp_path):
    (tmp_path / "mykv.toml").write_text(PACK_WITHOUT_LIBRARY)
    (tmp_path / "mylib.toml").write_text(PACK_OF_AN_ABSENT_LIBRARY)
    out = cli("probes", "doctor", "--probes", str(tmp_path / "mykv.toml"),
              "--probes", str(tmp_path / "mylib.toml")).stdout
    lines = out.splitlines()
    (mykv,) = [s for s in lines if s.startswith("mykv:")]
    assert mykv == "mykv: no library named (its targets' modules decide)", mykv
    (mylib,) = [s for s in lines if s.startswith("mylib_pack:")]
    assert mylib == "mylib_pack: mylib_absent not installed; versions >=1.0: not checked", mylib
    assert ": ok" not in mylib and "  not installed" not in mykv


def test_report_list_keeps_the_arguments_where_runs_differ(tmp_path):
    common = ["--device", "cpu", "--ctx", "2048", "--steps", "8", "--batch", "2",
              "--heads", "16", "--layers", "2"]
    for policy in ("legacy", "device"):
        done = cli("run", "--out", policy, "--", sys.executable, "-c", "pass", *common,
                   "--policy", policy, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    out = cli("report", "--list", ".", cwd=tmp_path).stdout
    rows = [s for s in out.splitlines() if "│" in s]
    assert len(rows) == 2, out
    for row, policy in zip(rows, ("legacy", "device"), strict=True):
        argv = row.split("│")[2].strip()
        assert "-c pass … --policy " in argv and argv.endswith(f" --policy {policy}"), row
