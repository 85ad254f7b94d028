"""docs/trace-schema.json is the schema made from the declarations (mlatrace.trace.schema)."""

from __future__ import annotations

import json

from conftest import REPO

from mlatrace import kinds
from mlatrace.trace.schema import render, schema


def test_the_checked_in_schema_is_current() -> None:
    text = (REPO / "docs" / "trace-schema.json").read_text()
    assert text == render(), "regenerate it: python -m mlatrace.trace.schema > docs/trace-schema.json"


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
