"""Rule thresholds and allow-lists, read from `mlatrace.toml` or `[tool.mlatrace]` in pyproject.toml.

Keys (all optional):

    long_len_factor = 8        # MLT001: a replay is long when seq_len_max >= factor x BLOCK_N
    default_block_n = 64       # BLOCK_N assumed when the trace does not say
    far_factor = 8             # MLT006: captured value and replay value differ by this ratio
                               # (also a host.decision's inputs without a `valid` range)
    far_min_len = 256          # MLT006: ... and the replay value is at least this long
    fail_on = "error"          # check's default threshold
    disable = ["MLT004"]       # rule ids never reported
    allow = [{rule = "MLT006", key = "*decode*"}]   # suppress matching findings
                               # (match on rule, key (glob), rank, pid, op)
    expect = ["graphs", "attn.call"]   # check exits 3 (blind) when the run recorded none
                               # of one of these (a record kind, or graphs, replays,
                               # attention, launches); see analysis/coverage.py
    underfill_fraction = 0.25  # MLT008: largest attention-like kernel < this x SMs CTAs
    growth_factor = 4          # MLT008: ... while the slowest timed replay >= this x fastest
    error_growth_factor = 10   # MLT008: an error (not a warning) from this growth on
    min_timed_replays = 3      # MLT008: fewer timed replays say nothing about growth
    attention_names = ["attn", "attention", "mla", "fmha", "flash", "splitkv", "paged",
                       "decode"]   # MLT008: case-insensitive substrings of attention-like
                               # kernel names (replaces the list; see analysis/kernels.py)
    graph_eager_share = 0.2    # MLT009: more decode steps than this share ran eagerly
                               # while a graph mode was on ...
    graph_padding_share = 0.3  # MLT009: ... or padding took more than this share of the
                               # replayed tokens
    graph_min_steps = 10       # MLT009: fewer decode steps (padded steps) judge nothing
"""

from __future__ import annotations

import difflib
import fnmatch
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mlatrace.analysis.graph_use import GraphUseRule
from mlatrace.analysis.kernels import GridRule


def rule_ids() -> tuple[str, ...]:
    """The ids of the rules (their registry, analysis/rules, imports this module)."""
    from mlatrace.analysis.rules import RULES

    return tuple(RULES)


class ConfigError(ValueError):
    """A config file that cannot be read or holds wrong values (check exits 2)."""


@dataclass
class Config:
    long_len_factor: int = 8
    default_block_n: int = 64
    far_factor: int = 8
    far_min_len: int = 256
    fail_on: str = "error"
    disable: set[str] = field(default_factory=set)
    allow: list[dict] = field(default_factory=list)
    expect: list[str] = field(default_factory=list)
    grid: GridRule = field(default_factory=GridRule)   # MLT008 (frozen-underfilled-grid)
    graph_use: GraphUseRule = field(default_factory=GraphUseRule)   # MLT009 (graph-underused)
    source: str | None = None

    def enabled(self, rule_id: str) -> bool:
        return rule_id not in self.disable

    def allowed(self, finding: Any, key: Any = None) -> bool:
        """True when an allow entry matches the finding (its rule and every field it names)."""
        return self.allow_entry(finding, key) is not None

    def allow_entry(self, finding: Any, key: Any = None) -> int | None:
        """The index of the first allow entry matching the finding, else None. Every entry
        names a rule (config_from_dict refuses one that does not): never a wildcard."""
        for index, entry in enumerate(self.allow):
            if entry.get("rule") is None or str(entry["rule"]).upper() != finding.id:
                continue
            if "key" in entry and not fnmatch.fnmatchcase(str(key), str(entry["key"])):
                continue
            if "rank" in entry and entry["rank"] != finding.rank:
                continue
            if "pid" in entry and entry["pid"] != finding.pid:
                continue
            if "op" in entry and not fnmatch.fnmatchcase(str(finding.details.get("op")), str(entry["op"])):
                continue
            return index
        return None


ALLOW_KEYS = ("rule", "key", "rank", "pid", "op")
"""The fields an allow entry may name; any other is a configuration error."""


def describe_allow(entry: dict) -> str:
    """An allow entry as written in TOML: {rule = "MLT006", key = "*decode*"}."""
    parts = ", ".join(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"'
                      for k, v in entry.items())
    return "{" + parts + "}"


def line_of(source: str | None, key: str) -> int | None:
    """The first line of file `source` where `key = ...` is written (for file:line errors)."""
    if not source:
        return None
    try:
        text = Path(source).read_text(errors="replace")
    except OSError:
        return None
    pattern = re.compile(rf"(^|[{{,\s]){re.escape(key)}\s*=")
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.search(line.split("#", 1)[0]):
            return number
    return None


def _where(source: str | None, key: str) -> str:
    line = line_of(source, key)
    return f"{source}:{line}" if line else str(source)


def _check_allow(entries: list[dict], source: str | None) -> None:
    """Every allow entry names a known rule and only fields it knows (ConfigError)."""
    for entry in entries:
        unknown = [k for k in entry if k not in ALLOW_KEYS]
        if unknown:
            close = difflib.get_close_matches(unknown[0], ALLOW_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{_where(source, unknown[0])}: allow entry {describe_allow(entry)}: "
                              f"unknown key {unknown[0]!r}{hint}; an entry may name "
                              f"{', '.join(ALLOW_KEYS)}")
        rule = entry.get("rule")
        if rule is None:
            raise ConfigError(f"{_where(source, 'allow')}: allow entry {describe_allow(entry)} "
                              "names no rule (it would suppress every finding); add rule = \"MLT...\"")
        if not isinstance(rule, str) or rule.upper() not in rule_ids():
            raise ConfigError(f"{_where(source, 'allow')}: allow entry {describe_allow(entry)}: "
                              f"unknown rule {rule!r} (known: {', '.join(rule_ids())})")


def config_from_dict(table: dict, source: str | None = None) -> Config:
    """Validate one `[tool.mlatrace]` table into a Config (ConfigError on wrong values)."""
    try:
        from mlatrace.analysis.config_table import UNSET, checked_table
    except ImportError:   # msgspec is a core dependency; an image without it reads no config
        raise ConfigError(f"{source}: reading a config needs msgspec (pip install msgspec)"
                          ) from None
    checked = checked_table(table, source)
    unknown = [v for v in checked.disable if v.upper() not in rule_ids()]
    if unknown:
        raise ConfigError(f"{_where(source, 'disable')}: unknown rule id(s) in disable: "
                          f"{', '.join(unknown)}")
    _check_allow(checked.allow, source)
    from mlatrace.analysis.coverage import ExpectError, expect_kinds

    for what in checked.expect:
        try:
            expect_kinds(what)
        except ExpectError as exc:
            raise ConfigError(f"{_where(source, 'expect')}: {exc}") from None
    grid = {key: getattr(checked, key) for key in ("underfill_fraction", "growth_factor",
                                                     "error_growth_factor", "min_timed_replays",
                                                     "attention_names")
            if getattr(checked, key) is not UNSET}
    graph_use = {name: getattr(checked, key) for key, name in (
        ("graph_eager_share", "eager_share"), ("graph_padding_share", "padding_share"),
        ("graph_min_steps", "min_steps")) if getattr(checked, key) is not UNSET}
    if "attention_names" in grid:
        grid["attention_names"] = tuple(grid["attention_names"])
    return Config(long_len_factor=checked.long_len_factor,
                  default_block_n=checked.default_block_n, far_factor=checked.far_factor,
                  far_min_len=checked.far_min_len, fail_on=checked.fail_on,
                  disable={v.upper() for v in checked.disable},
                  allow=[dict(v) for v in checked.allow], expect=list(checked.expect),
                  grid=replace(GridRule(), **grid),
                  graph_use=replace(GraphUseRule(), **graph_use), source=source)


def _read_toml(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def load_config(path: str | Path | None = None, search_dir: str | Path | None = None) -> Config:
    """Config from PATH, else from mlatrace.toml / pyproject.toml in search_dir (default cwd)."""
    if path is not None:
        path = Path(path)
        data = _read_toml(path)
        if path.name == "pyproject.toml" or "tool" in data:
            table = data.get("tool", {}).get("mlatrace", {})
        else:
            table = data.get("tool", {}).get("mlatrace", data)
        return config_from_dict(table, source=str(path))
    base = Path(search_dir) if search_dir is not None else Path.cwd()
    candidate = base / "mlatrace.toml"
    if candidate.is_file():
        return load_config(candidate)
    candidate = base / "pyproject.toml"
    if candidate.is_file():
        data = _read_toml(candidate)
        table = data.get("tool", {}).get("mlatrace")
        if isinstance(table, dict):
            return config_from_dict(table, source=str(candidate))
    return Config()
