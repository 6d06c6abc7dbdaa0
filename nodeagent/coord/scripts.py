"""The Lua scripts of a job, each a `Script` (coord/lua.py) naming its KEYS, its ARGV and its
reply, built from the shared fragments (fragments.py); READ_PAGE and LEAVE serve a pool too.

The leader repairs the job's own keys inside its heartbeat (SYNC), where holding the leader
lease is checked in the same atomic step: that is the fence.
"""

from __future__ import annotations

from typing import Protocol

from nodeagent.coord.fragments import CHANGES, GARBAGE, LEADER, NOW, READ_VIEW, TAKE_LEADER
from nodeagent.coord.keys import EVENTS_MAXLEN, WAKE_MAXLEN
from nodeagent.coord.lua import Call, Script
from nodeagent.coord.view import PAGE
from nodeagent.model.job import Event


class NodeKeys(Protocol):
    """The keys READ_PAGE and LEAVE touch: a job's (JobKeys) or a pool's (PoolKeys)."""

    @property
    def leases(self) -> str: ...
    @property
    def leader(self) -> str: ...
    @property
    def events(self) -> str: ...
    @property
    def changes(self) -> str: ...
    @property
    def change_seq(self) -> str: ...
    @property
    def digests(self) -> str: ...

    def node(self, name: str) -> str: ...
    def node_prefix(self) -> str: ...


# The leader's repairs of the job's own keys (SYNC's K.leases, K.job, K.events, K.commands,
# K.cordons, K.ranks and the change set). Run only while this node holds the leader lease,
# checked in the same script. A key of the wrong type holds nothing nodeagent wrote: it is
# deleted (the leases are rebuilt from the record's members and their node keys' TTLs, so no
# member looks gone). In the job hash, `rev` must be a counter, `gen` the record's generation,
# `cursor` an entry ID no later than the last command.
_REPAIR = """
local function last_command()
  if kind_of(K.commands) ~= 'stream' then return nil end
  local last = redis.call('XREVRANGE', K.commands, '+', '-', 'COUNT', 1)
  if #last == 0 then return nil end
  return last[1][1]
end
local function repair_job()
  local kind = kind_of(K.job)
  if kind ~= 'hash' then
    if kind ~= 'none' then
      note('job', K.job, wrong(K.job, 'hash'), 'deleted: the job re-forms')
      redis.call('DEL', K.job)
    end
    return nil
  end
  local f = redis.call('HMGET', K.job, 'rev', 'gen', 'cursor', 'record')
  if f[1] and not is_uint(f[1]) then
    note('job', K.job, 'field rev ' .. sample(f[1]) .. ' is not a revision', 'reset')
    redis.call('HSET', K.job, 'rev', fmt(now))
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
      note('job', K.job, problem, 'set to ' .. gen)
      redis.call('HSET', K.job, 'gen', gen)
    else
      note('job', K.job, problem, 'removed')
      redis.call('HDEL', K.job, 'gen')
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
    note('job', K.job, 'field cursor ' .. sample(cursor) .. ' is past every command',
      'set to ' .. fixed)
    redis.call('HSET', K.job, 'cursor', fixed)
  end
  return record
end
local function rebuild_leases(record)
  redis.call('DEL', K.leases)
  if not record or type(record.members) ~= 'table' then return end
  for _, member in ipairs(record.members) do
    if type(member) == 'string' and string.match(member, '^[%w][%w._-]*$') then
      local pttl = redis.call('PTTL', A.node_prefix .. member)
      if pttl > 0 then redis.call('ZADD', K.leases, now + pttl, member) end
    end
  end
end
local function repair()
  local record = repair_job()
  local kind = kind_of(K.leases)
  if kind ~= 'zset' and kind ~= 'none' then
    note('leases', K.leases, wrong(K.leases, 'zset'), "rebuilt from the members' node keys")
    rebuild_leases(record)
  end
  local owned = {{'events', K.events, 'stream'}, {'commands', K.commands, 'stream'},
    {'cordons', K.cordons, 'hash'}, {'job', K.ranks, 'hash'}}
  for _, k in ipairs(owned) do
    local found = kind_of(k[2])
    if found ~= k[3] and found ~= 'none' then
      note(k[1], k[2], wrong(k[2], k[3]), 'deleted')
      redis.call('DEL', k[2])
    end
  end
  repair_changes(K.changes, K.change_seq, K.digests)
end
"""


# Heartbeat: renew this node's lease, take or renew the leader lease, append events (`rest`),
# read. `held_rev`: the record revision the caller holds ('' for none: a leader always reads
# it, so a record replaced by hand at the same revision is seen, and rewritten at a new one).
# The record is: 1, the one at the revision the caller holds (not read, not sent again); to a
# leader, the record; to another node, {head, its rank or nil} (JobRecord.head_json: the member
# list is 90 KB at 10,000 nodes, and every node reads the record at every new revision), or the
# record when the ranks hash is not the one written with it (lost, garbage, an older writer's).
# Followers wake at the leader's deadline to take over at once. A garbage leader lease or epoch
# never stops the job: the lease lapses within lease_ttl, the epoch restarts from the server
# time (above any token handed out), and the leader repairs the job's other keys before it
# reads them.
SYNC = Script(
    "SYNC",
    keys=(
        "node",
        "leases",
        "leader",
        "epoch",
        "job",
        "events",
        "commands",
        "cordons",
        "changes",
        "change_seq",
        "digests",
        "ranks",
    ),
    args=(
        "name",
        "report",
        "ttl",
        "events_maxlen",
        "node_prefix",
        "digest",
        "held_rev",
        "change_cursor",
        "sweep",
        "sweep_count",
        "page",
    ),
    returns="{now_ms, leader, rev, record, this node's cordon, leader lease deadline (ms), "
    "garbage} and, for the leader only, {..., read_view's entries, reports, ttls, commands, seq, "
    "last change read, more, expired, next deadline, sweep, {the record's head, its members' "
    "digest, the ranks hash's digest}} (replies._stale_head checks the last)",
    body=NOW
    + GARBAGE
    + LEADER
    + TAKE_LEADER
    + CHANGES
    + _REPAIR
    + READ_VIEW
    + """
local name = A.name
local ttl = tonumber(A.ttl)
local mine = name .. ' '
local back = redis.call('EXISTS', K.node) == 0
redis.call('SET', K.node, A.report, 'PX', ttl)
local leader = take_leader(K.leader, K.epoch, name, A.node_prefix, ttl)
local leading = leader and string.sub(leader, 1, #mine) == mine
if leading then repair() end
try('leases', K.leases, 'zset', 'lease not renewed', 'ZADD', K.leases, now + ttl, name)
local digest = try('changes', K.digests, 'hash', 'ignored', 'HGET', K.digests, name)
if back or digest ~= A.digest then
  mark_changed(K.changes, K.change_seq, K.digests, name, A.digest)
end
for i = REST, #ARGV do  -- the events to append
  local added = try('events', K.events, 'stream', 'events not appended',
    'XADD', K.events, 'MAXLEN', '~', A.events_maxlen, '*', 'event', ARGV[i])
  if not added then break end
end
local function member_record()
  local f = redis.call('HMGET', K.job, 'head', 'members')
  if f[1] and f[2] then
    local ranks = redis.pcall('HMGET', K.ranks, '.members', name)
    if not ranks['err'] and ranks[1] == f[2] then return {f[1], ranks[2]} end
  end
  return redis.call('HGET', K.job, 'record')
end
local rev, record = '0', false
local held = try('job', K.job, 'hash', 'ignored', 'HGET', K.job, 'rev')
if held ~= nil then
  rev = held or '0'
  if leading then
    record = redis.call('HGET', K.job, 'record')
  elseif rev == A.held_rev then
    record = 1
  else
    record = member_record()
  end
end
local cordon = try('cordons', K.cordons, 'hash', 'ignored', 'HGET', K.cordons, name) or false
local leader_pttl = redis.call('PTTL', K.leader)
local leader_deadline = false
if leader_pttl > 0 then leader_deadline = now + leader_pttl end
if not leading then
  return {now, leader or false, rev, record, cordon, leader_deadline, garbage}
end
local view = read_view(K.leases, K.changes, K.change_seq, A.node_prefix, A.change_cursor,
  A.sweep, tonumber(A.sweep_count), tonumber(A.page), 0)
local cursor = redis.call('HGET', K.job, 'cursor') or '0-0'
local commands = try('commands', K.commands, 'stream', 'ignored',
  'XRANGE', K.commands, '(' .. cursor, '+', 'COUNT', 100) or {}
local head = redis.call('HMGET', K.job, 'head', 'members')
local ranks = redis.call('HGET', K.ranks, '.members')  -- (repair made it a hash or none)
head[3] = ranks
return {now, leader, rev, record, cordon, leader_deadline, garbage, view[1], view[2], view[3],
  commands, view[4], view[5], view[6], view[7], view[8], view[9], head}
""",
)


# More of what the leader reads (see read_view), or nodeagentctl status's pages: repairs
# nothing, notes garbage. `expired_at`: the offset of the first expired lease to read.
READ_PAGE = Script(
    "READ_PAGE",
    keys=("leases", "changes", "change_seq", "leader"),
    args=("node_prefix", "change_cursor", "sweep", "sweep_count", "page", "expired_at"),
    returns="SYNC's leader reply, with no record, cordon or commands",
    body=NOW
    + GARBAGE
    + READ_VIEW
    + """
local view = read_view(K.leases, K.changes, K.change_seq, A.node_prefix, A.change_cursor,
  A.sweep, tonumber(A.sweep_count), tonumber(A.page), tonumber(A.expired_at))
local leader = redis.pcall('GET', K.leader)
if type(leader) ~= 'string' then leader = false end
return {now, leader, '0', false, false, false, garbage, view[1], view[2], view[3], {},
  view[4], view[5], view[6], view[7], view[8], view[9]}
""",
)


def read_page_call(
    keys: NodeKeys, cursor: int | str, sweep: str, sweep_count: int, expired_at: int
) -> Call:
    """A call of READ_PAGE: PAGE changed nodes after `cursor`, `sweep_count` more from the sweep
    at `sweep` ('' for none), expired leases from offset `expired_at`."""
    return Call(
        {
            "leases": keys.leases,
            "changes": keys.changes,
            "change_seq": keys.change_seq,
            "leader": keys.leader,
        },
        {
            "node_prefix": keys.node_prefix(),
            "change_cursor": cursor,
            "sweep": sweep,
            "sweep_count": sweep_count,
            "page": PAGE,
            "expired_at": expired_at,
        },
    )


# Read-only header of a snapshot for nodeagentctl: repairs nothing, notes garbage. The leases
# are read in pages (READ_PAGE), so no call grows with the fleet.
SNAPSHOT = Script(
    "SNAPSHOT",
    keys=("leader", "job"),
    args=("node_prefix",),
    returns="{now_ms, leader, rev, record, false (no node's cordon), false, garbage}",
    body=NOW
    + GARBAGE
    + LEADER
    + """
local leader = read_leader(K.leader, A.node_prefix, 0, false) or false
local job = try('job', K.job, 'hash', 'ignored', 'HMGET', K.job, 'rev', 'record')
local rev, record = '0', false
if job then rev, record = job[1] or '0', job[2] end
return {now, leader, rev, record, false, false, garbage}
""",
)


# The leader's write, fenced by its token and the record revision it read. A new record
# appends its revision to `wake`, which wakes the followers (they do not read the events
# stream: at 10,000 nodes each would receive every node's events); the ranks WRITE_RANKS wrote
# for these members ('.pending') become the record's, or stay another list's (nodes then read
# the whole record). `record` '' leaves it unchanged; `replacing_garbage` '1': the record read
# at `rev` was garbage, replaced whatever generation it claimed (the generation check guards
# records nodeagent wrote). `rest`: the `reaped` nodes to reap (refused if a lease was renewed
# meanwhile; a reaped node leaves the change set), then m, then m (name, score as read) garbage
# leases to drop if the score is still that, then the events to append. Values that are not
# what nodeagent writes (a garbage rev or gen) are refused as FENCED too: the leader re-reads,
# and its next heartbeat repairs them.
COMMIT = Script(
    "COMMIT",
    keys=("leader", "job", "leases", "events", "changes", "digests", "wake", "ranks"),
    args=(
        "leader_value",
        "rev",
        "record",
        "generation",
        "cursor",
        "events_maxlen",
        "node_prefix",
        "replacing_garbage",
        "head",
        "members_digest",
        "reaped",
    ),
    returns="the new rev, or an error starting with FENCED",
    body=NOW
    + """
local held = redis.pcall('GET', K.leader)
if held ~= A.leader_value then
  return redis.error_reply('FENCED leader lease is not ' .. A.leader_value)
end
local fields = redis.pcall('HMGET', K.job, 'rev', 'gen')
if fields['err'] then
  return redis.error_reply('FENCED the job hash ' .. fields['err'])
end
local rev = tonumber(fields[1] or '0')
if not rev or not string.match(fields[1] or '0', '^%d+$') then
  return redis.error_reply('FENCED record revision is garbage')
end
if rev ~= tonumber(A.rev) then
  return redis.error_reply('FENCED record revision is ' .. fields[1] .. ', not ' .. A.rev)
end
local gen = tonumber(fields[2] or '-1')
if not gen then
  return redis.error_reply('FENCED record generation is garbage')
end
if A.record ~= '' and A.replacing_garbage ~= '1' and tonumber(A.generation) < gen then
  return redis.error_reply('FENCED generation ' .. A.generation .. ' is older than ' .. fields[2])
end
local n = tonumber(A.reaped)
for i = REST, REST - 1 + n do
  local deadline = redis.pcall('ZSCORE', K.leases, ARGV[i])
  if type(deadline) == 'table' or (deadline and tonumber(deadline) > now) then
    return redis.error_reply('FENCED lease of ' .. ARGV[i] .. ' was renewed')
  end
end
local m = tonumber(ARGV[REST + n])
for i = REST, REST - 1 + n do
  redis.pcall('ZREM', K.leases, ARGV[i])
  redis.call('DEL', A.node_prefix .. ARGV[i])
  redis.pcall('ZREM', K.changes, ARGV[i])
  redis.pcall('HDEL', K.digests, ARGV[i])
end
for i = REST + 1 + n, REST - 1 + n + 2 * m, 2 do
  if redis.pcall('ZSCORE', K.leases, ARGV[i]) == ARGV[i + 1] then
    redis.call('ZREM', K.leases, ARGV[i])
  end
end
if A.record ~= '' then
  rev = rev + 1
  redis.call('HSET', K.job, 'rev', string.format('%.0f', rev), 'gen', A.generation,
    'record', A.record, 'cursor', A.cursor, 'head', A.head, 'members', A.members_digest)
  local ranks = redis.pcall('HMGET', K.ranks, '.members', '.pending')
  if not ranks['err'] and ranks[1] ~= A.members_digest and ranks[2] == A.members_digest then
    redis.call('HSET', K.ranks, '.members', A.members_digest)
    redis.call('HDEL', K.ranks, '.pending')
  end
  local wake = {'XADD', K.wake, 'MAXLEN', '~', '"""
    + str(WAKE_MAXLEN)
    + """', '*', 'rev', string.format('%.0f', rev)}
  if type(redis.pcall(unpack(wake))) == 'table' then
    redis.call('DEL', K.wake)  -- not a stream: garbage, replaced (this write is fenced)
    redis.call(unpack(wake))
  end
end
for i = REST + 1 + n + 2 * m, #ARGV do
  if type(redis.pcall('XADD', K.events, 'MAXLEN', '~', A.events_maxlen, '*', 'event', ARGV[i]))
      == 'table' then
    break
  end
end
return rev
""",
)


# The leader writes the ranks of a new member list in pages before the COMMIT of its record
# (a 10,000-name hash in one call would run for tens of ms). The first page (`first_rank` 0)
# replaces the hash; '.pending' names the list, and COMMIT makes it '.members'. Until then nodes
# that read the record read it whole. Fenced by the leader lease, every page. `rest`: the names.
WRITE_RANKS = Script(
    "WRITE_RANKS",
    keys=("leader", "ranks"),
    args=("leader_value", "members_digest", "first_rank"),
    returns="1, or an error starting with FENCED",
    body="""
if redis.pcall('GET', K.leader) ~= A.leader_value then
  return redis.error_reply('FENCED leader lease is not ' .. A.leader_value)
end
local first = tonumber(A.first_rank)
if first == 0 then
  redis.call('UNLINK', K.ranks)  -- another list's ranks, or garbage (freed in the background)
  redis.call('HSET', K.ranks, '.pending', A.members_digest)
elseif redis.pcall('HGET', K.ranks, '.pending') ~= A.members_digest then
  return redis.error_reply('FENCED the ranks of ' .. A.members_digest .. ' were replaced meanwhile')
end
local hset = {'HSET', K.ranks}
for i = REST, #ARGV do  -- the names
  hset[#hset + 1] = ARGV[i]
  hset[#hset + 1] = string.format('%d', first + i - REST)
end
if #hset > 2 then redis.call(unpack(hset)) end
return 1
""",
)


# A node leaves on purpose (a job's or a pool's): drop its lease (and the leader lease if it holds
# it) at once, and mark the leaving in the change set, a change its leader reads. Keys of the
# wrong type are skipped (redis.pcall): leaving must not fail on garbage.
LEAVE = Script(
    "LEAVE",
    keys=("node", "leases", "leader", "events", "changes", "change_seq", "digests"),
    args=("name", "events_maxlen", "event"),
    returns="1",
    body=NOW
    + GARBAGE
    + CHANGES
    + """
redis.call('DEL', K.node)
redis.pcall('ZREM', K.leases, A.name)
local leader = redis.pcall('GET', K.leader)
if type(leader) == 'string' and string.sub(leader, 1, #A.name + 1) == A.name .. ' ' then
  redis.call('DEL', K.leader)
end
redis.pcall('XADD', K.events, 'MAXLEN', '~', A.events_maxlen, '*', 'event', A.event)
mark_changed(K.changes, K.change_seq, K.digests, A.name, false)
return 1
""",
)


# A follower takes the leader lease from a leader that a strict majority of the members hold
# out (job/suspicion.py, judged by the caller from the members' reports): only if the lease
# still holds the value the caller read, so a leader elected meanwhile is never deposed. The
# new token fences every write of the deposed one (COMMIT checks the lease's value).
DEPOSE = Script(
    "DEPOSE",
    keys=("leader", "epoch", "events"),
    args=("name", "expected", "ttl", "events_maxlen", "event"),
    returns="the new lease value, or false when the lease moved",
    body=GARBAGE
    + """
if redis.call('GET', K.leader) ~= A.expected then return false end
local token = redis.call('INCR', K.epoch)
local leader = A.name .. ' ' .. fmt(token)
redis.call('SET', K.leader, leader, 'PX', A.ttl)
redis.pcall('XADD', K.events, 'MAXLEN', '~', A.events_maxlen, '*', 'event', A.event)
return leader
""",
)


def leave_call(keys: NodeKeys, name: str, event: Event) -> Call:
    """A call of LEAVE: node `name` leaves, telling so with `event`."""
    return Call(
        {
            "node": keys.node(name),
            "leases": keys.leases,
            "leader": keys.leader,
            "events": keys.events,
            "changes": keys.changes,
            "change_seq": keys.change_seq,
            "digests": keys.digests,
        },
        {"name": name, "events_maxlen": EVENTS_MAXLEN, "event": event.to_json()},
    )
