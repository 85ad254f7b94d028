"""The around-callables both patch kinds (plain functions, wrapt wrappers) share: a
handler's before/after around one call, and the recording of fields read once the call
returned (when = return | both)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlatrace.probe import graphs
from mlatrace.probe.paths import CallView
from mlatrace.probe.recording import keyed_recording, recording
from mlatrace.probe.runtime import ProbeRuntime
from mlatrace.probe.targets import TargetInfo

__all__ = ["around_handler", "keyed_around", "recorder_around"]


def around_handler(runtime: ProbeRuntime, info: TargetInfo, before: Any, after: Any,
                    view: CallView, call: Callable, args: tuple, kwargs: dict) -> Any:
    """Run a handler's before/after around one call; a failing handler is disabled and
    the call goes on (shared by the plain-function and the wrapt patches)."""
    token = None
    try:
        if before is not None:
            token = before(view, info)
    except Exception as exc:
        runtime.fail(info.target, exc)
        return call(*args, **kwargs)
    try:
        result = call(*args, **kwargs)
    except BaseException as error:
        if after is not None and not runtime.disabled:
            try:
                after(view, info, token, None, error)
            except Exception as exc:
                runtime.fail(info.target, exc)
        raise
    if after is not None and not runtime.disabled:
        try:
            after(view, info, token, result, None)
        except Exception as exc:
            runtime.fail(info.target, exc)
    return result


def recorder_around(runtime: ProbeRuntime, info: TargetInfo, extract: Callable[..., dict],
                     note: Callable[[dict], None] | None, offset: int,
                     add: Callable[[str, dict], None], keyed: Callable[..., None] | None
                     ) -> Callable:
    """Run the call and record its fields once it returned (when = return | both).

    ``keyed`` (when = return) is keyed_recording's path; for when = both it is made
    here, where the fields read after the call are known; ``note`` is recording's
    path where neither applies."""
    target = info.target
    both = runtime.spec.when == "both"
    program = runtime.spec.extract
    entries = dict(getattr(program, "entries", None) or ())
    names = list(entries) if entries else (
        program.names() if hasattr(program, "names") else [])
    # when = both: the capture state is taken at call time (the call may change it).
    early_capturing = both and "capturing" in names
    early_gid = both and "gid" in names
    capturing, current_gid = graphs.capturing, graphs.current_gid
    cap_fn = entries.get("capturing") == ("call0", "capturing")
    gid_fn = entries.get("gid") == ("call0", "gid")
    late = extract
    if both and cap_fn and gid_fn and hasattr(program, "bind"):
        # The fields read after the call, without the capture state read before it.
        late = program.bind(info.positions, info.defaults, offset, last="layer",
                            skip=("capturing", "gid"))
    if both:
        keyed = (keyed_recording(runtime, info, add, offset, skip_late=("capturing", "gid"))
                 if late is not extract else None)
    if keyed is not None:
        around_keyed = keyed_around(runtime, target, late, keyed, both, capturing, current_gid)
        around_keyed.aside = keyed.aside        # type: ignore[attr-defined]
        return around_keyed
    if note is None:
        note = recording(runtime, info, add)

    def around(call: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        early = None
        if both:
            try:
                if late is not extract:
                    early = {"capturing": capturing(), "gid": current_gid()}
                elif (early_capturing and not cap_fn) or (early_gid and not gid_fn):
                    early = extract(instance, args, kwargs, None)
                else:
                    early = {}
                    if early_capturing:
                        early["capturing"] = capturing()
                    if early_gid:
                        early["gid"] = current_gid()
            except Exception as exc:
                runtime.fail(target, exc)
                return call(*args, **kwargs)
        result = call(*args, **kwargs)
        if not runtime.disabled:
            try:
                fields = late(instance, args, kwargs, result)
                if early:
                    if "capturing" in early:
                        fields["capturing"] = early["capturing"]
                    if "gid" in early:
                        fields["gid"] = early["gid"]
                note(fields)
            except Exception as exc:
                runtime.fail(target, exc)
        return result

    return around


def keyed_around(runtime: ProbeRuntime, target: str, late: Callable[..., dict],
                  keyed: Callable[..., None], both: bool, capturing: Callable[[], bool],
                  current_gid: Callable[[], Any]) -> Callable:
    """recorder_around's call with keyed_recording: for when = both, the capture state
    is read before the call and set on the fields read after it."""
    if not both:
        def around_return(call: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
            result = call(*args, **kwargs)
            if not runtime.disabled:
                try:
                    keyed(instance, args, kwargs, result, late)
                except Exception as exc:
                    runtime.fail(target, exc)
            return result

        return around_return

    threads = graphs._local      # capturing() and current_gid(), read inline

    def around_both(call: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        stack = threads.stack
        gid = stack[-1] if stack else None
        cap = gid is not None
        result = call(*args, **kwargs)
        if not runtime.disabled:
            def build(instance: Any, args: tuple, kwargs: dict, result: Any) -> dict:
                fields = late(instance, args, kwargs, result)
                fields["capturing"] = cap
                fields["gid"] = gid
                return fields

            try:
                keyed(instance, args, kwargs, result, build, cap)
            except Exception as exc:
                runtime.fail(target, exc)
        return result

    return around_both
