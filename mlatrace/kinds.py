"""The record kinds of a trace (the `k` field) and what each one is to every stage, declared
once: the writer, the reader, the builder, the exports and `--expect` read their sets of
kinds from here (docs/trace-format.md describes each record's fields).

Adding a kind: one `_declare` line here, the code that writes it, its section of
docs/trace-format.md, and a builder handler when the analysis reads it.
tests/test_kinds.py fails when a table of the reader, the builder or the exports names a
kind this module does not declare, or misses one it declares.

Standard library only: every traced process imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass

COMMON_FIELDS = {
    "k": "the record kind",
    "t": "int ns since the process header (a monotonic clock)",
    "seq": "per-process sequence number, strictly increasing: a gap means records were "
           "dropped (the writer's queue was full)",
    "tid": "the Python thread id",
}
"""The fields the recorder adds to every record, first on its line."""


@dataclass(frozen=True)
class Kind:
    """One record kind and its properties (all off unless declared)."""

    name: str
    doc: str
    step: bool = False        # written once per decode step: where a step starts (fold, sampling)
    folds: bool = False       # record/fold.py may stand it for a `steady` record
    fold_passes: bool = False  # written as it comes in a fold, never ending it
    at_cap: bool = False      # kept past `run --max-mb` (record/recorder.py)
    typed: bool = False       # read as a trace.typed.Record, not a dict (the builder's hot kinds)
    checked: bool = False     # the reader checks its fields (trace/validate.py CHECKS)
    built: bool = False       # the builder reads it (analysis/process_builder.py handlers)
    perfetto: bool = False    # a shape of its own in Perfetto (else an instant on its thread)
    otlp: bool = False        # read by the OTLP span builder (else an event of its span)


KINDS: dict[str, Kind] = {}
"""Every kind of schema mlatrace/1, by name."""


def _declare(name: str, doc: str, **properties: bool) -> str:
    KINDS[name] = Kind(name, doc, **properties)
    return name


PROCESS = _declare("process", "the header, first line of every file",
                   at_cap=True, built=True, perfetto=True, otlp=True)
PROCESS_RANK = _declare("process.rank", "the rank, learned after start",
                        at_cap=True, built=True, otlp=True)
PROCESS_INFO = _declare("process.info", "rank and world size, as process.rank (an older "
                        "name, still read)", at_cap=True, built=True)
PROCESS_END = _declare("process.end", "the last line: counts, drops, coverage",
                       at_cap=True, built=True, perfetto=True, otlp=True)
PROBE_ERROR = _declare("probe.error", "a probe that failed and stepped aside",
                       at_cap=True, built=True, otlp=True)
RECORD_ERROR = _declare("record.error", "a record that could not be encoded", at_cap=True)
DEVICE = _declare("device", "one GPU: name, arch, SM count",
                  at_cap=True, checked=True, built=True)
CAPTURE_BEGIN = _declare("graph.capture.begin", "a CUDA graph capture starts",
                         at_cap=True, built=True, perfetto=True, otlp=True)
CAPTURE_END = _declare("graph.capture.end", "a CUDA graph capture ends",
                       at_cap=True, built=True, perfetto=True, otlp=True)
GRAPH_NODES = _declare("graph.nodes", "the kernel nodes a capture froze",
                       at_cap=True, checked=True, built=True, otlp=True)
EAGER_BREAK = _declare("graph.eager_break", "a piecewise graph's eager split point",
                       at_cap=True, otlp=True)
REPLAY = _declare("graph.replay", "one replay of a captured graph",
                  folds=True, typed=True, built=True, perfetto=True, otlp=True)
REPLAY_TIME = _declare("graph.replay.time", "the GPU time of one replay",
                       fold_passes=True, typed=True, built=True, perfetto=True, otlp=True)
DISPATCH = _declare("dispatch", "the runtime choice of a graph (or eager)",
                    step=True, folds=True, typed=True, built=True, otlp=True)
ATTN_METADATA = _declare("attn.metadata", "one attention metadata build (per step)",
                         step=True, folds=True, typed=True, built=True, perfetto=True,
                         otlp=True)
ATTN_CALL = _declare("attn.call", "one attention forward call",
                     folds=True, built=True, otlp=True)
KERNEL_LAUNCH = _declare("kernel.launch", "one Triton kernel launch: grid, constexprs",
                         folds=True, built=True, otlp=True)
KERNEL_SPLIT = _declare("kernel.split", "a split-KV decision (num_kv_splits)",
                        folds=True, built=True, otlp=True)
KERNEL_SKIP = _declare("kernel.skip", "a kernel stage that did not run (stage 2 skipped)",
                       at_cap=True, built=True, otlp=True)
SYNC = _declare("sync", "a host-device synchronization", at_cap=True, built=True, otlp=True)
HOST_DECISION = _declare("host.decision", "a value the host computed that kernels use",
                         folds=True, built=True)
MARK = _declare("mark", "a user annotation (mlatrace.mark)", at_cap=True, built=True, otlp=True)
STEADY = _declare("steady", "steady decode steps folded into one record",
                  at_cap=True, checked=True, built=True, perfetto=True, otlp=True)
SAMPLE_RUN = _declare("sample.run", "the end of a sampled run of eager records",
                      fold_passes=True)
RUNNER_DUMMY_RUN = _declare("runner.dummy_run", "vLLM's warm-up run (a probe pack's kind)",
                            built=True)
RUNNER_CAPTURE_MODEL = _declare("runner.capture_model", "vLLM's capture of every batch size "
                                "(a probe pack's kind)")
RUNNER_WARMUP = _declare("runner.warmup", "transformers' pre-capture of batch shapes "
                         "(a probe pack's kind)")
RAY_INIT = _declare("ray.init", "ray.init in a traced driver")
RAY_WORKER = _declare("ray.worker", "the Ray worker a traced process is")


def _having(prop: str) -> frozenset[str]:
    return frozenset(name for name, kind in KINDS.items() if getattr(kind, prop))


ALL = frozenset(KINDS)
STEP = _having("step")
FOLDS = _having("folds")
FOLD_PASSES = _having("fold_passes")
AT_CAP = _having("at_cap")
TYPED = _having("typed")
CHECKED = _having("checked")
BUILT = _having("built")
PERFETTO_OWN = _having("perfetto")
OTLP_OWN = _having("otlp")
