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
JOB_KEY = "%s:{%s}:job"  # HASH gen=<int>, record=<JSON JobRecord>
EVENTS_KEY = "%s:{%s}:events"  # STREAM of events, capped
COMMANDS_KEY = "%s:{%s}:commands"  # STREAM of operator commands, capped
CORDONS_KEY = "%s:{%s}:cordons"  # HASH node name -> JSON Cordon

EVENTS_MAXLEN = 10_000
COMMANDS_MAXLEN = 1_000


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
    def events(self) -> str:
        return EVENTS_KEY % (self.prefix, self.job)

    @property
    def commands(self) -> str:
        return COMMANDS_KEY % (self.prefix, self.job)

    @property
    def cordons(self) -> str:
        return CORDONS_KEY % (self.prefix, self.job)
