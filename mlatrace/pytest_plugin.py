"""pytest plugin (entry point pytest11): trace code under test and fail on findings.

    def test_decode_graph(mlatrace_trace):          # records this test in-process
        run_capture_then_replay()
        assert not mlatrace_trace.findings           # analysis runs on first access

    @pytest.mark.mlatrace(fail_on="error")            # traced without naming the fixture;
    def test_other(): ...                            # fails when a finding >= error appears

`--mlatrace-fail-on error|warning` fails every traced test (fixture or marker) that
produces findings at or above that severity; the marker's `fail_on` wins over it and
`fail_on=None` only records. Tests that use neither are not traced: the plugin is inert.
Nothing here imports torch; the recorder and probes load only when a test asks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

FIXTURE = "mlatrace_trace"
_TRACER_KEY = pytest.StashKey["MlaTrace"]()


class _Tee:
    """A sink of the process's running recorder that writes one test's records to its own
    trace file (the header copied, seq renumbered from 1 so the file has no gaps)."""

    def __init__(self, path: Path, header: dict) -> None:
        import json

        path.mkdir(parents=True, exist_ok=True)
        self._dumps = json.dumps
        self._file = (path / f"p{os.getpid()}.jsonl").open("w")
        self._file.write(json.dumps(header) + "\n")
        self._seq = 0
        self._open = True

    def __call__(self, records: list[dict]) -> None:
        if not self._open:
            return
        lines = []
        for rec in records:
            if rec.get("k") == "process.end":
                continue
            self._seq += 1
            lines.append(self._dumps({**rec, "seq": self._seq}, default=repr))
        if lines:
            self._file.write("\n".join(lines) + "\n")

    def close(self) -> None:
        self._open = False
        self._file.close()


class MlaTrace:
    """One test's in-process trace: records while the test runs, analyses on demand."""

    def __init__(self, path: Path, rules: list[str] | None = None,
                 config: str | None = None) -> None:
        self.path = Path(path)
        self.rules = rules
        self.config_path = config
        self._recording = False
        self._installed_probes = False
        self._analysis: Any = None
        self._tee: _Tee | None = None

    def start(self) -> MlaTrace:
        try:
            from mlatrace import record
        except ImportError as exc:  # pragma: no cover - the recorder ships with mlatrace
            raise pytest.UsageError(f"mlatrace recorder unavailable: {exc}") from exc
        outer = record.current()
        if outer is not None:
            # pytest itself runs under `mlatrace run`: keep that recording going and copy
            # this test's records into the test's own trace as they are flushed.
            outer.close_folds()                  # steady steps folded so far, written now
            record.flush_now(timeout_s=5.0)      # what came before the test stays out
            self._tee = _Tee(self.path, outer.header())
            outer.add_sink(self._tee)
        else:
            record.start(str(self.path), run_id=f"pytest-{os.getpid()}")
        self._recording = True
        try:
            from mlatrace import probe

            self._installed_probes = bool(probe.install_default())
        except ImportError:  # the probe engine is optional: records emitted by hand still count
            self._installed_probes = False
        return self

    def stop(self) -> None:
        """Stop recording (flushes the file); probes installed by this trace are removed."""
        if not self._recording:
            return
        self._recording = False
        if self._installed_probes:
            from mlatrace import probe

            probe.uninstall()
            self._installed_probes = False
        from mlatrace import record

        if self._tee is not None:
            recorder = record.current()
            if recorder is not None:
                recorder.close_folds()           # the test's folded steps, written now
            record.flush_now(timeout_s=5.0)      # the test's last records reach the tee
            if recorder is not None:
                recorder.remove_sink(self._tee)
            record.flush_now(timeout_s=5.0)      # and a flush already under way has ended
            self._tee.close()
            self._tee = None
        else:
            record.stop("test end")

    @property
    def analysis(self) -> Any:
        """The mlatrace.analysis.Analysis of what was recorded (stops recording first)."""
        if self._analysis is None:
            self.stop()
            from mlatrace.analysis import Config, analyze, load_config
            from mlatrace.trace import open_trace

            config = load_config(self.config_path) if self.config_path else Config()
            self._analysis = analyze(open_trace(self.path), config, self.rules)
        return self._analysis

    @property
    def findings(self) -> list:
        return self.analysis.findings

    def failing(self, fail_on: str) -> list:
        from mlatrace.analysis import at_or_above

        return [f for f in self.findings if at_or_above(f.severity, fail_on)]

    def describe(self, findings: list) -> str:
        lines = [f"mlatrace: {len(findings)} finding{'' if len(findings) == 1 else 's'} in "
                 f"{self.path}"]
        for f in findings:
            lines.append(f"  {f.id} {f.name} [{f.severity}]: {f.message}")
            lines += [f"      {e.file}:seq {e.seq} ({e.kind}) {e.what}" for e in f.evidence[:3]]
            lines.append(f"      fix: {f.hint}")
        return "\n".join(lines)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mlatrace", "mlatrace CUDA-graph capture findings")
    group.addoption("--mlatrace-fail-on", choices=["error", "warning"], default=None,
                    help="fail traced tests (mlatrace_trace fixture or mlatrace marker) whose "
                         "trace has findings at or above this severity")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "mlatrace(fail_on='error', rules=None, config=None): trace this test "
                   "in-process with mlatrace and fail it on findings at or above fail_on")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # a marked test is traced even when it does not name the fixture
        if item.get_closest_marker("mlatrace") and FIXTURE not in getattr(item, "fixturenames", ()):
            item.fixturenames.append(FIXTURE)


def _marker_options(item: pytest.Item) -> tuple[bool, dict]:
    marker = item.get_closest_marker("mlatrace")
    if marker is None:
        return False, {}
    return True, dict(marker.kwargs)


@pytest.fixture
def mlatrace_trace(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Trace the code under test in this process; `.findings` analyses the trace."""
    _, options = _marker_options(request.node)
    rules = options.get("rules")
    tracer = MlaTrace(tmp_path_factory.mktemp("mlatrace"), rules=list(rules) if rules else None,
                      config=options.get("config"))
    request.node.stash[_TRACER_KEY] = tracer
    tracer.start()
    try:
        yield tracer
    finally:
        tracer.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    tracer = item.stash.get(_TRACER_KEY, None)
    if tracer is None:
        return result
    marked, options = _marker_options(item)
    option = item.config.getoption("--mlatrace-fail-on", None)
    fail_on = options["fail_on"] if "fail_on" in options else ("error" if marked else None)
    if "fail_on" not in options and option:
        fail_on = option
    if fail_on:
        bad = tracer.failing(fail_on)
        if bad:
            pytest.fail(tracer.describe(bad), pytrace=False)
    return result
