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
    min_timed_replays = 3      # MLT008: fewer timed replays say nothing about growth
    attention_names = ["attn", "attention", "mla", "fmha", "flash", "splitkv", "paged",
                       "decode"]   # MLT008: case-insensitive substrings of attention-like
                               # kernel names (replaces the list; see analysis/kernels.py)
"""

from __future__ import annotations

import difflib
import fnmatch
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

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


_INT_KEYS = ("long_len_factor", "default_block_n", "far_factor", "far_min_len")
_KNOWN_KEYS = (*_INT_KEYS, "fail_on", "disable", "allow", "expect", "underfill_fraction",
               "growth_factor", "min_timed_replays", "attention_names")


def config_from_dict(table: dict, source: str | None = None) -> Config:
    """Validate one `[tool.mlatrace]` table into a Config (ConfigError on wrong values)."""
    cfg = Config(source=source)
    for key, value in table.items():
        if key in _INT_KEYS:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{source}: {key} must be a positive integer, got {value!r}")
            setattr(cfg, key, value)
        elif key == "fail_on":
            if value not in ("error", "warning"):
                raise ConfigError(f"{source}: fail_on must be 'error' or 'warning', got {value!r}")
            cfg.fail_on = value
        elif key == "disable":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{source}: disable must be a list of rule ids")
            unknown = [v for v in value if v.upper() not in rule_ids()]
            if unknown:
                raise ConfigError(f"{source}: unknown rule id(s) in disable: {', '.join(unknown)}")
            cfg.disable = {v.upper() for v in value}
        elif key == "allow":
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise ConfigError(f"{source}: allow must be a list of tables, e.g. "
                                  "[{rule = \"MLT006\", key = \"...\"}]")
            _check_allow(value, source)
            cfg.allow = [dict(v) for v in value]
        elif key == "expect":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{source}: expect must be a list of record kinds, e.g. "
                                  "[\"graphs\", \"attn.call\"]")
            from mlatrace.analysis.coverage import ExpectError, expect_kinds

            for what in value:
                try:
                    expect_kinds(what)
                except ExpectError as exc:
                    raise ConfigError(f"{source}: {exc}") from None
            cfg.expect = list(value)
        elif key in ("underfill_fraction", "growth_factor"):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0 \
                    or (key == "underfill_fraction" and value > 1):
                raise ConfigError(f"{source}: {key} must be a positive number"
                                  + (" up to 1" if key == "underfill_fraction" else "")
                                  + f", got {value!r}")
            cfg.grid = replace(cfg.grid, **{key: float(value)})
        elif key == "min_timed_replays":
            if not isinstance(value, int) or isinstance(value, bool) or value < 2:
                raise ConfigError(f"{source}: min_timed_replays must be an integer >= 2, "
                                  f"got {value!r}")
            cfg.grid = replace(cfg.grid, min_timed_replays=value)
        elif key == "attention_names":
            if not isinstance(value, list) or not value or \
                    not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"{source}: attention_names must be a non-empty list of "
                                  "strings, e.g. [\"attn\", \"mla\"]")
            cfg.grid = replace(cfg.grid, attention_names=tuple(value))
        else:  # a mistyped key would silently leave its default in force
            close = difflib.get_close_matches(str(key), _KNOWN_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{_where(source, str(key))}: unknown key {key!r}{hint}; the "
                              f"keys are {', '.join(_KNOWN_KEYS)}")
    return cfg


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
