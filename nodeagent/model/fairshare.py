"""Fair share (pool.fair_share; docs/pool.md, "Fair share"): a priority factor from each user's
decayed usage against its share, added to a job's priority as Slurm's multifactor plugin adds
its fair-share factor. Pure.

- Usage: the node-seconds each user's jobs held, and each queue's, each second's worth halved
  every `half_life` (Slurm's PriorityDecayHalfLife). The pool leader charges it every round
  from the placements (`charged`), and keeps it in Redis, so a new leader goes on from it.
  Node-seconds until GPUs are what a job gets (issue 66): then GPU-seconds. A queue is kept
  under QUEUE + its name (a user's name holds no `:`).
- Share: pool.fair_share.shares names a user's shares and .queues a queue's (default 1 each);
  a user's share of the pool is its shares over the sum of the shares of the users known
  (those with usage or jobs), a queue's likewise among the queues.
- Factor (Slurm's classic formula): F = 2 ** (-(usage / total usage) / (share / total
  shares)), in (0, 1]: 1 for a user who used nothing, 0.5 for one who used exactly its share,
  less the more it used beyond it; a user against the users, a queue against the queues.
- Priority: a pending job is ordered by its priority plus `weight` x its user's F x its
  queue's F (then first come). With `weight` 0 (the default) fair share is off: priority, then
  first come.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nodeagent.errors import CorruptStateError

MAX_USERS = 100_000
QUEUE = "queue:"  # a queue's name in the usage and the shares


@dataclass(frozen=True)
class FairShare:
    """pool.fair_share."""

    weight: float = 0.0  # 0: off
    half_life_s: float = 7 * 86_400.0
    shares: Mapping[str, float] = field(default_factory=dict)  # user (QUEUE + queue) -> shares

    @property
    def on(self) -> bool:
        return self.weight > 0

    def shares_of(self, user: str) -> float:
        return float(self.shares.get(user, 1.0))


@dataclass(frozen=True)
class Usage:
    """Each user's decayed node-seconds, as of `at_ms` (Redis server time), and the policy the
    pool leader charged them under (what `nodeagentctl share` shows)."""

    at_ms: int
    users: Mapping[str, float] = field(default_factory=dict)
    policy: FairShare = field(default_factory=FairShare)

    def to_json(self) -> str:
        p = self.policy
        doc = {
            "at_ms": self.at_ms,
            "users": dict(sorted(self.users.items())),
            "policy": {"weight": p.weight, "half_life_s": p.half_life_s, "shares": p.shares},
        }
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Usage:
        """Raises: CorruptStateError, and nothing else."""
        try:
            doc = json.loads(raw)
            at_ms, users, policy = doc["at_ms"], doc["users"], doc["policy"]
            found = {str(u): _amount(v) for u, v in users.items()}
            shares = {str(u): _amount(v) for u, v in policy["shares"].items()}
            weight, half_life = _amount(policy["weight"]), _amount(policy["half_life_s"])
            if not isinstance(at_ms, int) or len(found) > MAX_USERS or half_life <= 0:
                raise ValueError("not what nodeagent writes")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptStateError(f"fair-share usage: {exc}") from None
        return cls(at_ms, found, FairShare(weight, half_life, shares))


def _amount(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a finite number >= 0, got {value!r}")
    return float(value)


def charged(usage: Usage, holding: Mapping[str, float], now_ms: int, half_life_s: float) -> Usage:
    """`usage` decayed to `now_ms`, plus what each user's `holding` nodes held since, each
    second decayed as it ages (the integral of nodes x 2^(-age / half_life)). Users whose
    usage decayed below a millisecond of a node are dropped."""
    dt = max(0, now_ms - usage.at_ms) / 1000
    keep = 0.5 ** (dt / half_life_s)
    gained = half_life_s / math.log(2) * (1 - keep)  # one node's, over dt, decayed to now
    users = {u: v * keep for u, v in usage.users.items()}
    for user, nodes in holding.items():
        users[user] = users.get(user, 0.0) + nodes * gained
    return Usage(now_ms, {u: v for u, v in users.items() if v >= 1e-3}, usage.policy)


@dataclass(frozen=True)
class Standing:
    """One user's (or queue's) share of the pool and of its usage, among its level's."""

    share: float
    used: float

    @property
    def factor(self) -> float:
        return float(2.0 ** (-self.used / self.share))


def standings(policy: FairShare, usage: Usage, names: Iterable[str]) -> dict[str, Standing]:
    """The standing of each of `names` (users, and QUEUE + queues) and each with usage: the
    users against the users, the queues against the queues."""
    known = set(usage.users) | set(names)
    found = {}
    for queues in (False, True):
        level = [n for n in known if n.startswith(QUEUE) == queues]
        total_shares = sum(policy.shares_of(n) for n in level) or 1.0
        total_usage = sum(usage.users.get(n, 0.0) for n in level)
        for name in level:
            used = usage.users.get(name, 0.0) / total_usage if total_usage > 0 else 0.0
            found[name] = Standing(policy.shares_of(name) / total_shares, used)
    return found


def factors(policy: FairShare, usage: Usage, names: Iterable[str]) -> dict[str, float]:
    """F for each of `names` and each with usage (`standings`), in (0, 1]."""
    return {n: s.factor for n, s in standings(policy, usage, names).items()}


def holding(
    placements: Mapping[str, str],
    users: Mapping[str, str],
    shares: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, float]:
    """How many nodes each user's jobs hold: `placements` node -> job, `users` job -> user;
    `shares`: node -> job -> the fraction of the node it holds (its GPUs of those offered),
    on the nodes jobs share."""
    found: dict[str, float] = {}
    for job in placements.values():
        user = users.get(job)
        if user:
            found[user] = found.get(user, 0) + 1
    for held in (shares or {}).values():
        for job, part in held.items():
            user = users.get(job)
            if user:
                found[user] = found.get(user, 0) + part
    return found
