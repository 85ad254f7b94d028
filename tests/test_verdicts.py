"""`check` verdicts that must never be a false OK: suppressions, collections of runs,
nothing attached, killed processes."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from mlatrace.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def check(*args: str):
    return CliRunner().invoke(main, ["check", *[str(a) for a in args]])


def test_mistyped_allow_entry_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n\n[tool.mlatrace]\nallow = [{rulle = "MLT004"}]\n')
    result = check(FIXTURES / "legacy_one_split")
    assert result.exit_code == 2, result.output
    assert f"{pyproject}:5" in result.output and "'rulle'" in result.output
    assert "did you mean 'rule'" in result.output
    pyproject.write_text('[tool.mlatrace]\nallow = [{rule = "MLT001", kee = "x"}]\n')
    result = check(FIXTURES / "legacy_one_split")
    assert result.exit_code == 2 and "'kee'" in result.output, result.output
    pyproject.write_text('[tool.mlatrace]\nallow = [{key = "x"}]\n')
    result = check(FIXTURES / "legacy_one_split")
    assert result.exit_code == 2 and "names no rule" in result.output, result.output
    pyproject.write_text('[tool.mlatrace]\nallow = [{rule = "MLT042"}]\n')
    assert check(FIXTURES / "legacy_one_split").exit_code == 2


def test_check_says_what_was_suppressed(tmp_path):
    cfg = tmp_path / "mlatrace.toml"
    cfg.write_text('allow = [{rule = "MLT004"}, {rule = "MLT001", rank = 0}]\n')
    result = check(FIXTURES / "legacy_one_split", "--config", cfg)
    assert result.exit_code == 0, result.output
    assert ('suppressed: 1 finding by allow entry {rule = "MLT001", rank = 0} '
            f"({cfg})") in result.output
    assert "MLT004" not in result.output.split("suppressed:")[1].split("\n")[0]

