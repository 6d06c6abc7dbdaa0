"""A node reports a peer's save as soon as the last copy of it lands (issue 41, part 2): the
receiver's loop is woken when the copies of one node's ranks of a step are all held, not at
each copy, so that the leader may commit within one heartbeat of the last copy and the agent
syncs once per sender and save. A real listener on loopback, real files."""

from __future__ import annotations

import time
from pathlib import Path

from nodeagent.checkpoint import sender
from nodeagent.checkpoint.peerauth import Unauthenticated
from nodeagent.checkpoint.replicas import Replicas
from nodeagent.checkpoint.wire import Hello
from tests.helpers.tiers import fake_save, node_replicas

JOB = "j"


def _send(receiver: Replicas, tmp_path: Path, step: int, rank: int) -> None:
    """Rank `rank` of `step` (world 4) sent from node a to the receiver, and held there."""
    slot = tmp_path / "sent" / f"{step}-{rank}"
    fake_save(slot, step, rank=rank, world=4, generation=2, size=20_000)
    assert receiver.address is not None
    sender.send(receiver.address, Hello(JOB, "a", "b", 2), slot, Unauthenticated())
    deadline = time.monotonic() + 10  # the listener's thread takes it after its answer
    while not any(h.step == step and rank in h.ranks for h in receiver.held()):
        assert time.monotonic() < deadline, f"rank {rank} of step {step} never held"
        time.sleep(0.01)
    time.sleep(0.2)  # the wake-up comes just after


def test_the_loop_is_woken_once_a_nodes_ranks_of_a_step_are_all_held(tmp_path: Path) -> None:
    woken: list[int] = []
    with node_replicas(
        tmp_path, "b", lambda _offer: None, per_node=2, landed=lambda: woken.append(1)
    ) as b:
        _send(b, tmp_path, 10, rank=2)  # node a runs ranks 2 and 3 of world 4
        assert woken == []
        _send(b, tmp_path, 10, rank=3)
        assert woken == [1]
        _send(b, tmp_path, 15, rank=3)  # the next save: its rank 2 is not here yet
        assert woken == [1]
        _send(b, tmp_path, 15, rank=2)
        assert woken == [1, 1]
        [held] = [h for h in b.held() if h.step == 15]
        assert held.ranks == (2, 3)
