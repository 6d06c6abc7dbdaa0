"""Everything that talks to Redis. No other package imports redis.

The stores: store.py (JobStore: a job's state), pool.py (PoolStore: a pool's), requests.py
(RequestStore: a pool's signed requests, their replies, the replay memory), handouts.py (the
job's copies hash: each node's share of the checkpoint copies), speeds.py (each node's pace a
window, and the leader's slow verdicts), holds.py (hold, release, requeue), poolqueues.py (a
pool's queues: one read, the writes), ended.py (clearing an ended job's keys), cordons.py (one
cordon write for both stores), tokens.py (the register of API tokens not revoked), runs.py (an
array's tasks, and earlier runs of a reused id: rare reads). Their keys and scripts: keys.py
(every key, in one place), lua.py (one wrapper per script: its KEYS, ARGV and reply),
scripts.py and poolscripts.py (a job's and a pool's scripts), fragments.py (the Lua they
share). Reading: poolreplies.py (a pool read's reply decoded: leases, hashes, statuses once per
text, the jobs the pool leader keeps), replies.py (a heartbeat's reply as a Snapshot), view.py
(the leader's kept view of the leases), streams.py, eventlog.py, listener.py (a thread
blocking on streams). Connections: client.py (URLs, Sentinel, Cluster, TLS), cluster.py,
embedded.py (`redis.url: embedded`), bounded.py (calls that never outlast the fence point).
Failures: errors.py (Redis errors as nodeagent's), failure.py (what kind). What a "done" is
worth: durable.py (a change confirmed on the operator's replicas with WAIT, or not
acknowledged).
"""
