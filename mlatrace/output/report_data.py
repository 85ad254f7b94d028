"""The report as data: what `mlatrace report --json` prints, what the text, the HTML page,
`check`, `diff` and `watch` are made from.

`report_dict` gives one object, schema `mlatrace.report/1` (stable: fields are only added):

    {
      "schema": "mlatrace.report/1",
      "trace": str,                          # the trace directory
      "summary": {"processes": int,
                  "graphs": int,        # capture units: root graphs, each with the graphs
                                        # captured inside it (gid 1>2,3 in the table)
                  "graphs_total": int,  # every graph, nested torch graphs included
                  "replays": int,                       # steps (nested replays counted once)
                  "findings": {"error": int, "warning": int},
                  "suppressed": int,
                  "problems": int,      # len(problems): the text, check and this agree
                  "marks": int,         # mlatrace.mark() records (all, even past the kept ones)
                  "exit_code": int|null,                # the traced command's (run.json)
                  "probes_attached": int|null,          # distinct probes with a patched
                                                        # target (null: not recorded)
                  "probes_errored": int,                # distinct probes with a probe.error
                  "blind": bool},                       # coverage.blind
      "processes": [{"file", "pid", "ppid", "rank", "root", "world_size", "role", "argv",
                     "schema", "records", "written", "dropped", "gaps", "end_reason"}],
                                  # records: what the file stands for (a steady record as the
                                  # records it folded); written: the records it holds
      "graphs": [{"pid", "rank", "file", "gid", "nested_gids": [int], "src", "key", "mode",
                  "segments", "eager_breaks", "capture_seq",
                  "capture_error": str|null,   # the capture raised (graph.capture.end)
                  "frozen": {"num_kv_splits": [int], "stage2": "present"|"skipped"|null,
                             "kernels": {name: {"grids": [[x, y, z]], "num_kv_splits": [int]}},
                             "hints": {name: value}, "ops": [str], "ptrs": {name: int},
                             "graph_nodes": int, "capture_seq_len_max": int|null,
                             "capture_sizes": {name: int}|null},
                  "replays": {"count": int, "seq_len_max": int|null, "seq_len_min": int|null,
                              "ptrs_stable": bool|null,
                              "gpu_ns": {"p50", "p90", "p99", "max", "mean",   # ns per replay
                                         "samples"}|null,              # timed replays
                              # over time (analysis/series.py), min/max per time bucket:
                              "lengths": {"points", "min", "max", "t0_ns", "t_last_ns",
                                          "bucket_ns", "buckets": [[t, min, max, n]]}|null,
                              "gpu_times": {"gid", ...as lengths}|null,  # replay.time
                              "gpu_hist": [[ns, count]]|null},  # 8 significant bits
                  "runtime": {"num_kv_splits": [int]}|null}],  # a unit with eager breaks:
                                        # split counts its process chose eagerly while replaying
      "attention": [{"file", "pid", "rank", "kind": "attn.call"|"attn.metadata",
                     "name",                 # the op (forward_mqa, ...) or the backend
                     "count", "captured", "eager", "layers",   # distinct layer names
                     "seq_len_min", "seq_len_max", "first": {"file", "seq"}}],
      "findings": [{"id", "name", "severity", "message", "hint", "pid", "rank", "gid",
                    "evidence": [{"file", "seq", "kind", "what"}], "details": {...},
                    "cost": {"replays", "timed", "replay_gpu_ns_p50", "replay_gpu_ns_p90",
                             "total_gpu_ns", "estimate": {"gpu_ns_p50", "how"}|null}|null}],
                                             # cost: MLT001/6/7 (mlatrace.analysis.cost)
      "suppressed": [same as findings],      # matched by the config's allow-list
      "problems": [{"file", "line", "reason"}],  # the reader's bad lines (line >= 1), then
                                        # per-file data loss (line 0): dropped records, no
                                        # process.end
      "marks": [{"file", "pid", "rank", "seq", "t", "name", "attrs"}]  # the first 100 per process
      "kernels": {                           # the kernel view (analysis/kernels.py)
        "graphs": [{"pid", "rank", "gid", "key", "nodes": int,   # graphs with graph.nodes
                    "device": str|null, "sms": int|null,          # from the `device` record
                    "attention": [{"name", "short", "grid": [x, y, z], "ctas": int,
                                   "attention": true, "why": "name"|"attn.call"}],
                    "largest": {...}|null,   # the attention-like kernel with the most CTAs
                    "smallest": {...}|null,  # ... with the fewest (MLT008 names it first)
                    "replay_gpu_ns": {"timed": int, "min": int|null, "max": int|null}}],
        "grids_differ": [{"kernel": short name,       # attention-like kernels launched with
                          "grids": [{"grid": [x, y, z], "graphs": ["pid:gid"]}]}]
      },                                     # more than one grid between graphs
      "coverage": {                          # what the probes saw (analysis/coverage.py)
        "blind": bool, "reasons": [str],     # why the trace cannot support a clean verdict
        "notes": [str],                      # what a rule could not judge (MLT008: no SMs)
        "probes_attached": int|null, "probes_errored": int,
        "engines": {name: version},          # probed engines named in the headers
        "ranks": {"world_size": int|null, "seen": [int], "kept": [int]|null,
                  "missing": [int]},
        "expect": [{"what", "kinds": [str], "records": int, "met": bool}],
        "records": {kind: int},              # records per kind, whole run
        "probe_errors": [{"file", "seq", "probe", "target", "reason", "error"}],
        "processes": [{"file", "pid", "rank",
                       "recorded": bool,     # process.end carried coverage (newer traces)
                       "ended": bool,        # the process wrote its process.end
                       "packs": [str], "packs_attached": [str]|null,
                       "packs_skipped": {pack: why},
                       "targets": {"patched": int, "not_imported": int, "inherited": int,
                                   "missing": [str], "drifted": [str], "failed": [str]},
                       "hits": {probe: int}, "records": {kind: int},
                       "probe_errors": int}]
      }
    }
"""

from __future__ import annotations

from typing import Any

from mlatrace.analysis import Analysis
from mlatrace.analysis.graph_use import graph_use
from mlatrace.analysis.kernels import kernel_view
from mlatrace.analysis.summary import root_graphs, units
from mlatrace.common import plural
from mlatrace.kinds import STEADY

REPORT_SCHEMA = "mlatrace.report/1"


def problems_of(model: Any) -> list[dict[str, Any]]:
    """Every problem of a trace, once, in one order: the reader's bad lines, then each
    process's data loss (dropped records, no process.end). The summary counts these,
    the text prints them, --json lists them and check prints them: the same list."""
    out = [{"file": p.file, "line": p.line, "reason": p.reason} for p in model.problems]
    for p in model.processes:
        if p.dropped:
            out.append({"file": p.file, "line": 0, "reason": (
                f"{plural(p.dropped, 'record')} dropped (seq gaps); replay counts come from "
                "process.end, evidence may be missing")})
        if p.end is None and p.records:
            out.append({"file": p.file, "line": 0, "reason": (
                "no process.end: a Ray worker (Ray ends workers without exit handlers); "
                "its trace holds every task it finished" if p.kinds.get("ray.worker")
                else "no process.end record (killed, or still running); the trace stops at "
                "its last flush" + (
                    f"; steady steps are folded: those since its last `steady` record (at "
                    f"most one {p.fold_s:g} s interval) are not counted" if p.fold_s else ""))})
        cap = (p.end or {}).get("cap")
        if isinstance(cap, dict) and cap.get("reached"):
            left = cap.get("left_out") if isinstance(cap.get("left_out"), dict) else {}
            out.append({"file": p.file, "line": 0, "reason": (
                f"size cap of {cap.get('max_mb')} MB reached: "
                f"{plural(sum(v for v in left.values() if isinstance(v, int)), 'record')} "
                "left out after it (" + (", ".join(f"{k} {v}" for k, v in left.items())
                                         or "none") + "); " + cap_kept_text(cap))})
    return out


CAP_KEPT_WORDS = (
    (("graph.capture.begin", "graph.capture.end", "graph.nodes", "device"), "captures"),
    (("sync",), "syncs"), (("graph.eager_break",), "eager breaks"), (("mark",), "marks"),
    (("probe.error", "record.error", "kernel.skip"), "errors"), (("steady",), "folds"),
    (("graph.replay", "attn.metadata", "dispatch"), "the steps folding writes in full"),
)
"""What the size cap keeps (process.end `cap.kept`), in words, in the order said."""


def cap_kept_text(cap: dict[str, Any]) -> str:
    """What the cap kept, from the kinds its process.end lists: without folding (`--fold
    0`) there are no folds, so no step record is kept after the cap."""
    kept = cap.get("kept")
    if not isinstance(kept, list):
        return "captures, errors and folds kept"   # an older trace: its recorder's rule
    folded = "graph.replay" in kept   # the recorder folded: its folds and full steps kept
    words = [word for kinds, word in CAP_KEPT_WORDS
             if set(kinds) & set(kept) and (folded or "steady" not in kinds)]
    text = (", ".join(words[:-1]) + " and " + words[-1]) if len(words) > 1 else "".join(words)
    return (text or "only process records") + " kept" + (
        "" if folded else " (no folding: no replay, metadata or call record after the cap)")


def records_stood_for(proc: Any) -> int:
    """The records a process file stands for: a `steady` record counts as the records it
    folded, not as one, so the figure is the same with folding on and off (and equals the
    sum of its kinds in the coverage's records line)."""
    kinds = proc.kinds
    return sum(kinds.values()) - kinds.get(STEADY, 0) if kinds else proc.records


def report_dict(trace_path: str, result: Analysis,
                run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report as data (schema mlatrace.report/1, see the module docstring)."""
    model = result.model
    counts = result.counts()
    problems = problems_of(model)
    run = run or {}
    coverage = result.coverage
    return {
        "schema": REPORT_SCHEMA,
        "trace": str(trace_path),
        "summary": {
            "processes": len(model.processes),
            "graphs": len(root_graphs(model)),
            "graphs_total": len(model.graphs),
            "replays": model.total_replays(),
            "findings": counts,
            "suppressed": len(result.suppressed),
            "problems": len(problems),
            "marks": sum(p.marks_total for p in model.processes),
            "exit_code": run.get("exit_code"),
            "probes_attached": coverage.probes_attached,
            "probes_errored": coverage.probes_errored,
            "blind": coverage.blind,
        },
        "processes": [{
            "file": p.file, "pid": p.pid, "ppid": p.ppid, "rank": p.rank,
            "root": p.ppid not in {q.pid for q in model.processes},
            "world_size": p.world_size, "role": p.role, "argv": p.argv, "schema": p.schema,
            "records": records_stood_for(p), "written": p.records,
            "dropped": p.dropped, "gaps": p.gaps,
            "end_reason": (p.end or {}).get("reason"),
        } for p in model.processes],
        "graphs": units(model),
        "attention": [{
            "file": p.file, "pid": p.pid, "rank": p.rank, "kind": a.kind, "name": a.name,
            "count": a.count, "captured": a.captured, "eager": a.count - a.captured,
            "layers": len(a.layers), "seq_len_min": a.seq_len_min, "seq_len_max": a.seq_len_max,
            "first": {"file": a.first.file, "seq": a.first.seq},
        } for p in model.processes for a in p.attention.values()],
        "findings": [f.to_dict() for f in result.findings],
        "suppressed": [f.to_dict() for f in result.suppressed],
        "problems": problems,
        "marks": [{"file": p.file, "pid": p.pid, "rank": p.rank, **m}
                  for p in model.processes for m in p.marks],
        "kernels": kernel_view(model, result.config.grid),
        "graph_use": graph_use(model),
        "coverage": coverage.to_dict(),
    }


def summary_line(data: dict[str, Any]) -> str:
    s = data["summary"]
    parts = [plural(s["processes"], "process", "processes"),
             plural(s["graphs"], "graph") + " captured",
             plural(s["replays"], "replay")]
    errors, warnings = s["findings"]["error"], s["findings"]["warning"]
    if errors or warnings:
        if errors:
            parts.append(plural(errors, "error finding"))
        if warnings:
            parts.append(plural(warnings, "warning finding"))
    else:
        parts.append("no findings")
    if s["problems"]:
        parts.append(plural(s["problems"], "problem"))
    attached, errored = s.get("probes_attached"), s.get("probes_errored", 0)
    if attached is None:
        parts.append("probe coverage not recorded"
                     + (f", {plural(errored, 'probe')} errored" if errored else ""))
    else:
        parts.append(f"{plural(attached, 'probe')} attached, {errored} errored")
    if s.get("blind"):
        parts.append("BLIND")
    if s.get("exit_code"):
        parts.append(f"the traced command exited with code {s['exit_code']}")
    return ", ".join(parts)

