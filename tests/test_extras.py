"""Optional extras: without OpenTelemetry installed (`[otlp]`) every command but the OTLP
ones works, and those say in one line which extra to install (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, MLATRACE, REPO

TRACE = FIXTURES / "legacy_one_split"


@pytest.fixture
def without_otel(tmp_path: Path) -> dict[str, str]:
    """An environment where `import opentelemetry` fails, as on a box without [otlp]."""
    shadow = tmp_path / "shadow" / "opentelemetry"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('opentelemetry is not installed')\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow.parent), str(REPO)]))


def mlatrace(env: dict[str, str], *args: str, cwd: Path | None = None
             ) -> subprocess.CompletedProcess:
    return subprocess.run([*MLATRACE, *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_the_otlp_commands_name_the_extra(without_otel: dict, tmp_path: Path) -> None:
    export = mlatrace(without_otel, "export", str(TRACE), "--otlp", "http://127.0.0.1:9")
    assert export.returncode == 2
    assert export.stderr == ("error: mlatrace export --otlp needs the 'otlp' extra: "
                             "pip install 'mlatrace[otlp]'\n")
    out = tmp_path / "t"
    run = mlatrace(without_otel, "run", "--out", str(out), "--otlp", "http://127.0.0.1:9",
                   "--", sys.executable, "-c", "pass")
    assert run.returncode == 2 and "pip install 'mlatrace[otlp]'" in run.stderr
    assert not out.exists()   # said before anything started


def test_everything_else_works_without_opentelemetry(without_otel: dict,
                                                     tmp_path: Path) -> None:
    for args in (("report", str(TRACE)), ("check", "--fail-on", "warning", str(TRACE)),
                 ("export", str(TRACE), "--perfetto", str(tmp_path / "p.json"))):
        done = mlatrace(without_otel, *args)
        assert done.returncode in (0, 1), (args, done.stderr)
        assert "opentelemetry" not in done.stderr
