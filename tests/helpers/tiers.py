"""Saves made by hand in the checkpoint tiers' format (nodeagent/channel/tier.py and
manifests.py), no torch."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from nodeagent.channel import manifests
from nodeagent.channel.manifests import Manifest
from nodeagent.checkpoint.peerauth import PlaneAuth, Unauthenticated
from nodeagent.checkpoint.replicas import Replicas
from nodeagent.checkpoint.transport import Accept, Listening
from nodeagent.config.settings import CheckpointConfig
from nodeagent.job.checkpoints.replicaduties import CopyTerms
from nodeagent.model.handout import Handout
from nodeagent.model.job import NodeReport
from nodeagent.model.tiers import Held, TierReport
from nodeagent.state import NodeState


def fake_save(
    directory: Path, step: int, rank: int = 0, world: int = 2, size: int = 1000, generation: int = 3
) -> None:
    """What a rank's save leaves: two files, then its manifest."""
    manifests.begin(directory)
    (directory / "__0_0.distcp").write_bytes(bytes(range(256)) * (size // 256) + b"x" * step)
    (directory / ".metadata").write_bytes(b"meta" + str(step).encode())
    manifest = Manifest(step, generation, world, rank, manifests.summarize(directory), job="j")
    manifests.write_manifest(directory, manifest)


def reporting(
    name: str,
    memory: dict[int, list[int]] | None = None,
    replicas: dict[int, list[int]] | None = None,
    domain: str = "",
    world: int = 4,
) -> NodeReport:
    """A node's report: for each step, the ranks it holds in its memory tier and its
    replica area, verified (generation 1; world 4 unless said)."""

    def held(steps: dict[int, list[int]] | None) -> tuple[Held, ...]:
        return tuple(
            Held(step, world, tuple(ranks), 1, tuple(f"{step:08x}{r:08x}" for r in ranks))
            for step, ranks in (steps or {}).items()
        )

    tier = TierReport(
        held(memory), (), (), held(replicas), f"127.0.0.1:{7000 + ord(name[0])}", domain
    )
    return NodeReport(name, "127.0.0.1", NodeState.RUNNING, lease_ttl_ms=3000, tier=tier)


@contextlib.contextmanager
def node_replicas(
    tmp_path: Path,
    node: str,
    accept: Accept | None = None,
    job: str = "j",
    auth: PlaneAuth | None = None,
    address: str = "127.0.0.1",
    per_node: int = 1,
    landed: Callable[[], None] = lambda: None,
) -> Iterator[Replicas]:
    """`node`'s replicas (memory tier and replica area under `tmp_path`), listening on
    `address` with `accept` if given (else once a test tells it whom to accept), closed at the
    end; peers authenticated by `auth` (none: the tests of what is copied where)."""
    config = CheckpointConfig(memory_size=1 << 24, memory_dir=str(tmp_path))
    listening = Listening(job, node, auth or Unauthenticated(), address, most=1 << 23)
    made = Replicas(config, node, job, listening, per_node=per_node, landed=landed)
    try:
        made.prepare(None)
        if accept is not None:
            made.listen(accept)
        yield made
    finally:
        made.close()


class CopyState:
    """The job's state as a node's copies read it (job/checkpoints/dialling.py CopyReads):
    this node's share, as `share` returns it now, and the reports of its peers."""

    def __init__(
        self,
        share: Callable[[], Handout | None] = lambda: None,
        reports: Mapping[str, NodeReport] | None = None,
    ) -> None:
        self.share = share
        self.reports = reports if reports is not None else {}  # read at each call

    def handout(self, name: str) -> Handout | None:
        return self.share()

    def peer_reports(self, names: Sequence[str]) -> dict[str, NodeReport]:
        return {n: r for n, r in self.reports.items() if n in names}


def terms(node: str, fetch_timeout: float = 30, share_wait: float = 5) -> CopyTerms:
    """A node's copies as the tests make them: one copy of each save, no rack."""
    return CopyTerms(node, "", 1, fetch_timeout, share_wait)
