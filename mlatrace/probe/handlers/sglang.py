"""Handlers for a call that is one keyed capture or replay of its own: SGLang's
DecodeCudaGraphRunner (capture_one_shape / execute; capture_one_batch_size / replay
before 0.5.14), usable by any engine shaped so."""

from __future__ import annotations

from typing import Any

from mlatrace import record
from mlatrace.common import hashable
from mlatrace.probe import graphs
from mlatrace.probe.handlers import Handler, _gids_of, close_capture, open_capture


class CaptureScope(Handler):
    """A function whose call makes one keyed capture (SGLang's capture_one_shape).

    Such functions warm up eagerly before they capture, so the scope's gid is
    opened as an eager region: ``capturing()`` stays false until the torch capture
    inside begins, which then names this gid as its parent. The gid is remembered
    per key (``fields.key``) on the instance for ReplayScope.
    """

    def before(self, view: Any, info: Any) -> Any:
        fields = self.fields(view)
        key = fields.get("key")
        gid, t0 = open_capture(self.src, key, fields.get("mode"))
        graphs.push_eager()
        return gid, key, t0

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        gid, key, t0 = token
        graphs.pop_eager()
        if error is None:
            _gids_of(view.instance)[hashable(key)] = gid
        close_capture(gid, t0, error)


class ReplayScope(Handler):
    """A function whose call replays the instance's capture for a key (SGLang's replay).

    ``options.key_after`` names the instance attribute holding the replayed key once
    the call returned (SGLang sets ``self.bs`` in load_batch).
    """

    OPTIONS = {"key_after": str}

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        attr = self.options.get("key_after")
        key = getattr(view.instance, attr, None) if attr else self.fields(view).get("key")
        gids = _gids_of(view.instance)
        gid = gids.get(hashable(key))
        if gid is None:
            gid = gids[hashable(key)] = graphs.next_gid()
        record.emit_replay(gid)
