"""Ended jobs: clearing a job's own keys, pruning what the pool keeps of ended jobs.

A job's id may be submitted again once its job has ended (poolscripts.POOL_SUBMIT moves the
ended one to the pool's history); the pool leader then clears the ended job's own keys (its
record, events, commands, leases: `clear_job`) before it admits the new one, so the new job
never reads the old one's record. Ended jobs are kept for `pool.keep_ended`, then `prune`
removes their status, spec and history, and (the pool leader, first) their own keys.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from nodeagent.coord.errors import redis_errors
from nodeagent.coord.fragments import ENDED, NOTE_JOB, NOW, POOL_FENCE
from nodeagent.coord.keys import JobKeys, PoolKeys
from nodeagent.coord.lua import Call, Script
from nodeagent.errors import CorruptStateError
from nodeagent.model.pool import PoolJob
from nodeagent.model.spec import JobSpec

# Delete every key of one job: its nodes' reports (the nodes its leases name), its leases,
# leader, record, ranks, streams, cordons, change set, copies, speeds and slow verdicts. Only for
# a job that has ended.
JOB_CLEAR = Script(
    "JOB_CLEAR",
    keys=(
        "leases",
        "leader",
        "epoch",
        "record",
        "ranks",
        "events",
        "commands",
        "wake",
        "cordons",
        "changes",
        "change_seq",
        "digests",
        "copies",
        "speeds",
        "slow",
    ),
    args=("node_prefix",),
    returns="the number of keys deleted",
    body="""
local deleted = 0
local nodes = redis.pcall('ZRANGEBYSCORE', K.leases, '-inf', '+inf')
if type(nodes) == 'table' then
  for _, name in ipairs(nodes) do deleted = deleted + redis.call('DEL', A.node_prefix .. name) end
end
return deleted + redis.call('DEL', K.leases, K.leader, K.epoch, K.record, K.ranks, K.events,
  K.commands, K.wake, K.cordons, K.changes, K.change_seq, K.digests, K.copies, K.speeds, K.slow)
""",
)


# The pool leader prunes ended jobs, fenced by its lease value: `rest` names jobs whose status
# it read as ended before `cutoff_ms` (each checked again here: a job whose id was submitted
# again since is kept), and the history of ended jobs scored before `cutoff_ms` goes too.
POOL_PRUNE = Script(
    "POOL_PRUNE",
    keys=(
        "leader",
        "specs",
        "jobs",
        "cancels",
        "history",
        "ended",
        "holds",
        "requeues",
        "job_changes",
        "holders",
    ),
    args=("leader_value", "cutoff_ms"),
    returns="the number of jobs pruned, or an error starting with FENCED",
    body=NOW
    + POOL_FENCE
    + ENDED
    + NOTE_JOB
    + """
local fenced = pool_fenced(K.leader, A.leader_value)
if fenced then return redis.error_reply(fenced) end
local cutoff = tonumber(A.cutoff_ms)
local pruned = 0
for i = REST, #ARGV do
  local ok, status = pcall(cjson.decode, redis.call('HGET', K.jobs, ARGV[i]) or '')
  if ok and type(status) == 'table' and ENDED[status.state] and status.pinned == false
      and tonumber(status.ended_ms) and tonumber(status.ended_ms) <= cutoff then
    redis.call('HDEL', K.specs, ARGV[i])
    redis.call('HDEL', K.jobs, ARGV[i])
    redis.call('HDEL', K.cancels, ARGV[i])
    redis.call('HDEL', K.holds, ARGV[i])
    redis.call('HDEL', K.requeues, ARGV[i])
    redis.call('HDEL', K.holders, ARGV[i])
    note_job(K.job_changes, ARGV[i])
    pruned = pruned + 1
  end
end
local old = redis.call('ZRANGEBYSCORE', K.ended, '-inf', cutoff)
for _, run in ipairs(old) do redis.call('HDEL', K.history, run) end
redis.call('ZREMRANGEBYSCORE', K.ended, '-inf', cutoff)
return pruned + #old
""",
)


def clear_job(client: redis.Redis, keys: JobKeys) -> int:
    """Delete every key of an ended job (its id is taken by a new job, or it is pruned); the
    number of keys deleted.

    Raises:
        CoordinationError: Redis could not be written.
    """
    call = Call(
        {
            "leases": keys.leases,
            "leader": keys.leader,
            "epoch": keys.leader_epoch,
            "record": keys.record,
            "ranks": keys.ranks,
            "events": keys.events,
            "commands": keys.commands,
            "wake": keys.wake,
            "cordons": keys.cordons,
            "changes": keys.changes,
            "change_seq": keys.change_seq,
            "digests": keys.digests,
            "copies": keys.copies,
            "speeds": keys.speeds,
            "slow": keys.slow,
        },
        {"node_prefix": keys.node_prefix()},
    )
    with redis_errors("clear an ended job's keys"):
        deleted: Any = JOB_CLEAR.bind(client)(call)
    return int(deleted)


def prune(
    client: redis.Redis, keys: PoolKeys, leader: str, cutoff_ms: int, jobs: Sequence[str]
) -> int:
    """Remove from the pool the ended `jobs` (ended at or before `cutoff_ms`) and the history
    of those before it; how many went. Their own keys are cleared first (`clear_job`).

    Raises:
        CoordinationError: Redis could not be written.
        FencedError: another node leads the pool.
    """
    call = Call(
        {
            "leader": keys.leader,
            "specs": keys.specs,
            "jobs": keys.jobs,
            "cancels": keys.cancels,
            "history": keys.history,
            "ended": keys.ended,
            "holds": keys.holds,
            "requeues": keys.requeues,
            "job_changes": keys.job_changes,
            "holders": keys.holders,
        },
        {"leader_value": leader, "cutoff_ms": cutoff_ms},
        list(jobs),
    )
    with redis_errors("prune ended jobs"):
        pruned: Any = POOL_PRUNE.bind(client)(call)
    return int(pruned)


def archived(client: redis.Redis, keys: PoolKeys) -> list[tuple[str, JobSpec | None, PoolJob]]:
    """The ended jobs whose id was submitted again (kept until pool.keep_ended): their id, spec
    (None: unreadable) and status, oldest first. What nodeagent did not write is left out.

    Raises:
        CoordinationError: Redis could not be read.
    """
    with redis_errors("read the pool's history"):
        found: Any = client.hgetall(keys.history)
    runs = []
    for run, raw in found.items():
        try:
            doc = json.loads(raw)
            status = PoolJob.from_json(json.dumps(doc["status"]))
        except (ValueError, KeyError, TypeError, CorruptStateError):
            continue
        try:
            spec: JobSpec | None = JobSpec.from_json(json.dumps(doc.get("spec")))
        except CorruptStateError:
            spec = None
        runs.append((str(run).rpartition(":")[0], spec, status))
    return sorted(runs, key=lambda found: found[2].seq)
