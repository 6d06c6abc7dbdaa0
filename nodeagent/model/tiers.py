"""What goes into Redis about a job's checkpoint tiers: what each node holds, what the leader
chose. The bytes themselves never do (nodeagent.channel.tier and .manifests, docs/checkpoints.md).

A node reports, in its NodeReport, the steps its memory tier holds verified (which ranks, at
which world size), the steps it copied to the persistent tier, and the steps its workers refused
at a restore. The leader keeps, in the JobRecord, the newest step whole in the persistent tier,
the steps never to restore again, and the order in which this generation's workers try sources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import MAX_INT, Reader

MAX_HELD = 64  # steps a node reports per tier (two slots per rank: a handful in practice)
MAX_RANKS = 1 << 20
MAX_BAD = 256
MAX_ROLLBACKS = 16  # the rollbacks a record keeps (CheckpointRecord.rollbacks)
BAD_AFTER = 3  # generations in a row that restored a step and failed before a newer save
_SOURCE = re.compile(r"(memory|persistent):[0-9]{1,15}(@[0-9]{1,15})?|script|start")
# A save's manifest digest (channel.manifests.digest): a SHA-256; 16 hex digits from agents
# before it (read during a rolling upgrade, and never matching a save of this one).
DIGEST_RE = re.compile(r"[0-9a-f]{64}|[0-9a-f]{16}")
ADDRESS_RE = re.compile(r"(\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9.-]{1,253}):[0-9]{1,5}")
MAX_REPLICAS = 8
MAX_ROWS = 10_000  # distinct row counts a save records (as many as a manifest may hold)


@dataclass(frozen=True)
class Held:
    """Verified saves of one step: which ranks, saved at which world size."""

    step: int
    world_size: int
    ranks: tuple[int, ...]
    generation: int = 0  # the generation that saved it: a step number may recur after a rollback
    # Each rank's manifest digest (channel.manifests.digest), in the order of `ranks`: what a peer
    # checks a copy offered to it against (empty: not said).
    digests: tuple[str, ...] = ()
    # The distinct row counts of the save's tensors when its whole state is sharded row-wise
    # (the manifest's dim0, channel/layout.py): which old ranks a rank of another world reads.
    # Empty: not row-wise, or not said.
    rows: tuple[int, ...] = ()

    @property
    def key(self) -> SaveKey:
        return (self.step, self.generation, self.world_size)

    @classmethod
    def read(cls, r: Reader) -> Held:
        world = r.integer("world_size", low=1, high=MAX_RANKS)
        ranks = r.items("ranks", MAX_RANKS)
        if not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < world for x in ranks
        ):
            raise CorruptStateError(f"{r.what}: ranks must be integers below {world}")
        digests = r.items("digests", MAX_RANKS)
        if digests and (
            len(digests) != len(ranks)
            or not all(isinstance(d, str) and DIGEST_RE.fullmatch(d) for d in digests)
        ):
            raise CorruptStateError(f"{r.what}: digests must be one SHA-256 (hex) per rank")
        rows = r.items("rows", MAX_ROWS)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in rows):
            raise CorruptStateError(f"{r.what}: rows must be row counts (integers)")
        return cls(
            step=r.integer("step"),
            world_size=world,
            ranks=tuple(ranks),
            generation=r.integer("generation", 0),
            digests=tuple(digests),
            rows=tuple(rows),
        )


SaveKey = tuple[int, int, int]  # (step, the generation that saved it, world size): one save


@dataclass(frozen=True)
class TierReport:
    """One node's tiers, as its agent verified them."""

    memory: tuple[Held, ...] = ()
    persisted: tuple[Held, ...] = ()  # what this node copied to the persistent tier
    refused: tuple[int, ...] = ()  # steps this node's workers refused (checksum, NaN)
    # Peers' saves this node holds, verified, in its replica area (job.checkpoint.replicas)
    replicas: tuple[Held, ...] = ()
    address: str | None = None  # host:port of this node's replica listener
    domain: str = ""  # the node's failure domain (its pool label `rack`): copies go elsewhere

    @classmethod
    def read(cls, r: Reader) -> TierReport:
        address = r.opt_text("address", 300)
        if address is not None and not ADDRESS_RE.fullmatch(address):
            raise CorruptStateError(f"{r.what}: address must be host:port, got {address!r}")
        return cls(
            memory=tuple(Held.read(h) for h in r.objects("memory", MAX_HELD)),
            persisted=tuple(Held.read(h) for h in r.objects("persisted", MAX_HELD)),
            refused=_steps(r, "refused"),
            replicas=tuple(Held.read(h) for h in r.objects("replicas", MAX_HELD)),
            address=address,
            domain=r.text("domain", "", 256),
        )

    def newest_memory(self) -> int | None:
        return max((h.step for h in self.memory), default=None)


@dataclass(frozen=True)
class CheckpointRecord:
    """The leader's record of the job's checkpoints (fenced with the record)."""

    restore: tuple[str, ...] = ()  # this generation's sources, in order: "memory:120", "start"
    persisted_step: int | None = None  # the newest step every rank of which is persisted
    persisted_world: int = 0
    persisted_generation: int = 0  # the generation that saved it
    bad: tuple[int, ...] = ()  # steps never restored again
    # The step the last generations restored and then failed before any node held a newer
    # save, and how many did so in a row: bad at BAD_AFTER (a crash or two that happen to come
    # soon after a restore, in a burst of faults or from a bad host, must not cost the step:
    # issue 41; a step that crashes every generation restoring it is a restart loop)
    suspect: int | None = None
    suspect_failures: int = 0
    newest: int = 0  # the newest step held anywhere when `restore` was chosen
    # The newest save every rank of which is verified on replicas + 1 live nodes (issue 27):
    # what a node loss restores from memory, at any world
    committed_step: int | None = None
    committed_generation: int = 0
    committed_world: int = 0
    replicas: int = 0  # job.checkpoint.replicas, as the leader plans with it
    # (generation, step): that generation went back to that step, older than saves held then.
    # The saves of older generations beyond it lie on a timeline no generation continues, and
    # are never restored, committed or persisted as the job's (job/checkpoints/restore.py:
    # `current`): a node that held some while it was cut off (held out by its peers, or back
    # after its lease lapsed) offers them in vain.
    rollbacks: tuple[tuple[int, int], ...] = ()

    @property
    def committed(self) -> SaveKey | None:
        if self.committed_step is None:
            return None
        return (self.committed_step, self.committed_generation, self.committed_world)

    @property
    def fetches(self) -> bool:
        """This generation's restore may read saves its nodes bring from peers: the leader
        plans the copies (`replicas`) and the order tries the memory tier. The leader hands
        every member its share of those fetches then, and each node's workers wait for it."""
        return bool(self.replicas) and any(s.startswith("memory:") for s in self.restore)

    @classmethod
    def read(cls, r: Reader) -> CheckpointRecord:
        restore = r.items("restore", 16)
        if not all(isinstance(s, str) and _SOURCE.fullmatch(s) for s in restore):
            raise CorruptStateError(f"{r.what}: restore must name sources such as memory:120")
        return cls(
            restore=tuple(restore),
            persisted_step=r.opt_integer("persisted_step"),
            persisted_world=r.integer("persisted_world", 0, high=MAX_RANKS),
            persisted_generation=r.integer("persisted_generation", 0),
            bad=_steps(r, "bad"),
            suspect=r.opt_integer("suspect"),
            suspect_failures=r.integer("suspect_failures", 0, high=BAD_AFTER),
            newest=r.integer("newest", 0),
            committed_step=r.opt_integer("committed_step"),
            committed_generation=r.integer("committed_generation", 0),
            committed_world=r.integer("committed_world", 0, high=MAX_RANKS),
            replicas=r.integer("replicas", 0, high=MAX_REPLICAS),
            rollbacks=_rollbacks(r),
        )


def _rollbacks(r: Reader) -> tuple[tuple[int, int], ...]:
    values = r.items("rollbacks", MAX_ROLLBACKS)
    if not all(
        isinstance(v, list)
        and len(v) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_INT for x in v)
        for v in values
    ):
        raise CorruptStateError(f"{r.what}: rollbacks must be [generation, step] pairs")
    return tuple((v[0], v[1]) for v in values)


def _steps(r: Reader, name: str) -> tuple[int, ...]:
    values = r.items(name, MAX_BAD)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise CorruptStateError(f"{r.what}: {name} must be a list of steps")
    return tuple(values)
