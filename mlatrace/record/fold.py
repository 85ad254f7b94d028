"""Folding of steady decode steps into `steady` records (the recorder's side).

A serving engine's decode step writes the same few records every step: its attention
metadata, its dispatch, the replays of its graphs, maybe the first eager call of each
probe. Once a thread's step repeats the previous one, field for field except numbers
that only move (a sequence length growing by one a step), the step is folded: its
records are not written, only accumulated, and one `steady` record per graph and
interval stands for them (`FOLD_S`, default 10 s; a fold also closes at any change, a
capture and the exit).

A step begins with the first step-marking record (`attn.metadata`, `dispatch`) after a
record of another kind; on a thread that makes no such record, with a replay of the
step's first graph. The records of a step are held (not written) while they match the
step before, position by position: same kind, same constant fields (keys, pointers,
decision values, grids, layers), numeric fields anywhere in their range. The first
record that does not match ends the fold: the open fold is written (its `steady`
records), then the held records of this step and the record itself, in full; the next
step is written in full too, and becomes the step that later ones must repeat.

Only the kinds in `FOLDABLE` fold; records made while capturing never do. Any other
kind (a sync, a capture, a probe error, a mark, a sampling run's end ...) ends the fold
and is written in full. `graph.replay.time` (the replay-time sample) never ends a fold:
one made on a thread with an open fold goes into it (the `times` of its first `steady`
record, written when the fold closes; a fold closes early once a graph holds MAX_TIMES
of them); any other is written as it comes.

A held step's records are compared with the template's fields as they came (`same`),
without freezing the fields that did not change; a probe whose call repeats its last
record but for the numbers that move hands only those numbers (`Folder.hold`): its
record is built from the last one only if the step breaks (`pending_fields`).

The builder (`mlatrace.analysis.builder`) reads a `steady` record as the records it
stands for: every finding, count and cost is the same with folding on and off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlatrace import kinds
from mlatrace.settings import DEFAULT_FOLD_S as FOLD_S

STEP_KINDS = kinds.STEP
FOLDABLE = kinds.FOLDS
# written as they come, never ending a fold: the replay-time sample and sampling's run
# ends (no rule reads a sample.run; it accounts for the records sampling left out)
PASS = kinds.FOLD_PASSES
SKIPPED = frozenset(("k", "t", "seq", "tid"))
# numeric fields whose exact value rules read (a set of values, not a range)
EXACT = frozenset(("layer", "gid", "n", "num_kv_splits", "block_n", "value", "parent",
                   "capturing", "dummy"))
RANGED_NESTED = frozenset(("inputs", "hints"))   # dicts whose numbers are ranges too
# eager records' pointers no rule reads (a fresh output buffer per step is usual); the
# metadata's are compared with the captured ones (MLT003)
POINTERS_KEPT = frozenset(("attn.metadata",))
# numeric fields also summed over the fold, not only ranged: a dispatch's real token
# count, whose total graph use needs (the padding a captured size wasted)
SUMMED = frozenset((("dispatch", "num_tokens"),))
MAX_STEP = 256          # a longer step is never folded (no steps marked?)
MAX_TIMES = 512         # replay times a fold holds per graph: it closes when one has this many
REPLAY_TIME = kinds.REPLAY_TIME

Write = Callable[[str, dict, int], None]
_NO_RANGE: dict = {}        # a replay's moving fields: none (never written to)
_CONTAINERS = (dict, list, tuple)


def freeze(value: Any) -> Any:
    """A hashable, comparable form of a record's field value.

    Loops, not generators: a record's shapes and pointers (a dict of lists of ints)
    freeze in one call, the nesting of a container of containers only recursing."""
    kind = type(value)
    if kind is dict:
        out = []
        for key, item in value.items():
            itype = type(item)
            if itype is list or itype is tuple:
                for part in item:
                    if type(part) in _CONTAINERS:
                        item = freeze(item)
                        break
                else:
                    item = tuple(item)
            elif itype is dict:
                item = freeze(item)
            out.append((key, item))
        return tuple(out)
    if kind is list or kind is tuple:
        for part in value:
            if type(part) in _CONTAINERS:
                return tuple([freeze(part) for part in value])
        return tuple(value)
    return value


def split(kind: str, fields: dict) -> tuple[tuple, dict]:
    """A record's constant key and its numeric fields that may move ({name: number};
    fields of `inputs` and `hints` named "inputs.x")."""
    const: list = [kind]
    ranged: dict = {}
    keep_ptrs = kind in POINTERS_KEPT
    for name, value in fields.items():
        if name in SKIPPED:
            continue
        vtype = type(value)
        if (vtype is int or vtype is float) and name not in EXACT:
            ranged[name] = value
        elif vtype is dict and name in RANGED_NESTED:
            for sub, item in value.items():
                itype = type(item)
                if itype is int or itype is float:
                    ranged[f"{name}.{sub}"] = item
                elif itype in _CONTAINERS:
                    const.append((f"{name}.{sub}", freeze(item)))
                else:
                    const.append((f"{name}.{sub}", item))
        elif name == "ptrs" and not keep_ptrs:
            continue
        elif vtype in _CONTAINERS:
            const.append((name, freeze(value)))
        else:
            const.append((name, value))
    const.append(tuple(ranged))
    return tuple(const), ranged


def same(kind: str, fields: dict, snapshot: tuple) -> dict | None:
    """The moving numbers of `fields` ({name: number}, as split gives them) when its
    split key equals that of `snapshot` ((kind, items) of a record already split);
    None when it differs or this comparison cannot tell (split decides then).

    Compares the two field by field in order, with the classes of split, constant
    values with == (tables as tables, whatever the order of their names): no freeze
    and no key built for the fields that did not change."""
    skind, items = snapshot
    if skind != kind or len(items) != len(fields):
        return None
    ranged: dict = {}
    keep_ptrs = kind in POINTERS_KEPT
    for (name, value), (sname, svalue) in zip(fields.items(), items, strict=True):
        if name != sname:
            return None
        if name in SKIPPED:
            continue
        vtype = type(value)
        stype = type(svalue)
        if (vtype is int or vtype is float) and name not in EXACT:
            if stype is not int and stype is not float:
                return None
            ranged[name] = value
        elif vtype is dict and name in RANGED_NESTED:
            if stype is not dict or len(value) != len(svalue):
                return None
            for (sub, item), (ssub, sitem) in zip(value.items(), svalue.items(), strict=True):
                itype = type(item)
                if sub != ssub:
                    return None
                if itype is int or itype is float:
                    if type(sitem) is not int and type(sitem) is not float:
                        return None
                    ranged[f"{name}.{sub}"] = item
                elif itype is not type(sitem) or itype in _CONTAINERS or item != sitem:
                    return None
        elif name == "ptrs" and not keep_ptrs:
            continue
        elif vtype is not stype or value != svalue:
            return None
    return ranged


def pending_fields(pending: tuple) -> dict:
    """The fields of a held record a probe did not build (Folder.hold): (base, moving,
    t), the probe's last record with the numbers of `moving` and time `t`."""
    base, moving, t = pending
    out = {name: value for name, value in base.items() if name not in _WRITTEN}
    for name, value in moving.items():
        table, dot, sub = name.partition(".")
        if dot and type(out.get(table)) is dict:
            if out[table] is base.get(table):
                out[table] = dict(out[table])
            out[table][sub] = value
        else:
            out[name] = value
    out["t"] = t
    return out


_WRITTEN = frozenset(("k", "seq", "tid"))     # what the recorder adds to a record it writes


class Fold:
    """The steps folded so far on one thread since the fold opened (Folder._end_step adds
    each step: its ranges and sums; a replay's count and numbers are read at close)."""

    __slots__ = ("steps", "t_first", "t_last", "ranges", "first", "last", "tid",
                 "replay_at", "ranged_at", "kinds", "summed_at", "sums", "times", "via")

    def __init__(self, step: list, t: int, tid: int) -> None:
        self.steps = 0
        self.t_first = t
        self.t_last = t
        self.tid = tid
        self.first = [(kind, fields if type(fields) is not tuple else pending_fields(fields))
                      for kind, _, fields, _ in step]  # the first folded step
        self.last = step                    # the last folded step (its replays' n)
        self.ranges: list[dict] = [{} for _ in step]
        self.times: dict[int, list] = {}    # gid -> [[n, gpu_ns, t - t_first]] held
        self.via: str | None = None         # the clock of the held times
        # Every step of a fold repeats its first position by position (same kinds, same
        # gids, the same ranged names), so a step added visits only the positions with
        # work, and a graph's replays are its places in the step times the steps.
        self.replay_at: dict[Any, list[int]] = {}   # gid -> its positions in the step
        for position, entry in enumerate(step):
            if entry[0] == "graph.replay":
                self.replay_at.setdefault(entry[1][1], []).append(position)
        self.ranged_at = [position for position, entry in enumerate(step)
                          if entry[0] != "graph.replay" and entry[3]]
        self.summed_at = [(position, name) for position, entry in enumerate(step)
                          if entry[3] for name in entry[3] if (entry[0], name) in SUMMED]
        self.sums = [0] * len(self.summed_at)
        kinds: dict[str, int] = {}
        for entry in step:
            kinds[entry[0]] = kinds.get(entry[0], 0) + 1
        self.kinds = kinds          # records per step, by kind (counted at close)

    def replays(self) -> dict[Any, tuple]:
        """gid -> (n_first, n_last, replays) of the folded steps."""
        first, last = self.first, self.last
        return {gid: (first[at[0]][1].get("n"), last[at[-1]][2].get("n"), len(at) * self.steps)
                for gid, at in self.replay_at.items()}

    def time(self, fields: dict, t: int) -> int:
        """Hold a graph.replay.time ({gid, n, gpu_ns, via} and t, of the fold's clock): how
        many times its graph now holds (0: not held, the record is written as it comes)."""
        gid, n, gpu, via = fields.get("gid"), fields.get("n"), fields.get("gpu_ns"), \
            fields.get("via")
        if len(fields) != 5 or type(gid) is not int or type(n) is not int \
                or type(gpu) is not int or gpu < 0 or type(via) is not str:
            return 0
        if via != self.via:
            if self.via is not None:
                return 0
            self.via = via
        times = self.times.get(gid)
        if times is None:
            times = self.times[gid] = []
        times.append([n, gpu, t - self.t_first])
        return len(times)


class ThreadFold:
    """One thread's step: held while it repeats the last, and the fold it goes into."""

    __slots__ = ("template", "snapshots", "step", "held", "fold", "last_kind", "marked",
                 "first_gid", "tid", "overflow", "last_fields")

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.template: list | None = None   # the keys of the last whole step
        # the fields of its records as they came ((kind, items); None: a replay, or not
        # kept), which same() compares a held step's records with
        self.snapshots: list = []
        self.step: list = []                # this step: (kind, key, fields|None, ranged)
        self.held = False                   # this step matches the template so far
        self.fold: Fold | None = None
        self.last_kind: str | None = None
        self.marked = False                 # this step has a step-marking record
        self.first_gid: Any = None
        self.overflow = False               # this step outgrew MAX_STEP: not looked at
        self.last_fields: Any = None        # the fields of the record appended last


class Folder:
    """Decides, record by record, which records a thread's steady steps fold away.

    `take(kind, fields, t, tid)` is True when the record was held (the caller writes
    nothing now); False when the caller writes it now, after whatever `write` was
    handed (a closed fold, held records) in the same call. Not thread-safe across one
    thread's records, which only that thread adds; `close_all` may run on another
    thread at exit.
    """

    def __init__(self, interval_s: float, write: Write, count_folded: Callable[[str, int], None]
                 ) -> None:
        self.interval_ns = int(interval_s * 1e9)
        self.write = write
        self.count_folded = count_folded
        self.threads: dict[int, ThreadFold] = {}
        self.folds = 0
        self.broken = 0                     # folds ended by a change

    def take(self, kind: str, fields: dict, t: int, tid: int) -> bool:
        if kind in PASS:
            if kind == REPLAY_TIME:
                state = self.threads.get(tid)
                fold = state.fold if state is not None else None
                if fold is not None:
                    held = fold.time(fields, t)
                    if held >= MAX_TIMES:
                        self._close(state)
                    return held > 0
            return False
        state = self.threads.get(tid)
        if state is None:
            state = self.threads[tid] = ThreadFold(tid)
        elif kind == "graph.replay" and state.held and len(fields) <= 3 \
                and fields.get("capturing") is not True:
            # The common case of a held step, in short: a replay that is not the step's
            # boundary and repeats the template's record at its place.
            step = state.step
            gid = fields.get("gid")
            if step and (state.marked or gid != state.first_gid):
                template = state.template
                position = len(step)
                if position < len(template) and template[position] == (kind, gid):
                    state.last_kind = kind
                    step.append((kind, template[position], fields, _NO_RANGE))
                    return True
        if kind not in FOLDABLE or fields.get("capturing") is True or (
                kind == "graph.replay" and len(fields) > 3):   # gid, n, t: nothing more
            if state.fold is not None or state.held or state.step:
                self._break(state)
                state.template = None
                state.step = []
                state.overflow = False
            state.last_kind = kind
            return False
        if state.overflow and kind not in STEP_KINDS and kind != "graph.replay":
            return False    # no step boundary for MAX_STEP records: nothing to fold here
        if kind == "graph.replay":
            gid = fields.get("gid")
            key: Any = (kind, gid)
            ranged: dict = {}
            boundary = not state.marked and gid == state.first_gid and state.step
        else:
            key = None
            boundary = kind in STEP_KINDS and state.last_kind not in STEP_KINDS and state.step
            gid = None
        if boundary:
            self._end_step(state, t)
        step = state.step
        if key is None:
            # A held step's record compared with the template's, field by field, where
            # it can be (same(): no freeze of fields that did not change); else split.
            if state.held and state.template is not None and len(step) < len(state.template):
                snapshot = state.snapshots[len(step)]
                if snapshot is not None:
                    ranged = same(kind, fields, snapshot)
                    if ranged is not None:
                        key = state.template[len(step)]
            if key is None:
                key, ranged = split(kind, fields)
        state.last_kind = kind
        if not step:
            state.marked = False
            state.first_gid = gid
        if kind in STEP_KINDS:
            state.marked = True
        if state.held:
            template = state.template
            position = len(step)
            if template is not None and position < len(template) and template[position] == key:
                step.append((kind, key, fields, ranged))
                state.last_fields = fields
                return True
            self._break(state)      # writes the fold and this step's held records
        if len(step) < MAX_STEP:
            # written in full: the fourth slot keeps its fields as they came (snapshot)
            step.append((kind, key, None, None if kind == "graph.replay"
                         else (kind, list(fields.items()))))
            state.last_fields = fields
        else:
            state.template = None
            state.overflow = True
        return False

    def key_of_last(self, tid: int, fields: dict) -> Any:
        """The key this thread's step gave `fields`, the record just taken (None: it
        is in no step)."""
        state = self.threads.get(tid)
        if state is None or state.last_fields is not fields or not state.step:
            return None
        return state.step[-1][1]

    def hold(self, kind: str, key: Any, base: dict, moving: dict, t: int, tid: int) -> bool:
        """take() for a record a probe did not build: `base` with the numbers of `moving`
        ({fold name: number}), whose key is `key` (the probe checked that its other
        fields equal base's). True when this thread's step is held and `key` is the
        template's at this place: the record joins the step (built only if the step
        breaks: pending_fields); False: the probe builds it and adds it (nothing changed
        here but a step boundary, which take() would also have passed).
        `moving`: exactly the numbers split() gives the record, in its field order. Not
        for replays (False): Recorder.add_replay counts and holds them (replay()).
        Generated probes run these steps in their frame (fold_inline): keep both alike."""
        state = self.threads.get(tid)
        if state is None or not state.held or kind not in FOLDABLE or kind == "graph.replay":
            return False
        if kind in STEP_KINDS and state.last_kind not in STEP_KINDS and state.step:
            self._end_step(state, t)
            if not state.held:
                return False
        template = state.template
        step = state.step
        position = len(step)
        if template is None or position >= len(template) or template[position] != key:
            return False
        if not step:
            state.marked = False
            state.first_gid = None
        if kind in STEP_KINDS:
            state.marked = True
        state.last_kind = kind
        state.last_fields = None
        step.append((kind, key, (base, moving, t), moving))
        return True

    def replay(self, gid: Any, n: int, t: int, tid: int) -> bool:
        """take() of a replay {gid, n, t} (Recorder.add_replay) in a held step, in short:
        True when held; False: the caller builds the record and hands it to take()."""
        state = self.threads.get(tid)
        if state is None or not state.held:
            return False
        step = state.step
        if not step or (not state.marked and gid == state.first_gid):
            return False
        template = state.template
        position = len(step)
        if position >= len(template) or template[position] != ("graph.replay", gid):
            return False
        state.last_kind = "graph.replay"
        step.append(("graph.replay", template[position], {"gid": gid, "n": n, "t": t},
                     _NO_RANGE))
        return True

    def _end_step(self, state: ThreadFold, t: int) -> None:
        """The thread's step is whole: fold it (it repeated the last one) or learn it."""
        step = state.step
        if state.held and state.template is not None and len(step) == len(state.template):
            fold = state.fold
            if fold is None:
                fold = state.fold = Fold(step, t, state.tid)
            fold.steps += 1
            fold.t_last = t
            fold.last = step
            if fold.summed_at:
                sums = fold.sums
                for index, (position, name) in enumerate(fold.summed_at):
                    sums[index] += step[position][3][name]
            all_ranges = fold.ranges
            for position in fold.ranged_at:
                ranges = all_ranges[position]
                for name, value in step[position][3].items():
                    span = ranges.get(name)
                    if span is None:
                        ranges[name] = [value, value]
                    elif value < span[0]:
                        span[0] = value
                    elif value > span[1]:
                        span[1] = value
            if t - fold.t_first >= self.interval_ns:
                self._close(state)
        else:
            if state.held:
                self._break(state)
            state.template = [entry[1] for entry in step] if len(step) < MAX_STEP else None
            state.snapshots = [entry[3] if entry[2] is None else None for entry in step]
        state.step = []
        state.overflow = False
        state.held = state.template is not None

    def _break(self, state: ThreadFold) -> None:
        """A change: write the open fold, then the held records of this step, in full."""
        if state.fold is not None:
            self.broken += 1
            self._close(state)
        if state.held:
            step = state.step
            for index, (kind, key, fields, _) in enumerate(step):
                if fields is not None:
                    if type(fields) is tuple:
                        fields = pending_fields(fields)
                    step[index] = (kind, key, None, None if kind == "graph.replay"
                                   else (kind, list(fields.items())))
                    self.write(kind, fields, state.tid)
            state.held = False

    def _close(self, state: ThreadFold) -> None:
        """Write the open fold of this thread: one `steady` record per graph (the first
        carries the step's pattern), or one with gid null for a step without replays."""
        fold, state.fold = state.fold, None
        if fold is None or not fold.steps:
            return
        for kind, per_step in fold.kinds.items():
            self.count_folded(kind, per_step * fold.steps)
        self.folds += 1
        pattern, merged_fields, merged_same = [], {}, {}
        constant: dict[str, dict] = {}
        for position, (kind, fields) in enumerate(fold.first):
            if kind == "graph.replay":
                pattern.append({"k": kind, "gid": fields.get("gid")})
                continue
            ranges = fold.ranges[position]
            same = {}
            for name, value in fields.items():
                if name in SKIPPED or name in ranges:
                    continue
                if type(value) is dict and name in RANGED_NESTED:
                    value = {k: v for k, v in value.items() if f"{name}.{k}" not in ranges}
                    if not value:
                        continue
                if name == "ptrs" and kind not in POINTERS_KEPT:
                    continue
                same[name] = value
            entry = {"k": kind, "same": same, "range": ranges}
            sums = {name: fold.sums[index] for index, (at, name) in enumerate(fold.summed_at)
                    if at == position}
            if sums:
                entry["sum"] = sums
            pattern.append(entry)
            into = merged_fields.setdefault(kind, {})
            for name, span in ranges.items():
                known = into.get(name)
                into[name] = list(span) if known is None else [min(known[0], span[0]),
                                                                 max(known[1], span[1])]
            kept = constant.get(kind)
            if kept is None:
                constant[kind] = dict(same)
            else:
                for name in [n for n, v in kept.items() if same.get(n, kept) != v]:
                    del kept[name]
        for kind, kept in constant.items():
            if kept:
                merged_same[kind] = kept
        common = {"t": fold.t_last, "steps": fold.steps, "t_first": fold.t_first,
                  "t_last": fold.t_last,
                  "fields": merged_fields, "same": merged_same, "fold": self.folds}
        gids = list(fold.replays().items()) or [(None, None)]
        for index, (gid, entry) in enumerate(gids):
            fields = {"gid": gid}
            if entry is None:
                fields.update(n_first=None, n_last=None, replays=0)
            else:
                fields.update(n_first=entry[0], n_last=entry[1], replays=entry[2])
                if gid in fold.times:
                    fields["gpu_ns"] = _summary(fold.times[gid])
            fields.update(common)
            if index == 0:
                fields["pattern"] = pattern
                if fold.times:
                    fields["times"] = {str(gid): times for gid, times in fold.times.items()}
                    fields["times_via"] = fold.via
                    self.count_folded(REPLAY_TIME, sum(map(len, fold.times.values())))
            self.write("steady", fields, fold.tid)

    def close_all(self) -> None:
        """The process ends (or a capture begins elsewhere): write every fold and held step."""
        for state in list(self.threads.values()):
            self._break(state)
            state.template = None
            state.step = []


def _summary(times: list) -> dict:
    """{count, p50, p90, max} of a fold's [n, gpu_ns, dt] times (exports read it)."""
    values = sorted([gpu for _, gpu, _ in times])
    return {"count": len(values), "p50": values[len(values) // 2],
            "p90": values[min(len(values) - 1, len(values) * 9 // 10)], "max": values[-1]}


def refold(rows: list[dict], interval_s: float = FOLD_S) -> list[dict]:
    """The records of a trace file written with folding off, as the recorder would have
    written them folding (new seqs; the header and `process.end` as they were). For
    checking that folding changes no analysis: the two files hold the same measurements."""
    out: list[dict] = rows[:1]
    ends: list[dict] = []

    def write(kind: str, fields: dict, tid: int) -> None:
        fields.update(k=kind, tid=tid)
        out.append(fields)

    folder = Folder(interval_s, write, lambda kind, n: None)
    for rec in rows[1:]:
        if rec.get("k") == "process.end":
            folder.close_all()
            ends.append(rec)
            out.append(rec)
            continue
        fields = {k: v for k, v in rec.items() if k not in ("k", "seq", "tid")}
        if not folder.take(rec["k"], fields, rec["t"], rec["tid"]):
            write(rec["k"], fields, rec["tid"])
    folder.close_all()
    if ends and out[-1] is not ends[-1]:    # folds closed at the end go before the end
        out.remove(ends[-1])
        out.append(ends[-1])
    for seq, rec in enumerate(out):
        rec["seq"] = seq
    return out

