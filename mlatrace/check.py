"""`mlatrace check TRACE`: a CI verdict over the findings.

Exit codes: 0 clean (no finding at or above --fail-on), 1 findings at or above it,
2 the trace is unreadable / has nothing usable, or the arguments or config are wrong.
`--junit FILE` writes one testcase per rule (failures carry the messages and evidence).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from mlatrace.analysis import RULES, Analysis, ConfigError, Finding, at_or_above
from mlatrace.report import (
    Unusable,
    load,
    make_console,
    print_warnings,
    report_dict,
    resolve_config,
)


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
    if result.problems:
        err = ET.SubElement(suite, "system-err")
        err.text = "\n".join(str(p) for p in result.problems)
    suite.set("tests", str(len(RULES)))
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


def main(trace: str | list[str], fail_on: str | None = "error", rules: list[str] | None = None,
         config: str | None = None, junit: str | None = None, run_id: str | None = None) -> int:
    """Analyse TRACE (one or several paths: one run) and return 0 (clean), 1 (findings
    at/above fail_on) or 2 (unusable)."""
    err = make_console(stderr=True)
    paths, trace = trace, trace if isinstance(trace, str) else " ".join(trace)
    try:
        cfg = resolve_config(config, trace)
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
        _trace, result = load(paths, cfg, selected or None, run_id=run_id)
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
    verdict = (f"FAILED: {len(bad)} finding(s) at or above {fail_on}" if bad
               else f"OK: no finding at or above {fail_on}")
    out.print(f"[bold {'red' if bad else 'green'}]{verdict}[/] ({summary['processes']} processes, "
              f"{summary['graphs']} graphs, {summary['replays']} replays, rules "
              f"{','.join(active) or 'none'})")
    return 1 if bad else 0
