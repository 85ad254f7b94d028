"""A bounded series of one graph's replays over time: min and max per time bucket.

The builder adds, for each replay of a capture unit, the `seq_len_max` of the metadata
built before it (and, for a graph whose replays were timed, each sampled GPU time) at
the record's time `t`. The series keeps at most `SERIES_BUCKETS` buckets of equal width
(a power of two of nanoseconds): when a point falls past the last bucket, neighbouring
buckets merge in pairs and the width doubles. A bucket keeps the smallest and largest
value and how many points fell in it, so a downsampled chart still shows every extreme
(a single replay at 100K among a million at 1 stays visible). Memory is bounded per
graph (the buckets, and at most FLUSH_AT points waiting to go into them).

The HTML report draws these as min/max bars; `report` draws them as a sparkline.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

SERIES_BUCKETS = 256
_FIRST_SHIFT = 16   # 65 us buckets to begin with: the width doubles as the series grows


FLUSH_AT = 4096     # points buffered before they go into the buckets


@dataclass(slots=True)
class Series:
    """Points (t ns, value) in at most SERIES_BUCKETS buckets of 2**shift ns from t0.

    Points are appended to `ts`/`vs` (the builder does so inline: two list appends per
    replay) and go into the buckets in runs (`flush`): the points of one bucket are
    found by bisection and reduced with min() and max(), so a long series costs little
    more than the appends. Every reader flushes first.
    """

    t0: int
    shift: int = _FIRST_SHIFT
    lo: list[int] = field(default_factory=list)
    hi: list[int] = field(default_factory=list)
    count: list[int] = field(default_factory=list)   # 0: an empty bucket (lo/hi unset)
    ts: list[int] = field(default_factory=list)      # pending points, in time order
    vs: list[int] = field(default_factory=list)
    flushed: int = 0
    lowest: int | None = None
    highest: int | None = None
    t_last: int = 0

    @property
    def points(self) -> int:
        return self.flushed + len(self.ts)

    def add(self, t: int, value: int) -> None:
        """One point; `t` before t0 (another thread's earlier record) counts in bucket 0."""
        self.ts.append(t)
        self.vs.append(value)
        if len(self.ts) >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Put the pending points into the buckets."""
        ts, vs = self.ts, self.vs
        if not ts:
            return
        self.ts, self.vs = [], []
        low, high = min(vs), max(vs)
        if self.lowest is None or low < self.lowest:
            self.lowest = low
        if self.highest is None or high > self.highest:
            self.highest = high
        self.t_last = max(self.t_last, max(ts))
        self.flushed += len(ts)
        if self.t_last - self.t0 >= SERIES_BUCKETS << self.shift:
            self._widen(self.t_last)
        lo, hi, count, t0, shift = self.lo, self.hi, self.count, self.t0, self.shift
        j, n = 0, len(ts)
        while j < n:
            i = max(0, (ts[j] - t0) >> shift)
            end = t0 + ((i + 1) << shift)  # the first time past bucket i
            k = bisect_left(ts, end, j + 1) if ts[-1] >= end else n
            if k <= j:  # times out of order: this point alone
                k = j + 1
            if i >= len(count):
                missing = i + 1 - len(count)
                count.extend([0] * missing)
                lo.extend([0] * missing)
                hi.extend([0] * missing)
            run_lo, run_hi = (vs[j], vs[j]) if k == j + 1 else (min(vs[j:k]), max(vs[j:k]))
            if count[i]:
                if run_lo < lo[i]:
                    lo[i] = run_lo
                if run_hi > hi[i]:
                    hi[i] = run_hi
            else:
                lo[i], hi[i] = run_lo, run_hi
            count[i] += k - j
            j = k

    def add_span(self, t_first: int, t_last: int, low: int, high: int, points: int) -> None:
        """Points folded into one record (`steady`): `points` values in [low, high] between
        t_first and t_last; the extremes go where the span begins and ends (a steady run's
        values only move one way), the other points with the last."""
        if points <= 0:
            return
        self.add(t_first, low)
        if points > 1:
            self.add(t_last, high)
            self.flush()
            i = min(max(0, (t_last - self.t0) >> self.shift), len(self.count) - 1)
            self.count[i] += points - 2
            self.flushed += points - 2

    def _widen(self, t: int) -> None:
        """Merge buckets in pairs (the width doubles) until `t` falls in the last one."""
        while t - self.t0 >= SERIES_BUCKETS << self.shift:
            self.shift += 1
            lo, hi, count = self.lo, self.hi, self.count
            new_lo, new_hi, new_count = [], [], []
            for j in range(0, len(count), 2):
                a = count[j]
                b = count[j + 1] if j + 1 < len(count) else 0
                if a and b:
                    new_lo.append(min(lo[j], lo[j + 1]))
                    new_hi.append(max(hi[j], hi[j + 1]))
                elif a or b:
                    k = j if a else j + 1
                    new_lo.append(lo[k])
                    new_hi.append(hi[k])
                else:
                    new_lo.append(0)
                    new_hi.append(0)
                new_count.append(a + b)
            self.lo, self.hi, self.count = new_lo, new_hi, new_count

    @property
    def bucket_ns(self) -> int:
        return 1 << self.shift

    def buckets(self) -> list[tuple[int, int, int, int]]:
        """(start t ns, min, max, points) of each non-empty bucket, in time order."""
        self.flush()
        width = 1 << self.shift
        return [(self.t0 + i * width, self.lo[i], self.hi[i], c)
                for i, c in enumerate(self.count) if c]

    def downsampled(self) -> bool:
        """Whether a bucket holds more than one point (a chart shows min..max bars)."""
        self.flush()
        return any(c > 1 for c in self.count)

    def to_dict(self) -> dict[str, Any]:
        """report --json: `buckets` are [t ns, min, max, points] (non-empty ones)."""
        self.flush()
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
