"""Coverage: what the probes of a run saw, and whether that supports a clean verdict.

A trace can only say "no findings" about what its probes watched. This module reads
what every process recorded about its own probes (`process.end.coverage`, the
`probe.error` records, records per kind, the header's versions and ranks) and judges
the run as a whole, never process by process (an API server never sees attention).
The run is **blind** (`check` exits 3) when:

- any probe failed (a `probe.error`: a handler that did not load, a target missing
  or drifted, a probe that raised);
- the headers' versions name a probed engine (vLLM, SGLang, AITER) yet no process
  recorded any graph or attention record;
- no probe attached in any process of the run, or a pack given with `--probes` none of
  whose targets attached, or that attached and was never called;
- a process ended without `process.end` (killed): its coverage is unknown;
- the size cap (`--max-mb`) left out records a rule reads (replays, metadata, calls,
  decisions, splits, launches): what happened after it was not judged;
- an expectation (`--expect`, `expect = [...]` in the config) was not met;
- ranks of the world size are missing (ranks left out with `--ranks`, recorded in the
  headers' `ranks_kept`, are not missing).

Traces written before coverage was recorded (no `coverage` in `process.end`) still
read: their per-target detail is unknown and only the record-based judgements apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlatrace.analysis.model import ProcessModel, TraceModel
from mlatrace.common import plural
from mlatrace.kinds import (
    ATTN_CALL,
    ATTN_METADATA,
    CAPTURE_BEGIN,
    CAPTURE_END,
    DISPATCH,
    GRAPH_NODES,
    HOST_DECISION,
    KERNEL_LAUNCH,
    KERNEL_SPLIT,
    KINDS,
    PROBE_ERROR,
    REPLAY,
    REPLAY_TIME,
)

ENGINES = ("vllm", "sglang", "aiter")
"""Engines with probe packs: their version in a header means graphs or attention are due."""

GRAPH_KINDS = (CAPTURE_BEGIN, CAPTURE_END, REPLAY, GRAPH_NODES)
ATTENTION_KINDS = (ATTN_CALL, ATTN_METADATA)

EXPECT_ALIASES: dict[str, tuple[str, ...]] = {
    "graphs": (CAPTURE_BEGIN,),
    "replays": (REPLAY,),
    "attention": ATTENTION_KINDS,
    "launches": (KERNEL_LAUNCH,),
}
"""Words `--expect` accepts besides record kinds (a kind has a dot: attn.call)."""

KNOWN_KINDS = tuple(KINDS)
"""The record kinds of schema mlatrace/1 (mlatrace/kinds.py), each a valid --expect."""

MAX_REASONS_PER_CAUSE = 10

CAP_BLINDING = (REPLAY, ATTN_METADATA, DISPATCH, ATTN_CALL, HOST_DECISION, KERNEL_SPLIT,
                KERNEL_LAUNCH)
"""Kinds the rules read: a size cap that left any of them out leaves the run unjudged."""

STATUS_WORDS = {"missing": "target missing", "drift": "signature drift",
                "load": "load error", "patch": "patch failed"}


class ExpectError(ValueError):
    """An expectation that names neither a record kind nor a known word (exit 2)."""


def expect_kinds(what: str) -> tuple[str, ...]:
    """The record kinds that meet expectation `what` (an alias or a record kind)."""
    name = what.strip()
    if name in EXPECT_ALIASES:
        return EXPECT_ALIASES[name]
    import difflib

    same_shape = [k for k in (*KNOWN_KINDS, *EXPECT_ALIASES) if k.count(".") == name.count(".")]
    close = difflib.get_close_matches(name, same_shape, n=1, cutoff=0.8)
    if name in KNOWN_KINDS or (not close and "." in name and all(
            part and part.replace("_", "").isalnum() for part in name.split("."))):
        return (name,)   # a dotted name not listed: a kind of a newer schema or a user pack
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ExpectError(f"unknown expectation {what!r}: {hint}use a record kind (attn.call, "
                      f"kernel.launch, mark, ...) or one of {', '.join(EXPECT_ALIASES)}")


@dataclass
class ProcessCoverage:
    """What one process's probes covered."""

    file: str
    pid: int | None
    rank: int | None
    recorded: bool                        # process.end carried a coverage object
    ended: bool                           # the process wrote its process.end
    packs: list[str]                      # installed (header `probes`)
    packs_attached: list[str] | None      # None: not recorded (older trace, no process.end)
    packs_skipped: dict[str, str]         # pack -> why nothing of it attached
    targets: dict[str, Any]               # patched/not_imported/inherited counts, lists
    hits: dict[str, int]                  # probe -> calls seen (counted probes, > 0)
    records: dict[str, int]               # records per kind
    probe_errors: list[dict]
    unseen: dict[str, int]                # probe -> calls passed uninspected (step-aside)
    steps_off: dict[str, int]             # probe -> steps its wrapper was taken off
    user_packs: list[str] = field(default_factory=list)     # given with --probes
    counted_packs: list[str] = field(default_factory=list)  # packs with a counted, patched probe

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "pid": self.pid, "rank": self.rank,
                "recorded": self.recorded, "ended": self.ended, "packs": self.packs,
                "packs_attached": self.packs_attached, "packs_skipped": self.packs_skipped,
                "targets": self.targets, "hits": self.hits, "records": self.records,
                "probe_errors": len(self.probe_errors), "unseen": self.unseen,
                "steps_off": self.steps_off, "user_packs": self.user_packs}


@dataclass
class Coverage:
    """The run's coverage and its blindness verdict (`reasons` empty: not blind)."""

    processes: list[ProcessCoverage] = field(default_factory=list)
    records: dict[str, int] = field(default_factory=dict)
    probe_errors: list[dict] = field(default_factory=list)
    probes_attached: int | None = None    # None: no process recorded coverage
    probes_errored: int = 0
    engines: dict[str, str] = field(default_factory=dict)
    ranks: dict[str, Any] = field(default_factory=dict)
    expect: list[dict[str, Any]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    # what a rule could not judge, and why (not blind: the rest of the verdict stands)
    notes: list[str] = field(default_factory=list)

    @property
    def blind(self) -> bool:
        return bool(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        """The `coverage` object of `report --json` (docs/trace-format.md)."""
        return {"blind": self.blind, "reasons": list(self.reasons), "notes": list(self.notes),
                "probes_attached": self.probes_attached,
                "probes_errored": self.probes_errored,
                "engines": dict(self.engines), "ranks": dict(self.ranks),
                "expect": [dict(e) for e in self.expect],
                "records": dict(self.records),
                "probe_errors": [dict(e) for e in self.probe_errors],
                "processes": [p.to_dict() for p in self.processes]}


def _status(reason: str) -> str:
    return reason.split(":", 1)[0].strip()


def process_coverage(proc: ProcessModel) -> ProcessCoverage:
    """One process's coverage from its process.end (when recorded) and its records."""
    end = proc.end if isinstance(proc.end, dict) else {}
    raw = end.get("coverage")
    recorded = isinstance(raw, dict) and isinstance(raw.get("probes"), dict)
    targets: dict[str, Any] = {"patched": 0, "not_imported": 0, "inherited": 0,
                               "missing": [], "drifted": [], "failed": []}
    hits: dict[str, int] = {}
    counted: set[str] = set()
    uncounted: set[str] = set()
    attached: list[str] | None = None
    skipped: dict[str, str] = {}
    if recorded:
        by_pack: dict[str, dict[str, int]] = {}
        for qualname, entry in raw["probes"].items():
            if not isinstance(entry, dict):
                continue
            pack = str(qualname).split(".", 1)[0]
            tally = by_pack.setdefault(pack, {"patched": 0, "not_imported": 0, "bad": set()})
            patched = entry.get("patched") if isinstance(entry.get("patched"), list) else []
            raw_not = entry.get("not_imported")
            not_imported = (len(raw_not) if isinstance(raw_not, list)
                            else raw_not if isinstance(raw_not, int) else 0)
            targets["patched"] += len(patched)
            targets["not_imported"] += not_imported
            tally["patched"] += len(patched)
            tally["not_imported"] += not_imported
            for target, why in (entry.get("skipped") or {}).items():
                status = _status(str(why))
                if status == "inherited":
                    targets["inherited"] += 1
                    continue
                tally["bad"].add(STATUS_WORDS.get(status, status))
                bucket = {"missing": "missing", "drift": "drifted"}.get(status, "failed")
                targets[bucket].append(f"{qualname} {target}")
            if isinstance(entry.get("hits"), int) and entry["hits"] > 0:
                hits[str(qualname)] = entry["hits"]
            if patched:  # a pack is "never called" only when every patched probe counts calls
                (counted if isinstance(entry.get("hits"), int) else uncounted).add(pack)
        attached = sorted(p for p, t in by_pack.items() if t["patched"])
        for pack, tally in sorted(by_pack.items()):
            if tally["patched"]:
                continue
            if tally["bad"]:
                skipped[pack] = ", ".join(sorted(tally["bad"]))
            elif tally["not_imported"]:
                skipped[pack] = "module never imported"
            else:
                skipped[pack] = "no target here (inherited only)"
        for path, why in (raw.get("failed_packs") or {}).items():
            other = isinstance(why, str) and why.startswith("other version")
            skipped[str(path)] = why if other else f"load error: {why}"
    return ProcessCoverage(file=proc.file, pid=proc.pid, rank=proc.rank, recorded=recorded,
                           ended=bool(end),
                           packs=list(proc.packs), packs_attached=attached,
                           packs_skipped=skipped, targets=targets, hits=hits,
                           records=dict(sorted(proc.kinds.items(), key=lambda kv: str(kv[0]))),
                           probe_errors=list(proc.probe_errors), unseen=_per_probe(end, "unseen"),
                           steps_off=_per_probe(end, "steps_off"),
                           user_packs=sorted(str(n) for n in (raw.get("user_packs") or [])
                                             if isinstance(n, str)) if recorded else [],
                           counted_packs=sorted(counted - uncounted))


def _per_probe(end: dict | None, name: str) -> dict[str, int]:
    """process.end's `unseen` (calls each probe passed through uninspected) or
    `steps_off` (steps its wrapper was taken off)."""
    raw = (end or {}).get(name)
    if not isinstance(raw, dict):
        return {}
    return {str(probe): n for probe, n in raw.items() if isinstance(n, int) and n > 0}


def _ranks(model: TraceModel) -> dict[str, Any]:
    world = max((p.world_size for p in model.processes if p.world_size), default=None)
    seen = sorted({p.rank for p in model.processes if p.rank is not None})
    kept: set[int] | None = None
    for p in model.processes:
        if p.ranks_kept:
            kept = (kept or set()) | set(p.ranks_kept)
    missing: list[int] = []
    if world:
        wanted = set(range(world)) if kept is None else set(range(world)) & kept
        missing = sorted(wanted - set(seen))
    return {"world_size": world, "seen": seen,
            "kept": sorted(kept) if kept is not None else None, "missing": missing}


def _error_line(e: dict) -> str:
    """One probe.error as a blind reason: where, which probe, why (target if not said)."""
    error, target = str(e.get("error")), e.get("target")
    on = f" on {target}" if target and str(target) not in error else ""
    why = STATUS_WORDS.get(str(e.get("reason")), e.get("reason") or "error")
    said = error if error.startswith(str(why)) else f"{why}: {error}"
    return f"probe error in {e['file']}:seq {e['seq']}: {e.get('probe')}{on}: {said}"


def _limited(lines: list[str]) -> list[str]:
    if len(lines) <= MAX_REASONS_PER_CAUSE:
        return lines
    return lines[:MAX_REASONS_PER_CAUSE] + [f"... and {len(lines) - MAX_REASONS_PER_CAUSE} "
                                            "more of the same cause"]


def _nothing_attached(cov: Coverage) -> list[str]:
    """Blind reasons for probes that saw nothing: no probe attached in any process (of
    those that recorded coverage), and each `--probes` pack (a process's coverage marks
    it `user`) none of whose targets attached, or that attached and was never called."""
    recorded = [p for p in cov.processes if p.recorded]
    if not recorded:
        return []   # older traces: unknown, only the record-based judgements apply
    out = []
    if cov.probes_attached == 0 and all(p.ended for p in cov.processes):
        packs = sorted({pack for p in recorded for pack in p.packs})
        out.append(f"no probe attached in any process of the run ({plural(len(recorded), 'process', 'processes')}"
                f"; packs installed: {', '.join(packs) or 'none'}): the command never imported "
                "a probed module, so nothing was watched")
    user: set[str] = set()
    attached: set[str] = set()
    called: set[str] = set()
    counted: set[str] = set()
    for p in recorded:
        user |= set(p.user_packs)
        attached |= set(p.packs_attached or [])
        called |= {qualname.split(".", 1)[0] for qualname in p.hits}
        counted |= set(p.counted_packs)
    for pack in sorted(user):
        if pack not in attached:
            why = sorted({p.packs_skipped[pack] for p in recorded if pack in p.packs_skipped})
            out.append(f"pack {pack} (--probes): none of its targets attached in any process "
                       f"({'; '.join(why) or 'no target found'})")
        elif pack in counted and pack not in called:
            out.append(f"pack {pack} (--probes): attached, but none of its probes was called")
    return out


def _capped(proc: ProcessModel) -> tuple[str | None, str | None]:
    """A blind reason for the records a rule reads that the size cap left out of this
    process, and a note for the replay times it left out (costs, MLT008), or None."""
    cap = (proc.end or {}).get("cap") if isinstance(proc.end, dict) else None
    if not isinstance(cap, dict) or not cap.get("reached"):
        return None, None
    left = cap.get("left_out") if isinstance(cap.get("left_out"), dict) else {}
    read = [(kind, n) for kind, n in left.items()
            if kind in CAP_BLINDING and isinstance(n, int) and n > 0]
    reason = note = None
    where = f"{proc.file} (pid {proc.pid}): size cap of {cap.get('max_mb')} MB reached"
    if read:
        reason = (f"{where}, the records rules read after it were left out ("
                  + ", ".join(f"{kind} {n}" for kind, n in read)
                  + "): the verdict covers only what came before the cap")
    timed = left.get(REPLAY_TIME)
    if isinstance(timed, int) and timed > 0:
        note = (f"{where}: {plural(timed, 'replay time')} left out after it; costs and "
                "MLT008 see only the replays timed before the cap")
    return reason, note


def judge(model: TraceModel, expect: list[str] | tuple[str, ...] = ()) -> Coverage:
    """The run's coverage and why it is blind (reasons), if it is."""
    cov = Coverage(processes=[process_coverage(p) for p in model.processes])
    for proc in model.processes:
        for kind, n in proc.kinds.items():
            cov.records[str(kind)] = cov.records.get(str(kind), 0) + n
        cov.probe_errors.extend(proc.probe_errors)
        for name in ENGINES:
            version = proc.versions.get(name)
            if isinstance(version, str) and version and name not in cov.engines:
                cov.engines[name] = version
    cov.records = dict(sorted(cov.records.items()))
    recorded = [p for p in cov.processes if p.recorded]
    if recorded:
        attached: set[str] = set()
        for proc in model.processes:
            probes = ((proc.end or {}).get("coverage") or {}).get("probes") or {}
            attached |= {str(q) for q, e in probes.items()
                         if isinstance(e, dict) and e.get("patched")}
        cov.probes_attached = len(attached)
    errored = {(e.get("probe"), e.get("target")) for e in cov.probe_errors}
    errors_total = cov.records.get(PROBE_ERROR, 0)
    cov.probes_errored = len({probe for probe, _ in errored}) or (1 if errors_total else 0)

    reasons: list[str] = []
    lines = [_error_line(e) for e in cov.probe_errors]
    if errors_total > len(lines):
        lines.append(f"{errors_total - len(lines)} more probe.error records")
    reasons += _limited(lines)

    if cov.engines and not any(cov.records.get(k) for k in GRAPH_KINDS + ATTENTION_KINDS):
        named = ", ".join(f"{name} {version}" for name, version in cov.engines.items())
        reasons.append(f"the headers name {named}, yet no process recorded any graph or "
                       "attention record (probes not attached? see the coverage section)")

    for what in expect:
        kinds = expect_kinds(what)
        count = sum(cov.records.get(k, 0) for k in kinds)
        cov.expect.append({"what": what, "kinds": list(kinds), "records": count,
                           "met": count > 0})
        if not count:
            named = what if kinds == (what,) else f"{what} ({' or '.join(kinds)})"
            reasons.append(f"expected {named}, but no process recorded any")

    reasons += _nothing_attached(cov)
    killed = [p for p in cov.processes if not p.ended]
    if killed:
        lines = [f"process killed: coverage unknown ({p.file}, pid {p.pid}: no process.end, "
                 "the process ended without writing it)" for p in killed]
        reasons += _limited(lines)

    lines = []
    for proc in model.processes:
        line, note = _capped(proc)
        if line:
            lines.append(line)
        if note:
            cov.notes.append(note)
    reasons += _limited(lines)

    cov.ranks = _ranks(model)
    if cov.ranks["missing"]:
        missing = ", ".join(map(str, cov.ranks["missing"]))
        reasons.append(f"rank(s) {missing} of world size {cov.ranks['world_size']} missing "
                       f"(ranks seen: {', '.join(map(str, cov.ranks['seen'])) or 'none'})")
    cov.reasons = reasons
    cov.notes += null_fields(model)
    return cov


NULL_AFTER = 8   # records of a probe's own kind before a field always null is called out


def null_fields(model: TraceModel) -> list[str]:
    """A probe problem per field of a user pack's own record kind that was null in every
    one of at least NULL_AFTER records: its path resolves to nothing (a typo, `args.x` of
    a parameter the target does not have as named, an attribute the object lacks)."""
    totals: dict[str, list] = {}
    for proc in model.processes:
        for kind, (n, nulls) in proc.custom_nulls.items():
            entry = totals.setdefault(kind, [0, {}])
            entry[0] += n
            for name, k in nulls.items():
                entry[1][name] = entry[1].get(name, 0) + k
    out = []
    for kind, (n, nulls) in sorted(totals.items()):
        empty = sorted(name for name, k in nulls.items() if k == n)
        if n >= NULL_AFTER and empty:
            out.append(f"probe problem: {kind} records: field(s) {', '.join(empty)} null in "
                       f"all {n}: their paths resolve to nothing on the calls seen (check "
                       "them against the target: docs/probes.md, field paths)")
    return out
