"""The Lua scripts nodeagent runs in Redis. Each starts with its KEYS and ARGV.

Every time comparison happens here, in Redis server time (TIME), never on an agent's clock.
Node names cannot contain spaces (config validation), so "<name> <token>" is unambiguous.

Nothing in Redis is trusted to be what nodeagent wrote: a command on a key of the wrong type is
run with redis.pcall and noted as garbage ("kind<TAB>key<TAB>problem<TAB>action", returned to
the caller, which reports it), so one bad key never fails a whole heartbeat. The leader repairs
the job's own keys inside its heartbeat (SYNC), where holding the leader lease is checked in the
same atomic step: that is the fence.
"""

from __future__ import annotations

from nodeagent.coord.keys import WAKE_MAXLEN

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

# The leader lease (KEYS[3]) as it stands: a valid "<node> <token>" value, false when free, or
# nil when it is garbage (wrong type, unparseable, no TTL, or, with a TTL longer than `ttl`,
# naming a node that holds no node key: no live agent renews it). Garbage is noted; with
# `clamp` its TTL is cut to `ttl`, so the lease is taken over within one lease_ttl, as if its
# holder had died.
LEADER = """
local function read_leader(prefix, ttl, clamp)
  local value = redis.pcall('GET', KEYS[3])
  local pttl = redis.call('PTTL', KEYS[3])
  local problem = nil
  if type(value) == 'table' then
    problem = wrong(KEYS[3], 'string')
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
    if pttl < 0 or pttl > ttl then redis.call('PEXPIRE', KEYS[3], ttl) end
  end
  note('leader', KEYS[3], problem, action)
  return nil
end
"""

# Take the leader lease (KEYS[3], tokens from KEYS[4]) when it is free, renew it when `name`
# holds it; returns its value as it now stands (nil: garbage, left to lapse).
TAKE_LEADER = """
local function take_leader(name, prefix, ttl)
  local mine = name .. ' '
  local leader = read_leader(prefix, ttl, true)
  if leader == false then
    local token = redis.pcall('INCR', KEYS[4])
    if type(token) == 'table' or token > 1e15 then
      local problem = 'passed 10^15'
      if type(token) == 'table' then problem = token['err'] end
      if string.sub(problem, 1, 9) == 'WRONGTYPE' then problem = wrong(KEYS[4], 'string') end
      note('leader-epoch', KEYS[4], problem, 'restarted from the server time')
      redis.call('SET', KEYS[4], fmt(now))
      token = redis.call('INCR', KEYS[4])
    end
    leader = mine .. fmt(token)
    redis.call('SET', KEYS[3], leader, 'PX', ttl)
  elseif leader and string.sub(leader, 1, #mine) == mine then
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
  return leader
end
"""

# The change set (KEYS[ci] changes zset, KEYS[ci + 1] change-seq counter, KEYS[ci + 2] digests
# hash): a node's heartbeat gives it a new change number when what the leader plans from changed
# (its digest), or when its node key was gone (it is back). The leader reads only the nodes
# changed since its cursor. Keys of the wrong type are noted; the leader deletes them (repair),
# so every node marks itself again at its next heartbeat, with numbers above the leader's cursor.
CHANGES = """
local function mark_changed(ci, name, digest)
  local seq = try('changes', KEYS[ci + 1], 'string', 'not marked', 'INCR', KEYS[ci + 1])
  if not seq then return end
  if seq == 1 then
    -- A new counter starts above every number the last one gave (as leader-epoch does): the
    -- leader's cursor stays valid and it reads every node that marks itself again.
    seq = now * 1000
    redis.call('SET', KEYS[ci + 1], fmt(seq))
  end
  if not try('changes', KEYS[ci], 'zset', 'not marked', 'ZADD', KEYS[ci], fmt(seq), name) then
    return
  end
  if digest then
    try('changes', KEYS[ci + 2], 'hash', 'ignored', 'HSET', KEYS[ci + 2], name, digest)
  else
    redis.pcall('HDEL', KEYS[ci + 2], name)
  end
end
-- The leader's repair: the change set is one thing; any of its keys garbage, all three go (each
-- node marks itself again at its next heartbeat, above the leader's cursor).
local function repair_changes(ci)
  local set = {{KEYS[ci], 'zset'}, {KEYS[ci + 1], 'string'}, {KEYS[ci + 2], 'hash'}}
  for _, k in ipairs(set) do
    local found = kind_of(k[1])
    local counter = found == 'string' and k[2] == 'string'
    if counter and not is_uint(redis.call('GET', k[1])) then found = 'garbage' end
    if found ~= k[2] and found ~= 'none' then
      local problem = wrong(k[1], k[2])
      if counter then problem = 'is not a counter' end
      note('changes', k[1], problem, 'the change set is rebuilt')
      redis.call('DEL', KEYS[ci], KEYS[ci + 1], KEYS[ci + 2])
      return
    end
  end
end
"""

# The leader's bounded read (KEYS[li] leases, KEYS[ci] changes, KEYS[ci + 1] change-seq):
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
local function read_view(li, ci, prefix, cursor, sweep, sweep_count, page, expired_at)
  local names, seen = {}, {}
  local function add(name)
    if not seen[name] then
      seen[name] = true
      names[#names + 1] = name
    end
  end
  local more, reached = 0, cursor
  local changed = try('changes', KEYS[ci], 'zset', 'ignored', 'ZRANGEBYSCORE', KEYS[ci],
    '(' .. cursor, '+inf', 'WITHSCORES', 'LIMIT', 0, page) or {}
  for i = 1, #changed, 2 do
    add(changed[i])
    reached = changed[i + 1]
  end
  if #changed >= 2 * page then more = 1 end
  local next_sweep = '0'
  if sweep ~= '' then
    local scanned = try('leases', KEYS[li], 'zset', 'ignored', 'ZSCAN', KEYS[li], sweep,
      'COUNT', sweep_count)
    if scanned then
      next_sweep = scanned[1]
      for i = 1, #scanned[2], 2 do add(scanned[2][i]) end
    end
  end
  local expired = try('leases', KEYS[li], 'zset', 'ignored', 'ZRANGEBYSCORE', KEYS[li], '-inf',
    now, 'WITHSCORES', 'LIMIT', expired_at, 4 * page) or {}
  if #expired >= 8 * page then more = 1 end
  local first = try('leases', KEYS[li], 'zset', 'ignored', 'ZRANGEBYSCORE', KEYS[li],
    '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1) or {}
  local entries, reports, ttls = {}, {}, {}
  for _, name in ipairs(names) do
    local key = prefix .. name
    entries[#entries + 1] = name
    entries[#entries + 1] = redis.pcall('ZSCORE', KEYS[li], name)
    reports[#reports + 1] = try('node', key, 'string', 'ignored', 'GET', key) or ''
    ttls[#ttls + 1] = redis.call('PTTL', key)
  end
  for i = 2, #entries, 2 do
    if type(entries[i]) ~= 'string' then entries[i] = false end
  end
  local seq = redis.pcall('GET', KEYS[ci + 1])
  if type(seq) ~= 'string' then seq = '0' end
  return {entries, reports, ttls, seq, reached, more, expired, first[2] or false, next_sweep}
end
"""


# The leader's repairs of the job's own keys (KEYS[2] leases, KEYS[5] job hash, KEYS[6] events,
# KEYS[7] commands, KEYS[8] cordons). Run only while this node holds the leader lease, checked in
# the same script. A key of the wrong type holds nothing nodeagent wrote: it is deleted (the
# leases are rebuilt from the record's members and their node keys' TTLs, so no member looks
# gone). In the job hash, `rev` must be a counter, `gen` the record's generation, `cursor` an
# entry ID no later than the last command.
_REPAIR = """
local function last_command()
  if kind_of(KEYS[7]) ~= 'stream' then return nil end
  local last = redis.call('XREVRANGE', KEYS[7], '+', '-', 'COUNT', 1)
  if #last == 0 then return nil end
  return last[1][1]
end
local function repair_job()
  local kind = kind_of(KEYS[5])
  if kind ~= 'hash' then
    if kind ~= 'none' then
      note('job', KEYS[5], wrong(KEYS[5], 'hash'), 'deleted: the job re-forms')
      redis.call('DEL', KEYS[5])
    end
    return nil
  end
  local f = redis.call('HMGET', KEYS[5], 'rev', 'gen', 'cursor', 'record')
  if f[1] and not is_uint(f[1]) then
    note('job', KEYS[5], 'field rev ' .. sample(f[1]) .. ' is not a revision', 'reset')
    redis.call('HSET', KEYS[5], 'rev', fmt(now))
  end
  local record = nil
  if f[4] then
    local ok, decoded = pcall(cjson.decode, f[4])
    if ok and type(decoded) == 'table' then record = decoded end
  end
  local gen = nil
  if record and type(record.generation) == 'number' and record.generation >= 0
      and record.generation == math.floor(record.generation)
      and record.generation <= 9007199254740991 then
    gen = fmt(record.generation)
  end
  if f[2] and f[2] ~= gen then
    local problem = 'field gen ' .. sample(f[2]) .. " is not the record's generation"
    if gen then
      note('job', KEYS[5], problem, 'set to ' .. gen)
      redis.call('HSET', KEYS[5], 'gen', gen)
    else
      note('job', KEYS[5], problem, 'removed')
      redis.call('HDEL', KEYS[5], 'gen')
    end
  end
  -- No command read can be later than the last one, or than now when there is none.
  local last = last_command()
  local bound = last or (fmt(now) .. '-99999999999999999999')
  local cursor = f[3]
  if cursor and (not is_id(cursor) or id_less(bound, cursor)) then
    local fixed = last or '0-0'
    if record and is_id(record.command_cursor) and not id_less(bound, record.command_cursor) then
      fixed = record.command_cursor
    end
    note('job', KEYS[5], 'field cursor ' .. sample(cursor) .. ' is past every command',
      'set to ' .. fixed)
    redis.call('HSET', KEYS[5], 'cursor', fixed)
  end
  return record
end
local function rebuild_leases(record)
  redis.call('DEL', KEYS[2])
  if not record or type(record.members) ~= 'table' then return end
  for _, member in ipairs(record.members) do
    if type(member) == 'string' and string.match(member, '^[%w][%w._-]*$') then
      local pttl = redis.call('PTTL', ARGV[5] .. member)
      if pttl > 0 then redis.call('ZADD', KEYS[2], now + pttl, member) end
    end
  end
end
local function repair()
  local record = repair_job()
  local kind = kind_of(KEYS[2])
  if kind ~= 'zset' and kind ~= 'none' then
    note('leases', KEYS[2], wrong(KEYS[2], 'zset'), "rebuilt from the members' node keys")
    rebuild_leases(record)
  end
  local owned = {{'events', KEYS[6], 'stream'}, {'commands', KEYS[7], 'stream'},
    {'cordons', KEYS[8], 'hash'}, {'job', KEYS[12], 'hash'}}
  for _, k in ipairs(owned) do
    local found = kind_of(k[2])
    if found ~= k[3] and found ~= 'none' then
      note(k[1], k[2], wrong(k[2], k[3]), 'deleted')
      redis.call('DEL', k[2])
    end
  end
  repair_changes(9)
end
"""

SYNC = (
    """
-- Heartbeat: renew this node's lease, take or renew the leader lease, append events, read.
-- KEYS[1] node key    KEYS[2] leases zset    KEYS[3] leader      KEYS[4] leader epoch
-- KEYS[5] job hash    KEYS[6] events stream  KEYS[7] commands stream  KEYS[8] cordons hash
-- KEYS[9] changes zset  KEYS[10] change-seq counter  KEYS[11] digests hash
-- KEYS[12] ranks hash
-- ARGV[1] node name   ARGV[2] report JSON    ARGV[3] lease ttl ms
-- ARGV[4] events maxlen  ARGV[5] node key prefix  ARGV[6] report digest
-- ARGV[7] the record revision the caller holds ('' for none: a leader always reads it, so a
--   record replaced by hand at the same revision is seen, and rewritten at a new one)
-- ARGV[8] the leader's change cursor  ARGV[9] its sweep cursor  ARGV[10] sweep count
-- ARGV[11] page size  ARGV[12..] event JSONs to append
-- The record is: 1, the one at the revision the caller holds (not read, not sent again); to a
-- leader, the record; to another node, {head, its rank or nil} (JobRecord.head_json: the member
-- list is 90 KB at 10,000 nodes, and every node reads the record at every new revision), or the
-- record when the ranks hash is not the one written with it (lost, garbage, an older writer's).
-- Returns {now_ms, leader, rev, record, this node's cordon, leader lease deadline (ms),
--   garbage} and, for the leader only, {..., read_view's entries, reports, ttls, commands, seq,
--   last change read, more, expired, next deadline, sweep, {the record's head, its members'
--   digest, the ranks hash's digest}} (the leader checks that what the others read is its
--   record's: replies._stale_head). Followers wake at the leader's deadline to take over at
--   once. A garbage leader lease or epoch never stops the job: the lease lapses within
--   lease_ttl, the epoch restarts from the server time (above any token handed out), and the
--   leader repairs the job's other keys before it reads them.
"""
    + NOW
    + GARBAGE
    + LEADER
    + TAKE_LEADER
    + CHANGES
    + _REPAIR
    + READ_VIEW
    + """
local name = ARGV[1]
local ttl = tonumber(ARGV[3])
local mine = name .. ' '
local back = redis.call('EXISTS', KEYS[1]) == 0
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
local leader = take_leader(name, ARGV[5], ttl)
local leading = leader and string.sub(leader, 1, #mine) == mine
if leading then repair() end
try('leases', KEYS[2], 'zset', 'lease not renewed', 'ZADD', KEYS[2], now + ttl, name)
local digest = try('changes', KEYS[11], 'hash', 'ignored', 'HGET', KEYS[11], name)
if back or digest ~= ARGV[6] then mark_changed(9, name, ARGV[6]) end
for i = 12, #ARGV do
  local added = try('events', KEYS[6], 'stream', 'events not appended',
    'XADD', KEYS[6], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[i])
  if not added then break end
end
local function member_record()
  local f = redis.call('HMGET', KEYS[5], 'head', 'members')
  if f[1] and f[2] then
    local ranks = redis.pcall('HMGET', KEYS[12], '.members', name)
    if not ranks['err'] and ranks[1] == f[2] then return {f[1], ranks[2]} end
  end
  return redis.call('HGET', KEYS[5], 'record')
end
local rev, record = '0', false
local held = try('job', KEYS[5], 'hash', 'ignored', 'HGET', KEYS[5], 'rev')
if held ~= nil then
  rev = held or '0'
  if leading then
    record = redis.call('HGET', KEYS[5], 'record')
  elseif rev == ARGV[7] then
    record = 1
  else
    record = member_record()
  end
end
local cordon = try('cordons', KEYS[8], 'hash', 'ignored', 'HGET', KEYS[8], name) or false
local leader_pttl = redis.call('PTTL', KEYS[3])
local leader_deadline = false
if leader_pttl > 0 then leader_deadline = now + leader_pttl end
if not leading then
  return {now, leader or false, rev, record, cordon, leader_deadline, garbage}
end
local view = read_view(2, 9, ARGV[5], ARGV[8], ARGV[9], tonumber(ARGV[10]), tonumber(ARGV[11]), 0)
local cursor = redis.call('HGET', KEYS[5], 'cursor') or '0-0'
local commands = try('commands', KEYS[7], 'stream', 'ignored',
  'XRANGE', KEYS[7], '(' .. cursor, '+', 'COUNT', 100) or {}
local head = redis.call('HMGET', KEYS[5], 'head', 'members')
local ranks = redis.call('HGET', KEYS[12], '.members')  -- (repair made it a hash or none)
head[3] = ranks
return {now, leader, rev, record, cordon, leader_deadline, garbage, view[1], view[2], view[3],
  commands, view[4], view[5], view[6], view[7], view[8], view[9], head}
"""
)

READ_PAGE = (
    """
-- More of what the leader reads (see read_view), or nodeagentctl status's pages: repairs
-- nothing, notes garbage.
-- KEYS[1] leases zset  KEYS[2] changes zset  KEYS[3] change-seq  KEYS[4] leader
-- ARGV[1] node key prefix  ARGV[2] change cursor  ARGV[3] sweep cursor ('' for none)
-- ARGV[4] sweep count  ARGV[5] page size  ARGV[6] offset of the first expired lease
-- Returns SYNC's leader reply, with no record, cordon or commands.
"""
    + NOW
    + GARBAGE
    + READ_VIEW
    + """
local view = read_view(1, 2, ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]),
  tonumber(ARGV[6]))
local leader = redis.pcall('GET', KEYS[4])
if type(leader) ~= 'string' then leader = false end
return {now, leader, '0', false, false, false, garbage, view[1], view[2], view[3], {},
  view[4], view[5], view[6], view[7], view[8], view[9]}
"""
)

SNAPSHOT = (
    """
-- Read-only header of a snapshot for nodeagentctl: repairs nothing, notes garbage. The leases
-- are read in pages (READ_PAGE), so no call grows with the fleet.
-- KEYS[1] unused      KEYS[2] leases zset    KEYS[3] leader     KEYS[4] job hash
-- ARGV[1..4] unused   ARGV[5] node key prefix
-- Returns {now_ms, leader, rev, record, false (no node's cordon), false, garbage}.
"""
    + NOW
    + GARBAGE
    + LEADER
    + """
local leader = read_leader(ARGV[5], 0, false) or false
local job = try('job', KEYS[4], 'hash', 'ignored', 'HMGET', KEYS[4], 'rev', 'record')
local rev, record = '0', false
if job then rev, record = job[1] or '0', job[2] end
return {now, leader, rev, record, false, false, garbage}
"""
)

COMMIT = (
    """
-- The leader's write, fenced by its token and the record revision it read.
-- KEYS[1] leader      KEYS[2] job hash       KEYS[3] leases zset  KEYS[4] events stream
-- KEYS[5] changes zset  KEYS[6] digests hash (a reaped node leaves the change set)
-- KEYS[7] wake stream: a new record appends its revision there, which wakes the followers
--   (they do not read the events stream: at 10,000 nodes each would receive every node's events)
-- KEYS[8] ranks hash: its ranks become the record's when WRITE_RANKS wrote them for these
--   members ('.pending'); they stay another list's (nodes then read the whole record) if not
-- ARGV[1] leader value ("<name> <token>")    ARGV[2] expected rev
-- ARGV[3] record JSON ('' = unchanged)       ARGV[4] its generation  ARGV[5] command cursor
-- ARGV[6] events maxlen  ARGV[7] node key prefix
-- ARGV[8] '1' when the record read at that revision was garbage: it is replaced whatever
--   generation it claimed (the generation check below guards records nodeagent wrote)
-- ARGV[9] the record's head JSON  ARGV[10] its members' digest
-- ARGV[11] n = number of nodes to reap  ARGV[12..11+n] nodes to reap (refused if a lease was
--   renewed meanwhile)  ARGV[12+n] m = number of garbage leases to drop
-- ARGV[13+n..12+n+2m] (name, score as read) pairs: dropped if the score is still that
-- ARGV[13+n+2m..] events to append
-- Returns the new rev, or an error starting with FENCED. Values that are not what nodeagent
-- writes (a garbage rev or gen) are refused as FENCED too: the leader re-reads, and its next
-- heartbeat repairs them.
"""
    + NOW
    + """
local held = redis.pcall('GET', KEYS[1])
if held ~= ARGV[1] then
  return redis.error_reply('FENCED leader lease is not ' .. ARGV[1])
end
local fields = redis.pcall('HMGET', KEYS[2], 'rev', 'gen')
if fields['err'] then
  return redis.error_reply('FENCED the job hash ' .. fields['err'])
end
local rev = tonumber(fields[1] or '0')
if not rev or not string.match(fields[1] or '0', '^%d+$') then
  return redis.error_reply('FENCED record revision is garbage')
end
if rev ~= tonumber(ARGV[2]) then
  return redis.error_reply('FENCED record revision is ' .. fields[1] .. ', not ' .. ARGV[2])
end
local gen = tonumber(fields[2] or '-1')
if not gen then
  return redis.error_reply('FENCED record generation is garbage')
end
if ARGV[3] ~= '' and ARGV[8] ~= '1' and tonumber(ARGV[4]) < gen then
  return redis.error_reply('FENCED generation ' .. ARGV[4] .. ' is older than ' .. fields[2])
end
local n = tonumber(ARGV[11])
for i = 12, 11 + n do
  local deadline = redis.pcall('ZSCORE', KEYS[3], ARGV[i])
  if type(deadline) == 'table' or (deadline and tonumber(deadline) > now) then
    return redis.error_reply('FENCED lease of ' .. ARGV[i] .. ' was renewed')
  end
end
local m = tonumber(ARGV[12 + n])
for i = 12, 11 + n do
  redis.pcall('ZREM', KEYS[3], ARGV[i])
  redis.call('DEL', ARGV[7] .. ARGV[i])
  redis.pcall('ZREM', KEYS[5], ARGV[i])
  redis.pcall('HDEL', KEYS[6], ARGV[i])
end
for i = 13 + n, 11 + n + 2 * m, 2 do
  if redis.pcall('ZSCORE', KEYS[3], ARGV[i]) == ARGV[i + 1] then
    redis.call('ZREM', KEYS[3], ARGV[i])
  end
end
if ARGV[3] ~= '' then
  rev = rev + 1
  redis.call('HSET', KEYS[2], 'rev', string.format('%.0f', rev), 'gen', ARGV[4],
    'record', ARGV[3], 'cursor', ARGV[5], 'head', ARGV[9], 'members', ARGV[10])
  local ranks = redis.pcall('HMGET', KEYS[8], '.members', '.pending')
  if not ranks['err'] and ranks[1] ~= ARGV[10] and ranks[2] == ARGV[10] then
    redis.call('HSET', KEYS[8], '.members', ARGV[10])
    redis.call('HDEL', KEYS[8], '.pending')
  end
  local wake = {'XADD', KEYS[7], 'MAXLEN', '~', '"""
    + str(WAKE_MAXLEN)
    + """', '*', 'rev', string.format('%.0f', rev)}
  if type(redis.pcall(unpack(wake))) == 'table' then
    redis.call('DEL', KEYS[7])  -- not a stream: garbage, replaced (this write is fenced)
    redis.call(unpack(wake))
  end
end
for i = 13 + n + 2 * m, #ARGV do
  if type(redis.pcall('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'event', ARGV[i]))
      == 'table' then
    break
  end
end
return rev
"""
)

WRITE_RANKS = """
-- The leader writes the ranks of a new member list in pages before the COMMIT of its record
-- (a 10,000-name hash in one call would run for tens of ms). The first page replaces the hash;
-- '.pending' names the list, and COMMIT makes it '.members'. Until then nodes that read the
-- record read it whole. Fenced by the leader lease, every page.
-- KEYS[1] leader  KEYS[2] ranks hash
-- ARGV[1] leader value  ARGV[2] the members' digest  ARGV[3] the first name's rank
-- ARGV[4..] names
-- Returns 1, or an error starting with FENCED.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED leader lease is not ' .. ARGV[1])
end
local first = tonumber(ARGV[3])
if first == 0 then
  redis.call('UNLINK', KEYS[2])  -- another list's ranks, or garbage (freed in the background)
  redis.call('HSET', KEYS[2], '.pending', ARGV[2])
elseif redis.pcall('HGET', KEYS[2], '.pending') ~= ARGV[2] then
  return redis.error_reply('FENCED the ranks of ' .. ARGV[2] .. ' were replaced meanwhile')
end
local hset = {'HSET', KEYS[2]}
for i = 4, #ARGV do
  hset[#hset + 1] = ARGV[i]
  hset[#hset + 1] = string.format('%d', first + i - 4)
end
if #hset > 2 then redis.call(unpack(hset)) end
return 1
"""

LEAVE = (
    """
-- A node leaves on purpose: drop its lease (and the leader lease if it holds it) at once.
-- KEYS[1] node key  KEYS[2] leases zset  KEYS[3] leader  KEYS[4] events stream
-- KEYS[5..7] (a job's) changes zset, change-seq, digests: the leaving is a change its leader
--   reads
-- ARGV[1] node name ARGV[2] events maxlen ARGV[3] event JSON
-- Keys of the wrong type are skipped (redis.pcall): leaving must not fail on garbage.
"""
    + NOW
    + GARBAGE
    + CHANGES
    + """
redis.call('DEL', KEYS[1])
redis.pcall('ZREM', KEYS[2], ARGV[1])
local leader = redis.pcall('GET', KEYS[3])
if type(leader) == 'string' and string.sub(leader, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('DEL', KEYS[3])
end
redis.pcall('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*', 'event', ARGV[3])
if #KEYS >= 7 then mark_changed(5, ARGV[1], false) end
return 1
"""
)
