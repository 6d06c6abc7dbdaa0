"""Fair share on a replayed trace: two users with equal shares, one submitting ten times as much.

    .venv/bin/python bench/fairshare.py [--hours 48] [--nodes 10] [--half-life 6h]

No Redis, no agents: the pool leader's decision (nodeagent.pool.schedule) and its fair share
(nodeagent.pool.fairness.charge, model/fairshare.py) round after round on a simulated clock, a
round every simulated minute. The trace: a pool of --nodes nodes; every job asks one node and
runs one hour; alice submits 10 jobs for each of bob's, at a steady rate: alice 6 times what the
pool runs, bob 0.6 times (more than his half), so both always have jobs waiting. The same trace
is replayed twice: fair share off (priority, then first come) and on (weight 1000, --half-life).
Each user's share of the pool is its node-time over all node-time, over the whole trace and over
its second half. The goal (issue 67): with fair share on, each user ends within 10 % of its
configured share (50 %). Writes bench/results/fairshare.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.config.values import parse_duration  # noqa: E402
from nodeagent.model.fairshare import FairShare, Usage  # noqa: E402
from nodeagent.model.pool import PoolJob, PoolJobState  # noqa: E402
from nodeagent.pool.fairness import charge  # noqa: E402
from nodeagent.pool.schedule import (  # noqa: E402
    JobView,
    NodeView,
    PoolView,
    SchedulePolicy,
    schedule,
)
from nodeagent.state import JobState  # noqa: E402

MINUTE_MS = 60_000
RUN_MS = 60 * MINUTE_MS  # every job runs an hour
START_MS = 1_800_000_000_000


def replay(hours: int, nodes: int, policy: FairShare | None) -> dict[str, Any]:
    """The trace through schedule() (and fair share, when `policy`); node-minutes per user."""
    node_views = {f"n{i:03d}": NodeView(f"n{i:03d}") for i in range(nodes)}
    jobs: dict[str, JobView] = {}
    started: dict[str, int] = {}  # job -> when it was admitted
    placements: dict[str, str] = {}
    usage = Usage(START_MS)
    held = {"alice": [0, 0], "bob": [0, 0]}  # node-minutes: first half, second half
    per_minute = nodes * 6.6 / 60  # both users' submissions: 6.6 times what the pool runs
    owed = {"alice": 0.0, "bob": 0.0}
    seq = 0
    rounds = hours * 60
    for minute in range(rounds):
        now = START_MS + minute * MINUTE_MS
        for user, rate in (("alice", per_minute * 10 / 11), ("bob", per_minute / 11)):
            owed[user] += rate
            while owed[user] >= 1:
                owed[user] -= 1
                seq += 1
                job_id = f"{user}-{seq}"
                status = PoolJob(PoolJobState.PENDING, seq, now)
                jobs[job_id] = JobView(job_id, status, 1, 1, 1, user=user)
        for job_id, at in list(started.items()):  # an hour's work done: its record succeeds
            if now - at >= RUN_MS:
                jobs[job_id] = replace(jobs[job_id], record_state=JobState.SUCCEEDED)
                del started[job_id]
        view = PoolView(now, node_views, jobs, placements)
        if policy is not None:
            usage, view = charge(policy, usage, view)
        result = schedule(view, SchedulePolicy())
        for job_id, status in result.jobs.items():
            if status.state.ended:
                del jobs[job_id]
            else:
                if status.state is PoolJobState.RUNNING and job_id not in started:
                    started[job_id] = now
                jobs[job_id] = replace(jobs[job_id], status=status)
        placements = dict(result.placements)
        half = 0 if minute < rounds // 2 else 1
        for job_id in placements.values():
            held[job_id.split("-")[0]][half] += 1
    total = [held["alice"][h] + held["bob"][h] for h in (0, 1)]
    return {
        user: {
            "share_whole": round((held[user][0] + held[user][1]) / (total[0] + total[1]), 4),
            "share_second_half": round(held[user][1] / total[1], 4),
            "node_hours": round((held[user][0] + held[user][1]) / 60, 1),
        }
        for user in ("alice", "bob")
    } | {"pending_at_end": sum(1 for j in jobs.values() if j.status.state.value == "pending")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=48)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--half-life", default="6h")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "fairshare.json"))
    args = parser.parse_args()
    half_life = parse_duration(args.half_life, "--half-life")
    policy = FairShare(weight=1000, half_life_s=half_life, shares={"alice": 1, "bob": 1})
    result: dict[str, Any] = {
        "hours": args.hours, "nodes": args.nodes, "half_life_s": half_life, "weight": 1000,
    }  # fmt: skip
    for name, used in (("off", None), ("on", policy)):
        began = time.perf_counter()
        found = replay(args.hours, args.nodes, used)
        found["replay_s"] = round(time.perf_counter() - began, 1)
        result[name] = found
        print(
            f"fair share {name:>3}: alice {100 * found['alice']['share_whole']:5.1f} % "
            f"(second half {100 * found['alice']['share_second_half']:5.1f} %), bob "
            f"{100 * found['bob']['share_whole']:5.1f} % (second half "
            f"{100 * found['bob']['share_second_half']:5.1f} %); {found['pending_at_end']} "
            f"pending at the end; replayed in {found['replay_s']} s"
        )
    on = result["on"]
    within = all(abs(on[u]["share_whole"] - 0.5) <= 0.05 for u in ("alice", "bob"))
    result["within_10_percent_of_share"] = within
    print(f"each user within 10 % of its 50 % share, over the whole trace: {within}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
