"""`mlatrace check`: exit codes, thresholds, rule selection, config files, JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import synth
from click.testing import CliRunner
from conftest import FIXTURES

from mlatrace.analysis import RULES, ConfigError, load_config
from mlatrace.cli import main


def run(*args: str):
    return CliRunner().invoke(main, ["check", *[str(a) for a in args]])


def test_exit_codes():
    assert run(FIXTURES / "device_healthy").exit_code == 0
    result = run(FIXTURES / "legacy_one_split")
    assert result.exit_code == 1
    assert "FAILED: 1 finding at or above error" in result.output
    assert "p1000.jsonl:seq" in result.output
    assert run(FIXTURES / "all_garbage").exit_code == 2
    assert run(FIXTURES / "no-such-trace").exit_code == 2
    assert run(FIXTURES / "legacy_one_split", "--rule", "MLT999").exit_code == 2
    assert run(FIXTURES / "legacy_one_split", "--fail-on", "fatal").exit_code == 2


def test_warning_threshold_and_rule_selection(tmp_path):
    syncs = synth.host_syncs(tmp_path / "s")
    assert run(syncs).exit_code == 0  # warnings only
    assert run(syncs, "--fail-on", "warning").exit_code == 1
    assert run(FIXTURES / "legacy_one_split", "--rule", "MLT002").exit_code == 0
    assert run(FIXTURES / "legacy_one_split", "--rule", "mlt001").exit_code == 1


def test_config_file_disable_allow_threshold(tmp_path):
    cfg = tmp_path / "mlatrace.toml"
    cfg.write_text('disable = ["MLT001"]\n')
    assert run(FIXTURES / "legacy_one_split", "--config", cfg).exit_code == 0
    cfg.write_text('allow = [{rule = "MLT001", key = "FULL(num_tokens=1)", rank = 0}]\n')
    assert run(FIXTURES / "legacy_one_split", "--config", cfg).exit_code == 0
    cfg.write_text("long_len_factor = 100000\n")
    assert run(FIXTURES / "legacy_one_split", "--config", cfg).exit_code == 0
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n[tool.mlatrace]\nfail_on = "warning"\n')
    syncs = synth.host_syncs(tmp_path / "s")
    assert run(syncs, "--config", pyproject).exit_code == 1
    assert run(syncs, "--config", pyproject, "--fail-on", "error").exit_code == 0
    cfg.write_text("long_len_factor = 'big'\n")
    result = run(FIXTURES / "legacy_one_split", "--config", cfg)
    assert result.exit_code == 2 and "long_len_factor" in result.output


def test_config_discovered_in_cwd(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.mlatrace]\ndisable = ["MLT001"]\n')
    monkeypatch.chdir(tmp_path)
    assert run(FIXTURES / "legacy_one_split").exit_code == 0
    (tmp_path / "mlatrace.toml").write_text("disable = []\n")  # mlatrace.toml wins
    assert run(FIXTURES / "legacy_one_split").exit_code == 1


def test_load_config_errors(tmp_path):
    bad = tmp_path / "mlatrace.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad)
    bad.write_text('disable = ["MLT042"]')
    with pytest.raises(ConfigError, match="MLT042"):
        load_config(bad)
    bad.write_text('allow = ["MLT001"]')
    with pytest.raises(ConfigError, match="allow"):
        load_config(bad)
    assert load_config(None, search_dir=tmp_path / "nothing-here").long_len_factor == 8


def test_junit_xml(tmp_path):
    out = tmp_path / "reports" / "mlatrace.xml"
    cfg = tmp_path / "mlatrace.toml"
    cfg.write_text('disable = ["MLT004"]\n')
    result = run(FIXTURES / "legacy_one_split", "--junit", out, "--config", cfg)
    assert result.exit_code == 1
    suite = ET.parse(out).getroot()
    rules = len(RULES)
    assert suite.tag == "testsuite" and suite.get("tests") == str(rules + 1)   # + coverage
    assert suite.get("failures") == "1" and suite.get("skipped") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert len(cases) == rules + 1
    assert cases["coverage"].find("failure") is None   # an older trace, not blind
    failure = cases["MLT001 frozen-one-split"].find("failure")
    assert failure is not None and "replayed 3 times" in failure.get("message")
    assert "p1000.jsonl:seq 5" in failure.text
    assert cases["MLT004 host-sync-in-decode"].find("skipped") is not None
    assert cases["MLT002 replay-beyond-capture"].find("failure") is None
