"""A bounded series of one graph's replays over time: min and max per time bucket.

The builder adds, for each replay of a capture unit, the `seq_len_max` of the metadata
built before it (and, for a graph whose replays were timed, each sampled GPU time) at
the record's time `t`. The series keeps at most `SERIES_BUCKETS` buckets of equal width
(a power of two of nanoseconds): when a point falls past the last bucket, neighbouring
buckets merge in pairs and the width doubles. A bucket keeps the smallest and largest
value and how many points fell in it, so a downsampled chart still shows every extreme
(a single replay at 100K among a million at 1 stays visible). Memory is bounded per
graph; the cost per point is a few integer operations.

The HTML report draws these as min/max bars; `report` draws them as a sparkline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SERIES_BUCKETS = 256
_FIRST_SHIFT = 16   # 65 us buckets to begin with: the width doubles as the series grows


@dataclass(slots=True)
class Series:
    """Points (t ns, value) in at most SERIES_BUCKETS buckets of 2**shift ns from t0."""

    t0: int
    shift: int = _FIRST_SHIFT
    lo: list[int] = field(default_factory=list)
    hi: list[int] = field(default_factory=list)
    count: list[int] = field(default_factory=list)   # 0: an empty bucket (lo/hi unset)
    points: int = 0
    lowest: int | None = None
    highest: int | None = None
    last: int | None = None          # the latest point's value
    t_last: int = 0

    def add(self, t: int, value: int) -> None:
        """One point; `t` before t0 (another thread's earlier record) counts in bucket 0."""
        self.points += 1
        self.last = value
        if t > self.t_last:
            self.t_last = t
        i = (t - self.t0) >> self.shift
        if i < 0:
            i = 0
        count = self.count
        if i >= len(count):
            if i >= SERIES_BUCKETS:
                i = self._widen(t)
                count = self.count
            missing = i + 1 - len(count)
            if missing > 0:
                count.extend([0] * missing)
                self.lo.extend([0] * missing)
                self.hi.extend([0] * missing)
        if count[i]:
            if value < self.lo[i]:
                self.lo[i] = value
            elif value > self.hi[i]:
                self.hi[i] = value
        else:
            self.lo[i] = self.hi[i] = value
        count[i] += 1
        if self.lowest is None or value < self.lowest:
            self.lowest = value
        if self.highest is None or value > self.highest:
            self.highest = value

    def add_span(self, t_first: int, t_last: int, low: int, high: int, points: int) -> None:
        """Points folded into one record (`steady`): `points` values in [low, high] between
        t_first and t_last; the extremes go where the span begins and ends (its values
        only move one way in a steady run, and the chart keeps both)."""
        if points <= 0:
            return
        self.add(t_first, low)
        if points > 1:
            self.add(t_last, high)
            i = max(0, (t_last - self.t0) >> self.shift)
            self.count[min(i, len(self.count) - 1)] += points - 2
            self.points += points - 2

    def _widen(self, t: int) -> int:
        """Merge buckets in pairs until `t` fits; returns its bucket."""
        while True:
            self.shift += 1
            lo, hi, count = self.lo, self.hi, self.count
            new_lo, new_hi, new_count = [], [], []
            for j in range(0, len(count), 2):
                a = count[j]
                b = count[j + 1] if j + 1 < len(count) else 0
                if a and b:
                    new_lo.append(min(lo[j], lo[j + 1]))
                    new_hi.append(max(hi[j], hi[j + 1]))
                elif a:
                    new_lo.append(lo[j])
                    new_hi.append(hi[j])
                elif b:
                    new_lo.append(lo[j + 1])
                    new_hi.append(hi[j + 1])
                else:
                    new_lo.append(0)
                    new_hi.append(0)
                new_count.append(a + b)
            self.lo, self.hi, self.count = new_lo, new_hi, new_count
            i = (t - self.t0) >> self.shift
            if i < SERIES_BUCKETS:
                return i

    @property
    def bucket_ns(self) -> int:
        return 1 << self.shift

    def buckets(self) -> list[tuple[int, int, int, int]]:
        """(start t ns, min, max, points) of each non-empty bucket, in time order."""
        width = 1 << self.shift
        return [(self.t0 + i * width, self.lo[i], self.hi[i], c)
                for i, c in enumerate(self.count) if c]

    def downsampled(self) -> bool:
        """Whether a bucket holds more than one point (a chart shows min..max bars)."""
        return any(c > 1 for c in self.count)

    def to_dict(self) -> dict[str, Any]:
        """report --json: `buckets` are [t ns, min, max, points] (non-empty ones)."""
        return {"points": self.points, "min": self.lowest, "max": self.highest,
                "t0_ns": self.t0, "t_last_ns": self.t_last, "bucket_ns": self.bucket_ns,
                "buckets": [list(b) for b in self.buckets()]}


def add_point(holder: Any, name: str, t: Any, value: Any) -> None:
    """Add (t, value) to `holder`'s series attribute `name`, making it on the first point;
    points without an int time or value are left out."""
    if type(t) is not int or type(value) is not int:
        return
    series = getattr(holder, name)
    if series is None:
        series = Series(t0=t)
        setattr(holder, name, series)
    series.add(t, value)
