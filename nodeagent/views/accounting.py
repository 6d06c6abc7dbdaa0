"""What the accounting database adds to the verbs (docs/accounting.md): `history` beyond the
pool's window (pool.keep_ended), and `report` (sreport): usage by user, queue or day.

`history` lists the pool's own ended jobs (views/history.py) and, from the database, the runs
the pool no longer keeps: a run in both is listed once, as the pool has it.
"""

from __future__ import annotations

from typing import Any

from nodeagent.accounting.ledger import Filter, Ledger
from nodeagent.coord.pool import PoolStore
from nodeagent.errors import UsageError
from nodeagent.model.accounting import BY, Record
from nodeagent.views import history as pool_history
from nodeagent.views.documents import rfc3339

HISTORY_LIMIT = 10_000  # runs read from the database at most, newest first


def history(
    store: PoolStore,
    ledger: Ledger | None,
    since: str | None = None,
    user: str | None = None,
    state: str | None = None,
    limit: int = HISTORY_LIMIT,
) -> list[dict[str, Any]]:
    """The ended jobs, oldest end first: the pool's, then the database's older ones.

    Raises:
        UsageError: a bad `since`.
        AccountingError: the database could not be read.
    """
    snap = store.read()
    since_ms = pool_history.since_ms_of(since, snap.now_ms) if since else None
    rows = pool_history.history(store, snap, since_ms, user, state)
    if ledger is None:
        return rows
    where = Filter(store.keys.pool, since_ms=since_ms, user=user, state=state)
    kept = {(row["job"], row["seq"]) for row in rows}
    older = [r for r in ledger.runs(where, limit) if (r.job, r.seq) not in kept]
    merged = [row_of(r) for r in older] + rows
    return sorted(merged, key=lambda row: row["ended"] or "")


def report(
    store: PoolStore,
    ledger: Ledger | None,
    by: str,
    since: str | None = None,
    until: str | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """Usage by `by` (user, queue, day) of the jobs that ended in [since, until).

    Raises:
        UsageError: no database, a bad `by`, `since` or `until`.
        AccountingError: the database could not be read.
    """
    if ledger is None:
        raise UsageError(
            "report reads the accounting database: name it with --accounting URL (or "
            "pool.accounting in --config, or NODEAGENT_ACCOUNTING_URL)"
        )
    if by not in BY:
        raise UsageError(f"--by: expected one of {', '.join(BY)}, got {by!r}")
    now_ms = store.now_ms()
    where = Filter(
        store.keys.pool,
        since_ms=pool_history.since_ms_of(since, now_ms) if since else None,
        until_ms=pool_history.since_ms_of(until, now_ms) if until else None,
        user=user,
    )
    usage = ledger.report(by, where)
    return {
        "by": by,
        "since": rfc3339(where.since_ms),
        "until": rfc3339(where.until_ms),
        "rows": [u.to_data() for u in usage],
    }


def row_of(record: Record) -> dict[str, Any]:
    """A record as `history` lists a run (views/runs.Run.row's fields)."""
    return {
        "job": record.job,
        "seq": record.seq,
        "user": record.user,
        "kind": record.kind,
        "state": record.state,
        "queue": record.queue,
        "priority": None,
        "submitted": rfc3339(record.submitted_ms),
        "started": rfc3339(record.started_ms),
        "ended": rfc3339(record.ended_ms),
        "elapsed_s": record.elapsed_s,
        "nodes": record.nodes,
        "node_hours": round(record.node_hours, 4),
        "gpus": record.gpus,
        "gpu_hours": None if record.gpu_hours is None else round(record.gpu_hours, 4),
        "exit_code": record.exit_code,
        "reason": record.reason,
        "ettr": record.ettr,
    }
