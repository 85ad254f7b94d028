"""The schema of mlatrace/1 (`python -m mlatrace.trace.schema`) is made from the
declarations, and the trace format describes every kind it names."""

from __future__ import annotations

import json

from conftest import REPO

from mlatrace import kinds
from mlatrace.trace.schema import render, schema


def test_the_command_prints_the_schema() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "mlatrace.trace.schema"], capture_output=True,
                         text=True, timeout=60, cwd=REPO, check=True).stdout
    assert out == render() and json.loads(out)["schema"] == "mlatrace/1"


def test_the_schema_names_every_kind_and_its_properties() -> None:
    made = schema()
    assert list(made["kinds"]) == list(kinds.KINDS)
    assert set(made["kinds"]["steady"]["properties"]) >= {"at_cap", "checked", "built"}
    assert "typed_fields" in made["kinds"]["graph.replay"]
    assert "sms" in made["kinds"]["device"]["check"]
    json.dumps(made)


def test_every_kind_has_its_section_in_the_trace_format() -> None:
    text = (REPO / "docs" / "trace-format.md").read_text()
    missing = [k for k in kinds.KINDS if f"| `{k}` |" not in text]
    assert not missing, missing
