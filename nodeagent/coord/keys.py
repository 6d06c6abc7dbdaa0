"""Every Redis key nodeagent uses, in one place.

All keys of a job share the hash tag ``{<job>}`` so the whole job lives in one Redis Cluster slot
and multi-key Lua scripts are legal there.
"""

from __future__ import annotations

from dataclasses import dataclass

NODE_KEY = "%s:{%s}:node:%s"  # STRING, JSON NodeReport, PX lease_ttl
LEASES_KEY = "%s:{%s}:leases"  # ZSET member=node name, score=lease deadline (server ms)
LEADER_KEY = "%s:{%s}:leader"  # STRING "<node> <token>", PX lease_ttl
LEADER_EPOCH_KEY = "%s:{%s}:leader-epoch"  # INCR counter: fencing tokens
JOB_KEY = "%s:{%s}:job"  # HASH rev, gen, cursor, record=<JSON JobRecord>, head, members
# node -> group rank in the record's members, and ".members" -> their digest: what a node that
# does not lead reads with the record's head instead of the member list (scripts.SYNC)
RANKS_KEY = "%s:{%s}:ranks"  # HASH
EVENTS_KEY = "%s:{%s}:events"  # STREAM of events, capped
COMMANDS_KEY = "%s:{%s}:commands"  # STREAM of operator commands, capped
WAKE_KEY = "%s:{%s}:wake"  # STREAM, capped: an entry per record write, what followers wait on
CORDONS_KEY = "%s:{%s}:cordons"  # HASH node name -> JSON Cordon
# What the leader reads instead of every report at every heartbeat (scripts.py, coord/view.py):
CHANGES_KEY = "%s:{%s}:changes"  # ZSET member=node name, score=change number of its last change
CHANGE_SEQ_KEY = "%s:{%s}:change-seq"  # INCR counter: change numbers
DIGESTS_KEY = "%s:{%s}:digests"  # HASH node name -> digest of what the leader plans from
# node name -> JSON Handout: the node's share of the copies of the job's saves (issue 27),
# written by the leader (coord/handouts.py)
COPIES_KEY = "%s:{%s}:copies"  # HASH
# node name -> JSON NodeSpeed: its ranks' pace over its last window, written by the node once a
# window; the leader reads it whole once a window (job/speed.py, job/slowness.py)
SPEEDS_KEY = "%s:{%s}:speeds"  # HASH
SLOW_KEY = "%s:{%s}:slow"  # HASH node name -> JSON SlowVerdict, written by the leader

EVENTS_MAXLEN = 10_000
COMMANDS_MAXLEN = 1_000
WAKE_MAXLEN = 100


@dataclass(frozen=True)
class JobKeys:
    """The keys of one job under one prefix."""

    prefix: str
    job: str

    def node(self, name: str) -> str:
        return NODE_KEY % (self.prefix, self.job, name)

    def node_prefix(self) -> str:
        """What every node key starts with; Lua scripts append the node name."""
        return self.node("")

    @property
    def leases(self) -> str:
        return LEASES_KEY % (self.prefix, self.job)

    @property
    def leader(self) -> str:
        return LEADER_KEY % (self.prefix, self.job)

    @property
    def leader_epoch(self) -> str:
        return LEADER_EPOCH_KEY % (self.prefix, self.job)

    @property
    def record(self) -> str:
        return JOB_KEY % (self.prefix, self.job)

    @property
    def ranks(self) -> str:
        return RANKS_KEY % (self.prefix, self.job)

    @property
    def events(self) -> str:
        return EVENTS_KEY % (self.prefix, self.job)

    @property
    def commands(self) -> str:
        return COMMANDS_KEY % (self.prefix, self.job)

    @property
    def cordons(self) -> str:
        return CORDONS_KEY % (self.prefix, self.job)

    @property
    def wake(self) -> str:
        return WAKE_KEY % (self.prefix, self.job)

    @property
    def changes(self) -> str:
        return CHANGES_KEY % (self.prefix, self.job)

    @property
    def change_seq(self) -> str:
        return CHANGE_SEQ_KEY % (self.prefix, self.job)

    @property
    def digests(self) -> str:
        return DIGESTS_KEY % (self.prefix, self.job)

    @property
    def copies(self) -> str:
        return COPIES_KEY % (self.prefix, self.job)

    @property
    def speeds(self) -> str:
        return SPEEDS_KEY % (self.prefix, self.job)

    @property
    def slow(self) -> str:
        return SLOW_KEY % (self.prefix, self.job)


# The pool's keys: one hash tag per pool, {pool:<name>} (job ids cannot hold a ':', so a pool's
# slot is never a job's). Each job keeps its own keys above.
POOL_NODE_KEY = "%s:{pool:%s}:node:%s"  # STRING, JSON PoolNode, PX lease_ttl
POOL_LEASES_KEY = "%s:{pool:%s}:leases"  # ZSET member=node name, score=lease deadline (server ms)
POOL_LEADER_KEY = "%s:{pool:%s}:leader"  # STRING "<node> <token>", PX lease_ttl
POOL_LEADER_EPOCH_KEY = "%s:{pool:%s}:leader-epoch"  # INCR counter: fencing tokens
POOL_SPECS_KEY = "%s:{pool:%s}:specs"  # HASH job id -> JSON JobSpec (nodeagentctl submit)
POOL_JOBS_KEY = "%s:{pool:%s}:jobs"  # HASH job id -> JSON PoolJob (the pool leader's)
POOL_SEQ_KEY = "%s:{pool:%s}:seq"  # INCR counter: submission order
# ZSET job id -> when its status or spec was last written or deleted (server ms): what the pool
# leader reads of the jobs between its full reads (coord/pool.py, HeldJobs)
POOL_JOB_CHANGES_KEY = "%s:{pool:%s}:jobchanges"
POOL_PLACEMENTS_KEY = "%s:{pool:%s}:placements"  # HASH node -> job id (the pool leader's)
POOL_CANCELS_KEY = "%s:{pool:%s}:cancels"  # HASH job id -> who asked to cancel it
POOL_HOLDS_KEY = "%s:{pool:%s}:holds"  # HASH job id -> who holds it (pending, not admitted)
# HASH allocation id -> until when (Redis server ms) its holder, `nodeagentctl alloc`, renewed it
POOL_HOLDERS_KEY = "%s:{pool:%s}:holders"
POOL_REQUEUES_KEY = "%s:{pool:%s}:requeues"  # HASH job id -> JSON {by, admitted_ms}: requeue it
# An ended job whose name was submitted again: its spec and status, kept until pool.keep_ended
POOL_HISTORY_KEY = "%s:{pool:%s}:history"  # HASH "<job>:<seq>" -> {"spec": ..., "status": ...}
POOL_ENDED_KEY = "%s:{pool:%s}:ended"  # ZSET "<job>:<seq>" (of history) -> ended (server ms)
POOL_CORDONS_KEY = "%s:{pool:%s}:cordons"  # HASH node -> JSON Cordon (out of the pool)
POOL_EVENTS_KEY = "%s:{pool:%s}:events"  # STREAM of pool events, capped
POOL_QUEUES_KEY = "%s:{pool:%s}:queues"  # HASH queue name -> JSON QueueView (nodeagentctl queue)
POOL_CHANGES_KEY = "%s:{pool:%s}:changes"  # ZSET node -> change number (as a job's changes)
POOL_CHANGE_SEQ_KEY = "%s:{pool:%s}:change-seq"  # INCR counter: change numbers
POOL_DIGESTS_KEY = "%s:{pool:%s}:digests"  # HASH node -> digest of its pool report
POOL_REQUESTS_KEY = "%s:{pool:%s}:requests"  # STREAM of signed requests (pool.auth: munge)
POOL_REQUEST_CURSOR_KEY = "%s:{pool:%s}:request-cursor"  # STRING last request id taken
POOL_SEEN_KEY = "%s:{pool:%s}:seen"  # ZSET credential id -> its expiry (server ms): replays
POOL_REPLY_KEY = "%s:{pool:%s}:reply:%s"  # STRING JSON Reply to one request, EX REPLY_TTL_S
POOL_AUTH_KEY = "%s:{pool:%s}:auth"  # STRING the pool leader's pool.auth (munge, none)
# STRING JSON {replicas, timeout_ms}: the pool leader's pool.durability (coord/durable.py)
POOL_DURABILITY_KEY = "%s:{pool:%s}:durability"
POOL_ACKS_KEY = "%s:{pool:%s}:acks"  # STRING counter: the write a WAIT counts from
# STRING reply JSON (TTL REPLY_TTL_S): what the request of that id was answered, for its retries
POOL_DONE_KEY = "%s:{pool:%s}:done:%s"
# API tokens not revoked: id -> JSON {user, uid, iat, exp} (coord/tokens.py; the pool leader's)
POOL_TOKENS_KEY = "%s:{pool:%s}:tokens"  # HASH
# Tokens a browser has signed in with (POST /v1/session), once each: id -> when (seconds)
POOL_SIGNINS_KEY = "%s:{pool:%s}:signins"  # HASH
# Arrays submitted: id -> its user (pool/submission.py: an id a live array holds is not given
# to another job or array)
POOL_ARRAYS_KEY = "%s:{pool:%s}:arrays"  # HASH
# The last pool event the pool leader has told of (pool/notify.py)
POOL_NOTIFIED_KEY = "%s:{pool:%s}:notified"  # STRING stream ID
# Accounting records of ended jobs not yet in the accounting database, scored by their end (ms),
# each its record's JSON (model/accounting.py; written with the job's end, taken by
# pool/ledger.py)
POOL_LEDGER_KEY = "%s:{pool:%s}:ledger"  # ZSET
# Fair share: each user's decayed usage and the policy it was charged under (model/fairshare.py;
# the pool leader's, written fenced)
POOL_USAGE_KEY = "%s:{pool:%s}:usage"  # STRING JSON
REQUESTS_MAXLEN = 10_000
REPLY_TTL_S = 600


@dataclass(frozen=True)
class PoolKeys:
    """The keys of one pool under one prefix."""

    prefix: str
    pool: str

    def _key(self, template: str) -> str:
        return template % (self.prefix, self.pool)

    def node(self, name: str) -> str:
        return POOL_NODE_KEY % (self.prefix, self.pool, name)

    def node_prefix(self) -> str:
        return self.node("")

    def job(self, job_id: str) -> JobKeys:
        """A job's own keys, under the same prefix."""
        return JobKeys(self.prefix, job_id)

    @property
    def leases(self) -> str:
        return self._key(POOL_LEASES_KEY)

    @property
    def leader(self) -> str:
        return self._key(POOL_LEADER_KEY)

    @property
    def leader_epoch(self) -> str:
        return self._key(POOL_LEADER_EPOCH_KEY)

    @property
    def specs(self) -> str:
        return self._key(POOL_SPECS_KEY)

    @property
    def jobs(self) -> str:
        return self._key(POOL_JOBS_KEY)

    @property
    def seq(self) -> str:
        return self._key(POOL_SEQ_KEY)

    @property
    def job_changes(self) -> str:
        return self._key(POOL_JOB_CHANGES_KEY)

    @property
    def placements(self) -> str:
        return self._key(POOL_PLACEMENTS_KEY)

    @property
    def cancels(self) -> str:
        return self._key(POOL_CANCELS_KEY)

    @property
    def holds(self) -> str:
        return self._key(POOL_HOLDS_KEY)

    @property
    def holders(self) -> str:
        return self._key(POOL_HOLDERS_KEY)

    @property
    def requeues(self) -> str:
        return self._key(POOL_REQUEUES_KEY)

    @property
    def history(self) -> str:
        return self._key(POOL_HISTORY_KEY)

    @property
    def ended(self) -> str:
        return self._key(POOL_ENDED_KEY)

    @property
    def cordons(self) -> str:
        return self._key(POOL_CORDONS_KEY)

    @property
    def events(self) -> str:
        return self._key(POOL_EVENTS_KEY)

    @property
    def queues(self) -> str:
        return self._key(POOL_QUEUES_KEY)

    @property
    def changes(self) -> str:
        return self._key(POOL_CHANGES_KEY)

    @property
    def change_seq(self) -> str:
        return self._key(POOL_CHANGE_SEQ_KEY)

    @property
    def digests(self) -> str:
        return self._key(POOL_DIGESTS_KEY)

    @property
    def requests(self) -> str:
        return self._key(POOL_REQUESTS_KEY)

    @property
    def request_cursor(self) -> str:
        return self._key(POOL_REQUEST_CURSOR_KEY)

    @property
    def seen(self) -> str:
        return self._key(POOL_SEEN_KEY)

    @property
    def tokens(self) -> str:
        return self._key(POOL_TOKENS_KEY)

    @property
    def signins(self) -> str:
        return self._key(POOL_SIGNINS_KEY)

    @property
    def arrays(self) -> str:
        return self._key(POOL_ARRAYS_KEY)

    @property
    def notified(self) -> str:
        return self._key(POOL_NOTIFIED_KEY)

    @property
    def ledger(self) -> str:
        return self._key(POOL_LEDGER_KEY)

    @property
    def usage(self) -> str:
        return self._key(POOL_USAGE_KEY)

    def reply(self, request_id: str) -> str:
        return POOL_REPLY_KEY % (self.prefix, self.pool, request_id)

    def done(self, request_id: str) -> str:
        """A change's answer by its request id (model/request.py REQUEST_ID), not its entry's."""
        return POOL_DONE_KEY % (self.prefix, self.pool, request_id)

    @property
    def auth(self) -> str:
        return self._key(POOL_AUTH_KEY)

    @property
    def durability(self) -> str:
        return self._key(POOL_DURABILITY_KEY)

    @property
    def acks(self) -> str:
        return self._key(POOL_ACKS_KEY)
