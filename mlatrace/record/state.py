"""The recording state of this process, in one object instead of module globals.

One `ProcessState` per process (`STATE`): the running recorder, whether the exit and fork
hooks are registered, the parts `process.end` carries (`set_end_info`) and the hooks
every recorder runs when it closes. A forked child keeps it (the fork hook hands it to
the child's recorder), so the child's `process.end` carries the same parts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProcessState:
    """What the record face and every `Recorder` of this process share."""

    recorder: Any = None          # the running record.recorder.Recorder, or None
    hooks_registered: bool = False
    # name -> callable giving an extra field of process.end (the probe engine's coverage)
    end_info: dict[str, Callable[[], Any]] = field(default_factory=dict)
    end_info_once: set[str] = field(default_factory=set)   # given once=True: dropped after one end
    close_hooks: list[Callable[[], None]] = field(default_factory=list)


STATE = ProcessState()
