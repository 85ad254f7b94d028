"""Typed records: the most frequent kinds decoded into one slotted type, for the builder.

A decode step writes a `dispatch`, an `attn.metadata` and one or two `graph.replay`
records, and the builder reads a few fields of each. Decoding such a line into a
`Record` (msgspec skips the fields it does not name) takes about half the time of
building its dict, freeing it is cheaper, and the builder reads attributes instead of
looking keys up. The reader hands out `Record`s only when asked (`typed=True`: the
builder's reads); every other consumer keeps the dicts of the whole records.

`TYPED_KINDS` come as `Record`s, every other kind as its dict, whatever the codec:
with msgspec a piece's lines are decoded at once (one JSON array) into `Record`s and a
line of another kind is decoded again into its dict; with the stdlib's json (msgspec
absent) the dicts of the typed kinds are turned into `Record`s. A field a line does not
carry reads None, as `dict.get` would, so code that reads a stored record (the rules,
the view) reads both forms alike (`get`).
"""

from __future__ import annotations

from typing import Any

from mlatrace.kinds import TYPED

TYPED_KINDS = TYPED

# the fields the builder and the rules read of the typed kinds (besides k, t, seq)
RECORD_FIELDS = ("tid", "gid", "n", "gpu_ns", "capturing", "backend", "layer", "seq_len_min",
                 "seq_len_max", "num_reqs", "max_query_len", "num_tokens", "ptrs", "via",
                 "max_model_len",  # max_model_len: a failed capture's sizes (report)
                 "mode", "key", "uniform")


def _get(self: Any, name: str, default: Any = None) -> Any:
    """`dict.get` of a record: None fields (absent from the line) give `default`."""
    value = getattr(self, name, None)
    return default if value is None else value


try:
    import msgspec

    # gc=False: a record holds no reference back to anything that could hold it (its
    # only containers are its own ptrs dict), so the collector never needs to track it
    Record: Any = msgspec.defstruct(
        "Record", [("k", Any), ("t", int), ("seq", int),
                   *((name, Any, None) for name in RECORD_FIELDS)],
        gc=False, namespace={"get": _get}, module=__name__)
    decode_records: Any = msgspec.json.Decoder(list[Record]).decode  # a JSON array of them
except ImportError:  # pragma: no cover - exercised where msgspec is absent (see tests)
    from dataclasses import make_dataclass

    Record = make_dataclass("Record", [("k", Any), ("t", int), ("seq", int),
                                       *((name, Any, None) for name in RECORD_FIELDS)],
                            namespace={"get": _get}, slots=True)
    Record.__module__ = __name__
    decode_records = None


def to_record(rec: dict[str, Any]) -> Any:
    """The `Record` of a record's dict (fields it lacks read None)."""
    return Record(*map(rec.get, _ALL_FIELDS))


_ALL_FIELDS = ("k", "t", "seq", *RECORD_FIELDS)


__all__ = ["RECORD_FIELDS", "TYPED_KINDS", "Record", "decode_records", "to_record"]
