"""`mlatrace merge DIR... -o OUT`: one run's trace directories copied into one, for archiving.

OUT gets one subdirectory per source directory, named by the host whose processes it
holds (`OUT/<host>/run.json`, `OUT/<host>/p<pid>.jsonl`; by its path from the sources'
common parent when hosts do not tell the sources apart), and `OUT/merge.json`, which
says where each came from. Files are copied byte for byte (a truncated last line stays
truncated, to be reported the same way), so OUT reads as the sources read together:
`mlatrace report OUT` is the same run, with the same processes, ranks and findings.

Exit codes: 0 merged, 2 no trace under DIRS, traces of different runs without `--run`,
OUT not empty, or a copy failed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from mlatrace.exitcodes import MlatraceError
from mlatrace.trace.reader import Trace, TraceError
from mlatrace.trace.runs import RunInfo, find_runs, select_run

MERGE_SCHEMA = "mlatrace.merge/1"


def _hosts(trace: Trace) -> list[str]:
    hosts = sorted({str(p.header["host"]) for p in trace.processes
                    if p.header and p.header.get("host")})
    if not hosts and trace.run and trace.run.get("host"):
        hosts = [str(trace.run["host"])]
    return hosts


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name).strip(".") or "trace"


def dir_names(traces: list[Trace]) -> list[str]:
    """The subdirectory of OUT for each source: its host when every source holds one host
    of its own; otherwise its path from the sources' common parent, as the reader names
    their files, so the merged run reads with the same file names."""
    hosts = [_hosts(t) for t in traces]
    if all(len(h) == 1 for h in hosts) and len({h[0] for h in hosts}) == len(hosts):
        return [_safe(h[0]) for h in hosts]
    roots = [t.root.resolve() for t in traces]
    common = Path(os.path.commonpath(roots))
    names, taken = [], set()
    for root in roots:
        rel = root.relative_to(common).as_posix()
        base = _safe(rel.replace("/", "_")) if rel != "." else _safe(root.name)
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}-{n}"
        taken.add(name)
        names.append(name)
    return names


def merge(paths: list[str], out: str | Path, run_id: str | None = None
          ) -> tuple[RunInfo, str | None, Path]:
    """Copy the run under `paths` into `out`; returns (the run, a note on which run, out)."""
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise TraceError(f"{target}: exists and is not an empty directory")
    runs = find_runs(paths)
    if len(runs) > 1 and run_id is None:  # never keep one run of several silently
        listed = "; ".join(f"{r.run_id} ({', '.join(str(d) for d in r.dirs)})" for r in runs)
        raise TraceError(f"{' '.join(paths)}: holds {len(runs)} different runs ({listed}); "
                         "merge copies one run: say which with --run ID")
    run, note = select_run(runs, run_id, " ".join(paths))
    target.mkdir(parents=True, exist_ok=True)
    sources = []
    traces = sorted(run.traces, key=lambda t: str(t.root.resolve()))
    for trace, name in zip(traces, dir_names(traces), strict=True):
        dest = target / name
        dest.mkdir()
        files = [p.path for p in trace.processes]
        if (trace.root / "run.json").exists():
            files.insert(0, trace.root / "run.json")
        for f in files:
            shutil.copyfile(f, dest / f.name)
        sources.append({"dir": str(trace.root.resolve()), "as": name,
                        "files": len(files)})
    manifest = {"schema": MERGE_SCHEMA, "run_id": run.run_id, "hosts": run.hosts,
                "sources": sources}
    (target / "merge.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return run, note, target


def main(paths: list[str], out: str, run_id: str | None = None) -> int:
    """`mlatrace merge`: 0 merged; MlatraceError (exit 2) when there is nothing to merge or
    it cannot be written."""
    try:
        run, note, target = merge(paths, out, run_id)
    except TraceError as exc:
        raise MlatraceError(f"error: {exc}") from exc
    except OSError as exc:
        raise MlatraceError(f"error: cannot write {out}: {exc.strerror or exc}") from exc
    if note:
        sys.stderr.write(f"note: {note}\n")
    print(f"merged run {run.run_id}: {run.processes} process files from {len(run.dirs)} "
          f"directories (hosts {', '.join(run.hosts) or '-'}) into {target}")
    return 0


__all__ = ["MERGE_SCHEMA", "main", "merge"]
