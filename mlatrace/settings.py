"""The MLATRACE_* settings of a traced process: one frozen `Settings`, the table of the
variables (`VARIABLES`: name, field, parser, formatter, doc) and the only reading of
them from the environment (`Settings.from_env`), besides the bootstrap's MLATRACE_HOME.

Parsing is tolerant, as a traced process must never fail over its settings: a bad
value gives the default. One exception, as before: a non-integer in MLATRACE_RANKS
raises ValueError (the bootstrap then says tracing is disabled in that process;
`run --ranks` is checked by the launcher). Stdlib only: every traced process imports this module.
`python -m mlatrace.settings` prints the table of docs/contracts.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_LAUNCH_SAMPLE = 8
DEFAULT_SAMPLE = 1
DEFAULT_STEP_ASIDE = (8, 64)
DEFAULT_REPLAY_TIMING = (8, 64)   # time the first 8 replays of each graph, then 1 in 64
DEFAULT_FOLD_S = 10.0             # steady steps folded per graph and this many seconds
WATCH_FOLD_S = 1.0                # ... under `run --watch` (no --fold): the live view's lag
PREFIX = "MLATRACE_"
# The sitecustomize that starts tracing in every Python process of a run: first on the
# PYTHONPATH of `run`'s child and of Ray's workers.
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inject", "bootstrap")


def parse_seconds(text: str | None, default: float | None) -> float | None:
    """A non-negative number setting (MLATRACE_FOLD, MLATRACE_MAX_MB); unset or bad -> default."""
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        return default
    return value if value >= 0 and value == value and value != float("inf") else default


def parse_step_aside(text: str | None) -> tuple[int, int] | None:
    """MLATRACE_STEP_ASIDE "SETTLE,VERIFY" -> (SETTLE, VERIFY); unset -> the default;
    "0", "off" or anything else -> None (every call inspected)."""
    if text is None or text == "":
        return DEFAULT_STEP_ASIDE
    settle, _, verify = text.partition(",")
    if not (settle.isdigit() and verify.isdigit()) or int(settle) < 1 or int(verify) < 2:
        return None
    return int(settle), int(verify)


def parse_replay_timing(text: str | None) -> tuple[int, int] | None:
    """MLATRACE_REPLAY_TIMING "N:M" -> (N, M); unset -> the default; "off"/"0"/bad -> None."""
    if text is None or text == "":
        return DEFAULT_REPLAY_TIMING
    first, _, every = text.partition(":")
    if not (first.isdigit() and every.isdigit()) or int(every) < 1:
        return None
    return int(first), int(every)


def _text(text: str | None) -> str | None:
    return text or None


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _positive(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() and int(text) > 0 else None


def _sample(text: str | None) -> int:
    return int(text) if text and text.isdigit() else DEFAULT_SAMPLE


def _ranks(text: str | None) -> frozenset[int] | None:
    return frozenset(int(r) for r in (text or "").split(",") if r.strip()) or None


def _paths(text: str | None) -> tuple[str, ...]:
    return tuple(p for p in (text or "").split(os.pathsep) if p)


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(n for n in (text or "").replace(",", " ").split() if n)


def _on(text: str | None) -> bool:
    """A flag: set to anything but "" or "0"."""
    return (text or "0") not in ("", "0")


def _not_off(text: str | None) -> bool:
    """A flag that is on unless "0"."""
    return text != "0"


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _pair(sep: str) -> Callable[[Any], str]:
    return lambda v: "off" if v is None else f"{v[0]}{sep}{v[1]}"


def _plain(value: Any) -> str:
    return "" if value is None else str(value)


def _number(value: Any) -> str:
    return "" if value is None else repr(float(value))


@dataclass(frozen=True)
class Variable:
    """One MLATRACE_* variable: its name, the Settings field it sets, how it is read
    (unset: None) and written, and what it does."""

    name: str
    field: str
    parse: Callable[[str | None], Any]
    format: Callable[[Any], str]
    default: str
    doc: str


VARIABLES: tuple[Variable, ...] = (
    Variable("MLATRACE_OUT", "out", _text, _plain, "unset",
             "trace directory; unset: the process is not traced"),
    Variable("MLATRACE_RUN_ID", "run_id", _text, _plain, "unset", "the run's id (run.json)"),
    Variable("MLATRACE_RANKS", "ranks", _ranks, lambda v: ",".join(map(str, sorted(v or ()))),
             "all", "comma-separated ranks to record (`run --ranks`)"),
    Variable("MLATRACE_REPLAY_SAMPLE", "replay_sample", _positive, _plain, "all",
             "write 1 in N graph.replay records after the first N (counts stay exact)"),
    Variable("MLATRACE_SAMPLE", "sample", _sample, _plain, str(DEFAULT_SAMPLE),
             "eager probed calls repeating their last record: keep the first N of each "
             "run, count the rest (0: keep all)"),
    Variable("MLATRACE_LAUNCH_SAMPLE", "launch_sample", _count, _plain, "MLATRACE_SAMPLE",
             "the same for eager kernel launches"),
    Variable("MLATRACE_GRAPH_NODES", "graph_nodes", _not_off, lambda v: "1" if v else "0", "1",
             "read each captured graph's kernel nodes (0: off)"),
    Variable("MLATRACE_REPLAY_TIMING", "replay_timing", parse_replay_timing, _pair(":"), "8:64",
             "`N:M`: time the first N replays of each graph, then 1 in M; `off`"),
    Variable("MLATRACE_STEP_ASIDE", "step_aside", parse_step_aside, _pair(","), "8,64",
             "`SETTLE,VERIFY`: probes look at the first call of each steady step only; `0`: off"),
    Variable("MLATRACE_FOLD", "fold", lambda t: parse_seconds(t, DEFAULT_FOLD_S), _number,
             str(DEFAULT_FOLD_S), "fold steady steps into `steady` records of this many "
             "seconds (0: off)"),
    Variable("MLATRACE_MAX_MB", "max_mb", lambda t: parse_seconds(t, None), _number, "none",
             "per process file: past this many MB keep only captures, errors, folds and changes"),
    Variable("MLATRACE_PROBES", "probes", _paths, os.pathsep.join, "none",
             "extra pack files (os.pathsep-separated; `run --probes`)"),
    Variable("MLATRACE_DISABLE_PACKS", "disable_packs", _names, ",".join, "none",
             "pack names not to install (comma- or space-separated; `run --no-pack`)"),
    Variable("MLATRACE_OTLP", "otlp", _text, _plain, "unset",
             "stream spans live to this OTLP endpoint (`run --otlp`)"),
    Variable("MLATRACE_OTLP_PARENT", "otlp_parent", _text, _plain, "unset",
             "`pid:span_id:trace_id` of the exporting parent (set for its children)"),
    Variable("MLATRACE_OTLP_TIMEOUT", "otlp_timeout", _float, _plain, "the exporter's",
             "seconds an OTLP export may take"),
    Variable("MLATRACE_DISABLE", "disabled", _on, lambda v: "1" if v else "0", "0",
             "1: do nothing (no recorder, no probes)"),
    Variable("MLATRACE_HOST", "host", _text, _plain, "unset",
             "the launcher's host; a process on another host writes into `OUT/<host>`"),
    Variable("MLATRACE_LAUNCHER_PID", "launcher_pid", _text, _plain, "unset",
             "the launcher's pid: a traced process on its host ends when it is gone"),
    Variable("MLATRACE_HOME", "home", _text, _plain, "unset",
             "where mlatrace is imported from (the bootstrap puts it on sys.path)"),
    Variable("MLATRACE_JSON", "json", _text, _plain, "msgspec",
             "`stdlib`: encode records with json on the flush thread, not msgspec"),
    Variable("MLATRACE_KERNELS", "kernels", _text, _plain, "the pack's",
             "regex of the Triton kernel names whose launches are recorded"),
    Variable("MLATRACE_TRITON_LAUNCH_HOOK", "triton_launch_hook", _on,
             lambda v: "1" if v else "0", "0", "1: record launches through Triton's launch hook"),
    Variable("MLATRACE_KEEP_DOT", "keep_dot", _text, _plain, "unset",
             "keep each captured graph's debug dump (.dot) in this directory"),
    Variable("MLATRACE_DOCTOR_LOG", "doctor_log", _text, _plain, "unset",
             "internal to `probes doctor`: the log its child writes"),
    Variable("MLATRACE_DOCTOR_SKIP", "doctor_skip", _text, _plain, "unset",
             "internal to `probes doctor`: the targets its child skips (JSON)"),
)


@dataclass(frozen=True)
class Settings:
    """The MLATRACE_* settings, parsed (field docs: `VARIABLES`)."""

    out: str | None = None
    run_id: str | None = None
    ranks: frozenset[int] | None = None
    replay_sample: int | None = None
    sample: int = DEFAULT_SAMPLE
    launch_sample: int | None = None          # None: as `sample`
    graph_nodes: bool = True
    replay_timing: tuple[int, int] | None = DEFAULT_REPLAY_TIMING
    step_aside: tuple[int, int] | None = DEFAULT_STEP_ASIDE
    fold: float | None = DEFAULT_FOLD_S
    max_mb: float | None = None
    probes: tuple[str, ...] = ()
    disable_packs: tuple[str, ...] = ()
    otlp: str | None = None
    otlp_parent: str | None = None
    otlp_timeout: float | None = None
    disabled: bool = False
    host: str | None = None
    launcher_pid: str | None = None
    home: str | None = None
    json: str | None = None
    kernels: str | None = None
    triton_launch_hook: bool = False
    keep_dot: str | None = None
    doctor_log: str | None = None
    doctor_skip: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings an environment gives (os.environ by default)."""
        env = os.environ if environ is None else environ
        return cls(**{v.field: v.parse(env.get(v.name)) for v in VARIABLES})

    def to_env(self, fields: tuple[str, ...] | None = None) -> dict[str, str]:
        """The variables of the settings (of `fields`, default all) that differ from the
        defaults: what a process started with them must find in its environment."""
        default = Settings()
        return {v.name: v.format(getattr(self, v.field)) for v in VARIABLES
                if (fields is None or v.field in fields)
                and getattr(self, v.field) != getattr(default, v.field)}

    def options(self, fields: tuple[str, ...]) -> dict[str, str | None]:
        """`fields` as their variables' text, None at the default (run.json's `options`)."""
        env = self.to_env(fields)
        return {field: env.get(name_of(field)) for field in fields}

    @property
    def launch_every(self) -> int:
        """The eager launch sampling N (MLATRACE_LAUNCH_SAMPLE, else MLATRACE_SAMPLE)."""
        return self.sample if self.launch_sample is None else self.launch_sample

    @property
    def traced(self) -> bool:
        """This process records (MLATRACE_OUT set, not disabled)."""
        return bool(self.out) and not self.disabled


RUN_FIELDS = ("out", "run_id", "host", "launcher_pid", "home", "ranks", "replay_sample",
              "sample", "launch_sample", "graph_nodes", "replay_timing", "step_aside", "fold",
              "max_mb", "probes", "disable_packs", "otlp")
"""The settings `mlatrace run` gives its command (the launcher's own, then its options):
in the command's environment they come from the launcher only (`run_env`)."""
RUN_OPTIONS = RUN_FIELDS[5:]
"""The fields that are options of `mlatrace run` (same names, `--no-pack`: disable_packs)."""

_BY_FIELD = {v.field: v for v in VARIABLES}


def name_of(field: str) -> str:
    """The MLATRACE_* variable of a Settings field (KeyError for an unknown field)."""
    return _BY_FIELD[field].name


def run_env(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
    """The environment `mlatrace run` starts its command in: `base` with the bootstrap
    first on PYTHONPATH and the RUN_FIELDS of `settings` in place of any it had (a pack
    turned off in `base`'s MLATRACE_DISABLE_PACKS stays off)."""
    inherited = Settings.from_env(base).disable_packs
    settings = dataclasses.replace(settings, disable_packs=tuple(
        dict.fromkeys(inherited + settings.disable_packs)))
    env = {k: v for k, v in base.items() if k not in {name_of(f) for f in RUN_FIELDS}}
    env.update(settings.to_env(RUN_FIELDS))
    old = env.get("PYTHONPATH", "")
    parts = [BOOTSTRAP_DIR] + [p for p in old.split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def current() -> Settings:
    """This process's settings, as its environment gives them now."""
    return Settings.from_env(os.environ)


def tracing_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The MLATRACE_* variables of an environment, as they are (handed on to other
    processes: Ray's workers)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.startswith(PREFIX)}


def variables_table() -> str:
    """The Markdown table of VARIABLES (docs/contracts.md holds it)."""
    rows = ["| variable | `Settings` field | default | what it does |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | `{v.field}` | {v.default} | {v.doc} |" for v in VARIABLES]
    return "\n".join(rows) + "\n"


assert [v.field for v in VARIABLES] == [f.name for f in dataclasses.fields(Settings)]

if __name__ == "__main__":
    print(variables_table(), end="")
