"""What the job's leader hands each node about the copies of the job's saves (issue 27).

The leader reads every node's report anyway (coord/view.py keeps them current), so it plans
every node's copies (job/checkpoints/replication.py) and writes each node its share: a field of the
job's copies hash, one small JSON object per node. A node reads its own field, never every report:
the Redis work of planning is the leader's reads, O(members) a save, not O(members²).

A node's share, for one generation: the transfers it makes (sends to a peer, fetches for the
restore of its workers), its successors on the ring (where it copies the save its workers make
as they stop for a scale-down or a drain, job/checkpoints/handover.py), the addresses of the peers
these name, and the peers that may ask it for a copy (send it one, or fetch one from it): what its
listener accepts a request from; and the saves each may fetch from it (`serves`): a fetch of
anything else is refused, whoever asks (issue 40).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import NAME_RE, Reader
from nodeagent.model.tiers import ADDRESS_RE, DIGEST_RE, MAX_RANKS, SaveKey

MAX_TRANSFERS = 4096  # a node's share (k copies of its ranks' saves, or a restore's reads)
Served = tuple[str, int, int, int]  # (the node asking, step, the generation that saved it, rank)


@dataclass(frozen=True)
class Transfer:
    """One copy to make: `fetch` brings the save here from the first of `sources` that has it
    whole; otherwise this node sends it to `target`."""

    key: SaveKey
    rank: int
    digest: str
    sources: tuple[str, ...]
    target: str
    fetch: bool = False

    def __str__(self) -> str:
        step, generation, world = self.key
        where = f"from {', '.join(self.sources)}" if self.fetch else f"to {self.target}"
        return f"step {step}@{generation} rank {self.rank}/{world} {where}"

    def to_data(self) -> list[object]:
        return [*self.key, self.rank, self.digest, list(self.sources), self.target, self.fetch]

    @classmethod
    def read(cls, value: object, what: str) -> Transfer:
        if not isinstance(value, list) or len(value) != 8:
            raise CorruptStateError(f"{what}: a transfer must be a list of 8 items, got {value!r}")
        step, generation, world, rank, digest, sources, target, fetch = value
        numbers = (step, generation, world, rank)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
            raise CorruptStateError(f"{what}: step, generation, world and rank must be integers")
        if not 0 < world <= MAX_RANKS or rank >= world:
            raise CorruptStateError(f"{what}: rank {rank} is not a rank of a world of {world}")
        if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
            raise CorruptStateError(
                f"{what}: the digest must be a SHA-256 (64 hex digits), got {digest!r}"
            )
        names = [*sources, target] if isinstance(sources, list) else None
        if not names or not all(isinstance(n, str) and NAME_RE.match(n) for n in names):
            raise CorruptStateError(f"{what}: sources and target must be node names")
        if not isinstance(fetch, bool):
            raise CorruptStateError(f"{what}: fetch must be true or false, got {fetch!r}")
        return cls((step, generation, world), rank, digest, tuple(sources), target, fetch)


@dataclass(frozen=True)
class Handout:
    """One node's share of the copies of one generation (the module docstring)."""

    generation: int
    transfers: tuple[Transfer, ...] = ()
    addresses: tuple[tuple[str, str], ...] = ()  # (node, host:port) of every peer named
    peers: tuple[str, ...] = ()  # the nodes whose requests this node's listener serves
    successors: tuple[str, ...] = ()  # the next `replicas` nodes on the ring
    # The saves peers may fetch from this node; None: a share of a leader from before, which
    # said nothing of it (a named peer may fetch any save then, as it could).
    serves: tuple[Served, ...] | None = None
    # Written with a scale-down's announcement (job/checkpoints/handouts.py): successors for
    # the hand-over only. Never the running generation's share, though its generation is the
    # same: a node that read it as that would start its workers with nothing to bring.
    announced: bool = False

    def to_json(self) -> str:
        body: dict[str, object] = {
            "generation": self.generation,
            "transfers": [t.to_data() for t in self.transfers],
            "addresses": dict(self.addresses),
            "peers": list(self.peers),
            "successors": list(self.successors),
        }
        if self.serves is not None:
            body["serves"] = [list(s) for s in self.serves]
        if self.announced:
            body["announced"] = True
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes, what: str) -> Handout:
        """Raises: CorruptStateError naming what is wrong (what nodeagent did not write)."""
        r = Reader.of(raw, what)
        transfers = r.items("transfers", MAX_TRANSFERS)
        addresses = r.mapping("addresses")
        for name, address in addresses.items():
            if not NAME_RE.match(name) or not isinstance(address, str):
                raise CorruptStateError(f"{what}: addresses must map node names to host:port")
            if not ADDRESS_RE.fullmatch(address):
                raise CorruptStateError(f"{what}: address must be host:port, got {address!r}")
        return cls(
            generation=r.integer("generation"),
            transfers=tuple(
                Transfer.read(t, f"{what}: transfers[{i}]") for i, t in enumerate(transfers)
            ),
            addresses=tuple(sorted(addresses.items())),
            peers=r.names("peers"),
            successors=r.names("successors"),
            serves=_served(r.raw("serves"), what),
            announced=r.flag("announced", False),
        )

    @property
    def address_map(self) -> dict[str, str]:
        return dict(self.addresses)


def _served(value: object, what: str) -> tuple[Served, ...] | None:
    """Raises: CorruptStateError (not a list of [node, step, generation, rank])."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_TRANSFERS * 8:
        raise CorruptStateError(f"{what}: serves must be a list of [node, step, generation, rank]")
    served = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 4
            or not isinstance(item[0], str)
            or not NAME_RE.match(item[0])
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in item[1:])
        ):
            raise CorruptStateError(f"{what}: serves holds {item!r}, not [node, step, gen, rank]")
        served.append((item[0], item[1], item[2], item[3]))
    return tuple(served)
