"""Finding and Evidence: what a rule reports (fields fixed by docs/contracts.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITY_ORDER = {"warning": 1, "error": 2}

@dataclass
class Evidence:
    """One record a finding rests on: open `file` and look for `"seq": seq`."""

    file: str
    seq: int
    kind: str
    what: str

    def __str__(self) -> str:
        return f"{self.file}:seq {self.seq} ({self.kind}) {self.what}"


@dataclass
class Finding:
    id: str
    name: str
    severity: str
    message: str
    hint: str
    evidence: list[Evidence]
    pid: int | None = None
    rank: int | None = None
    gid: int | None = None
    details: dict = field(default_factory=dict)
    cost: dict | None = None   # set by analysis.cost for findings on a replayed graph

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def signature(self) -> tuple:
        """Identity across two traces (diff): rule, rank, graph key, op/buffer; never pids or seqs."""
        return (self.id, self.rank, str(self.details.get("key")),
                str(self.details.get("op") or self.details.get("buffer") or ""))


def make_finding(rule_id: str, message: str, hint: str, evidence: list[Evidence], *,
                 pid: int | None, rank: int | None, gid: int | None, details: dict,
                 severity: str | None = None) -> Finding:
    """A finding of `rule_id`; `severity` overrides the rule's default (MLT002, MLT006)."""
    from mlatrace.analysis.rules import RULES  # the registry imports the rules, which import this

    rule = RULES[rule_id]
    return Finding(rule_id, rule.name, severity or rule.severity, message, hint, evidence, pid,
                   rank, gid, details)


def at_or_above(severity: str, threshold: str) -> bool:
    return SEVERITY_ORDER.get(severity, 0) >= SEVERITY_ORDER.get(threshold, 2)
