"""Where, in replay length, a unit's frozen decision no longer holds (from its findings).

A chart of replay lengths over time marks the length the graph was captured at and
shades the lengths its findings say the capture is wrong for:

- MLT001 frozen-one-split: seq_len_max >= the rule's threshold (8 x BLOCK_N by default);
- MLT002 replay-beyond-capture: lengths past the captured max_seq_len;
- MLT006 frozen-host-decision on seq_len_max: outside the decision's `valid` range, or,
  without one, `far_factor` or more away from the captured input;
- MLT007 decision-mismatch: every length (the host already decided otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LENGTH_INPUTS = ("seq_len_max", "max_seq_len")


@dataclass(frozen=True)
class Region:
    """Lengths in [lo, hi] (hi None: unbounded) where finding `rule` says the frozen value
    is wrong; `label` says why, in a few words."""

    rule: str
    lo: int
    hi: int | None
    label: str

    def holds(self, value: int) -> bool:
        return value >= self.lo and (self.hi is None or value <= self.hi)


def unit_findings(unit: dict[str, Any], findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings about a capture unit: same process, on its graph or one nested in it."""
    gids = {unit["gid"], *unit.get("nested_gids", ())}
    return [f for f in findings if f.get("pid") == unit["pid"] and (
        f.get("gid") in gids or (f.get("details") or {}).get("captured_gid") in gids)]


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def captured_length(unit: dict[str, Any], findings: list[dict[str, Any]]) -> tuple[int, str] | None:
    """The replay length the unit was captured at, and where that figure comes from."""
    frozen = unit.get("frozen") or {}
    value = _int(frozen.get("capture_seq_len_max"))
    if value is not None:
        return value, "seq_len_max of the metadata at capture"
    for f in findings:
        details = f.get("details") or {}
        inputs = details.get("inputs") or {}
        if isinstance(inputs, dict) and _int(inputs.get("seq_len_max")) is not None:
            return inputs["seq_len_max"], f"{f['id']}: the captured decision's seq_len_max"
        if _int(details.get("hint_min_kv_seq_len")) is not None:
            return details["hint_min_kv_seq_len"], f"{f['id']}: the capture's min_kv_seq_len hint"
    return None


def regions_of(findings: list[dict[str, Any]], far_factor: int = 8) -> list[Region]:
    """The length regions the findings say the frozen values are wrong for (see module)."""
    out: list[Region] = []
    for f in findings:
        d = f.get("details") or {}
        rule = f.get("id")
        if rule == "MLT001" and _int(d.get("threshold")) is not None:
            threshold, block_n = d["threshold"], _int(d.get("block_n"))
            why = f" ({threshold // block_n} x BLOCK_N {block_n})" if block_n else ""
            out.append(Region(rule, threshold, None,
                              f"one KV split is too few from {threshold}{why}"))
        elif rule == "MLT002" and _int(d.get("captured_max_seq_len")) is not None:
            cap = d["captured_max_seq_len"]
            out.append(Region(rule, cap + 1, None, f"past the captured max_seq_len {cap}"))
        elif rule == "MLT006" and d.get("input") in LENGTH_INPUTS:
            out += _decision_regions(rule, d, far_factor)
        elif rule == "MLT007":
            out.append(Region(rule, 0, None, "every length: the host decided otherwise "
                                             "before these replays"))
    return out


def _decision_regions(rule: str, d: dict[str, Any], far_factor: int) -> list[Region]:
    name = d.get("input")
    valid = (d.get("valid") or {}).get(name) if isinstance(d.get("valid"), dict) else None
    value = f"{d.get('op')}={d.get('value')}"
    if isinstance(valid, (list, tuple)) and len(valid) == 2:
        lo, hi = _int(valid[0]), _int(valid[1])
        out = []
        if lo is not None and lo > 0:
            out.append(Region(rule, 0, lo - 1, f"{value} holds from {name} {lo}"))
        if hi is not None:
            out.append(Region(rule, hi + 1, None, f"{value} holds up to {name} {hi}"))
        return out
    captured = _int((d.get("inputs") or {}).get(name))
    if captured is None or captured <= 0:
        return []
    out = [Region(rule, captured * far_factor, None,
                  f"{far_factor}x or more past the captured {name} {captured}")]
    if captured // far_factor > 0:
        out.append(Region(rule, 0, captured // far_factor,
                          f"{far_factor}x or more below the captured {name} {captured}"))
    return out
