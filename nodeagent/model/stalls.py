"""What crosses Redis about ranks silent past their step times (job/stalls.py): each one as its
node's report lists it, and each one the job's leader names in the record as the rank every
other rank waits on."""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.model.decode import Reader

MAX_STEP = 2**63 - 1


@dataclass(frozen=True)
class RankStall:
    """A local rank silent past its step times: its last beat's step; whether its compute moved
    on since that beat (it did its part of the next step and waits on a peer, or did when it
    stopped); whether its process sleeps, having used next to no CPU since that beat."""

    local_rank: int
    step: int
    waiting: bool
    asleep: bool

    @classmethod
    def read(cls, r: Reader) -> RankStall:
        return cls(
            local_rank=r.integer("local_rank", high=65534),
            step=r.integer("step", high=MAX_STEP),
            waiting=r.flag("waiting"),
            asleep=r.flag("asleep"),
        )


@dataclass(frozen=True)
class WaitedOn:
    """A rank every other rank of the generation waits on, named by the job's leader: its node
    fails it as hung."""

    node: str
    local_rank: int

    @classmethod
    def read(cls, r: Reader) -> WaitedOn:
        return cls(node=r.name("node"), local_rank=r.integer("local_rank", high=65534))
