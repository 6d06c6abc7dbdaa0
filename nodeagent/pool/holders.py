"""Allocations held from a terminal (`nodeagentctl alloc`): the holder's lease, pure rules and
the pool leader's round (docs/interactive.md, "Its end").

`alloc` renews its allocation every RENEW_S while it runs (PoolStore.keep_holder: until when,
on Redis's clock; under pool.auth: munge through a signed KEEP, which only the allocation's
user or an operator may send). An `alloc` killed with SIGKILL, or a login host that dies,
stops renewing: once its lease has run out, the pool leader cancels the allocation, as if its
shell had exited, and its nodes go back to the pool. TTL_MS is long enough that a loaded login
host (a load average of 5) never lapses it, and short enough that the nodes come back within
about a heartbeat of the pool's rounds after it. An allocation made through the API has no
holder (it is not `attended`): it lasts until it is cancelled or its time limit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from nodeagent.coord.pool import PoolStore
from nodeagent.pool.schedview import JobView

log = logging.getLogger(__name__)

TTL_MS = 15_000  # a holder's lease
RENEW_S = 3.0  # how often `alloc` renews it
GONE = "its holder (nodeagentctl alloc) stopped renewing it: killed, or its host lost"


def lapsed(jobs: Iterable[JobView], until: Mapping[str, int | None], now_ms: int) -> list[str]:
    """The attended allocations, not ended nor being cancelled, whose holder's lease has run
    out (`until`: each one's, None: never renewed; one submitted under TTL_MS ago is given
    its first renewal's time)."""
    return [
        job.id
        for job in jobs
        if job.attended
        and job.cancel is None
        and not job.status.state.ended
        and now_ms - job.status.submitted_ms > TTL_MS
        and (until.get(job.id) or 0) < now_ms
    ]


def cancel_lapsed(store: PoolStore, jobs: Mapping[str, JobView], now_ms: int) -> list[str]:
    """One pool round's part: the allocations whose holder is gone, cancelled (said)."""
    watched = [j for j in jobs.values() if j.attended and j.cancel is None]
    if not watched:
        return []
    gone = lapsed(watched, store.holders([j.id for j in watched]), now_ms)
    for job_id in gone:
        store.cancel(job_id, GONE)
        log.info("pool: allocation %s: %s", job_id, GONE)
    return gone
