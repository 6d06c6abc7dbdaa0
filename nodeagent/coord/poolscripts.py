"""The pool's Lua scripts. Each starts with its KEYS and ARGV; every key of one call is a key of
one pool (one hash tag), so they run on a Redis Cluster too. Garbage in a key is noted (see
scripts.py) and skipped, never a failed heartbeat.
"""

from __future__ import annotations

from nodeagent.coord.scripts import CHANGES, GARBAGE, LEADER, NOW, TAKE_LEADER

POOL_SYNC = (
    """
-- A node's pool heartbeat: renew its pool lease, take or renew the pool leader lease, mark the
-- node changed when its report did (as a job's SYNC), read where the pool placed it.
-- KEYS[1] node key  KEYS[2] leases zset  KEYS[3] leader  KEYS[4] leader epoch
-- KEYS[5] placements hash  KEYS[6] changes zset  KEYS[7] change-seq  KEYS[8] digests hash
-- ARGV[1] node name  ARGV[2] report JSON  ARGV[3] lease ttl ms  ARGV[4] node key prefix
-- ARGV[5] report digest
-- Returns {now_ms, leader or false, leader lease deadline or false, placement or false,
--   garbage}.
"""
    + NOW
    + GARBAGE
    + LEADER
    + TAKE_LEADER
    + CHANGES
    + """
local name, ttl = ARGV[1], tonumber(ARGV[3])
local back = redis.call('EXISTS', KEYS[1]) == 0
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
try('leases', KEYS[2], 'zset', 'lease not renewed', 'ZADD', KEYS[2], now + ttl, name)
local leader = take_leader(name, ARGV[4], ttl)
if leader and string.sub(leader, 1, #name + 1) == name .. ' ' then repair_changes(6) end
local digest = try('changes', KEYS[8], 'hash', 'ignored', 'HGET', KEYS[8], name)
if back or digest ~= ARGV[5] then mark_changed(6, name, ARGV[5]) end
local pttl = redis.call('PTTL', KEYS[3])
local deadline = false
if pttl > 0 then deadline = now + pttl end
local placement = try('placements', KEYS[5], 'hash', 'ignored', 'HGET', KEYS[5], name) or false
return {now, leader or false, deadline, placement, garbage}
"""
)

POOL_READ = (
    """
-- The pool's hashes, read at once (the pool leader, nodeagentctl): repairs nothing. Its nodes
-- are read in pages (scripts.READ_PAGE), so no call grows with the number of nodes.
-- KEYS[1] placements  KEYS[2] jobs  KEYS[3] cancels  KEYS[4] cordons  KEYS[5] leader
-- KEYS[6] queues
-- ARGV[1] '1': the placements are not read (the pool leader has them: it alone writes them)
-- Returns {now_ms, leader or false, placements (false when not read), jobs, cancels, cordons,
--   queues (flat field/value lists), garbage}.
"""
    + NOW
    + GARBAGE
    + """
local function all(kind, key)
  return try(kind, key, 'hash', 'ignored', 'HGETALL', key) or {}
end
local leader = redis.pcall('GET', KEYS[5])
if type(leader) ~= 'string' then leader = false end
local placements = false
if ARGV[1] ~= '1' then placements = all('placements', KEYS[1]) end
return {now, leader, placements, all('jobs', KEYS[2]), all('cancels', KEYS[3]),
  all('cordons', KEYS[4]), all('queues', KEYS[6]), garbage}
"""
)

POOL_COMMIT = (
    """
-- The pool leader's write, fenced by its lease value.
-- KEYS[1] leader  KEYS[2] placements  KEYS[3] jobs  KEYS[4] events  KEYS[5] leases
-- KEYS[6] changes  KEYS[7] digests (a dropped lease's node leaves the change set)
-- ARGV[1] leader value ("<name> <token>")  ARGV[2] events maxlen
-- ARGV[3] n, then n nodes to unplace; then m, then m (node, job) placements; then k, then k
--   (job, status JSON); then r, then r lapsed leases to drop (kept if renewed meanwhile);
--   then events to append.
-- Returns 1, or an error starting with FENCED.
"""
    + NOW
    + """
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED pool leader lease is not ' .. ARGV[1])
end
local i = 3
local function take()
  local n = tonumber(ARGV[i])
  local first = i + 1
  i = i + 1 + n
  return first, n
end
local first, n = take()
for j = first, first + n - 1 do redis.pcall('HDEL', KEYS[2], ARGV[j]) end
first, n = take()
i = i + n
for j = first, first + 2 * n - 1, 2 do redis.pcall('HSET', KEYS[2], ARGV[j], ARGV[j + 1]) end
first, n = take()
i = i + n
for j = first, first + 2 * n - 1, 2 do redis.pcall('HSET', KEYS[3], ARGV[j], ARGV[j + 1]) end
first, n = take()
for j = first, first + n - 1 do
  local deadline = redis.pcall('ZSCORE', KEYS[5], ARGV[j])
  if type(deadline) == 'string' and tonumber(deadline) <= now then
    redis.pcall('ZREM', KEYS[5], ARGV[j])
    redis.pcall('ZREM', KEYS[6], ARGV[j])
    redis.pcall('HDEL', KEYS[7], ARGV[j])
  end
end
for j = i, #ARGV do
  if type(redis.pcall('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*', 'event', ARGV[j]))
      == 'table' then
    break
  end
end
return 1
"""
)

POOL_SUBMIT = (
    """
-- Submit a job: store its spec and a pending status, once per job id.
-- KEYS[1] specs  KEYS[2] jobs  KEYS[3] seq  KEYS[4] events
-- ARGV[1] job id  ARGV[2] spec JSON  ARGV[3] '1' when pinned by nodes' job: sections
-- ARGV[4] events maxlen  ARGV[5] event JSON
-- Returns {1, status JSON} when submitted, {0, status JSON or false} when the id exists.
"""
    + NOW
    + """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return {0, redis.call('HGET', KEYS[2], ARGV[1]) or false}
end
local seq = redis.call('INCR', KEYS[3])
local pinned = 'false'
if ARGV[3] == '1' then pinned = 'true' end
local status = string.format(
  '{"pinned":%s,"reason":"submitted","seq":%.0f,"state":"pending","submitted_ms":%.0f}',
  pinned, seq, now)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], status)
redis.pcall('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[5])
return {1, status}
"""
)
