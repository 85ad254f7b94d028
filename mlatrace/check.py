"""`mlatrace check TRACE`: a CI verdict over the findings and the coverage.

Exit codes (ExitCode): 0 clean (no finding at or above --fail-on, and not blind),
1 findings at or above it, 2 the trace is unreadable / has nothing usable, or the
arguments or config are wrong, 3 blind: the trace cannot support a clean verdict
(a probe.error, a probed engine in the headers but no graph or attention record, an
unmet --expect, ranks missing; analysis/coverage.py). Findings (1) take precedence
over blindness (3).

Output: one line per finding starting with its id at column 0, then coverage lines
(`coverage ...`, indented `blind: ...`) that never start with an id, then the verdict.
`--junit FILE` writes one testcase per rule (failures carry the messages and evidence)
and a `coverage` testcase that fails when the run is blind.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from enum import IntEnum
from pathlib import Path
from typing import Any

from mlatrace.analysis import RULES, Analysis, ConfigError, Finding, at_or_above
from mlatrace.report import (
    Unusable,
    load,
    make_console,
    print_warnings,
    report_dict,
    resolve_config,
)


class ExitCode(IntEnum):
    """What `mlatrace check` exits with (README, "Commands and exit codes")."""

    CLEAN = 0       # no finding at or above the threshold, and the trace is not blind
    FINDINGS = 1    # a finding at or above the threshold (takes precedence over BLIND)
    UNUSABLE = 2    # unreadable trace, unknown schema, bad arguments or config
    BLIND = 3       # the trace cannot support a clean verdict (see coverage.reasons)


def verdict_code(bad: list[Finding], blind: bool) -> ExitCode:
    """Findings first, then blindness."""
    if bad:
        return ExitCode.FINDINGS
    return ExitCode.BLIND if blind else ExitCode.CLEAN


def failing(findings: list[Finding], fail_on: str) -> list[Finding]:
    return [f for f in findings if at_or_above(f.severity, fail_on)]


def junit_xml(result: Analysis, fail_on: str, rules: list[str], trace: str) -> ET.ElementTree:
    """One testsuite `mlatrace`, one testcase per rule; a failure lists that rule's findings."""
    suite = ET.Element("testsuite", name="mlatrace")
    failures = skipped = 0
    for rule_id, (name, severity) in RULES.items():
        case = ET.SubElement(suite, "testcase", classname="mlatrace.rules",
                             name=f"{rule_id} {name}", file=str(trace), time="0")
        if rule_id not in rules:
            skipped += 1
            why = "disabled by config" if not result.config.enabled(rule_id) else "not selected (--rule)"
            ET.SubElement(case, "skipped", message=why)
            continue
        mine = [f for f in result.findings if f.id == rule_id]
        bad = failing(mine, fail_on)
        if bad:
            failures += 1
            failure = ET.SubElement(case, "failure", type=severity,
                                    message=f"{len(bad)} finding(s): {bad[0].message}")
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
    if result.problems:
        err = ET.SubElement(suite, "system-err")
        err.text = "\n".join(str(p) for p in result.problems)
    suite.set("tests", str(len(RULES) + 1))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    ET.indent(suite)
    return ET.ElementTree(suite)


def _finding_text(f: Finding) -> str:
    lines = [f"[{f.severity}] {f.message}", f"pid {f.pid} rank {f.rank} gid {f.gid}"]
    lines += [f"  {e.file}:seq {e.seq} ({e.kind}) {e.what}" for e in f.evidence]
    lines.append(f"fix: {f.hint}")
    return "\n".join(lines)


def main(trace: str, fail_on: str | None = "error", rules: list[str] | None = None,
         config: str | None = None, junit: str | None = None,
         expect: list[str] | None = None) -> int:
    """Analyse TRACE and return an ExitCode: 0 clean, 1 findings at/above fail_on,
    2 unusable, 3 blind."""
    err = make_console(stderr=True)
    try:
        cfg = resolve_config(config, trace, expect)
    except ConfigError as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    fail_on = fail_on or cfg.fail_on
    if fail_on not in ("error", "warning"):
        err.print(f"[red]error:[/] --fail-on must be error or warning, not {fail_on!r}")
        return 2
    selected = [r.upper() for r in rules or []]
    unknown = [r for r in selected if r not in RULES]
    if unknown:
        err.print(f"[red]error:[/] unknown rule id(s): {', '.join(unknown)} "
                  f"(known: {', '.join(RULES)})")
        return 2
    try:
        _trace, result = load(trace, cfg, selected or None)
    except Unusable as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    active = [r for r in RULES if cfg.enabled(r) and (not selected or r in selected)]
    if junit:
        try:
            Path(junit).parent.mkdir(parents=True, exist_ok=True)
            junit_xml(result, fail_on, active, trace).write(junit, encoding="utf-8",
                                                            xml_declaration=True)
        except OSError as exc:
            err.print(f"[red]error:[/] cannot write {junit}: {exc.strerror or exc}")
            return 2
    out = make_console()
    print_warnings(err, result.problems)
    bad = failing(result.findings, fail_on)
    for f in result.findings:
        colour = "red" if f.severity == "error" else "yellow"
        out.print(f"[{colour}]{f.id}[/] {f.severity} rank {f.rank}: {f.message}")
        if f.evidence:
            e = f.evidence[0]
            out.print(f"    at {e.file}:seq {e.seq} ({e.kind}); fix: {f.hint}")
    data = report_dict(trace, result)
    summary = data["summary"]
    coverage = result.coverage
    render_coverage_lines(out, coverage)
    code = verdict_code(bad, coverage.blind)
    if code is ExitCode.FINDINGS:
        verdict, colour = f"FAILED: {len(bad)} finding(s) at or above {fail_on}", "red"
        if coverage.blind:
            verdict += " (and the trace is blind, see coverage)"
    elif code is ExitCode.BLIND:
        verdict, colour = ("BLIND: no finding at or above " + fail_on + ", but the trace "
                           "cannot support a clean verdict"), "red"
    else:
        verdict, colour = f"OK: no finding at or above {fail_on}", "green"
    out.print(f"[bold {colour}]{verdict}[/] ({summary['processes']} processes, "
              f"{summary['graphs']} graphs, {summary['replays']} replays, rules "
              f"{','.join(active) or 'none'})")
    return int(code)


def render_coverage_lines(out: Any, coverage: Any) -> None:
    """`coverage: ...` and indented `blind: ...` lines (never starting with a finding id)."""
    from rich.markup import escape

    attached = coverage.probes_attached
    head = (f"{attached} probe(s) attached" if attached is not None
            else "probe coverage not recorded")
    state = "blind" if coverage.blind else "not blind"
    out.print(f"coverage: {head}, {coverage.probes_errored} errored; {state}",
              highlight=False, soft_wrap=True)
    for reason in coverage.reasons:
        out.print(f"  blind: {escape(reason)}", highlight=False, soft_wrap=True)
