"""The record kinds of a trace (the `k` field; docs/trace-format.md describes each).

One name per kind, for the code that writes, reads, checks or exports records: a kind
spelled here is spelled the same everywhere.
"""

from __future__ import annotations

PROCESS = "process"                          # the header, first line of every file
PROCESS_RANK = "process.rank"                # the rank, learned after start
PROCESS_INFO = "process.info"
PROCESS_END = "process.end"                  # the last line: counts, drops, coverage
PROBE_ERROR = "probe.error"
RECORD_ERROR = "record.error"                # a record that could not be encoded
DEVICE = "device"                            # one GPU: name, arch, SM count
CAPTURE_BEGIN = "graph.capture.begin"
CAPTURE_END = "graph.capture.end"
GRAPH_NODES = "graph.nodes"                  # the kernel nodes a capture froze
EAGER_BREAK = "graph.eager_break"            # a piecewise graph's eager split point
REPLAY = "graph.replay"
REPLAY_TIME = "graph.replay.time"            # the GPU time of one replay
DISPATCH = "dispatch"                        # the runtime choice of a graph (or eager)
ATTN_METADATA = "attn.metadata"              # one attention metadata build (per step)
ATTN_CALL = "attn.call"
KERNEL_LAUNCH = "kernel.launch"
KERNEL_SPLIT = "kernel.split"
KERNEL_SKIP = "kernel.skip"
SYNC = "sync"                                # a host-device synchronization
HOST_DECISION = "host.decision"
MARK = "mark"                                # a user annotation (mlatrace.mark)
STEADY = "steady"                            # steady decode steps folded into one record
SAMPLE_RUN = "sample.run"                    # the end of a sampled run of eager records
RUNNER_DUMMY_RUN = "runner.dummy_run"           # vLLM's warm-up run (a probe pack's kind)
RUNNER_CAPTURE_MODEL = "runner.capture_model"   # vLLM's capture of every batch size
RUNNER_WARMUP = "runner.warmup"                 # transformers' pre-capture of batch shapes
RAY_INIT = "ray.init"
RAY_WORKER = "ray.worker"

ALL = frozenset({
    PROCESS, PROCESS_RANK, PROCESS_INFO, PROCESS_END, PROBE_ERROR, RECORD_ERROR, DEVICE,
    CAPTURE_BEGIN, CAPTURE_END, GRAPH_NODES, EAGER_BREAK, REPLAY, REPLAY_TIME, DISPATCH,
    ATTN_METADATA, ATTN_CALL, KERNEL_LAUNCH, KERNEL_SPLIT, KERNEL_SKIP, SYNC, HOST_DECISION,
    MARK, STEADY, SAMPLE_RUN, RUNNER_DUMMY_RUN, RUNNER_CAPTURE_MODEL, RUNNER_WARMUP, RAY_INIT,
    RAY_WORKER,
})
