"""The Lua scripts nodeagent runs in Redis. Each starts with its KEYS and ARGV.

Every time comparison happens here, in Redis server time (TIME), never on an agent's clock.
Node names cannot contain spaces (config validation), so "<name> <token>" is unambiguous.
"""

from __future__ import annotations

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_CLUSTER = """
local leases = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local reports = {}
for i = 1, #leases, 2 do
  reports[#reports + 1] = redis.call('GET', ARGV[5] .. leases[i]) or ''
end
"""

SYNC = (
    """
-- Heartbeat: renew this node's lease, take or renew the leader lease, append events, read.
-- KEYS[1] node key    KEYS[2] leases zset    KEYS[3] leader      KEYS[4] leader epoch
-- KEYS[5] job hash    KEYS[6] events stream  KEYS[7] commands stream  KEYS[8] cordons hash
-- ARGV[1] node name   ARGV[2] report JSON    ARGV[3] lease ttl ms
-- ARGV[4] events maxlen  ARGV[5] node key prefix  ARGV[6..] event JSONs to append
-- Returns {now_ms, leader, rev, record, this node's cordon, leader lease deadline (ms)} and,
--   for the leader only, {..., leases (name, deadline, ...), reports (one per lease, '' if
--   missing), commands}. Followers wake at the leader's deadline to take over at once.
"""
    + _NOW
    + """
local name = ARGV[1]
local ttl = tonumber(ARGV[3])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[2], now + ttl, name)
local mine = name .. ' '
local leader = redis.call('GET', KEYS[3])
if not leader then
  leader = mine .. redis.call('INCR', KEYS[4])
  redis.call('SET', KEYS[3], leader, 'PX', ttl)
elseif string.sub(leader, 1, #mine) == mine then
  redis.call('PEXPIRE', KEYS[3], ttl)
end
for i = 6, #ARGV do
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[i])
end
local rev = redis.call('HGET', KEYS[5], 'rev') or '0'
local record = redis.call('HGET', KEYS[5], 'record') or false
local cordon = redis.call('HGET', KEYS[8], name) or false
local leader_deadline = now + redis.call('PTTL', KEYS[3])
if string.sub(leader, 1, #mine) ~= mine then
  return {now, leader, rev, record, cordon, leader_deadline}
end
"""
    + _CLUSTER
    + """
local cursor = redis.call('HGET', KEYS[5], 'cursor') or '0-0'
local commands = redis.call('XRANGE', KEYS[7], '(' .. cursor, '+', 'COUNT', 100)
return {now, leader, rev, record, cordon, leader_deadline, leases, reports, commands}
"""
)

SNAPSHOT = (
    """
-- Read-only snapshot for nodeagentctl.
-- KEYS[1] unused      KEYS[2] leases zset    KEYS[3] leader     KEYS[4] job hash
-- ARGV[1..4] unused   ARGV[5] node key prefix
-- Returns {now_ms, leader, rev, record, false (no node's cordon), false, leases, reports}.
"""
    + _NOW
    + """
local leader = redis.call('GET', KEYS[3]) or false
local rev = redis.call('HGET', KEYS[4], 'rev') or '0'
local record = redis.call('HGET', KEYS[4], 'record') or false
"""
    + _CLUSTER
    + """
return {now, leader, rev, record, false, false, leases, reports}
"""
)

COMMIT = (
    """
-- The leader's write, fenced by its token and the record revision it read.
-- KEYS[1] leader      KEYS[2] job hash       KEYS[3] leases zset  KEYS[4] events stream
-- ARGV[1] leader value ("<name> <token>")    ARGV[2] expected rev
-- ARGV[3] record JSON ('' = unchanged)       ARGV[4] its generation  ARGV[5] command cursor
-- ARGV[6] events maxlen  ARGV[7] node key prefix  ARGV[8] n = number of nodes to reap
-- ARGV[9..8+n] nodes to reap (refused if a lease was renewed meanwhile)  ARGV[9+n..] events
-- Returns the new rev, or an error starting with FENCED.
"""
    + _NOW
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED leader lease is not ' .. ARGV[1])
end
local rev = tonumber(redis.call('HGET', KEYS[2], 'rev') or '0')
if rev ~= tonumber(ARGV[2]) then
  return redis.error_reply('FENCED record revision is ' .. rev .. ', not ' .. ARGV[2])
end
local gen = tonumber(redis.call('HGET', KEYS[2], 'gen') or '-1')
if ARGV[3] ~= '' and tonumber(ARGV[4]) < gen then
  return redis.error_reply('FENCED generation ' .. ARGV[4] .. ' is older than ' .. gen)
end
local n = tonumber(ARGV[8])
for i = 9, 8 + n do
  local deadline = redis.call('ZSCORE', KEYS[3], ARGV[i])
  if deadline and tonumber(deadline) > now then
    return redis.error_reply('FENCED lease of ' .. ARGV[i] .. ' was renewed')
  end
end
for i = 9, 8 + n do
  redis.call('ZREM', KEYS[3], ARGV[i])
  redis.call('DEL', ARGV[7] .. ARGV[i])
end
if ARGV[3] ~= '' then
  rev = rev + 1
  redis.call('HSET', KEYS[2], 'rev', rev, 'gen', ARGV[4], 'record', ARGV[3], 'cursor', ARGV[5])
end
for i = 9 + n, #ARGV do
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'event', ARGV[i])
end
return rev
"""
)

LEAVE = """
-- A node leaves on purpose: drop its lease (and the leader lease if it holds it) at once.
-- KEYS[1] node key  KEYS[2] leases zset  KEYS[3] leader  KEYS[4] events stream
-- ARGV[1] node name ARGV[2] events maxlen ARGV[3] event JSON
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local leader = redis.call('GET', KEYS[3])
if leader and string.sub(leader, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('DEL', KEYS[3])
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*', 'event', ARGV[3])
return 1
"""
