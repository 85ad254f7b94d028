"""The JSON encoders of the trace writer: msgspec at add time where it imports, stdlib
json (one C encoder built once) on the flush thread otherwise. Stdlib only (and msgspec)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from mlatrace.settings import current

YIELD_EVERY_RECORDS = 64    # the flush thread hands the GIL back this often when it encodes


def json_default(obj: object) -> object:
    """Encode what json cannot: tuples come as lists already; others as a short repr."""
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, bytes):
        return obj.decode(errors="replace")
    for cast in (int, float):
        try:
            return cast(obj)  # numpy scalars, torch.Size items, enums with int values
        except Exception:
            pass
    return repr(obj)[:200]


# Built once: json.dumps with non-default arguments builds an encoder per call.
ENCODER = json.JSONEncoder(separators=(",", ":"), default=json_default)


def fast_encoder() -> Callable[[Any], str] | None:
    """ENCODER.encode without its per-call set-up: one C encoder made once, reused.

    JSONEncoder.encode builds a new C encoder (and a circular-reference table) for
    every record; this one is built once, without the table (a circular record raises
    RecursionError here, and the caller then encodes it with ENCODER, which gives the
    error it always gave). None when the C encoder is missing or its output differs.
    """
    try:
        from json.encoder import c_make_encoder, encode_basestring_ascii

        if c_make_encoder is None:
            return None
        make = c_make_encoder(None, json_default, encode_basestring_ascii, None, ":", ",",
                              False, False, True)
        join = "".join

        def encode(obj: Any) -> str:
            return join(make(obj, 0))

        sample = {"k": "x\u00e9\n", "t": 1, "a": [1, 2.5, None, True, False, (3, 4)],
                  "b": {"c": float("inf"), "d": {}}, "e": {2, 1}, "f": b"x", "g": object}
        if encode(sample) != ENCODER.encode(sample):
            return None
        return encode
    except Exception:
        return None


FAST_ENCODE = fast_encoder()


def msgspec_encoder() -> Callable[[Any], bytes] | None:
    """msgspec's JSON encoder (a fraction of a microsecond per record), when it imports.

    Types msgspec does not know go through the same default as the json path.
    """
    try:
        import msgspec

        return msgspec.json.Encoder(enc_hook=json_default).encode
    except Exception:
        return None


# msgspec encodes at add time (see Recorder.add); without it records are queued as dicts
# and the flush thread encodes them with stdlib json, while the program is in GIL-free
# calls (a CUDA launch, say): the C encoder costs a few us per record, too much for the
# hot path of a traced GPU program.
ENCODE_NOW = msgspec_encoder()


def encode_now() -> Callable[[Any], bytes] | None:
    """The add-time encoder of a new recorder: msgspec's, unless MLATRACE_JSON=stdlib."""
    return ENCODE_NOW if current().json != "stdlib" else None


def encode_line(record: dict) -> str:
    """One record as a JSON line (raises as ENCODER.encode does)."""
    if FAST_ENCODE is not None:
        try:
            return FAST_ENCODE(record)
        except Exception:
            pass
    return ENCODER.encode(record)


def line_of(record: dict) -> str:
    """A record's JSON line; a record.error line (same t/seq/tid) if it cannot be encoded."""
    try:
        return encode_line(record)
    except Exception as exc:  # keep seq so the reader does not see a phantom drop
        return json.dumps({"k": "record.error", "t": record.get("t", 0),
                           "seq": record.get("seq", 0), "tid": record.get("tid", 0),
                           "kind": str(record.get("k")), "error": repr(exc)[:200]})


def lines_bytes(records: list) -> bytes:
    """Queued records as the file's bytes: JSON bytes lines (msgspec) as they are, dicts
    through the json path, the GIL handed back every YIELD_EVERY_RECORDS dicts (the
    traced program never waits on encoding)."""
    try:
        return b"\n".join(records) + b"\n"       # all bytes: the common case
    except TypeError:
        pass
    parts = []
    for i, item in enumerate(records):
        if type(item) is bytes:
            parts.append(item)
            continue
        if i and not i % YIELD_EVERY_RECORDS:
            time.sleep(0)
        parts.append(line_of(item).encode())
    return b"\n".join(parts) + b"\n"
