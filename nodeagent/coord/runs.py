"""Rare reads of a pool's jobs, beside PoolStore's round: the tasks of an array (a verb on a
whole array), and how earlier runs of a reused id ended (a dependency bound to such a run)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nodeagent.coord.errors import redis_errors
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.poolreplies import status_of
from nodeagent.errors import CorruptStateError
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.spec import JobSpec


def history_states(store: PoolStore, runs: Sequence[str]) -> dict[str, PoolJobState]:
    """How each of these earlier runs ("id:seq", moved to the pool's history when their id
    was taken over) ended; one not there (pruned) is left out."""
    with redis_errors("read the pool's history"):
        raws: Any = store.client.hmget(store.keys.history, list(runs))
    found: dict[str, PoolJobState] = {}
    for run, raw in zip(runs, raws, strict=True):
        try:
            state = json.loads(raw)["status"]["state"] if raw else None
            found[run] = PoolJobState(state)
        except (ValueError, KeyError, TypeError):
            continue
    return found


def tasks_of(store: PoolStore, array_id: str) -> dict[str, PoolJob | None]:
    """Array `array_id`'s tasks (model/array.py) the pool holds, in index order, each with its
    status (None: one that does not decode): the jobs `ARRAY_T` whose spec says they are its
    tasks. A rare read (a verb on a whole array): every status and these specs, not the
    leader's cached specs."""
    prefix = f"{array_id}_"
    with redis_errors("read the pool's jobs"):
        statuses: Any = store.client.hgetall(store.keys.jobs)  # HKEYS is not in the ACL
        named = [
            str(j)
            for j in statuses
            if str(j).startswith(prefix) and str(j)[len(prefix) :].isdigit()
        ]
        raws: Any = store.client.hmget(store.keys.specs, named) if named else []
    found = []
    for job_id, raw in zip(named, raws, strict=True):
        try:
            spec = JobSpec.from_json(raw) if raw is not None else None
        except CorruptStateError:
            continue
        if spec is not None and spec.array_task is not None and spec.array_task.job == array_id:
            found.append((spec.array_task.index, job_id))
    return {job_id: status_of(statuses[job_id]) for _, job_id in sorted(found)}
