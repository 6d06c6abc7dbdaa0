"""The root agent never reads a tier's files through a link or as another user's
(channel/beneath.py, issue 40): real directories, links and owners. Before, O_NOFOLLOW guarded
only the last component, so a worker's `slot-0` made a link to another directory had the agent
verify, report and send what lay there."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.channel import manifests, tier
from nodeagent.channel.beneath import open_beneath
from nodeagent.channel.manifests import BadCopy
from nodeagent.checkpoint import scan, sender
from nodeagent.checkpoint.peerauth import Unauthenticated
from nodeagent.checkpoint.replicas import Replicas
from nodeagent.checkpoint.transport import Offer
from nodeagent.checkpoint.wire import Hello, ReplicaError, Want
from tests.helpers.tiers import fake_save, node_replicas

NOBODY = 65534
FLAGS = os.O_RDONLY


@pytest.fixture
def tiers(tmp_path: Path) -> Path:
    """memory_dir, with a tier `a.j` and, outside it, a directory holding a genuine save."""
    memory_dir = tmp_path / "shm"
    (memory_dir / "a.j").mkdir(parents=True)
    fake_save(tmp_path / "elsewhere", 40, size=4096)
    return memory_dir


def test_a_plain_file_below_the_root_opens(tiers: Path) -> None:
    fake_save(tier.slots(tiers / "a.j", 0)[0], 10)
    fd = open_beneath(tiers, tier.slots(tiers / "a.j", 0)[0] / manifests.MANIFEST, FLAGS)
    os.close(fd)


def test_a_link_anywhere_on_the_way_is_not_followed(tiers: Path, tmp_path: Path) -> None:
    tier.rank_dir(tiers / "a.j", 0).mkdir()
    tier.slots(tiers / "a.j", 0)[0].symlink_to(tmp_path / "elsewhere")
    (tiers / "a.j" / "rank-1").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    for path in (
        tier.slots(tiers / "a.j", 0)[0] / manifests.MANIFEST,
        tiers / "a.j" / "rank-1" / manifests.MANIFEST,
    ):
        assert (path).exists()  # through the link, as a plain open would go
        with pytest.raises(OSError) as raised:
            open_beneath(tiers, path, FLAGS)
        assert raised.value.errno in (errno.ELOOP, errno.ENOTDIR)
    with pytest.raises(OSError) as outside:
        open_beneath(tiers, tmp_path / "elsewhere" / manifests.MANIFEST, FLAGS)
    assert outside.value.errno == errno.EXDEV


def test_a_file_of_another_user_in_a_tier_is_not_read(tiers: Path) -> None:
    """A hard link to another user's file, or a file chowned away, in the tier the agent gave
    the job's user: not the tier owner's, not read."""
    slot = tier.slots(tiers / "a.j", 0)[0]
    fake_save(slot, 10)
    os.chown(slot / "__0_0.distcp", NOBODY, NOBODY)
    with pytest.raises(OSError) as raised:
        open_beneath(tiers, slot / "__0_0.distcp", FLAGS)
    assert raised.value.errno == errno.EPERM
    with pytest.raises(BadCopy, match="another user's"):
        manifests.verify(slot, beneath=tiers)
    os.chown(tiers / "a.j", NOBODY, NOBODY)  # the tier is nobody's: so may its files be
    os.chown(slot.parent, NOBODY, NOBODY)
    os.chown(slot, NOBODY, NOBODY)
    assert manifests.verify(slot, beneath=tiers).step == 10


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Replicas]:
    """Node a of job j, serving b, its slot-0 of rank 0 a link to a genuine save elsewhere."""

    def accept(offer: Offer) -> str | None:
        return None

    with node_replicas(tmp_path / "shm", "a", accept, "j") as made:
        made.memory.mkdir()
        tier.rank_dir(made.memory, 0).mkdir()
        fake_save(tmp_path / "elsewhere", 40, size=4096)
        tier.slots(made.memory, 0)[0].symlink_to(tmp_path / "elsewhere")
        yield made


def test_the_agent_never_verifies_reports_or_serves_a_save_through_a_linked_slot(
    node: Replicas, tmp_path: Path
) -> None:
    verified = scan.Verified(node.memory)
    problems = verified.refresh()
    assert verified.saves() == [] and any("a link" in p for p in problems), problems
    assert node.address is not None
    with pytest.raises(ReplicaError, match="a link, something else than a file"):
        sender.fetch(
            node.address,
            Hello("j", "b", "a", 3),
            Want(0, 40, 3),
            tmp_path / "got",
            Unauthenticated(),
        )
    with pytest.raises(BadCopy, match="a link"):
        sender.send(
            node.address,
            Hello("j", "a", "a", 3),
            tier.slots(node.memory, 0)[0],
            Unauthenticated(),
            beneath=node.memory.parent,
        )
