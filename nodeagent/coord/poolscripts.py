"""The pool's Lua scripts, each a `Script` (coord/lua.py) naming its KEYS, ARGV and reply; every
key of one call is a key of one pool (one hash tag), so they run on a Redis Cluster too.
Garbage in a key is noted (see fragments.py) and skipped, never a failed heartbeat.
"""

from __future__ import annotations

from nodeagent.coord.fragments import (
    CHANGES,
    ENDED,
    GARBAGE,
    LEADER,
    NOTE_JOB,
    NOW,
    POOL_FENCE,
    TAKE_LEADER,
)
from nodeagent.coord.keys import EVENTS_MAXLEN, PoolKeys
from nodeagent.coord.lua import Call, Script
from nodeagent.model.job import Event
from nodeagent.model.spec import JobSpec

# A node's pool heartbeat: renew its pool lease, take or renew the pool leader lease, mark the
# node changed when its report did (as a job's SYNC), read where the pool placed it.
POOL_SYNC = Script(
    "POOL_SYNC",
    keys=("node", "leases", "leader", "epoch", "placements", "changes", "change_seq", "digests"),
    args=("name", "report", "ttl", "node_prefix", "digest"),
    returns="{now_ms, leader or false, leader lease deadline or false, placement or false, "
    "garbage}",
    body=NOW
    + GARBAGE
    + LEADER
    + TAKE_LEADER
    + CHANGES
    + """
local name, ttl = A.name, tonumber(A.ttl)
local back = redis.call('EXISTS', K.node) == 0
redis.call('SET', K.node, A.report, 'PX', ttl)
try('leases', K.leases, 'zset', 'lease not renewed', 'ZADD', K.leases, now + ttl, name)
local leader = take_leader(K.leader, K.epoch, name, A.node_prefix, ttl)
if leader and string.sub(leader, 1, #name + 1) == name .. ' ' then
  repair_changes(K.changes, K.change_seq, K.digests)
end
local digest = try('changes', K.digests, 'hash', 'ignored', 'HGET', K.digests, name)
if back or digest ~= A.digest then
  mark_changed(K.changes, K.change_seq, K.digests, name, A.digest)
end
local pttl = redis.call('PTTL', K.leader)
local deadline = false
if pttl > 0 then deadline = now + pttl end
local placement = try('placements', K.placements, 'hash', 'ignored', 'HGET', K.placements,
  name) or false
return {now, leader or false, deadline, placement, garbage}
""",
)


# The pool's hashes, read at once (the pool leader, nodeagentctl): repairs nothing. Its nodes
# are read in pages (scripts.READ_PAGE), so no call grows with the number of nodes.
# `skip_placements` '1': the placements are not read (the pool leader has them: it alone writes
# them). `skip_jobs` '1': the jobs' statuses are not read (a listing of the nodes).
POOL_READ = Script(
    "POOL_READ",
    keys=(
        "placements",
        "jobs",
        "cancels",
        "cordons",
        "leader",
        "queues",
        "holds",
        "requeues",
        "job_changes",
    ),
    args=("skip_placements", "skip_jobs", "jobs_since", "changes_keep_ms"),
    returns="{now_ms, leader or false, placements (false when not read), jobs (empty when not "
    "read), cancels, cordons, queues, holds, requeues (flat field/value lists), garbage, "
    "1 when jobs holds only the jobs changed since jobs_since (a status false: deleted)}",
    body=NOW
    + GARBAGE
    + """
local function all(kind, key)
  return try(kind, key, 'hash', 'ignored', 'HGETALL', key) or {}
end
local leader = redis.pcall('GET', K.leader)
if type(leader) ~= 'string' then leader = false end
local placements = false
if A.skip_placements ~= '1' then placements = all('placements', K.placements) end
local jobs = {}
local changes = 0
local since = tonumber(A.jobs_since)
if A.skip_jobs ~= '1' and since and since >= now - tonumber(A.changes_keep_ms) then
  local changed = redis.pcall('ZRANGEBYSCORE', K.job_changes, since, '+inf')
  if type(changed) == 'table' and not changed.err then
    changes = 1
    for _, job in ipairs(changed) do
      local raw = redis.pcall('HGET', K.jobs, job)
      if type(raw) ~= 'string' then raw = false end
      jobs[#jobs + 1] = job
      jobs[#jobs + 1] = raw
    end
  end
end
if A.skip_jobs ~= '1' and changes == 0 then jobs = all('jobs', K.jobs) end
return {now, leader, placements, jobs, all('cancels', K.cancels),
  all('cordons', K.cordons), all('queues', K.queues), all('holds', K.holds),
  all('requeues', K.requeues), garbage, changes}
""",
)


# The pool leader's write, fenced by its lease value. `rest`: n, then n nodes to unplace; then
# m, then m (node, job) placements; then k, then k (job, status JSON); then b, then b (ended
# ms, accounting record JSON) for the ledger, written with the ends they record; then the
# fair-share usage JSON ('' for none); then r, then r lapsed leases to drop (kept if renewed
# meanwhile; a dropped lease's node leaves the change set); then events to append.
POOL_COMMIT = Script(
    "POOL_COMMIT",
    keys=(
        "leader",
        "placements",
        "jobs",
        "ledger",
        "usage",
        "events",
        "leases",
        "changes",
        "digests",
        "job_changes",
    ),
    args=("leader_value", "events_maxlen", "changes_keep_ms"),
    returns="1, or an error starting with FENCED",
    body=NOW
    + POOL_FENCE
    + NOTE_JOB
    + """
local fenced = pool_fenced(K.leader, A.leader_value)
if fenced then return redis.error_reply(fenced) end
local i = REST
local function take()
  local n = tonumber(ARGV[i])
  local first = i + 1
  i = i + 1 + n
  return first, n
end
local first, n = take()
for j = first, first + n - 1 do redis.pcall('HDEL', K.placements, ARGV[j]) end
first, n = take()
i = i + n
for j = first, first + 2 * n - 1, 2 do redis.pcall('HSET', K.placements, ARGV[j], ARGV[j + 1]) end
first, n = take()
i = i + n
for j = first, first + 2 * n - 1, 2 do
  redis.pcall('HSET', K.jobs, ARGV[j], ARGV[j + 1])
  note_job(K.job_changes, ARGV[j])
end
redis.pcall('ZREMRANGEBYSCORE', K.job_changes, '-inf', now - tonumber(A.changes_keep_ms))
first, n = take()
i = i + n
for j = first, first + 2 * n - 1, 2 do redis.call('ZADD', K.ledger, ARGV[j], ARGV[j + 1]) end
if ARGV[i] ~= '' then redis.call('SET', K.usage, ARGV[i]) end
i = i + 1
first, n = take()
for j = first, first + n - 1 do
  local deadline = redis.pcall('ZSCORE', K.leases, ARGV[j])
  if type(deadline) == 'string' and tonumber(deadline) <= now then
    redis.pcall('ZREM', K.leases, ARGV[j])
    redis.pcall('ZREM', K.changes, ARGV[j])
    redis.pcall('HDEL', K.digests, ARGV[j])
  end
end
for j = i, #ARGV do
  if type(redis.pcall('XADD', K.events, 'MAXLEN', '~', A.events_maxlen, '*', 'event', ARGV[j]))
      == 'table' then
    break
  end
end
return 1
""",
)


# Submit a job: store its spec and a pending status. An id in use is refused unless its job has
# ended (and was submitted, not pinned): then its spec and status move to the history (kept
# until pool.keep_ended) and the new job is marked `stale_keys`, so the pool leader clears the
# ended job's own keys before admitting it. `pinned` '1': pinned by nodes' job: sections;
# `held_by` (not ''): submitted held (submit --hold), by whom. `request` (not ''): the request's
# id: an id in use by a spec of that request is this submission arriving again (a retry, by
# redis-py after a timeout or by nodeagentctl): answered as it was made, nothing written.
_SUBMIT_KEYS = (
    "specs",
    "jobs",
    "seq",
    "events",
    "cancels",
    "history",
    "ended",
    "holds",
    "requeues",
    "job_changes",
)
_SUBMIT_ARGS = ("job", "spec", "pinned", "events_maxlen", "event", "held_by", "request")
_SUBMIT = """
local stale = 'false'
if redis.call('HEXISTS', K.specs, A.job) == 1 then
  local raw = redis.call('HGET', K.jobs, A.job)
  if A.request ~= '' then  -- the same request again (a retry): the submission it made
    local stored, spec = pcall(cjson.decode, redis.call('HGET', K.specs, A.job))
    if stored and type(spec) == 'table' and spec.request == A.request then
      return {1, raw or false}
    end
  end
  local ok, old = pcall(cjson.decode, raw or '')
    if A.pinned == '1' or not ok or type(old) ~= 'table' or old.pinned ~= false
      or not ENDED[old.state] or not tonumber(old.seq) then
    return {0, raw or false}
  end
  local run = A.job .. ':' .. string.format('%.0f', tonumber(old.seq))
  redis.call('HSET', K.history, run,
    '{"spec":' .. redis.call('HGET', K.specs, A.job) .. ',"status":' .. raw .. '}')
  redis.call('ZADD', K.ended, tonumber(old.ended_ms) or now, run)
  redis.call('HDEL', K.cancels, A.job)
  redis.call('HDEL', K.holds, A.job)
  redis.call('HDEL', K.requeues, A.job)
  stale = 'true'
end
if A.held_by ~= '' then redis.call('HSET', K.holds, A.job, A.held_by) end
local seq = redis.call('INCR', K.seq)
local pinned = 'false'
if A.pinned == '1' then pinned = 'true' end
local status = string.format('{"pinned":%s,"reason":"submitted","seq":%.0f,"stale_keys":%s,'
  .. '"state":"pending","submitted_ms":%.0f}', pinned, seq, stale, now)
redis.call('HSET', K.specs, A.job, A.spec)
redis.call('HSET', K.jobs, A.job, status)
note_job(K.job_changes, A.job)
if A.event ~= '' then
  redis.pcall('XADD', K.events, 'MAXLEN', '~', A.events_maxlen, '*', 'event', A.event)
end
return {1, status}
"""
POOL_SUBMIT = Script(
    "POOL_SUBMIT",
    keys=_SUBMIT_KEYS,
    args=_SUBMIT_ARGS,
    returns="{1, status JSON} when submitted, {0, status JSON or false} when the id is in use",
    body=NOW + NOTE_JOB + ENDED + _SUBMIT,
)


# The pool leader takes one request (pool.auth: munge), fenced by its lease value: the cursor
# moves past it, and its credential (by `credential_id`, '' for none) is remembered until it
# expires, so it is taken once however many leaders see it (munged detects a replay only on its
# own host). Expired memories are dropped.
_CLAIM_KEYS = ("leader", "cursor", "seen")
_CLAIM_ARGS = ("leader_value", "request_id", "credential_id", "expires_ms")
_CLAIM = """
local fenced = pool_fenced(K.leader, A.leader_value)
if fenced then return redis.error_reply(fenced) end
redis.call('SET', K.cursor, A.request_id)
if A.credential_id ~= '' then
  if redis.call('TYPE', K.seen)['ok'] ~= 'zset' then redis.call('DEL', K.seen) end
  redis.call('ZREMRANGEBYSCORE', K.seen, '-inf', now)
  if redis.call('ZSCORE', K.seen, A.credential_id) then return 'replayed' end
  redis.call('ZADD', K.seen, math.max(tonumber(A.expires_ms), now + 1), A.credential_id)
end
"""
POOL_CLAIM = Script(
    "POOL_CLAIM",
    keys=_CLAIM_KEYS,
    args=_CLAIM_ARGS,
    returns="'ok', 'replayed', or an error starting with FENCED",
    body=NOW + POOL_FENCE + _CLAIM + "return 'ok'\n",
)


# A submission taken with its request, in one script: the claim (POOL_CLAIM's), then the job
# stored (POOL_SUBMIT's) only if the request was taken now. One round trip less a submission,
# and a pool leader that dies between the two leaves no request taken but not done.
POOL_TAKE_SUBMIT = Script(
    "POOL_TAKE_SUBMIT",
    keys=_SUBMIT_KEYS + _CLAIM_KEYS,
    args=_SUBMIT_ARGS + _CLAIM_ARGS,
    returns="as POOL_SUBMIT, or 'replayed' (nothing stored), or an error starting with FENCED",
    body=NOW + NOTE_JOB + POOL_FENCE + ENDED + _CLAIM + _SUBMIT,
)


# A job's spec replaced (a pending job scaled: pool/jobverbs.scale_plan), noted as changed.
POOL_REPLACE_SPEC = Script(
    "POOL_REPLACE_SPEC",
    keys=("specs", "job_changes"),
    args=("job", "spec"),
    returns="1",
    body=NOW
    + NOTE_JOB
    + """
redis.call('HSET', K.specs, A.job, A.spec)
note_job(K.job_changes, A.job)
return 1
""",
)


def submit_call(
    keys: PoolKeys, spec: JobSpec, pinned: bool, held_by: str, event: Event | None
) -> Call:
    """POOL_SUBMIT's call for `spec` (and POOL_TAKE_SUBMIT's, with the request taken);
    `event`: what the pool's stream says of it (None: nothing, another job of the same
    submission says it)."""
    return Call(
        {
            "specs": keys.specs,
            "jobs": keys.jobs,
            "seq": keys.seq,
            "events": keys.events,
            "cancels": keys.cancels,
            "history": keys.history,
            "ended": keys.ended,
            "holds": keys.holds,
            "requeues": keys.requeues,
            "job_changes": keys.job_changes,
        },
        {
            "held_by": held_by,
            "job": spec.id,
            "spec": spec.to_json(),
            "pinned": "1" if pinned else "0",
            "events_maxlen": EVENTS_MAXLEN,
            "event": event.to_json() if event is not None else "",
            "request": spec.request,
        },
    )


def submitted(spec: JobSpec) -> Event:
    """What the pool's stream says of a job stored."""
    said = f"job {spec.id}: submitted by {spec.submitted_by or 'its nodes'}"
    return Event("job_submitted", message=said, data={"job": spec.id})
