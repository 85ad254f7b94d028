"""Pictures of a report: SVG charts for the HTML report, a sparkline for the terminal.

Both read the report's data (`mlatrace.output.report.report_dict`): a capture unit's replay
series (`graphs[].replays.lengths`, `gpu_times`, `gpu_hist`) and its findings, from
which `regions` derives the captured value and the lengths at which the frozen
decision no longer holds.
"""

from mlatrace.output.charts.regions import Region, captured_length, regions_of, unit_findings
from mlatrace.output.charts.spark import sparkline

__all__ = ["Region", "captured_length", "regions_of", "sparkline", "unit_findings"]
