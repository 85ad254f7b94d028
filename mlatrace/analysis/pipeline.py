"""The analysis pipeline: model -> rules (allow-list applied) -> costs -> coverage.

`mlatrace.analysis` re-exports `analyze`, `analyze_model` and `Analysis` from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlatrace.analysis.builder import build_model
from mlatrace.analysis.config import Config
from mlatrace.analysis.cost import attach_costs
from mlatrace.analysis.coverage import Coverage, judge
from mlatrace.analysis.findings import SEVERITY_ORDER, Finding
from mlatrace.analysis.kernels import merge_into_explaining, unavailable
from mlatrace.analysis.model import TraceModel
from mlatrace.analysis.rules import RULES

__all__ = ["Analysis", "analyze", "analyze_model"]


@dataclass
class Analysis:
    model: TraceModel
    findings: list[Finding] = field(default_factory=list)
    suppressed: list[Finding] = field(default_factory=list)
    config: Config = field(default_factory=Config)
    coverage: Coverage = field(default_factory=Coverage)

    @property
    def problems(self) -> list:
        return self.model.problems

    def counts(self) -> dict[str, int]:
        out = {"error": 0, "warning": 0}
        for f in self.findings:
            out[f.severity] = out.get(f.severity, 0) + 1
        return out


def analyze_model(model: TraceModel, config: Config | None = None,
                  rules: list[str] | None = None) -> Analysis:
    """Run the enabled rules (or only `rules`) over a built model, applying the allow-list."""
    config = config or Config()
    wanted = {r.upper() for r in rules} if rules else None
    findings, suppressed = [], []
    seen: set[tuple] = set()
    for rule_id, rule in RULES.items():
        if not config.enabled(rule_id) or (wanted is not None and rule_id not in wanted):
            continue
        for finding in rule.find(model, config):
            if not finding.evidence:
                continue  # no finding without evidence
            identity = _identity(finding)
            if identity in seen:
                continue  # the same decision seen in a wrapper and in the graph nested in it
            seen.add(identity)
            if config.allow and config.allowed(finding, finding.details.get("key")):
                suppressed.append(finding)
            else:
                findings.append(finding)
    # MLT008 on a graph MLT001/MLT006 already explains is their evidence, not a finding
    findings = merge_into_explaining(model, findings + suppressed)
    suppressed = [f for f in findings if f in suppressed]
    findings = [f for f in findings if f not in suppressed]
    findings.sort(key=lambda f: (-SEVERITY_ORDER.get(f.severity, 0), f.id,
                                 f.rank if f.rank is not None else -1, f.pid or 0, f.gid or 0))
    attach_costs(model, findings + suppressed)
    coverage = judge(model, config.expect)
    if config.enabled("MLT008") and (wanted is None or "MLT008" in wanted):
        note = unavailable(model)
        if note:
            coverage.notes.append(note)
    return Analysis(model=model, findings=findings, suppressed=suppressed, config=config,
                    coverage=coverage)


def _identity(f: Finding) -> tuple:
    d = f.details
    return (f.id, f.pid, f.gid, str(d.get("op")), str(d.get("buffer")), str(d.get("value")),
            d.get("capturing"), f.message if f.gid is None else None)


def analyze(trace: Any, config: Config | None = None, rules: list[str] | None = None) -> Analysis:
    """Build the model of an opened trace (mlatrace.trace.open_trace) and run the rules."""
    return analyze_model(build_model(trace), config, rules)
