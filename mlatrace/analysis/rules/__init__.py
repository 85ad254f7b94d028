"""The rules: pure functions from the graph model to findings with evidence.

Every rule reads only the TraceModel and the Config; none emits a finding without at
least one record (file, seq) to show for it.

The rules by family: splits (MLT001, MLT002), buffers (MLT003-MLT005), host_decisions
(MLT006, MLT007); MLT008 comes from the kernel view (analysis/kernels.py), MLT009 from
graph use (analysis/graph_use.py). What they share is in common.

`RULES` is the one registry of them: id, name, default severity, function, and whether
findings get a cost. Adding a rule: its function (in a family module, or a new one), its
`Rule` line here, and its row in docs/findings.md (tests/test_rules_registry.py checks
the row).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlatrace.analysis.config import Config
from mlatrace.analysis.findings import Finding
from mlatrace.analysis.model import TraceModel
from mlatrace.analysis.rules.buffers import (
    host_sync_in_decode,
    mixed_kernels_in_graph,
    static_buffer_drift,
)
from mlatrace.analysis.rules.common import Verdict, judge
from mlatrace.analysis.rules.host_decisions import decision_mismatch, frozen_host_decision
from mlatrace.analysis.rules.splits import frozen_one_split, replay_beyond_capture

__all__ = ["RULES", "Rule", "Verdict", "decision_mismatch", "frozen_host_decision",
           "frozen_one_split", "frozen_underfilled_grid", "graph_underused",
           "host_sync_in_decode", "judge",
           "mixed_kernels_in_graph", "replay_beyond_capture", "static_buffer_drift"]


def frozen_underfilled_grid(model: TraceModel, config: Config) -> list[Finding]:
    """MLT008: generic, from kernel nodes, the SM count and replay times (analysis/kernels.py)."""
    from mlatrace.analysis.kernels import underfilled_grid

    return underfilled_grid(model, config.grid)


def graph_underused(model: TraceModel, config: Config) -> list[Finding]:
    """MLT009: decode steps eager with graphs on, or padding waste (analysis/graph_use.py)."""
    from mlatrace.analysis.graph_use import graph_underused as underused

    return underused(model, config.graph_use)


@dataclass(frozen=True)
class Rule:
    """One rule: what a finding of it is called, and the function that finds them."""

    id: str
    name: str
    severity: str     # the default; a finding may say otherwise (MLT002, MLT006, MLT008)
    find: Callable[[TraceModel, Config], list[Finding]]
    costed: bool = False   # findings on a replayed graph get a `cost` (analysis/cost.py)


RULES: dict[str, Rule] = {rule.id: rule for rule in (
    Rule("MLT001", "frozen-one-split", "error", frozen_one_split, costed=True),
    Rule("MLT002", "replay-beyond-capture", "error", replay_beyond_capture),
    Rule("MLT003", "static-buffer-drift", "error", static_buffer_drift),
    Rule("MLT004", "host-sync-in-decode", "warning", host_sync_in_decode),
    Rule("MLT005", "mixed-kernels-in-graph", "error", mixed_kernels_in_graph),
    Rule("MLT006", "frozen-host-decision", "warning", frozen_host_decision, costed=True),
    Rule("MLT007", "decision-mismatch", "error", decision_mismatch, costed=True),
    Rule("MLT008", "frozen-underfilled-grid", "warning", frozen_underfilled_grid, costed=True),
    Rule("MLT009", "graph-underused", "warning", graph_underused),
)}
"""Every rule, by id, in the order they run and are listed (check, --junit)."""
