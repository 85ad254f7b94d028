"""One registry of rules (mlatrace.analysis.rules.RULES): every rule it holds runs, is
configurable, is a testcase of `check --junit`, and has its row in docs/findings.md."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

from mlatrace.analysis import RULES, Config, analyze_model
from mlatrace.analysis.config import ConfigError, config_from_dict
from mlatrace.analysis.model import TraceModel

ROW = re.compile(r"^\| (MLT\d{3}) ([a-z-]+) \| ([a-z, ]+) \|", re.M)


def docs_rows() -> dict[str, tuple[str, str]]:
    text = (REPO / "docs" / "findings.md").read_text()
    return {m[1]: (m[2], m[3]) for m in ROW.finditer(text)}


def test_every_rule_has_its_docs_row_and_every_row_a_rule() -> None:
    rows = docs_rows()
    assert sorted(rows) == sorted(RULES)
    for rule in RULES.values():
        name, severities = rows[rule.id]
        assert name == rule.name, rule.id
        assert rule.severity in severities, rule.id


def test_every_rule_runs_and_a_disabled_one_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlatrace.analysis import rules as rules_mod

    ran: list[str] = []
    spies = {rid: rules_mod.Rule(r.id, r.name, r.severity,
                                 lambda model, config, rid=rid: ran.append(rid) or [])
             for rid, r in RULES.items()}
    monkeypatch.setattr("mlatrace.analysis.pipeline.RULES", spies)
    analyze_model(TraceModel(root="t"), Config(disable={"MLT004"}))
    assert ran == [r for r in RULES if r != "MLT004"]


def test_config_knows_every_rule_and_no_other() -> None:
    assert config_from_dict({"disable": [r.lower() for r in RULES]}).disable == set(RULES)
    with pytest.raises(ConfigError, match="MLT999"):
        config_from_dict({"disable": ["MLT999"]})


def test_junit_has_one_testcase_per_rule(tmp_path) -> None:
    from conftest import FIXTURES

    from mlatrace.analysis import analyze
    from mlatrace.output.check import junit_xml
    from mlatrace.trace import open_trace

    trace = FIXTURES / "legacy_one_split"
    result = analyze(open_trace(trace))
    suite = junit_xml(result, "error", list(RULES), str(trace)).getroot()
    names = [case.get("name") for case in suite.iter("testcase")
             if case.get("classname") == "mlatrace.rules"]
    assert names == [f"{r.id} {r.name}" for r in RULES.values()]
