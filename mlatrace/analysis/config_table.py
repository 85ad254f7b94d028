"""The `[tool.mlatrace]` table as one msgspec Struct: the types and ranges of every key,
each constraint's description the words of its error. Imported when a config is read
(msgspec is a core dependency, but the readers run without it: the H200 image)."""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Literal, get_args, get_type_hints

import msgspec

from mlatrace.analysis.config import ConfigError, _where

UNSET = msgspec.UNSET


def _must(what: str, **constraints: Any) -> Any:
    """A msgspec constraint with the words that say it in an error (`... must be WHAT`)."""
    return msgspec.Meta(description=what, **constraints)


PositiveInt = Annotated[int, _must("a positive integer", ge=1)]


class Table(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One `[tool.mlatrace]` table as written: types and ranges checked by msgspec, the
    rule ids, allow entries and expectations by `config_from_dict` (they need the rule
    registry, the kinds and a "did you mean")."""

    long_len_factor: PositiveInt = 8
    default_block_n: PositiveInt = 64
    far_factor: PositiveInt = 8
    far_min_len: PositiveInt = 256
    fail_on: Annotated[Literal["error", "warning"], _must("'error' or 'warning'")] = "error"
    disable: Annotated[list[str], _must("a list of rule ids")] = []
    allow: Annotated[list[dict[str, Any]], _must(
        'a list of tables, e.g. [{rule = "MLT006", key = "..."}]')] = []
    expect: Annotated[list[str], _must(
        'a list of record kinds, e.g. ["graphs", "attn.call"]')] = []
    underfill_fraction: Annotated[float, _must("a positive number up to 1", gt=0, le=1)] \
        | msgspec.UnsetType = msgspec.UNSET
    growth_factor: Annotated[float, _must("a positive number", gt=0)] \
        | msgspec.UnsetType = msgspec.UNSET
    error_growth_factor: Annotated[float, _must("a positive number", gt=0)] \
        | msgspec.UnsetType = msgspec.UNSET
    min_timed_replays: Annotated[int, _must("an integer >= 2", ge=2)] \
        | msgspec.UnsetType = msgspec.UNSET
    attention_names: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], _must(
        'a non-empty list of strings, e.g. ["attn", "mla"]', min_length=1)] \
        | msgspec.UnsetType = msgspec.UNSET
    graph_eager_share: Annotated[float, _must("a share from 0 up to (not including) 1",
                                              ge=0, lt=1)] | msgspec.UnsetType = msgspec.UNSET
    graph_padding_share: Annotated[float, _must("a share from 0 up to (not including) 1",
                                                ge=0, lt=1)] | msgspec.UnsetType = msgspec.UNSET
    graph_min_steps: Annotated[int, _must("a positive integer", ge=1)] \
        | msgspec.UnsetType = msgspec.UNSET


KNOWN_KEYS = Table.__struct_fields__


def _what(key: str) -> str:
    """The words of `key`'s constraint (its msgspec.Meta description)."""
    hint = get_type_hints(Table, include_extras=True)[key]
    for arg in (hint, *get_args(hint)):
        for meta in getattr(arg, "__metadata__", ()):
            if getattr(meta, "description", None):
                return meta.description
    return "valid"


def checked_table(table: dict, source: str | None) -> Table:
    """`table` as a Table, or ConfigError `file:line: key must be ..., got value`."""
    try:
        return msgspec.convert(table, Table)
    except msgspec.ValidationError as exc:
        text = str(exc)
    unknown = re.search(r"unknown field `([^`]+)`", text)
    if unknown:  # a mistyped key would silently leave its default in force
        key = unknown[1]
        close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{_where(source, key)}: unknown key {key!r}{hint}; the keys are "
                          f"{', '.join(KNOWN_KEYS)}") from None
    at = re.search(r"at `\$\.(\w+)", text)
    key = at[1] if at else "?"
    raise ConfigError(f"{_where(source, key)}: {key} must be {_what(key)}, got "
                      f"{table.get(key)!r}") from None
