"""The Lua every script of a job or a pool is built from (scripts.py, poolscripts.py): the server
time, garbage notes and typed calls, the leader lease, the change set, the leader's bounded read.
Each fragment takes the keys it touches as parameters, so scripts whose keys differ share it.

Every time comparison happens in Lua, in Redis server time (TIME), never on an agent's clock.
Node names cannot contain spaces (config validation), so "<name> <token>" is unambiguous.

Nothing in Redis is trusted to be what nodeagent wrote: a command on a key of the wrong type is
run with redis.pcall and noted as garbage ("kind<TAB>key<TAB>problem<TAB>action", returned to
the caller, which reports it), so one bad key never fails a whole heartbeat.
"""

from __future__ import annotations

from nodeagent.model.pool import PoolJobState

NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""


# Helpers of every script: garbage notes, typed calls, what counts as a counter or an entry ID.
GARBAGE = """
local garbage = {}
local function note(kind, key, problem, action)
  garbage[#garbage + 1] = kind .. '\\t' .. key .. '\\t' .. problem .. '\\t' .. (action or 'ignored')
end
local function sample(value)
  value = tostring(value)
  if #value > 64 then value = string.sub(value, 1, 61) .. '...' end
  return '"' .. value .. '"'
end
local function kind_of(key)
  return redis.call('TYPE', key)['ok']
end
local function wrong(key, want)
  return 'holds a ' .. kind_of(key) .. ', not a ' .. want
end
-- A command whose error reply is noted as garbage of `kind` instead of failing the script.
-- Returns nil on an error (a missing key or field still gives false).
local function try(kind, key, want, action, ...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply['err'] then
    local problem = reply['err']
    if string.sub(problem, 1, 9) == 'WRONGTYPE' then problem = wrong(key, want) end
    note(kind, key, problem, action)
    return nil
  end
  return reply
end
local function fmt(n)
  return string.format('%.0f', n)
end
local function is_uint(s)
  return type(s) == 'string' and #s <= 16 and string.match(s, '^%d+$') ~= nil
    and tonumber(s) <= 9007199254740991
end
local function is_id(s)
  return type(s) == 'string' and #s <= 41 and string.match(s, '^%d+%-%d+$') ~= nil
end
local function id_less(a, b)
  local function part(x)
    x = string.gsub(x, '^0+(%d)', '%1')
    return x
  end
  local am, as = string.match(a, '^(%d+)%-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)%-(%d+)$')
  am, as, bm, bs = part(am), part(as), part(bm), part(bs)
  if am ~= bm then
    if #am ~= #bm then return #am < #bm end
    return am < bm
  end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
"""


# The leader lease (`key`) as it stands: a valid "<node> <token>" value, false when free, or
# nil when it is garbage (wrong type, unparseable, no TTL, or, with a TTL longer than `ttl`,
# naming a node that holds no node key: no live agent renews it). Garbage is noted; with
# `clamp` its TTL is cut to `ttl`, so the lease is taken over within one lease_ttl, as if its
# holder had died.
LEADER = """
local function read_leader(key, prefix, ttl, clamp)
  local value = redis.pcall('GET', key)
  local pttl = redis.call('PTTL', key)
  local problem = nil
  if type(value) == 'table' then
    problem = wrong(key, 'string')
  elseif value then
    local holder, token = string.match(value, '^([^ ]+) (%d+)$')
    if not holder or #token > 16 then
      problem = 'is not "<node> <token>": ' .. sample(value)
    elseif pttl < 0 then
      problem = 'has no TTL'
    elseif clamp and pttl > ttl and redis.call('EXISTS', prefix .. holder) == 0 then
      -- (within ttl it lapses soon anyway: a holder that just died is no garbage)
      problem = 'names ' .. sample(holder) .. ', which has no node key'
    end
  end
  if not problem then return value end
  local action = 'ignored'
  if clamp then
    action = 'taken over within lease_ttl'
    if pttl < 0 or pttl > ttl then redis.call('PEXPIRE', key, ttl) end
  end
  note('leader', key, problem, action)
  return nil
end
"""


# Take the leader lease (`key`, tokens from `epoch`) when it is free, renew it when `name`
# holds it; returns its value as it now stands (nil: garbage, left to lapse).
TAKE_LEADER = """
local function take_leader(key, epoch, name, prefix, ttl)
  local mine = name .. ' '
  local leader = read_leader(key, prefix, ttl, true)
  if leader == false then
    local token = redis.pcall('INCR', epoch)
    if type(token) == 'table' or token > 1e15 then
      local problem = 'passed 10^15'
      if type(token) == 'table' then problem = token['err'] end
      if string.sub(problem, 1, 9) == 'WRONGTYPE' then problem = wrong(epoch, 'string') end
      note('leader-epoch', epoch, problem, 'restarted from the server time')
      redis.call('SET', epoch, fmt(now))
      token = redis.call('INCR', epoch)
    end
    leader = mine .. fmt(token)
    redis.call('SET', key, leader, 'PX', ttl)
  elseif leader and string.sub(leader, 1, #mine) == mine then
    redis.call('PEXPIRE', key, ttl)
  end
  return leader
end
"""


# The change set (`changes` zset, `seq_key` change-seq counter, `digests` hash):
# a node's heartbeat gives it a new change number when what the leader plans from changed
# (its digest), or when its node key was gone (it is back). The leader reads only the nodes
# changed since its cursor. Keys of the wrong type are noted; the leader deletes them (repair),
# so every node marks itself again at its next heartbeat, with numbers above the leader's cursor.
CHANGES = """
local function mark_changed(changes, seq_key, digests, name, digest)
  local seq = try('changes', seq_key, 'string', 'not marked', 'INCR', seq_key)
  if not seq then return end
  if seq == 1 then
    -- A new counter starts above every number the last one gave (as leader-epoch does): the
    -- leader's cursor stays valid and it reads every node that marks itself again.
    seq = now * 1000
    redis.call('SET', seq_key, fmt(seq))
  end
  if not try('changes', changes, 'zset', 'not marked', 'ZADD', changes, fmt(seq), name) then
    return
  end
  if digest then
    try('changes', digests, 'hash', 'ignored', 'HSET', digests, name, digest)
  else
    redis.pcall('HDEL', digests, name)
  end
end
-- The leader's repair: the change set is one thing; any of its keys garbage, all three go (each
-- node marks itself again at its next heartbeat, above the leader's cursor).
local function repair_changes(changes, seq_key, digests)
  local set = {{changes, 'zset'}, {seq_key, 'string'}, {digests, 'hash'}}
  for _, k in ipairs(set) do
    local found = kind_of(k[1])
    local counter = found == 'string' and k[2] == 'string'
    if counter and not is_uint(redis.call('GET', k[1])) then found = 'garbage' end
    if found ~= k[2] and found ~= 'none' then
      local problem = wrong(k[1], k[2])
      if counter then problem = 'is not a counter' end
      note('changes', k[1], problem, 'the change set is rebuilt')
      redis.call('DEL', changes, seq_key, digests)
      return
    end
  end
end
"""


# The leader's bounded read (`leases`, `changes` and its `seq_key` counter):
# - up to `page` nodes changed after change number `cursor`, and `sweep_count` leases more from
#   a ZSCAN of the leases at `sweep` ('' for none): a slow full pass that finds what no change
#   announced (a lease written by hand, a change set lost), every lease in about M / sweep_count
#   heartbeats (all of them at once while the set is small);
#   for each: its lease deadline (false: it holds none), report ('' if missing), node key PTTL;
# - up to 4 * page expired leases (deadline <= now) from `expired_at` on, with their deadlines;
# - the earliest live deadline (the leader wakes then);
# - the change counter (below the cursor: the change set was lost, the leader reads it all).
# Returns {entries (name, deadline, ...), reports, ttls, seq, last change number read,
#   more (1: a page was full), expired (name, deadline, ...), next deadline or false, sweep}.
READ_VIEW = """
local function read_view(leases, changes, seq_key, prefix, cursor, sweep, sweep_count, page,
    expired_at)
  local names, seen = {}, {}
  local function add(name)
    if not seen[name] then
      seen[name] = true
      names[#names + 1] = name
    end
  end
  local more, reached = 0, cursor
  local changed = try('changes', changes, 'zset', 'ignored', 'ZRANGEBYSCORE', changes,
    '(' .. cursor, '+inf', 'WITHSCORES', 'LIMIT', 0, page) or {}
  for i = 1, #changed, 2 do
    add(changed[i])
    reached = changed[i + 1]
  end
  if #changed >= 2 * page then more = 1 end
  local next_sweep = '0'
  if sweep ~= '' then
    local scanned = try('leases', leases, 'zset', 'ignored', 'ZSCAN', leases, sweep,
      'COUNT', sweep_count)
    if scanned then
      next_sweep = scanned[1]
      for i = 1, #scanned[2], 2 do add(scanned[2][i]) end
    end
  end
  local expired = try('leases', leases, 'zset', 'ignored', 'ZRANGEBYSCORE', leases, '-inf',
    now, 'WITHSCORES', 'LIMIT', expired_at, 4 * page) or {}
  if #expired >= 8 * page then more = 1 end
  local first = try('leases', leases, 'zset', 'ignored', 'ZRANGEBYSCORE', leases,
    '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1) or {}
  local entries, reports, ttls = {}, {}, {}
  for _, name in ipairs(names) do
    local key = prefix .. name
    entries[#entries + 1] = name
    entries[#entries + 1] = redis.pcall('ZSCORE', leases, name)
    reports[#reports + 1] = try('node', key, 'string', 'ignored', 'GET', key) or ''
    ttls[#ttls + 1] = redis.call('PTTL', key)
  end
  for i = 2, #entries, 2 do
    if type(entries[i]) ~= 'string' then entries[i] = false end
  end
  local seq = redis.pcall('GET', seq_key)
  if type(seq) ~= 'string' then seq = '0' end
  return {entries, reports, ttls, seq, reached, more, expired, first[2] or false, next_sweep}
end
"""


# The pool leader's writes: why one is refused (its lease key no longer holds `value`), or nil.
# The pool job states that are ended (PoolJobState.ended), as a Lua set: `ENDED[state]`.
ENDED = (
    "local ENDED = {"
    + ", ".join(f"{state.value} = true" for state in PoolJobState if state.ended)
    + "}\n"
)

POOL_FENCE = """
local function pool_fenced(leader_key, value)
  if redis.pcall('GET', leader_key) ~= value then
    return 'FENCED pool leader lease is not ' .. value
  end
  return nil
end
"""


# A job's status or spec written or deleted: noted in the job changes set at the script's time,
# what the pool leader reads between its full reads of the jobs (coord/pool.py, HeldJobs). A
# key that is not a set is left alone: the leader then reads every job.
NOTE_JOB = """
local function note_job(key, job)
  redis.pcall('ZADD', key, now, job)
end
"""
