"""`nodeagentctl share` (sshare), GET /v1/share: each user's and each queue's shares, decayed
usage and fair-share factor, as the pool leader last saved them (model/fairshare.py;
docs/pool.md, "Fair share"), decayed to now. A job's priority gains weight x its user's factor
x its queue's."""

from __future__ import annotations

from typing import Any

from nodeagent.coord.pool import PoolStore
from nodeagent.model.fairshare import QUEUE, FairShare, Standing, Usage, charged, standings
from nodeagent.pool.fairness import read_usage
from nodeagent.views.documents import JSON_VERSION, rfc3339


def share(store: PoolStore) -> dict[str, Any]:
    """The pool's fair share: its policy, then a row per user and per queue with usage or a
    job."""
    snap = store.read()
    saved = read_usage(store)
    doc: dict[str, Any] = {"version": JSON_VERSION, "pool": store.keys.pool}
    if saved is None:
        return {**doc, "on": False, "saved": None, "users": [], "queues": []}
    policy = saved.policy
    usage = charged(saved, {}, snap.now_ms, policy.half_life_s)  # decayed to now
    specs = store.specs([j for j, s in snap.jobs.items() if not s.state.ended])
    live = [spec for spec in specs.values() if not isinstance(spec, str)]
    names = [s.user for s in live if s.user] + [QUEUE + s.queue for s in live]
    found = standings(policy, usage, names)
    return {
        **doc,
        "on": policy.on,
        "weight": policy.weight,
        "half_life_s": policy.half_life_s,
        "saved": rfc3339(saved.at_ms),
        "users": _rows(policy, usage, found, queues=False),
        "queues": _rows(policy, usage, found, queues=True),
    }


def _rows(
    policy: FairShare, usage: Usage, found: dict[str, Standing], queues: bool
) -> list[dict[str, Any]]:
    return [
        {
            "queue" if queues else "user": name.removeprefix(QUEUE),
            "shares": policy.shares_of(name),
            "share": round(standing.share, 4),
            "usage_node_hours": round(usage.users.get(name, 0.0) / 3600, 4),
            "usage": round(standing.used, 4),
            "factor": round(standing.factor, 4),
        }
        for name, standing in sorted(found.items())
        if name.startswith(QUEUE) == queues
    ]
