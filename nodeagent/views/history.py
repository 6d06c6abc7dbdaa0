"""The ended jobs the pool keeps (`nodeagentctl history`, GET /v1/history; sacct): user,
elapsed time, nodes, node-hours, exit code and effective training time ratio (ETTR: the pool
leader accounts it from the job's events as it ends, model/goodput.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from nodeagent.config.values import parse_duration
from nodeagent.coord.ended import archived
from nodeagent.coord.pool import PoolSnapshot, PoolStore
from nodeagent.errors import ConfigError, UsageError
from nodeagent.model.spec import JobSpec
from nodeagent.views.runs import Run


def history(
    store: PoolStore,
    snap: PoolSnapshot,
    since_ms: int | None = None,
    user: str | None = None,
    state: str | None = None,
) -> list[dict[str, Any]]:
    """The ended jobs of the pool as `snap` read it, oldest end first."""
    ended = [j for j, s in snap.jobs.items() if s.state.ended and not s.pinned]
    specs = store.specs(ended)
    runs = [Run(j, s if isinstance(s, JobSpec) else None, snap.jobs[j]) for j, s in specs.items()]
    runs += [Run(j, spec, status) for j, spec, status in archived(store.client, store.keys)]
    return [
        run.row(snap.now_ms)
        for run in sorted(runs, key=lambda r: r.status.ended_ms or 0)
        if (since_ms is None or (run.status.ended_ms or 0) >= since_ms)
        and (user is None or (run.spec is not None and run.spec.user == user))
        and (state is None or run.status.state.value == state)
    ]


def since_ms_of(value: str, now_ms: int) -> int:
    """--since: a duration ago, or an RFC 3339 time (a date alone: its midnight, UTC).

    Raises:
        UsageError: neither.
    """
    try:
        return now_ms - round(parse_duration(value, "--since") * 1000)
    except ConfigError:
        pass
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--since: expected a duration ago (2h, 7d) or an RFC 3339 time "
            f"(2026-11-23T08:00:00Z), got {value!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return round(when.timestamp() * 1000)
