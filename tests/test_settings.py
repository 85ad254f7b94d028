"""The settings module: the one table of MLATRACE_* variables, its parsing, its docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlatrace.settings import VARIABLES, Settings, variables_table

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mlatrace"


def test_the_docs_table_is_the_generated_one() -> None:
    text = (REPO / "docs" / "contracts.md").read_text()
    table = text.split("<!-- settings table: begin -->\n")[1].split("<!-- settings table: end -->")[0]
    assert table == variables_table(), "regenerate it: python -m mlatrace.settings"


def test_every_variable_named_in_the_package_is_in_the_table() -> None:
    known = {v.name for v in VARIABLES}
    named = set()
    for path in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r"MLATRACE_[A-Z][A-Z_]*[A-Z]", path.read_text()))
    assert named - known == set()


def test_only_the_settings_module_and_the_bootstrap_read_the_environment() -> None:
    # a read: env.get("MLATRACE_..."), os.environ["MLATRACE_..."], os.getenv("MLATRACE_...")
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        for line in path.read_text().splitlines():
            if re.search(r"""\.get\(\s*["']MLATRACE_|environ\[\s*["']MLATRACE_|getenv\(\s*["']MLATRACE_""",
                         line):
                readers.add(path.relative_to(PACKAGE).as_posix())
    assert readers <= {"settings.py", "inject/bootstrap/sitecustomize.py"}, readers


def test_unset_gives_the_defaults() -> None:
    assert Settings.from_env({}) == Settings()
    assert Settings().to_env() == {}


@pytest.mark.parametrize(("env", "field", "value"), [
    ({"MLATRACE_DISABLE": "1"}, "disabled", True),
    ({"MLATRACE_DISABLE": "0"}, "disabled", False),
    ({"MLATRACE_DISABLE": ""}, "disabled", False),
    ({"MLATRACE_GRAPH_NODES": "0"}, "graph_nodes", False),
    ({"MLATRACE_GRAPH_NODES": ""}, "graph_nodes", True),
    ({"MLATRACE_RANKS": "0, 2"}, "ranks", frozenset({0, 2})),
    ({"MLATRACE_REPLAY_SAMPLE": "0"}, "replay_sample", None),
    ({"MLATRACE_SAMPLE": "x"}, "sample", 1),
    ({"MLATRACE_SAMPLE": "0"}, "sample", 0),
    ({"MLATRACE_REPLAY_TIMING": "off"}, "replay_timing", None),
    ({"MLATRACE_REPLAY_TIMING": "2:4"}, "replay_timing", (2, 4)),
    ({"MLATRACE_STEP_ASIDE": "0"}, "step_aside", None),
    ({"MLATRACE_FOLD": "-1"}, "fold", 10.0),
    ({"MLATRACE_MAX_MB": "2.5"}, "max_mb", 2.5),
    ({"MLATRACE_DISABLE_PACKS": "a, b c"}, "disable_packs", ("a", "b", "c")),
    ({"MLATRACE_OTLP_TIMEOUT": "soon"}, "otlp_timeout", None),
])
def test_values_parse_as_the_readers_always_did(env: dict, field: str, value: object) -> None:
    assert getattr(Settings.from_env(env), field) == value


def test_launches_follow_the_call_sampling_unless_set() -> None:
    assert Settings.from_env({"MLATRACE_SAMPLE": "3"}).launch_every == 3
    assert Settings.from_env({"MLATRACE_SAMPLE": "3", "MLATRACE_LAUNCH_SAMPLE": "0"}).launch_every == 0


def test_to_env_reads_back_as_the_same_settings() -> None:
    env = {"MLATRACE_OUT": "/t", "MLATRACE_RANKS": "1,0", "MLATRACE_REPLAY_TIMING": "off",
           "MLATRACE_STEP_ASIDE": "4,16", "MLATRACE_FOLD": "0", "MLATRACE_PROBES": "/a.toml",
           "MLATRACE_DISABLE_PACKS": "x,y", "MLATRACE_GRAPH_NODES": "0", "MLATRACE_DISABLE": "1"}
    settings = Settings.from_env(env)
    assert Settings.from_env(settings.to_env()) == settings


def test_run_env_is_the_settings_in_place_of_the_inherited_run_variables() -> None:
    """`mlatrace run`'s child environment (settings.run_env): the run's settings replace
    any inherited run variable, others pass through, a pack turned off stays off."""
    import os

    from mlatrace.settings import BOOTSTRAP_DIR, run_env

    base = {"MLATRACE_FOLD": "3", "MLATRACE_RANKS": "1", "MLATRACE_DISABLE_PACKS": "a",
            "MLATRACE_KERNELS": "mla", "PYTHONPATH": f"/x{os.pathsep}{BOOTSTRAP_DIR}",
            "HOME": "/root"}
    env = run_env(Settings(out="/t", run_id="r1", fold=0.0, disable_packs=("b",),
                           replay_timing=None), base)
    assert env["PYTHONPATH"] == f"{BOOTSTRAP_DIR}{os.pathsep}/x"
    child = Settings.from_env(env)
    assert (child.out, child.run_id, child.fold, child.ranks) == ("/t", "r1", 0.0, None)
    assert child.disable_packs == ("a", "b") and child.replay_timing is None
    assert env["MLATRACE_KERNELS"] == "mla" and env["HOME"] == "/root"
    assert "MLATRACE_RANKS" not in env and "MLATRACE_GRAPH_NODES" not in env
