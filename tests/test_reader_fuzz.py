"""Random and mutated lines through the reader, the model and the report: never a crash."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlatrace.analysis import analyze
from mlatrace.output.diff import diff_dict
from mlatrace.output.report import report_dict
from mlatrace.trace import open_trace
from mlatrace.trace.typed import TYPED_KINDS, to_record

FIXTURE = Path(__file__).parent / "fixtures" / "legacy_one_split" / "p1000.jsonl"
VALID = FIXTURE.read_text().splitlines()
KINDS = ["process", "graph.capture.begin", "graph.capture.end", "graph.replay", "graph.nodes",
         "attn.metadata", "attn.call", "kernel.split", "kernel.launch", "kernel.skip", "sync",
         "dispatch", "process.end", "process.rank", "mark", "unknown.kind"]
FIELDS = ["gid", "parent", "n", "gpu_ns", "seq_len_max", "seq_len_min", "ptrs", "hints", "op",
          "layer", "capturing", "num_kv_splits", "block_n", "const", "grid", "kernels", "replays",
          "rank", "mode", "key", "name", "policy", "min_kv_seq_len", "tid", "where"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=8)


@st.composite
def records(draw):
    record = {"k": draw(st.sampled_from(KINDS)), "t": draw(st.integers(0, 10**6)),
              "seq": draw(st.integers(-2, 60)), "tid": draw(st.sampled_from([1, 2, None, "x"]))}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=6)):
        record[name] = draw(json_values)
    return json.dumps(record)


def mutate(line: str, data) -> str:
    choice = data.draw(st.integers(0, 3))
    if choice == 0:  # cut
        return line[: data.draw(st.integers(0, len(line)))]
    if choice == 1:  # flip one character
        i = data.draw(st.integers(0, max(0, len(line) - 1)))
        return line[:i] + data.draw(st.sampled_from(["{", "}", '"', ",", "0", "x", "\x00"])) + line[i + 1:]
    if choice == 2:  # change one field's value
        try:
            record = json.loads(line)
        except ValueError:
            return line
        key = data.draw(st.sampled_from(sorted(record)))
        record[key] = data.draw(json_values)
        return json.dumps(record)
    return line


def analyse_lines(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "p1000.jsonl").write_text("\n".join(lines) + ("\n" if lines else ""))
        result = analyze(open_trace(root))
        report_dict(str(root), result)
        diff_dict("a", result, "b", result)
        for finding in result.findings:
            assert finding.evidence


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), max_size=25))
def test_random_records_never_crash(lines):
    analyse_lines(lines)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_valid_trace_never_crashes(data):
    lines = list(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = mutate(lines[i], data)
    analyse_lines(lines)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=10))
def test_random_bytes_never_crash(chunks):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "p5.jsonl").write_bytes(b"\n".join(chunks))
        result = analyze(open_trace(root))
        report_dict(str(root), result)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_chunk_reader_equals_the_line_by_line_checks(data):
    """The fast path (whole chunks decoded and checked at once) hands out exactly the
    records, problems, gaps, drops and end of the per-line checks, wherever chunks are cut:
    mutated lines, blank lines, repeated and jumping seqs (before process.end too), an
    unended last line."""
    import io

    from mlatrace.trace import reader as trace_mod

    lines = list(VALID)
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = mutate(lines[i], data)
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        choice = data.draw(st.integers(0, 2))
        if choice == 0:
            lines.insert(i, data.draw(st.sampled_from(
                ["", "  ", "[1]", '{"k":"x"}{"k":"y"}', '{"k":"x","t":1,"seq":1},{"k":"x","t":1,"seq":2}'])))
        elif choice == 1:  # a line written twice: its seq is not after the last
            lines.insert(i + 1, lines[i])
        else:  # a seq jump: records dropped by the writer
            jump = data.draw(st.integers(1, 5))
            lines[i:] = [_shift_seq(line, jump) for line in lines[i:]]
    blob = ("\n".join(lines) + ("\n" if data.draw(st.booleans()) else "")).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p1000.jsonl"
        path.write_bytes(blob)
        by_line = trace_mod.ProcessFile(path, [])
        by_line.read_header()
        expected = list(by_line.checked_lines(enumerate(io.BytesIO(blob), start=1)))
        chunked = trace_mod.ProcessFile(path, [])
        chunked.read_header()
        typed = trace_mod.ProcessFile(path, [])  # the builder's reads: Records for some kinds
        typed.read_header()
        old = trace_mod.DECODE_BYTES
        trace_mod.DECODE_BYTES = data.draw(st.integers(1, 400))
        try:
            got = [r for chunk in chunked.record_chunks() for r in chunk]
            got_typed = [r for chunk in typed.record_chunks(typed=True) for r in chunk]
        finally:
            trace_mod.DECODE_BYTES = old
    assert got == expected
    assert list(map(str, chunked.problems)) == list(map(str, by_line.problems))
    assert (chunked.gaps, chunked.dropped, chunked.records_read, chunked.end) == \
        (by_line.gaps, by_line.dropped, by_line.records_read, by_line.end)
    assert got_typed == [to_record(r) if type(r["k"]) is str and r["k"] in TYPED_KINDS else r
                         for r in expected]
    assert list(map(str, typed.problems)) == list(map(str, by_line.problems))
    assert (typed.gaps, typed.dropped, typed.records_read, typed.end) == \
        (by_line.gaps, by_line.dropped, by_line.records_read, by_line.end)


def _shift_seq(line: str, jump: int) -> str:
    try:
        record = json.loads(line)
        record["seq"] += jump
    except (ValueError, TypeError, KeyError, IndexError):
        return line
    return json.dumps(record)
