"""The documents every face shows: the JSON forms of listings, times and events that
`nodeagentctl --json` prints and the API returns (one spelling for both)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from nodeagent.errors import CorruptStateError
from nodeagent.model.job import Event

JSON_VERSION = 1  # of every nodeagentctl --json document (status, health, show, listings)


def rfc3339(ms: int | None) -> str | None:
    """A Redis server time (ms) as RFC 3339, UTC, to the second (None: none, or out of the
    calendar's range, as an entry ID written by hand may be)."""
    if ms is None:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return None


def listing(kind: str, pool: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A --json listing (jobs, nodes, queue list, history): {"version", "pool", kind: rows}."""
    return {"version": JSON_VERSION, "pool": pool, kind: rows}


def decode(entry_id: str, fields: Mapping[str, str]) -> tuple[Event, str | None]:
    """The event in a stream entry, and the entry's text when it is not an event nodeagent
    wrote (then the event is a `corrupt_event` saying why)."""
    raw = fields.get("event", "")
    try:
        return Event.from_stream(entry_id, raw), None
    except (CorruptStateError, TypeError, ValueError) as exc:
        try:
            at_ms: int | None = int(entry_id.split("-")[0])
        except ValueError:
            at_ms = None
        return Event("corrupt_event", message=str(exc), at_ms=at_ms, id=entry_id), raw


def event_doc(entry_id: str, fields: Mapping[str, str]) -> dict[str, Any]:
    """One event as a document: the event with its `data` as stored, whatever JSON that is; an entry
    that is not an event nodeagent wrote is a `corrupt_event` with the entry as `raw`."""
    event, raw = decode(entry_id, fields)
    data = dict(event.data) if isinstance(event.data, Mapping) else event.data
    doc: dict[str, Any] = {
        "version": JSON_VERSION,  # each line is a document of its own (JSON lines)
        "id": event.id,
        "at_ms": event.at_ms,
        "at": rfc3339(event.at_ms),
        "type": event.type,
        "generation": event.generation,
        "node": event.node,
        "message": event.message,
        "data": data,
    }
    if raw is not None:
        try:
            doc["raw"] = json.loads(raw)
        except ValueError:
            doc["raw"] = raw
    return doc
