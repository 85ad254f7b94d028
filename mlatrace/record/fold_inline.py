"""The folder's step for a held call, as source lines that a generated probe runs in
its own frame.

A steady decode step calls each probe's wrapper once; holding that call in the fold
through `Folder.hold` would cost a second Python frame per probe and step. The
generated probes (`mlatrace.probe.recording.keyed_lines`) splice these lines in
instead. They take the same steps as `Folder.hold` for a kind the fold holds; the rare
branch (a step marker whose call ends the step, `Folder._end_step`) still calls
`Folder.hold`. `tests/test_fold.py` runs both paths against the unfolded trace.
"""

from __future__ import annotations

from mlatrace import kinds


def holds(kind: str) -> bool:
    """Whether Folder.hold can hold a record of `kind` (else it always says False)."""
    return kind in kinds.FOLDS and kind != kinds.REPLAY


def hold_lines(marks_step: bool, done: str) -> list[str]:
    """Folder.hold(kind, last[1], last[2], moving, t, tid) for a generated probe.

    In scope: `folder`, `recorder`, `kind`, `last` (const, key, base), `moving`,
    `clock`, `thread_id`, `step_kinds` (kinds.STEP); `done` is the statement that
    ends the probe's recording once the call is held. Falling through the lines means
    "not held": the probe builds the record, as when hold() returns False."""
    append = [
        "ftemplate = fstate.template",
        "fstep = fstate.step",
        "if ftemplate is not None and len(fstep) < len(ftemplate) "
        "and ftemplate[len(fstep)] == last[1]:",
        "    if not fstep:",
        "        fstate.marked = False",
        "        fstate.first_gid = None",
        *(["    fstate.marked = True"] if marks_step else []),
        "    fstate.last_kind = kind",
        "    fstate.last_fields = None",
        "    fstep.append((kind, last[1], (last[2], moving, clock() - recorder.t0), moving))",
        f"    {done}",
    ]
    lines = ["fstate = folder.threads.get(thread_id())",
             "if fstate is not None and fstate.held:"]
    if not marks_step:
        return lines + ["    " + line for line in append]
    return lines + [
        "    if fstate.last_kind not in step_kinds and fstate.step:",
        "        # this call ends the step: Folder.hold's rare branch (_end_step)",
        "        if folder.hold(kind, last[1], last[2], moving, clock() - recorder.t0, "
        "fstate.tid):",
        f"            {done}",
        "    else:",
        *("        " + line for line in append),
    ]
