"""The `mlatrace` command line: parses arguments and delegates to one stage module each.

Exit codes (documented in the README): 0 ok / clean, 1 findings at or above the
threshold (check) or probe drift (probes doctor), 2 usage error or unreadable trace;
`run` passes the traced command's exit code through (128+N when killed by signal N).
"""

from __future__ import annotations

import sys

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlatrace", prog_name="mlatrace")
def main() -> None:
    """Record what CUDA-graph capture froze, then report, diff and check it."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Trace directory (default ./mlatrace-trace/<timestamp>).")
@click.option("--ranks", default=None, help="Keep only these ranks' events, e.g. 0 or 0,1.")
@click.option("--probes", "probes", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Extra probe pack (TOML); repeatable.")
@click.option("--replay-sample", type=click.IntRange(min=1), default=None,
              help="Keep the first N replay records per graph, then 1 in N.")
@click.option("--launch-sample", type=click.IntRange(min=0), default=None,
              help="Eager kernel launches repeating their last grid and constexprs: keep the "
                   "first N in a row, then 1 in N (default 8; 0 keeps all).")
@click.option("--graph-nodes/--no-graph-nodes", default=True,
              help="Dump each captured graph's kernel nodes (capture-time cost only).")
@click.option("--otlp", default=None, help="Also export spans live to this OTLP/HTTP endpoint.")
@click.option("--run-id", "run_id", default=None,
              help="Join a run traced on several hosts: give every host's `mlatrace run` the "
                   "same id (default: a new one; the default --out is then "
                   "./mlatrace-trace/<run-id>/<host>).")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(out: str | None, ranks: str | None, probes: tuple[str, ...], replay_sample: int | None,
        launch_sample: int | None, graph_nodes: bool, otlp: str | None, run_id: str | None,
        cmd: tuple[str, ...]) -> None:
    """Run CMD with probes in every Python process it starts: mlatrace run -- CMD..."""
    from mlatrace.inject import launcher

    sys.exit(launcher.run(list(cmd), out=out, ranks=ranks, probes=list(probes),
                          replay_sample=replay_sample, launch_sample=launch_sample,
                          graph_nodes=graph_nodes, otlp=otlp, run_id=run_id))


@main.command()
@click.argument("trace", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema).")
@click.option("-v", "--verbose", is_flag=True, help="Show the evidence of each finding.")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="mlatrace.toml or pyproject.toml with [tool.mlatrace].")
@click.option("--run", "run_id", default=None,
              help="Of several runs under TRACE, this run_id (default: the newest).")
@click.option("--list", "list_runs", is_flag=True,
              help="List the runs under TRACE (run_id, start, argv, hosts, processes).")
def report(trace: tuple[str, ...], as_json: bool, verbose: bool, config: str | None,
           run_id: str | None, list_runs: bool) -> None:
    """Summarise a run: processes, graphs, frozen topology, replays, findings.

    TRACE: a trace directory, several (one per host), or a parent holding them;
    directories sharing a run_id are one run."""
    from mlatrace import report as report_mod

    sys.exit(report_mod.main(list(trace), as_json=as_json, verbose=verbose, config=config,
                             run_id=run_id, list_runs=list_runs))


@main.command()
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def diff(a: str, b: str, as_json: bool) -> None:
    """Topology differences between two traces (A -> B)."""
    from mlatrace import diff as diff_mod

    sys.exit(diff_mod.main(a, b, as_json=as_json))


@main.command()
@click.argument("trace", nargs=-1, required=True, type=click.Path())
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default=None,
              help="Lowest severity that fails (default: the config's fail_on, else error).")
@click.option("--rule", "rules", multiple=True, help="Only these rule ids (repeatable).")
@click.option("--config", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Write JUnit XML here.")
@click.option("--run", "run_id", default=None,
              help="Of several runs under TRACE, this run_id (default: the newest).")
def check(trace: tuple[str, ...], fail_on: str | None, rules: tuple[str, ...],
          config: str | None, junit: str | None, run_id: str | None) -> None:
    """CI verdict: exit 0 clean, 1 findings at/above --fail-on, 2 unreadable trace.

    TRACE: as for report (several directories of one run, or a parent)."""
    from mlatrace import check as check_mod

    sys.exit(check_mod.main(list(trace), fail_on=fail_on, rules=list(rules), config=config,
                            junit=junit, run_id=run_id))


@main.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False),
              help="The directory to write (must not exist or be empty).")
@click.option("--run", "run_id", default=None,
              help="Of several runs under DIRS, this run_id (default: the newest).")
def merge(dirs: tuple[str, ...], out: str, run_id: str | None) -> None:
    """Copy one run's trace directories (one per host) into one directory, for archiving."""
    from mlatrace.trace import merge as merge_mod

    sys.exit(merge_mod.main(list(dirs), out, run_id=run_id))


@main.command()
@click.argument("trace", type=click.Path())
@click.option("--otlp", default=None, help="OTLP endpoint URL.")
@click.option("--protocol", type=click.Choice(["http/protobuf", "grpc"]), default="http/protobuf")
@click.option("--service-name", default="mlatrace")
@click.option("--perfetto", type=click.Path(dir_okay=False), default=None,
              help="Write Chrome/Perfetto trace-event JSON here.")
def export(trace: str, otlp: str | None, protocol: str, service_name: str,
           perfetto: str | None) -> None:
    """Export a trace to OpenTelemetry (OTLP) and/or a Perfetto timeline."""
    from mlatrace import export as export_mod

    sys.exit(export_mod.main(trace, otlp=otlp, protocol=protocol, service_name=service_name,
                             perfetto=perfetto))


@main.group()
def probes() -> None:
    """Probe packs: list them, check them against installed packages."""


@probes.command("list")
@click.option("--probes", "extra", multiple=True, type=click.Path(exists=True, dir_okay=False))
def probes_list(extra: tuple[str, ...]) -> None:
    """Packs, probes and their targets."""
    from mlatrace.probe import commands

    sys.exit(commands.list_packs(list(extra)))


@probes.command("doctor")
@click.option("--probes", "extra", multiple=True, type=click.Path(exists=True, dir_okay=False))
def probes_doctor(extra: tuple[str, ...]) -> None:
    """Which targets exist in installed packages and whether signatures match (exit 1 on drift)."""
    from mlatrace.probe import commands

    sys.exit(commands.doctor(list(extra)))


@main.group()
def bench() -> None:
    """Benchmarks whose results the README records."""


@bench.command("record")
@click.option("--events", type=int, default=200_000)
def bench_record(events: int) -> None:
    """Recorder cost per event and traced/untraced ratio of a probed tight loop."""
    from mlatrace.bench import record_bench

    sys.exit(record_bench.main(events=events))


@bench.command("probes")
@click.option("--launches", type=int, default=2000)
def bench_probes(launches: int) -> None:
    """Added cost per eager Triton launch and per probed Python call."""
    from mlatrace.bench import probes_bench

    sys.exit(probes_bench.main(launches=launches))


@bench.command("analyze")
@click.option("--events", type=int, default=1_000_000)
def bench_analyze(events: int) -> None:
    """Time and peak memory of `report` on a generated trace."""
    from mlatrace.bench import analyze_bench

    sys.exit(analyze_bench.main(events=events))


@bench.command("splits")
@click.option("--out", type=click.Path(file_okay=False), default="bench-splits")
@click.option("--quick", is_flag=True, help="Fewer lengths/iterations (smoke test).")
def bench_splits(out: str, quick: bool) -> None:
    """Per-step decode latency by KV length and split policy, replayed from CUDA graphs (GPU)."""
    from mlatrace.bench import splits_bench

    sys.exit(splits_bench.main(out=out, quick=quick))


@bench.command("overhead")
@click.option("--steps", type=int, default=200)
def bench_overhead(steps: int) -> None:
    """Decode step time under graph replay, traced vs untraced (GPU)."""
    from mlatrace.bench import overhead_bench

    sys.exit(overhead_bench.main(steps=steps))


@main.command()
@click.option("--policy", type=click.Choice(["legacy", "bucketed", "device"]), default="legacy")
@click.option("--out", type=click.Path(file_okay=False), default=None)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto")
def demo(policy: str, out: str | None, device: str) -> None:
    """Trace the bundled reference decode program and print its report."""
    from mlatrace.reference import demo as demo_mod

    sys.exit(demo_mod.main(policy=policy, out=out, device=device))


if __name__ == "__main__":
    main()
