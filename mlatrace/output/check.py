"""`mlatrace check TRACE`: a CI verdict over the findings and the coverage.

Exit codes (ExitCode): 0 clean (no finding at or above --fail-on, and not blind),
1 findings at or above it, 2 the trace is unreadable / has nothing usable, a header
names a schema this mlatrace does not know (no verdict on records it may misread), or
the arguments or config are wrong, 3 blind: the trace cannot support a clean verdict
(a probe.error, a probed engine in the headers but no graph or attention record, an
unmet --expect, ranks missing; analysis/coverage.py). Findings (1) take precedence
over blindness (3).

Output is plain lines for CI logs, never wrapped: the trace's problems (`warning: ...`),
one line per finding starting with its id at column 0, its evidence and fix, then
coverage lines (`coverage ...`, indented `blind: ...`) that never start with an id, then
the verdict. `--junit FILE` writes one testcase per rule (failures carry the messages
and evidence) and a `coverage` testcase that fails when the run is blind.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlatrace.analysis import RULES, Analysis, ConfigError, Finding, at_or_above
from mlatrace.analysis.load import Unusable, load, resolve_config
from mlatrace.exitcodes import ExitCode, MlatraceError  # also check.ExitCode, as before
from mlatrace.output.report import (
    make_console,
    plural,
    print_warnings,
    problem_text,
    problems_of,
    rank_text,
    report_dict,
)
from mlatrace.trace import SCHEMA_MAJOR, SCHEMA_NAME, check_schema


@dataclass(frozen=True)
class Verdict:
    """What `check` says of one run: its exit code and headline. The one judgement of
    findings and coverage: `check` prints it, the HTML page shows it."""

    code: ExitCode
    failing: int      # findings at or above `fail_on`
    blind: bool
    fail_on: str

    @property
    def headline(self) -> str:
        if self.code is ExitCode.FINDINGS:
            head = f"FAILED: {plural(self.failing, 'finding')} at or above {self.fail_on}"
            return head + (" (and the trace is blind, see coverage)" if self.blind else "")
        if self.code is ExitCode.BLIND:
            return (f"BLIND: no finding at or above {self.fail_on}, but the trace cannot "
                    "support a clean verdict")
        return f"OK: no finding at or above {self.fail_on}"


def judge(severities: Iterable[str], blind: bool, fail_on: str) -> Verdict:
    """The verdict on findings of these severities and a run blind or not: findings at or
    above `fail_on` first (exit 1), then blindness (3), else clean (0)."""
    failing = sum(1 for s in severities if at_or_above(s, fail_on))
    code = ExitCode.FINDINGS if failing else ExitCode.BLIND if blind else ExitCode.CLEAN
    return Verdict(code, failing, blind, fail_on)


def failing(findings: list[Finding], fail_on: str) -> list[Finding]:
    return [f for f in findings if at_or_above(f.severity, fail_on)]


def junit_xml(result: Analysis, fail_on: str, rules: list[str], trace: str) -> ET.ElementTree:
    """One testsuite `mlatrace`, one testcase per rule; a failure lists that rule's findings."""
    suite = ET.Element("testsuite", name="mlatrace")
    failures = skipped = 0
    for rule_id, rule in RULES.items():
        case = ET.SubElement(suite, "testcase", classname="mlatrace.rules",
                             name=f"{rule_id} {rule.name}", file=str(trace), time="0")
        if rule_id not in rules:
            skipped += 1
            why = "disabled by config" if not result.config.enabled(rule_id) else "not selected (--rule)"
            ET.SubElement(case, "skipped", message=why)
            continue
        mine = [f for f in result.findings if f.id == rule_id]
        bad = failing(mine, fail_on)
        if bad:
            failures += 1
            failure = ET.SubElement(case, "failure", type=rule.severity,
                                    message=f"{plural(len(bad), 'finding')}: {bad[0].message}")
            failure.text = "\n\n".join(_finding_text(f) for f in bad)
        elif mine:  # below the threshold: visible, not failing
            out = ET.SubElement(case, "system-out")
            out.text = "\n\n".join(_finding_text(f) for f in mine)
    coverage = result.coverage
    case = ET.SubElement(suite, "testcase", classname="mlatrace.coverage", name="coverage",
                         file=str(trace), time="0")
    if coverage.blind:
        failures += 1
        failure = ET.SubElement(case, "failure", type="blind",
                                message=f"blind: {coverage.reasons[0]}")
        failure.text = "\n".join(coverage.reasons)
    else:
        out = ET.SubElement(case, "system-out")
        attached = coverage.probes_attached
        out.text = (f"{attached if attached is not None else 'unknown number of'} probes "
                    f"attached, {coverage.probes_errored} errored; records: "
                    + ", ".join(f"{k} {n}" for k, n in coverage.records.items()))
    problems = problems_of(result.model)
    if problems:
        err = ET.SubElement(suite, "system-err")
        err.text = "\n".join(problem_text(p) for p in problems)
    suite.set("tests", str(len(RULES) + 1))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    ET.indent(suite)
    return ET.ElementTree(suite)


def _finding_text(f: Finding) -> str:
    graph = f" gid {f.gid}" if f.gid is not None else ""   # a finding of no one graph
    lines = [f"[{f.severity}] {f.message}", f"pid {f.pid} rank {rank_text(f.rank)}{graph}"]
    lines += [f"  {e.file}:seq {e.seq} ({e.kind}) {e.what}" for e in f.evidence]
    lines.append(f"fix: {f.hint}")
    return "\n".join(lines)


WORST_FIRST = (ExitCode.UNUSABLE, ExitCode.FINDINGS, ExitCode.BLIND, ExitCode.CLEAN)


def worst(codes: list[int]) -> int:
    """The exit of a collection of runs: 2 before 1 before 3 before 0."""
    return min(codes, key=lambda c: WORST_FIRST.index(ExitCode(c))) if codes else 0


def main(trace: str | list[str], fail_on: str | None = "error", rules: list[str] | None = None,
         config: str | None = None, junit: str | None = None,
         expect: list[str] | None = None, run_id: str | None = None,
         html: str | None = None) -> int:
    """Analyse TRACE and return an ExitCode: 0 clean, 1 findings at/above fail_on,
    2 unusable, 3 blind. `html`: also write the report's page there
    (mlatrace.output.html_report), its verdict judged at fail_on; for a collection, one page
    with every run (a section each) and the collection's verdict. TRACE holding several runs
    (a collection): every run is judged, one verdict line each, and the exit is the worst
    (`worst`)."""
    if run_id is None:
        from mlatrace.trace import TraceError
        from mlatrace.trace.runs import find_runs

        paths = [trace] if isinstance(trace, str) else list(trace)
        try:
            runs = find_runs(paths) if not (len(paths) == 1 and Path(paths[0]).is_file()) else []
        except (TraceError, OSError):
            runs = []  # check_run says why
        if len(runs) > 1:
            return _check_collection(paths, runs, fail_on, rules, config, junit, expect, html)
    return check_run(trace, fail_on, rules, config, junit, expect, run_id, html=html)


def _check_collection(paths: list[str], runs: list[Any], fail_on: str | None,
                      rules: list[str] | None, config: str | None, junit: str | None,
                      expect: list[str] | None, html: str | None = None) -> int:
    """Judge every run of a collection; one `run ID: VERDICT` line each, the worst exit."""
    out = make_console()
    out.print(f"{' '.join(paths)} holds {len(runs)} runs: judging each", highlight=False,
              soft_wrap=True)
    codes, suites, pages = [], [], []   # pages: what --html shows of each run
    for run in runs:
        dirs = ", ".join(str(d) for d in run.dirs)
        out.print(f"== run {run.run_id} ({dirs})", highlight=False, soft_wrap=True)
        shown: list[dict] = []
        try:
            code = check_run(paths, fail_on, rules, config, None, expect, run.run_id,
                             junit_suites=suites if junit else None,
                             pages=shown if html else None)
        except MlatraceError as error:   # this run's verdict; the others are still judged
            print(error.message, file=sys.stderr)
            code = error.code
        codes.append(code)
        pages.append(shown[0] if shown else {"data": None, "result": None})
        pages[-1].update(run_id=str(run.run_id), dirs=run.dirs, code=code)
    code = worst(codes)
    if html:
        from mlatrace.output.html_report import write_collection

        err = make_console(stderr=True)
        if not write_collection(html, " ".join(paths), pages, code, err,
                                fail_on=next((p["fail_on"] for p in pages if p.get("fail_on")),
                                             fail_on or "error")):
            return ExitCode.UNUSABLE
    if junit and suites:
        root = ET.Element("testsuites", name="mlatrace")
        root.extend(suites)
        ET.indent(root)
        try:
            Path(junit).parent.mkdir(parents=True, exist_ok=True)
            ET.ElementTree(root).write(junit, encoding="utf-8", xml_declaration=True)
        except OSError as exc:
            raise MlatraceError(f"error: cannot write {junit}: {exc.strerror or exc}") from None
    for run, c in zip(runs, codes, strict=True):
        out.print(f"run {run.run_id}: {_VERDICT_WORD[ExitCode(c)]} (exit {c})", highlight=False,
                  soft_wrap=True)
    out.print(f"collection of {len(runs)} runs: exit {code} (the worst: 2, then 1, then 3, "
              "then 0)", highlight=False, soft_wrap=True)
    return code


_VERDICT_WORD = {ExitCode.CLEAN: "OK", ExitCode.FINDINGS: "FAILED", ExitCode.BLIND: "BLIND",
                 ExitCode.UNUSABLE: "UNUSABLE"}


def check_run(trace: str | list[str], fail_on: str | None = "error",
              rules: list[str] | None = None, config: str | None = None,
              junit: str | None = None, expect: list[str] | None = None,
              run_id: str | None = None, junit_suites: list | None = None,
              html: str | None = None, pages: list | None = None) -> int:
    """`check` of one run (TRACE's newest, or `run_id`): its ExitCode (MlatraceError, exit 2,
    when the run or the arguments are unusable). `junit_suites`: append the run's JUnit
    testsuite there instead of writing `junit`; `pages`: append {"data", "result",
    "fail_on"} there for the collection's page (`html` is not written)."""
    paths, trace = trace, trace if isinstance(trace, str) else " ".join(trace)
    try:
        cfg = resolve_config(config, trace, expect)
    except ConfigError as exc:
        raise MlatraceError(f"error: {exc}") from None
    fail_on = fail_on or cfg.fail_on
    if fail_on not in ("error", "warning"):
        raise MlatraceError(f"error: --fail-on must be error or warning, not {fail_on!r}")
    selected = [r.upper() for r in rules or []]
    unknown = [r for r in selected if r not in RULES]
    if unknown:
        raise MlatraceError(f"error: unknown rule id(s): {', '.join(unknown)} "
                            f"(known: {', '.join(RULES)})")
    try:
        opened, result = load(paths, cfg, selected or None, run_id=run_id)
    except Unusable as exc:
        raise MlatraceError(f"error: {exc}") from None
    unknown = unknown_schemas(result)
    if unknown:
        file, schema = unknown[0]
        raise MlatraceError(f"error: {file}: the header says schema {schema!r}, this "
                            f"mlatrace reads {SCHEMA_NAME}/{SCHEMA_MAJOR}: no verdict "
                            "(upgrade mlatrace; `mlatrace report` shows a best-effort view)")
    active = [r for r in RULES if cfg.enabled(r) and (not selected or r in selected)]
    if junit_suites is not None:
        suite = junit_xml(result, fail_on, active, trace).getroot()
        suite.set("name", f"mlatrace run {run_id}")
        junit_suites.append(suite)
    if junit:
        try:
            Path(junit).parent.mkdir(parents=True, exist_ok=True)
            junit_xml(result, fail_on, active, trace).write(junit, encoding="utf-8",
                                                            xml_declaration=True)
        except OSError as exc:
            raise MlatraceError(f"error: cannot write {junit}: {exc.strerror or exc}") from None
    data = report_dict(trace, result, run=opened.run)
    if pages is not None:
        pages.append({"data": data, "result": result, "fail_on": fail_on})
    if html:
        from mlatrace.output.html_report import save

        save(html, data, result, make_console(stderr=True), fail_on=fail_on)
    out = make_console()
    print_warnings(out, data["problems"])   # on stdout, before the verdict they qualify
    for f in result.findings:
        colour = "red" if f.severity == "error" else "yellow"
        out.print(f"[{colour}]{f.id}[/] {f.severity} rank {rank_text(f.rank)}: {f.message}",
                  soft_wrap=True)
        if f.evidence:
            e = f.evidence[0]
            out.print(f"    at {e.file}:seq {e.seq} ({e.kind}); fix: {f.hint}", soft_wrap=True)
    print_suppressed(out, result)
    summary = data["summary"]
    coverage = result.coverage
    render_coverage_lines(out, coverage)
    verdict = judge((f.severity for f in result.findings), coverage.blind, fail_on)
    colour = "green" if verdict.code is ExitCode.CLEAN else "red"
    problems = f", {plural(summary['problems'], 'problem')}" if summary["problems"] else ""
    if summary["exit_code"]:
        problems += f", the traced command exited with code {summary['exit_code']}"
    out.print(f"[bold {colour}]{verdict.headline}[/] "
              f"({plural(summary['processes'], 'process', 'processes')}, "
              f"{plural(summary['graphs'], 'graph')}, {plural(summary['replays'], 'replay')}"
              f"{problems}; rules {','.join(active) or 'none'})", soft_wrap=True)
    return int(verdict.code)


def suppressed_by_entry(result: Analysis) -> list[tuple[dict, int]]:
    """(allow entry, how many findings it suppressed), in the config's order."""
    counts = [0] * len(result.config.allow)
    for f in result.suppressed:
        index = result.config.allow_entry(f, f.details.get("key"))
        if index is not None:
            counts[index] += 1
    return [(entry, n) for entry, n in zip(result.config.allow, counts, strict=True) if n]


def print_suppressed(out: Any, result: Analysis) -> None:
    """`suppressed: N findings by {rule = ...} (config)`: one line per allow entry that hid any."""
    from rich.markup import escape

    from mlatrace.analysis.config import describe_allow

    for entry, n in suppressed_by_entry(result):
        out.print(f"suppressed: {plural(n, 'finding')} by allow entry "
                  f"{escape(describe_allow(entry))} ({result.config.source})",
                  highlight=False, soft_wrap=True)


def render_coverage_lines(out: Any, coverage: Any) -> None:
    """`coverage: ...` and indented `blind: ...` lines (never starting with a finding id)."""
    from rich.markup import escape

    attached = coverage.probes_attached
    killed = any(not p.ended for p in coverage.processes)
    head = (plural(attached, "probe") + " attached" if attached is not None
            else "process killed: coverage unknown" if killed
            else "probe coverage not recorded")
    state = "blind" if coverage.blind else "not blind"
    out.print(f"coverage: {head}, {coverage.probes_errored} errored; {state}",
              highlight=False, soft_wrap=True)
    for reason in coverage.reasons:
        out.print(f"  blind: {escape(reason)}", highlight=False, soft_wrap=True)
    for note in getattr(coverage, "notes", ()):
        out.print(f"  note: {escape(note)}", highlight=False, soft_wrap=True)


def unknown_schemas(result: Analysis) -> list[tuple[str, str]]:
    """(file, schema) of each process whose header names a schema this reader does not know."""
    return [(p.file, p.schema) for p in result.model.processes
            if p.schema is not None and check_schema(p.schema)]
