"""`report --html FILE`, `check --html FILE`, `watch --html FILE`: one self-contained page.

The page is made from the report's data (`report.report_dict`) and the analysis model
(for the kernel view): the verdict and coverage, the findings with their evidence, fix
and cost, then per capture unit what it froze, its replay lengths over time against the
captured length (the frozen region shaded), its replay GPU times and the kernels its
graph froze, the process tree with ranks, and how to open the trace in Perfetto.

Charts are inline SVG drawn here (`mlatrace.output.charts.svg`): the file needs no network and
no library, and a browser shows it as it is. Everything that comes from the trace is
escaped, and a Content-Security-Policy lets no script run but the page's own one (a few
lines that note script errors and blocked content into the page, for tests and users
alike), so a trace whose argv or marks carry markup shows it as text.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

from mlatrace.output.charts import captured_length, regions_of, unit_findings
from mlatrace.output.charts.svg import HALF, compact, duration, esc, histogram_chart, series_chart
from mlatrace.output.html_graph_use import graph_use_section
from mlatrace.output.html_kernels import explained_by_pack, kernel_rows

MAX_CHARTED = 40       # capture units drawn with charts; the rest are listed
MAX_FINDINGS = 200
MAX_LIST = 200         # marks, problems, processes, evidence lines shown
MAX_KERNELS = 64       # kernel rows per unit

# the page's only script: script errors and blocked content become visible in the page
PAGE_SCRIPT = """(function(){var seen=[],root=document.documentElement;
function show(){root.setAttribute('data-errors',String(seen.length));
var box=document.getElementById('page-errors');
if(box&&seen.length){box.textContent=seen.join('\\n');box.hidden=false;}}
function note(m){seen.push(String(m));show();}
window.addEventListener('error',function(e){note('script error: '+e.message);});
document.addEventListener('securitypolicyviolation',function(e){
note('blocked by the page policy: '+e.violatedDirective);});
window.addEventListener('load',function(){root.setAttribute('data-loaded','1');show();});
})();"""

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1a202c;
margin:0;background:#f7fafc}
main{max-width:1180px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:18px;margin:28px 0 8px;
border-bottom:1px solid #cbd5e0;padding-bottom:4px}h3{font-size:15px;margin:12px 0 6px}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{background:#edf2f7;padding:8px 10px;border-radius:4px;overflow-x:auto;white-space:pre-wrap}
.sub{color:#4a5568;margin:0 0 10px}
.verdict{border-radius:6px;padding:12px 16px;margin:12px 0;color:#fff;font-size:17px}
.verdict b{font-size:20px}.v-fail{background:#c53030}.v-blind{background:#b7791f}
.v-ok{background:#2f855a}.verdict .sub{color:#f7fafc;margin:4px 0 0;font-size:13.5px}
table{border-collapse:collapse;margin:6px 0;background:#fff}
table.findings{width:100%}table.findings td:first-child{white-space:nowrap}
td,th{border:1px solid #e2e8f0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#edf2f7;font-weight:600}td.num{text-align:right}
.finding{background:#fff;border-left:5px solid #c53030;padding:8px 12px;margin:10px 0;
border-radius:3px}.finding.warning{border-left-color:#d69e2e}
.fid{font-weight:700}.sev-error{color:#c53030;font-weight:600}
.sev-warning{color:#b7791f;font-weight:600}
.graph{background:#fff;padding:10px 14px;margin:14px 0;border-radius:4px;
border:1px solid #e2e8f0}.graph.frozen{border-left:5px solid #c53030}
.badge{display:inline-block;border-radius:3px;padding:0 6px;font-size:12px;color:#fff;
background:#718096;margin-left:6px}.badge.bad{background:#c53030}
.charts{display:flex;flex-wrap:wrap;gap:8px}
svg.chart{background:#fff;max-width:100%;height:auto;font-size:11px;fill:#1a202c}
svg .ctitle{font-size:13px;font-weight:600}svg .cnote{font-size:10.5px;fill:#4a5568}
svg .rlabel,svg .caplabel,svg .plabel{font-size:11px;font-weight:600}
.tree,.tree ul{list-style:none;padding-left:18px}.tree li{margin:2px 0}
.argv{color:#4a5568;word-break:break-all}.under{color:#c53030;font-weight:600}
#page-errors{background:#fed7d7;color:#742a2a;padding:8px;white-space:pre-wrap}
details>summary{cursor:pointer;color:#2b6cb0}
section.run{border-top:3px solid #2d3748;margin-top:36px}.v-ok-text{color:#2f855a}
.v-fail-text{color:#c53030}.v-blind-text{color:#b7791f}
"""


def _csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return (f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
            f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'")


VERDICT_CLASS = {0: "v-ok", 1: "v-fail", 3: "v-blind"}   # by check's exit code


def verdict(data: dict[str, Any], fail_on: str = "error") -> tuple[str, int, str]:
    """(css class, `mlatrace check` exit code, headline): check's verdict (`check.judge`)
    on the report data's findings and coverage."""
    from mlatrace.output.check import judge

    blind = bool((data.get("coverage") or {}).get("blind"))
    judged = judge((f["severity"] for f in data["findings"]), blind, fail_on)
    return VERDICT_CLASS[judged.code], int(judged.code), judged.headline


def _table(head: list[str], rows: list[list[Any]], num: set[int] | None = None,
           cls: str = "") -> str:
    """A table of escaped cells (a cell given as ('html', markup) is taken as markup)."""
    num = num or set()
    out = [f'<table class="{esc(cls)}">' + ("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head)
                                            + "</tr>" if any(head) else "")]
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = cell[1] if isinstance(cell, tuple) and cell[0] == "html" else esc(
                "-" if cell is None else cell)
            cells.append(f'<td class="num">{text}</td>' if i in num else f"<td>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "".join(out) + "</table>"


def _rank(rank: Any) -> str:
    return "-" if rank is None else str(rank)


def _grid(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(str(v) for v in value) + ")"
    return "-" if value is None else str(value)


def _anchor(pid: Any, gid: Any) -> str:
    return f"g-{esc(pid)}-{esc(gid)}"


# -- sections -------------------------------------------------------------------------

def _header(data: dict[str, Any], generated: str, live: bool) -> str:
    from mlatrace.output.report_data import summary_line

    trace = data["trace"]
    note = " (live snapshot, rewritten at each refresh)" if live else ""
    return (f"<header><h1>mlatrace report</h1>"
            f'<p class="sub">trace <code>{esc(trace)}</code>, made {esc(generated)}{note}</p>'
            f'<p class="sub" id="summary">{esc(summary_line(data))}</p></header>')


def _verdict(data: dict[str, Any], fail_on: str) -> str:
    cls, code, head = verdict(data, fail_on)
    cov = data.get("coverage") or {}
    reasons = "".join(f"<div>blind: {esc(r)}</div>" for r in cov.get("reasons", [])[:20])
    counts = data["summary"]["findings"]
    return (f'<section id="verdict" class="verdict {cls}" data-exit="{code}"><b>{esc(head)}</b>'
            f'<p class="sub">{counts["error"]} error and {counts["warning"]} warning '
            f"finding(s); <code>mlatrace check</code> exits {code} "
            f"(--fail-on {esc(fail_on)})</p><div class=\"sub\">{reasons}</div></section>")


def _coverage(data: dict[str, Any]) -> str:
    cov = data.get("coverage")
    if not cov:
        return ""
    attached = cov.get("probes_attached")
    head = (f"{attached} probe(s) attached" if attached is not None
            else "probe coverage not recorded by this trace")
    parts = [f'<section id="coverage"><h2>Coverage</h2><p>{esc(head)}, '
             f'{esc(cov.get("probes_errored", 0))} errored; '
             + ("<b class=\"sev-error\">blind</b>" if cov.get("blind") else "no blind spot found")
             + "</p>"]
    if cov.get("reasons"):
        parts.append("<ul>" + "".join(f"<li>{esc(r)}</li>" for r in cov["reasons"]) + "</ul>")
    if cov.get("engines"):
        parts.append("<p>engines in the headers: " + esc(", ".join(
            f"{k} {v}" for k, v in cov["engines"].items())) + "</p>")
    ranks = cov.get("ranks") or {}
    if ranks.get("world_size"):
        parts.append(f"<p>ranks: world size {esc(ranks['world_size'])}, seen "
                     f"{esc(', '.join(map(str, ranks.get('seen', []))) or 'none')}"
                     + (f"; <b class=\"sev-error\">missing {esc(ranks['missing'])}</b>"
                        if ranks.get("missing") else "") + "</p>")
    for e in cov.get("expect", []):
        parts.append(f"<p>expect {esc(e['what'])}: {esc(e['records'])} record(s), "
                     + ("met" if e["met"] else "<b class=\"sev-error\">not met</b>") + "</p>")
    from mlatrace.output.report_text import units_note

    records = [[k, f"{n}{units_note(k, n, data['summary'])}"]
               for k, n in (cov.get("records") or {}).items()]
    if records:
        parts.append("<details><summary>records per kind</summary>"
                     + _table(["kind", "records"], records, {1}) + "</details>")
    rows = []
    for p in cov.get("processes", [])[:MAX_LIST]:
        t = p.get("targets") or {}
        rows.append([p["file"], _rank(p.get("rank")), ", ".join(p.get("packs_attached") or [])
                     or ("not recorded" if not p.get("recorded") else "none"),
                     t.get("patched"), ", ".join(t.get("missing", []) + t.get("drifted", [])
                                                 + t.get("failed", [])) or "-",
                     p.get("probe_errors")])
    if rows:
        parts.append("<details><summary>packs and targets per process</summary>"
                     + _table(["file", "rank", "packs attached", "targets patched",
                               "missing / drifted / failed", "probe errors"], rows, {3, 5})
                     + "</details>")
    return "".join(parts) + "</section>"


def _cost(f: dict[str, Any]) -> str:
    from mlatrace.output.report_text import cost_line

    line = cost_line(f)
    return f'<p class="cost">cost: {esc(line)}</p>' if line else ""


def _findings_table(data: dict[str, Any]) -> str:
    """One row per finding, first on the page; the details follow the graphs."""
    findings = data["findings"]
    parts = ['<section id="findings"><h2>Findings</h2>']
    if not findings:
        parts.append('<p class="none">No findings.</p>')
    rows = []
    for i, f in enumerate(findings[:MAX_FINDINGS]):
        sev = "error" if f["severity"] == "error" else "warning"
        graph = (f'<a href="#{_anchor(f["pid"], f["gid"])}">gid {esc(f["gid"])}</a>'
                 if f.get("gid") is not None else "-")
        rows.append([("html", f'<a href="#f-{i}" class="fid">{esc(f["id"])}</a> '
                              f'{esc(f["name"])}'),
                     ("html", f'<span class="sev-{sev}">{sev}</span>'), _rank(f.get("rank")),
                     ("html", graph), f["message"]])
    if rows:
        parts.append(_table(["finding", "severity", "rank", "graph", "message"], rows,
                            cls="findings"))
    if len(findings) > MAX_FINDINGS:
        parts.append(f"<p>... {len(findings) - MAX_FINDINGS} more (report --json lists "
                     "them all)</p>")
    if data["summary"].get("suppressed"):
        parts.append(f"<p>{esc(data['summary']['suppressed'])} finding(s) suppressed by the "
                     "config's allow-list.</p>")
    return "".join(parts) + "</section>"


def _findings(data: dict[str, Any]) -> str:
    """Each finding with its evidence, fix and cost."""
    findings = data["findings"]
    if not findings:
        return ""
    parts = ['<section id="finding-details"><h2>Findings: evidence, fix, cost</h2>']
    for i, f in enumerate(findings[:MAX_FINDINGS]):
        sev = "error" if f["severity"] == "error" else "warning"
        where = f"rank {_rank(f.get('rank'))}, pid {f.get('pid')}" + (
            f", gid {f.get('gid')}" if f.get("gid") is not None else "")
        link = (f' (<a href="#{_anchor(f["pid"], f["gid"])}">graph</a>)'
                if f.get("gid") is not None else "")
        evidence = "".join(f"<li><code>{esc(e['file'])}:seq {esc(e['seq'])}</code> "
                           f"({esc(e['kind'])}) {esc(e['what'])}</li>"
                           for e in f.get("evidence", [])[:MAX_LIST])
        parts.append(
            f'<article class="finding {sev}" id="f-{i}" data-id="{esc(f["id"])}">'
            f'<div><span class="fid">{esc(f["id"])} {esc(f["name"])}</span> '
            f'<span class="sev-{sev}">{sev}</span> <span class="sub">{esc(where)}</span>'
            f"{link}</div><p>{esc(f['message'])}</p>"
            f"<details open><summary>evidence</summary><ul>{evidence}</ul></details>"
            f"<p><b>fix:</b> {esc(f['hint'])}</p>{_cost(f)}</article>")
    return "".join(parts) + "</section>"


def _frozen_rows(unit: dict[str, Any], model: Any) -> list[list[Any]]:
    frozen = unit["frozen"]
    rows: list[list[Any]] = []
    if frozen.get("num_kv_splits"):
        rows.append(["KV splits", ", ".join(map(str, frozen["num_kv_splits"]))])
    for name, k in frozen.get("kernels", {}).items():
        grids = " ".join(_grid(g) for g in k.get("grids", []))
        splits = (f", NUM_KV_SPLITS {', '.join(map(str, k['num_kv_splits']))}"
                  if k.get("num_kv_splits") else "")
        rows.append([f"launch {name}", f"grid {grids}{splits}"])
    if frozen.get("stage2"):
        rows.append(["stage 2 (reduce)", frozen["stage2"]])
    for name, value in frozen.get("hints", {}).items():
        rows.append([f"hint {name}", value])
    root = model.graph(unit["pid"], unit["gid"]) if model is not None else None
    if root is not None:
        for g in sorted(model.subtree(root), key=lambda g: g.gid):
            for d in g.decisions[:MAX_LIST]:
                inputs = ", ".join(f"{k}={v}" for k, v in (d.inputs or {}).items())
                valid = f"; holds for {d.valid}" if d.valid else ""
                rows.append([f"decision {d.name}", f"{d.value} (from {inputs or 'no inputs'}"
                                                    f"{valid})"])
    if frozen.get("ops"):
        rows.append(["attention ops", ", ".join(frozen["ops"])])
    if frozen.get("capture_seq_len_max") is not None:
        rows.append(["seq_len_max at capture", frozen["capture_seq_len_max"]])
    rows.append(["graph nodes", frozen.get("graph_nodes", 0)])
    return rows


def _kernel_view(unit: dict[str, Any], model: Any, mine: list[dict[str, Any]]) -> str:
    view = kernel_rows(model, unit)
    if view is None:
        return ""
    sms = view["sms"]
    rows = []
    for r in view["shown"][:MAX_KERNELS]:
        share = (f"{r['ctas']} / {sms} = {r['share']:.2g}" if r["share"] is not None
                 else (f"{r['ctas']} / ?" if r["ctas"] is not None else "-"))
        cls = ' class="under"' if r["underfilled"] else ""
        name = (f'<span title="{esc(r["name"])}"{cls}>{esc(r["short"])}</span>'
                + (" (attention)" if r["attention"] else ""))
        rows.append([r["gid"], ("html", name), _grid(r["grid"]), _grid(r["block"]), r["smem"],
                     ("html", f"<span{cls}>{esc(share)}</span>")])
    unexplained = not explained_by_pack(model, unit)
    largest = view["largest"]
    lead = ""
    if largest is not None and largest["share"] is not None and largest["underfilled"]:
        small = view["smallest"] or largest   # the frozen-smallest grid first, as MLT008
        also = (f' ({esc(largest["short"])}, the largest, {largest["ctas"]})'
                if small is not largest else "")
        lead = (f'<p class="under">{esc(small["short"])} launches {small["ctas"]} '
                f'CTA{"s" if small["ctas"] != 1 else ""} at grid {esc(_grid(small["grid"]))} '
                f'on {sms} SMs{also}: the capture froze a parallelism below a quarter of the '
                'GPU.</p>')
    head = ("No engine pack explains this graph: these are the kernels its capture froze"
            if unexplained else "Kernels the capture froze")
    more = (f"<p>... {len(view['shown']) - MAX_KERNELS} more distinct kernels</p>"
            if len(view["shown"]) > MAX_KERNELS else "")
    body = (f"<p>{esc(view['total'])} kernel node(s), {len(view['shown'])} distinct; SMs: "
            f"{esc(sms if sms else '?')} ({esc(view['sms_from'])})</p>{lead}"
            + _table(["gid", "kernel", "grid", "block", "smem", "CTAs / SMs"], rows, {4})
            + more)
    opened = " open" if unexplained or not mine else ""
    return (f'<details class="kernels"{opened}><summary>{esc(head)}</summary>'
            f"{body}</details>")


def _charts(unit: dict[str, Any], mine: list[dict[str, Any]], far_factor: int) -> str:
    replays = unit["replays"]
    out = []
    lengths = replays.get("lengths")
    captured = captured_length(unit, mine)
    regions = regions_of(mine, far_factor)
    from mlatrace.output.report_text import gid_text

    name = f"gid {gid_text(unit['gid'], unit.get('nested_gids', []))}"
    if lengths and lengths.get("buckets") and captured is not None and regions:
        past = sorted({r.rule + ": " + r.label for r in regions
                       if r.holds(lengths["max"]) or r.holds(lengths["min"])})
        if past:
            head = (f"captured at seq_len_max {captured[0]}, replayed at "
                    f"{lengths['min']}..{lengths['max']}: " + "; ".join(past))
            out.append(f'<p class="under frozen-headline">{esc(head)}</p>')
    if lengths and lengths.get("buckets"):
        out.append(series_chart(lengths, kind="lengths", title=f"{name}: replay length "
                                "(seq_len_max before each replay) over time",
                                y_label="seq_len_max", y_fmt=compact, count=replays["count"],
                                captured=captured, regions=regions, what="replay"))
    hist = replays.get("gpu_hist")
    gpu = replays.get("gpu_ns") or {}
    clock = replay_clock(replays)
    if hist:
        out.append(histogram_chart(hist, title=f"{name}: replay {clock} distribution",
                                   marks={k: gpu.get(k) for k in ("p50", "p90", "max")},
                                   width=HALF, x_label=f"{clock} per replay"))
    times = replays.get("gpu_times")
    if times and times.get("buckets") and times["points"] > 1:
        inner = (f" (timed on gid {times['gid']} inside it)" if times["gid"] != unit["gid"]
                 else "")
        out.append(series_chart(times, kind="gpu-times",
                                title=f"{name}: replay {clock} over time{inner}",
                                y_label=clock.split(" (")[0],
                                y_fmt=duration, what="timed replay", width=HALF))
    if not out:
        return ('<p class="sub">No replay with metadata or GPU time recorded: nothing to '
                "chart.</p>")
    return '<div class="charts">' + "".join(out) + "</div>"


# the replay lengths as the chart, its caption and the text report's sparkline give them
LENGTHS_ROW = "replay length min..max (seq_len_max before each replay)"


def replay_clock(replays: dict[str, Any]) -> str:
    """What a unit's replay times are: GPU time, or the host clock of a CPU host graph
    (the text report's words, report_text.cost_line)."""
    return "host time (CPU host graph)" if replays.get("timed_via") == "host" else "GPU time"


def _unit(unit: dict[str, Any], data: dict[str, Any], model: Any, far_factor: int,
          charted: bool) -> str:
    from mlatrace.output.report_text import gid_text

    mine = unit_findings(unit, data["findings"])
    bad = any(f["severity"] == "error" for f in mine)
    badges = "".join(f'<span class="badge{" bad" if f["severity"] == "error" else ""}">'
                     f'{esc(f["id"])}</span>' for f in mine)
    r = unit["replays"]
    gpu = r.get("gpu_ns") or {}
    lengths = r.get("lengths") or {}
    lens = ("-" if r.get("seq_len_max") is None
            else f"{lengths.get('min', r.get('seq_len_max'))}..{r.get('seq_len_max')}")
    facts = [["replays", r["count"]], [LENGTHS_ROW, lens],
             [f"{replay_clock(r)} per replay p50 / p90 / max",
              " / ".join(duration(gpu[k]) for k in ("p50", "p90", "max"))
              + f" ({gpu.get('samples')} timed)" if gpu else "not timed"],
             ["static buffers stable", {True: "yes", False: "NO", None: "-"}[r.get("ptrs_stable")]]]
    if unit.get("capture_error"):
        facts.append(["capture error", unit["capture_error"]])
    rank = "" if unit.get("rank") is None else f"rank {unit['rank']} "
    head = (f"{rank}pid {unit['pid']} gid "
            f"{gid_text(unit['gid'], unit.get('nested_gids', []))}: "
            f"{unit.get('key') if unit.get('key') is not None else '(no key)'} "
            f"{unit.get('mode') or ''} ({unit.get('src') or '?'})")
    charts = (_charts(unit, mine, far_factor) if charted
              else '<p class="sub">(charts left out: only the first units are drawn)</p>')
    return (f'<article class="graph{" frozen" if bad else ""}" id="{_anchor(unit["pid"], unit["gid"])}">'
            f"<h3>{esc(head)}{badges}</h3>"
            '<div class="charts">'
            f"<div><b>what the capture froze</b>{_table(['', 'frozen'], _frozen_rows(unit, model))}</div>"
            f"<div><b>what the replays saw</b>{_table(['', ''], facts)}</div></div>"
            f"{charts}{_kernel_view(unit, model, mine)}</article>")


def _graphs(data: dict[str, Any], model: Any, far_factor: int) -> str:
    units = data["graphs"]
    if not units:
        return '<section id="graphs"><h2>Graphs</h2><p>No graph captured.</p></section>'

    def weight(u: dict[str, Any]) -> tuple:
        mine = unit_findings(u, data["findings"])
        return (-sum(2 if f["severity"] == "error" else 1 for f in mine), -u["replays"]["count"])

    order = sorted(range(len(units)), key=lambda i: weight(units[i]))
    charted = set(order[:MAX_CHARTED])
    parts = ['<section id="graphs"><h2>Graphs: what capture froze, what replays needed</h2>',
             '<p class="sub">The dashed line is the length the graph was captured at; red '
             "bands are the lengths at which its frozen decision no longer holds (from its "
             "findings), and replays that reached them are drawn red.</p>"]
    if len(units) > MAX_CHARTED:
        parts.append(f"<p>{len(units)} capture units: charts for the {MAX_CHARTED} with the "
                     "most findings and replays.</p>")
    for i in order:
        parts.append(_unit(units[i], data, model, far_factor, i in charted))
    return "".join(parts) + "</section>"


def _processes(data: dict[str, Any]) -> str:
    procs = data["processes"][:MAX_LIST * 5]
    by_pid = {p["pid"]: p for p in procs}
    children: dict[Any, list[dict[str, Any]]] = {}
    roots = []
    for p in procs:
        if p["ppid"] in by_pid and p["ppid"] != p["pid"]:
            children.setdefault(p["ppid"], []).append(p)
        else:
            roots.append(p)

    def item(p: dict[str, Any], seen: set) -> str:
        seen.add(p["pid"])
        argv = " ".join(str(a) for a in (p.get("argv") or []))
        short = argv if len(argv) <= 160 else argv[:159] + "…"
        kids = [c for c in children.get(p["pid"], []) if c["pid"] not in seen]
        sub = "<ul>" + "".join(item(c, seen) for c in kids) + "</ul>" if kids else ""
        end = p.get("end_reason") or "no process.end"
        return (f"<li><b>pid {esc(p['pid'])}</b> rank {esc(_rank(p.get('rank')))} "
                f"<i>{esc(p.get('role'))}</i> {esc(p.get('records'))} records, {esc(end)} "
                f'<code class="argv" title="{esc(argv)}">{esc(short)}</code>{sub}</li>')

    seen: set = set()
    tree = "".join(item(p, seen) for p in roots)
    rest = "".join(item(p, seen) for p in procs if p["pid"] not in seen)  # ppid cycles
    return (f'<section id="processes"><h2>Process tree</h2><ul class="tree">{tree}{rest}</ul>'
            "</section>")


def _attention(data: dict[str, Any]) -> str:
    rows = [[a["pid"], _rank(a["rank"]), a["kind"], a["name"], a["count"], a["captured"],
             a["eager"], a["layers"] or "-",
             "-" if a["seq_len_max"] is None else f"{a['seq_len_min']}..{a['seq_len_max']}"]
            for a in data.get("attention", [])[:MAX_LIST]]
    if not rows:
        return ""
    return ('<section id="attention"><h2>Attention</h2>'
            + _table(["pid", "rank", "record", "op / backend", "count", "captured", "eager",
                      "layers", "seq len min..max"], rows, {4, 5, 6, 7}) + "</section>")


def _marks_problems(data: dict[str, Any]) -> str:
    parts = []
    marks = data.get("marks") or []
    if marks:
        rows = [[m["file"], _rank(m.get("rank")), m.get("seq"), m.get("name"),
                 " ".join(f"{k}={v}" for k, v in (m.get("attrs") or {}).items())]
                for m in marks[:MAX_LIST]]
        parts.append(f'<section id="marks"><h2>Marks</h2><details><summary>'
                     f"{esc(data['summary'].get('marks', len(marks)))} mlatrace.mark "
                     "annotation(s)</summary>"
                     + _table(["file", "rank", "seq", "name", "attrs"], rows) + "</details></section>")
    problems = data.get("problems") or []
    if problems:
        from mlatrace.output.report_text import problem_text

        items = "".join(f"<li>{esc(problem_text(p))}</li>" for p in problems[:MAX_LIST])
        more = (f"<li>... {len(problems) - MAX_LIST} more</li>" if len(problems) > MAX_LIST
                else "")
        parts.append(f'<section id="problems"><h2>Problems</h2><ul>{items}{more}</ul></section>')
    return "".join(parts)


def _perfetto(data: dict[str, Any]) -> str:
    trace = shlex.quote(str(data["trace"]))
    return ('<section id="perfetto"><h2>The same trace in Perfetto</h2>'
            f"<pre>mlatrace export {esc(trace)} --perfetto trace-perfetto.json</pre>"
            "<p>then open <code>https://ui.perfetto.dev</code> and choose <i>Open trace "
            "file</i> with <code>trace-perfetto.json</code> (the UI reads the file in the "
            "browser; it is not uploaded). Captures, replays, attention calls and findings "
            "are slices and instants on one track per process and thread.</p></section>")


def render_html(data: dict[str, Any], model: Any = None, *, fail_on: str = "error",
                far_factor: int = 8, refresh_s: float | None = None,
                generated: str | None = None) -> str:
    """The page for the report data of one run (`report_dict`) and its model (kernel view);
    `refresh_s`: the browser reloads it that often (watch snapshots)."""
    generated = generated or time.strftime("%Y-%m-%d %H:%M:%S %Z")
    refresh = (f'<meta http-equiv="refresh" content="{max(1, int(refresh_s))}">'
               if refresh_s else "")
    body = "".join([
        _header(data, generated, refresh_s is not None),
        '<div id="page-errors" hidden></div>',
        run_sections(data, model, fail_on, far_factor), _footer(),
    ])
    return _page(f"mlatrace report: {data['trace']}", body, refresh)


def run_sections(data: dict[str, Any], model: Any, fail_on: str, far_factor: int) -> str:
    """The sections of one run's page, from its verdict to how to open it in Perfetto."""
    return "".join([
        _verdict(data, fail_on), _findings_table(data), _graphs(data, model, far_factor),
        graph_use_section(data), _findings(data), _processes(data), _coverage(data), _attention(data), _marks_problems(data),
        _perfetto(data),
    ])


def _footer() -> str:
    from mlatrace import __version__

    return (f'<footer class="sub">made by mlatrace {esc(__version__)}; charts are SVG drawn '
            "when the report was made: this file needs no network</footer>")


def _page(title: str, body: str, head: str = "") -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{_csp(PAGE_SCRIPT)}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"{head}<title>{esc(title)}</title>"
            f"<style>{STYLE}</style><script>{PAGE_SCRIPT}</script></head>"
            f"<body><main>{body}</main></body></html>\n")


_VERDICT_OF_EXIT = {0: ("v-ok", "OK"), 1: ("v-fail", "FAILED"), 2: ("v-fail", "UNUSABLE"),
                    3: ("v-blind", "BLIND")}
_ID = re.compile(r'((?<![\w-])id="|href="#)')


def render_collection(where: str, runs: list[dict[str, Any]], code: int, *,
                      fail_on: str = "error", generated: str | None = None) -> str:
    """`check DIR --html` where DIR holds several runs: the collection's verdict (the worst
    exit), a table of the runs, and one section per run, named by its run id as `check`
    prints it, with that run's verdict, findings, graphs and coverage. Each of `runs`:
    {"run_id", "dirs", "code", "data" (report_dict, None when unusable), "result"}."""
    from mlatrace.output.report_data import summary_line

    generated = generated or time.strftime("%Y-%m-%d %H:%M:%S %Z")
    cls, word = _VERDICT_OF_EXIT.get(code, ("v-fail", "?"))
    rows, sections = [], []
    for i, run in enumerate(runs):
        anchor = f"run-{i + 1}"
        run_cls, run_word = _VERDICT_OF_EXIT.get(run["code"], ("v-fail", "?"))
        data = run["data"]
        counts = data["summary"]["findings"] if data else None
        rows.append([("html", f'<a href="#{anchor}">{esc(run["run_id"])}</a>'),
                     ", ".join(map(str, run["dirs"])),
                     ("html", f'<span class="{run_cls}-text">{esc(run_word)}</span>'),
                     run["code"], "-" if counts is None else counts["error"],
                     "-" if counts is None else counts["warning"]])
        if data is None:
            body = (f'<section class="verdict {run_cls}" data-exit="{run["code"]}">'
                    f"<b>{esc(run_word)}</b><p class=\"sub\">the trace of this run cannot be "
                    "read (mlatrace check says why)</p></section>")
        else:
            result = run["result"]
            far = getattr(getattr(result, "config", None), "far_factor", 8)
            body = run_sections(data, getattr(result, "model", None), fail_on,
                                far if isinstance(far, int) else 8)
            body = _ID.sub(rf"\g<1>r{i + 1}-", body)  # ids unique per run
            body = f'<p class="sub">{esc(summary_line(data))}</p>' + body
        sections.append(f'<section class="run" id="{anchor}" data-run="{esc(run["run_id"])}" '
                        f'data-exit="{run["code"]}"><h2 class="run-head">run '
                        f"{esc(run['run_id'])} <span class=\"sub\">"
                        f"({esc(', '.join(map(str, run['dirs'])))})</span></h2>{body}</section>")
    head = (f"<header><h1>mlatrace check: {len(runs)} runs</h1>"
            f'<p class="sub">collection <code>{esc(where)}</code>, made {esc(generated)}; '
            "every run is judged and the exit is the worst (2, then 1, then 3, then 0)</p>"
            "</header>")
    each = ", ".join(f"run {r['run_id']}: {_VERDICT_OF_EXIT.get(r['code'], ('', '?'))[1]}"
                     for r in runs)
    verdict = (f'<section id="verdict" class="verdict {cls}" data-exit="{code}">'
               f"<b>{esc(word)}: collection of {len(runs)} runs, exit {code}</b>"
               f'<p class="sub">{esc(each)} (--fail-on {esc(fail_on)})</p></section>')
    table = ('<section id="runs"><h2>Runs</h2>'
             + _table(["run", "directories", "verdict", "exit", "errors", "warnings"], rows,
                      {3, 4, 5}) + "</section>")
    body = "".join([head, '<div id="page-errors" hidden></div>', verdict, table, *sections,
                    _footer()])
    return _page(f"mlatrace check: {len(runs)} runs in {where}", body)


def write_collection(path: str, where: str, runs: list[dict[str, Any]], code: int,
                     err: Any, fail_on: str = "error") -> bool:
    """`check DIR --html FILE` of a collection: write its page (atomically), say so on
    stderr; False (the error said) when it cannot be written."""
    return _save_text(path, render_collection(where, runs, code, fail_on=fail_on), err)


def _save_text(path: str, text: str, err: Any) -> bool:
    try:
        size = _write_atomic(path, text.encode("utf-8"))
    except OSError as exc:
        from rich.markup import escape

        err.print(f"[red]error:[/] cannot write {escape(path)}: {exc.strerror or exc}",
                  highlight=False, soft_wrap=True)
        return False
    err.print(f"wrote {path} ({size / 1024:.0f} KiB)", highlight=False, soft_wrap=True,
              markup=False)
    return True


def _write_atomic(path: str | os.PathLike, text: bytes) -> int:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(text)
    os.replace(tmp, target)
    return len(text)


def write_html(path: str | os.PathLike, data: dict[str, Any], model: Any = None,
               **options: Any) -> int:
    """Write the page atomically (a reader never sees half a file); returns its bytes."""
    return _write_atomic(path, render_html(data, model, **options).encode("utf-8"))


def write_report(path: str, data: dict[str, Any], result: Any, **options: Any) -> int:
    """`write_html` for an Analysis (its model and its config's far factor)."""
    config = getattr(result, "config", None)
    far = getattr(config, "far_factor", 8)
    return write_html(path, data, getattr(result, "model", None),
                      far_factor=far if isinstance(far, int) else 8, **options)


def save(path: str, data: dict[str, Any], result: Any, err: Any, **options: Any) -> None:
    """`--html FILE` of report and check: write the page and say so on stderr (`err`, a
    rich console); MlatraceError (exit 2) when it cannot be written."""
    from mlatrace.exitcodes import MlatraceError

    try:
        size = write_report(path, data, result, **options)
    except OSError as exc:
        raise MlatraceError(f"error: cannot write {path}: {exc.strerror or exc}") from None
    err.print(f"wrote {path} ({size / 1024:.0f} KiB)", highlight=False, soft_wrap=True,
              markup=False)


class LivePage:
    """`watch --html FILE`: the page of the watched run, rewritten at each refresh that
    brought a new analysis (and once at the end, without the reload tag)."""

    RELOAD_S = 2

    def __init__(self, path: str) -> None:
        self.path = path
        self.shown: Any = None
        self.error: str | None = None

    def update(self, live: Any, final: bool = False) -> None:
        from mlatrace.output.report_data import report_dict

        analysis = live.analysis
        if analysis is None or (analysis is self.shown and not final):
            return
        self.shown = analysis
        data = report_dict(str(live.roots[0]), analysis, run=live.run_json())
        try:
            write_report(self.path, data, analysis,
                         refresh_s=None if final else self.RELOAD_S)
            self.error = None
        except OSError as exc:  # the view goes on; the reason is kept for the end
            self.error = f"cannot write {self.path}: {exc.strerror or exc}"
