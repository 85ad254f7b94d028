"""The `mlatrace` command line: parses arguments and delegates to one stage module each.

Exit codes (documented in the README; mlatrace.exitcodes.ExitCode): 0 ok / clean,
1 findings at or above the threshold (check) or probe drift (probes doctor), 2 usage
error or unreadable trace, 3 blind (check: the trace cannot support a clean verdict);
`run` passes the traced command's exit code through (128+N when killed by signal N).
A stage ends a command early by raising MlatraceError: `MlatraceGroup` is the one place
that turns it into its line on stderr and its exit code.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from mlatrace.exitcodes import MlatraceError


class MlatraceGroup(click.Group):
    """The `mlatrace` group: a MlatraceError from any command (subgroups included) is one
    line on stderr, no traceback, and the error's exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MlatraceError as error:
            print(error.message, file=sys.stderr)
            sys.exit(error.code)


class OptionError(click.BadParameter):
    """A bad option value, found by the option's click type: click reports it as the one
    line it says (`mlatrace whatif: --lengths ...`), exit 2, without its usage block."""

    def show(self, file: Any = None) -> None:
        print(self.message, file=file or sys.stderr)


class RunOption(click.ParamType):
    """A `run` option checked by `mlatrace.inject.launcher.check_<name>`, which returns
    the value (normalised) or raises MlatraceError with the line to show."""

    name = "text"  # the metavar --help shows, as before

    def __init__(self, check: str) -> None:
        self.check = check

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        from mlatrace.inject import launcher

        try:
            return getattr(launcher, f"check_{self.check}")(value)
        except MlatraceError as error:
            raise OptionError(error.message, ctx=ctx, param=param) from None


class Lengths(click.ParamType):
    """`whatif --lengths 8192,32768`: positive integers ("" is the default: None)."""

    name = "text"  # the metavar --help shows, as before

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> list[int] | None:
        if isinstance(value, list) or value == "":
            return value or None
        try:
            lengths = [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise OptionError("mlatrace whatif: --lengths wants comma-separated integers, "
                              f"got {value!r}", ctx=ctx, param=param) from None
        if not lengths or min(lengths) < 1:
            raise OptionError("mlatrace whatif: --lengths must be positive", ctx=ctx,
                              param=param)
        return lengths


class GraphModes(click.ParamType):
    """`bench overhead --graph full,breakable`: the reference engine's graph modes."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> list[str]:
        if isinstance(value, list):
            return value
        from mlatrace.bench.overhead_bench import GOALS

        modes = [m.strip() for m in value.split(",") if m.strip()]
        if not modes or any(m not in GOALS for m in modes):
            raise OptionError(f"bench overhead: --graph takes {', '.join(GOALS)} "
                              f"(comma-separated), not {value!r}", ctx=ctx, param=param)
        return modes


@click.group(cls=MlatraceGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlatrace", prog_name="mlatrace")
def main() -> None:
    """Record what CUDA-graph capture froze, then report, diff and check it."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "out", default=None,
              help="Trace directory, created if needed (default ./mlatrace-trace/<timestamp>).")
@click.option("--ranks", type=RunOption("ranks"), default=None, show_default="all ranks",
              help="Keep only these ranks' events, e.g. 0 or 0,1.")
@click.option("--probes", "probes", multiple=True,
              type=click.Path(exists=True, dir_okay=False, resolve_path=True),
              help="Extra probe pack (TOML); repeatable.")
@click.option("--replay-sample", type=click.IntRange(min=1), default=None,
              show_default="keep every replay record",
              help="Keep the first N replay records per graph, then 1 in N (process.end "
                   "still counts every replay).")
@click.option("--launch-sample", type=click.IntRange(min=0), default=None,
              help="Eager kernel launches repeating their last grid and constexprs: keep the "
                   "first N in a row (default: --sample's N; 0 keeps all).")
@click.option("--sample", type=click.IntRange(min=0), default=None,
              help="Eager probed calls and launches repeating their last record: keep the "
                   "first N of each run, then count (default 1; 0 keeps every record).")
@click.option("--step-aside", "step_aside", type=RunOption("step_aside"), default=None,
              metavar="SETTLE,VERIFY|0",
              help="Probes whose decode steps are steady look at each step's first call "
                   "only, and at a whole step every VERIFY-th (default 8,64; 0: look at "
                   "every call). process.end counts what was not looked at (unseen).")
@click.option("--replay-timing", type=RunOption("replay_timing"), default=None,
              metavar="N:M|off",
              help="Time replays on the GPU with CUDA events (no sync): the first N replays "
                   "of each graph, then 1 in M (default 8:64; off: none).")
@click.option("--graph-nodes/--no-graph-nodes", default=True,
              help="Dump each captured graph's kernel nodes (capture-time cost only).")
@click.option("--fold", "fold", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Fold steady decode steps into one `steady` record per graph and SECONDS "
                   "(default 10, 1 with --watch; 0: write every step's records).")
@click.option("--max-mb", "max_mb", type=click.FloatRange(min=0), default=None, metavar="N",
              help="Per process file: past N MB keep only captures, changes, errors, folds "
                   "and process.end (default: no cap).")
@click.option("--otlp", default=None, help="Also export spans live to this OTLP/HTTP endpoint.")
@click.option("--no-pack", "disable_packs", multiple=True, metavar="NAME",
              help="Do not install this probe pack (by name, see `probes list`); repeatable.")
@click.option("--watch", "watch", is_flag=True,
              help="Show the live watch view while CMD runs; CMD's output goes to cmd.log "
                   "in the trace dir.")
@click.option("--run-id", "run_id", type=RunOption("run_id"), default=None,
              help="Join a run traced on several hosts: give every host's `mlatrace run` the "
                   "same id (default: a new one; the default --out is then "
                   "./mlatrace-trace/<run-id>/<host>).")
@click.option("-q", "--quiet", is_flag=True,
              help="Print nothing of mlatrace's own when CMD ends (scripts that run many "
                   "traced commands); errors are still printed.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(out: str | None, watch: bool, quiet: bool, cmd: tuple[str, ...],
        **options: Any) -> None:
    """Run CMD with probes in every Python process it starts: mlatrace run -- CMD..."""
    from dataclasses import replace

    from click.core import ParameterSource

    from mlatrace.inject import launcher
    from mlatrace.settings import Settings

    # each option is the Settings field of its name; one not given keeps the default
    ctx = click.get_current_context()
    settings = Settings(**{name: value for name, value in options.items()
                           if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT})
    view = None
    if watch:
        from mlatrace.output.watch.run_view import RunView
        from mlatrace.settings import WATCH_FOLD_S

        view = RunView()
        if ctx.get_parameter_source("fold") is ParameterSource.DEFAULT:
            # the view shows a steady stretch when its fold closes: close folds every
            # WATCH_FOLD_S, not every 10 s (a steady record per graph and second: the
            # trace stays small, and no reader has to peek into the recorder's open fold)
            settings = replace(settings, fold=WATCH_FOLD_S)
    sys.exit(launcher.run(list(cmd), settings, out=out, view=view, quiet=quiet))


@main.command()
@click.argument("trace", type=click.Path(), required=False)
@click.option("--once", is_flag=True, help="Print one snapshot and exit (scripts, tests).")
@click.option("--json", "as_json", is_flag=True,
              help="With --once: the snapshot as JSON (schema mlatrace.watch/1).")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="mlatrace.toml or pyproject.toml with [tool.mlatrace].")
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None,
              help="Keep an HTML report here, rewritten at each refresh.")
def watch(trace: str | None, once: bool, as_json: bool, config: str | None,
          html: str | None) -> None:
    """Findings live while the traced program runs (default: newest run in ./mlatrace-trace)."""
    from mlatrace.output import watch as watch_mod

    sys.exit(watch_mod.main(trace, once=once, config=config, as_json=as_json, html=html))


@main.command()
@click.argument("trace", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema).")
@click.option("-v", "--verbose", is_flag=True, help="Show the evidence of each finding.")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="mlatrace.toml or pyproject.toml with [tool.mlatrace].")
@click.option("--expect", "expect", multiple=True, metavar="KIND",
              help="A record kind (attn.call, ...) or graphs/replays/attention/launches the "
                   "run must contain; the coverage section says whether it did. Repeatable.")
@click.option("--run", "run_id", default=None,
              help="Of several runs under TRACE, this run_id (default: the newest).")
@click.option("--list", "list_runs", is_flag=True,
              help="List the runs under TRACE (run_id, start, argv, hosts, processes).")
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None,
              help="Also write the report as one self-contained HTML file (charts inline).")
def report(trace: tuple[str, ...], as_json: bool, verbose: bool, config: str | None,
           expect: tuple[str, ...], run_id: str | None, list_runs: bool,
           html: str | None) -> None:
    """Summarise a run: processes, coverage, graphs, frozen topology, replays, findings.

    \b
    TRACE: a trace directory, several (one per host), or a parent holding them;
    directories sharing a run_id are one run (a parent of several runs: the
    newest, said on stderr; --list lists them).

    \b
    A capture unit is a root graph and the graphs captured inside it: gid 1>2-4
    in the graphs table is unit 1 (vLLM's wrapper graph, a breakable capture)
    enclosing the torch graphs 2, 3 and 4. The summary's "graphs captured" and
    --json's summary.graphs count units; summary.graphs_total counts every
    graph, nested ones included. Columns that do not fit the terminal are left
    out (the table says which; --json has them all). -v adds the evidence of
    each finding, the frozen details of each graph and the mlatrace.mark()
    annotations.

    Exit codes: 0 a report was made (findings or not), 2 unreadable trace or config.
    """
    from mlatrace.output import report as report_mod

    sys.exit(report_mod.main(list(trace), as_json=as_json, verbose=verbose, config=config,
                             expect=list(expect), run_id=run_id, list_runs=list_runs,
                             html=html))


@main.command()
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema).")
def diff(a: str, b: str, as_json: bool) -> None:
    """Topology differences between two traces (A -> B)."""
    from mlatrace.output import diff as diff_mod

    sys.exit(diff_mod.main(a, b, as_json=as_json))


@main.command()
@click.argument("trace", type=click.Path())
@click.option("--device", type=click.Choice(["cuda"]), default="cuda",
              help="Where to run the reference kernel (a CUDA GPU).")
@click.option("--save", is_flag=True,
              help="Write whatif.json into the trace dir (report's cost estimates use it).")
@click.option("--lengths", type=Lengths(), default=None,
              help="KV lengths to measure, e.g. 8192,32768 "
              "(default: the replays' shortest and longest).")
@click.option("--replays", type=click.IntRange(min=1), default=50,
              help="Graph replays per timing round (3 rounds, the fastest kept).")
@click.option("--json", "as_json", is_flag=True, help="Print the whatif.json object instead.")
def whatif(trace: str, device: str, save: bool, lengths: list[int] | None, replays: int,
           as_json: bool) -> None:
    """Frozen split vs device policy at the trace's shapes, with the reference kernel (GPU)."""
    from mlatrace.output import whatif as whatif_mod

    sys.exit(whatif_mod.main(trace, device=device, save=save, lengths=lengths, replays=replays,
                             as_json=as_json))


@main.command()
@click.argument("trace", nargs=-1, required=True, type=click.Path())
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default=None,
              help="Lowest severity that fails (default: the config's fail_on, else error).")
@click.option("--rule", "rules", multiple=True, help="Only these rule ids (repeatable).")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="mlatrace.toml or pyproject.toml with [tool.mlatrace] (default: the one "
                   "in the current directory, if any).")
@click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Write JUnit XML here.")
@click.option("--expect", "expect", multiple=True, metavar="KIND",
              help="Exit 3 unless the run recorded this: a record kind (attn.call, "
                   "kernel.launch, ...) or graphs, replays, attention, launches. Repeatable; "
                   "adds to `expect = [...]` in the config.")
@click.option("--run", "run_id", default=None,
              help="Of several runs under TRACE, this run_id (default: the newest).")
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None,
              help="Also write the HTML report here (one self-contained file, for CI; "
                   "of several runs, one page with a section per run).")
def check(trace: tuple[str, ...], fail_on: str | None, rules: tuple[str, ...],
          config: str | None, junit: str | None, expect: tuple[str, ...],
          run_id: str | None, html: str | None) -> None:
    """CI verdict over findings and coverage.

    \b
    Exit codes:
      0  clean: no finding at or above --fail-on, and the trace is not blind
      1  a finding at or above --fail-on (takes precedence over 3)
      2  unreadable trace, unknown schema, bad arguments or config
      3  blind: the trace cannot support a clean verdict (a probe.error; vLLM,
         SGLang or AITER in the headers but no graph or attention record; an
         unmet --expect; ranks of the world size missing)
      Exit 2 also when a process header names a schema this mlatrace does not
      know (e.g. mlatrace/9 from a newer mlatrace): no verdict on records it may
      misread; `mlatrace report` still shows a best-effort view.

    TRACE: as for report (several directories of one run, or a parent).

    Output is plain lines, never wrapped: problems (warning: ...), one line per
    finding starting with its id, its evidence and fix, coverage lines, then the
    verdict.
    """
    from mlatrace.output import check as check_mod

    sys.exit(check_mod.main(list(trace), fail_on=fail_on, rules=list(rules), config=config,
                            junit=junit, expect=list(expect), run_id=run_id, html=html))



@main.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False),
              help="The directory to write (must not exist or be empty).")
@click.option("--run", "run_id", default=None,
              help="The run_id to copy; required when DIRS hold several runs (merge "
                   "never picks one of them for you).")
def merge(dirs: tuple[str, ...], out: str, run_id: str | None) -> None:
    """Copy one run's trace directories (one per host) into one directory, for archiving."""
    from mlatrace.trace import merge as merge_mod

    sys.exit(merge_mod.main(list(dirs), out, run_id=run_id))


@main.command()
@click.argument("trace", type=click.Path())
@click.option("--otlp", default=None, help="OTLP endpoint URL.")
@click.option("--protocol", type=click.Choice(["http/protobuf", "grpc"]), default="http/protobuf",
              show_default=True,
              help="OTLP transport: http/protobuf (e.g. http://collector:4318/v1/traces) or "
                   "grpc (collector:4317; needs the gRPC exporter installed).")
@click.option("--service-name", default="mlatrace", show_default=True,
              help="service.name resource attribute of the exported spans.")
@click.option("--perfetto", type=click.Path(dir_okay=False), default=None,
              help="Write Chrome/Perfetto trace-event JSON here.")
def export(trace: str, otlp: str | None, protocol: str, service_name: str,
           perfetto: str | None) -> None:
    """Export a trace to OpenTelemetry (OTLP) and/or a Perfetto timeline."""
    from mlatrace.output import export as export_mod

    sys.exit(export_mod.main(trace, otlp=otlp, protocol=protocol, service_name=service_name,
                             perfetto=perfetto))


@main.group()
def probes() -> None:
    """Probe packs: list them, check them against installed packages."""


PROBES_HELP = "Also load this probe pack (TOML), as `mlatrace run --probes` does; repeatable."


@probes.command("list")
@click.option("--probes", "extra", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help=PROBES_HELP)
def probes_list(extra: tuple[str, ...]) -> None:
    """Packs, probes and their targets."""
    from mlatrace.probe import commands

    sys.exit(commands.list_packs(list(extra)))


@probes.command("doctor")
@click.option("--probes", "extra", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help=PROBES_HELP)
@click.option("--source", type=click.Path(exists=True, file_okay=False),
              help="Check targets statically in this source tree (e.g. unpacked wheels) "
                   "instead of importing them.")
def probes_doctor(extra: tuple[str, ...], source: str | None) -> None:
    """Which targets exist in installed packages and whether signatures match (exit 1 on drift)."""
    from mlatrace.probe import commands

    sys.exit(commands.doctor(list(extra), source=source))


@main.group()
def bench() -> None:
    """Benchmarks; their commands and figures are in docs/benchmarks.md."""


@bench.command("record")
@click.option("--events", type=int, default=500_000, show_default=True,
              help="Events each traced loop records (marks, probed calls).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Alternating traced/untraced runs of each workload (medians are kept).")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None,
              help="Also write the results as JSON to this file.")
def bench_record(events: int, repeats: int, json_out: str | None) -> None:
    """All-in cost per recorded event (mark and a probed call) and the recorder's drops."""
    from mlatrace.bench import record_bench

    sys.exit(record_bench.main(events=events, repeats=repeats, json_out=json_out))


@bench.command("probes")
@click.option("--launches", type=int, default=2000, show_default=True,
              help="Launches (and probed calls) to time.")
def bench_probes(launches: int) -> None:
    """Added cost per eager Triton launch and per probed Python call."""
    from mlatrace.bench import probes_bench

    sys.exit(probes_bench.main(launches=launches))


@bench.command("analyze")
@click.option("--events", type=int, default=1_000_000, show_default=True,
              help="Records in the generated trace.")
@click.option("--incremental", is_flag=True,
              help="Follow the trace through the incremental model (watch) instead.")
def bench_analyze(events: int, incremental: bool) -> None:
    """Time and peak memory of `report` (or of following, --incremental) on a generated trace."""
    from mlatrace.bench import analyze_bench

    sys.exit(analyze_bench.main(events=events, incremental=incremental))


@bench.command("html")
@click.option("--events", type=int, default=1_000_000, show_default=True,
              help="Records in the generated trace.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Alternating runs of each command (the best is kept).")
def bench_html(events: int, repeats: int) -> None:
    """What `report --html` adds to `report` on a generated trace, and the page's size."""
    from mlatrace.bench import html_bench

    sys.exit(html_bench.main(events, repeats))


@bench.command("splits")
@click.option("--out", type=click.Path(file_okay=False), default="bench-splits", show_default=True,
              help="Directory for splits.md, splits.json and splits.png.")
@click.option("--quick", is_flag=True, help="Fewer lengths/iterations (smoke test).")
def bench_splits(out: str, quick: bool) -> None:
    """Per-step decode latency by KV length and split policy, replayed from CUDA graphs (GPU)."""
    from mlatrace.bench import gpu_device_present

    if not gpu_device_present():  # before torch's import, which alone takes seconds
        raise MlatraceError("mlatrace bench splits needs a CUDA GPU (no GPU device on this "
                            "machine)")
    from mlatrace.exitcodes import require_extra

    require_extra("plot", "mlatrace bench splits (splits.png)")
    from mlatrace.bench import splits_bench

    sys.exit(splits_bench.main(out=out, quick=quick))


@bench.command("overhead")
@click.option("--steps", type=int, default=300, show_default=True,
              help="Decode steps per run (at most 40 without CUDA).")
@click.option("--graph", "graph_modes", type=GraphModes(), default="full",
              help="Graph modes of the reference engine, comma-separated: full, breakable, none.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Alternating traced/untraced rounds per graph mode (medians are kept).")
@click.option("--sample", type=click.IntRange(min=0), default=None,
              help="MLATRACE_SAMPLE of the traced runs (default: mlatrace's, 1).")
@click.option("--step-aside", "step_aside", default=None, metavar="SETTLE,VERIFY|0",
              help="`mlatrace run --step-aside` of the traced runs (default: mlatrace's).")
@click.option("--in-process", is_flag=True,
              help="One traced process per mode, alternating blocks of steps with the probes "
                   "at work and without them (immune to host drift between runs).")
@click.option("--baseline", type=click.Choice(["unpatched", "passthrough"]),
              default="unpatched", show_default=True,
              help="With --in-process, the steps without probes: every patch taken off "
                   "(traced vs untraced), or the wrappers passing calls through (the "
                   "probes' work beyond bare wrappers).")
@click.option("--host-only", is_flag=True,
              help="With --in-process: drop the device work, leaving the step's Python.")
@click.option("--layers", type=click.IntRange(min=1), default=16, show_default=True,
              help="With --in-process: decoder layers of the model (32 and 61 are real "
                   "model shapes).")
@click.option("--json-out", type=click.Path(dir_okay=False), default="bench-overhead.json",
              help="Where the JSON summary goes.")
def bench_overhead(steps: int, graph_modes: list[str], rounds: int, sample: int | None,
                   step_aside: str | None, in_process: bool, baseline: str, host_only: bool,
                   layers: int, json_out: str) -> None:
    """Decode step time, traced vs untraced, per graph mode (GPU time and wall)."""
    from mlatrace.bench import overhead_bench

    sys.exit(overhead_bench.main(steps=steps, graphs=graph_modes, rounds=rounds,
                                 sample=sample, json_out=json_out, in_process=in_process,
                                 host_only=host_only, step_aside=step_aside,
                                 baseline=baseline, layers=layers))


@main.command()
@click.option("--policy", type=click.Choice(["legacy", "bucketed", "device"]), default="legacy",
              show_default=True,
              help="KV-split policy of the reference decode: legacy (AITER's host formula, "
                   "frozen at capture: MLT001), bucketed, or device (derived on the GPU: "
                   "no finding).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              show_default="a temporary directory, removed at the end",
              help="Keep the trace in this directory.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Where the reference decode runs (auto: CUDA if available).")
def demo(policy: str, out: str | None, device: str) -> None:
    """Trace the bundled reference decode program and print its report."""
    from mlatrace.reference import demo as demo_mod

    sys.exit(demo_mod.main(policy=policy, out=out, device=device))


if __name__ == "__main__":
    main()
