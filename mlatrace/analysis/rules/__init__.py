"""The rules: pure functions from the graph model to findings with evidence.

Every rule reads only the TraceModel and the Config; none emits a finding without at
least one record (file, seq) to show for it.

The rules by family: splits (MLT001, MLT002), buffers (MLT003-MLT005), host_decisions
(MLT006, MLT007); MLT008 comes from the kernel view (analysis/kernels.py), MLT009 from
graph use (analysis/graph_use.py). What they share is in common.
"""

from __future__ import annotations

from collections.abc import Callable

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

__all__ = ["RULE_FUNCTIONS", "Verdict", "decision_mismatch", "frozen_host_decision",
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


RULE_FUNCTIONS: dict[str, Callable[[TraceModel, Config], list[Finding]]] = {
    "MLT001": frozen_one_split,
    "MLT002": replay_beyond_capture,
    "MLT003": static_buffer_drift,
    "MLT004": host_sync_in_decode,
    "MLT005": mixed_kernels_in_graph,
    "MLT006": frozen_host_decision,
    "MLT007": decision_mismatch,
    "MLT008": frozen_underfilled_grid,
    "MLT009": graph_underused,
}
