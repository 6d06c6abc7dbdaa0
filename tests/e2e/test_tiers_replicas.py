"""End to end: the memory tier replicated to peers (issue 27). Real agents, a real Redis, FSDP2
on gloo (examples/train_fsdp.py), four nodes with one worker each. A whole node lost (its agent
and worker SIGKILLed, its tmpfs wiped) -> the job re-forms at world 3 and resumes from memory at
the newest committed step, resharded from the survivors' copies, bit for bit."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster import LocalCluster, RedisServer, wait_for
from tests.helpers.fsdp import (
    fsdp_cluster,
    restored,
    saved_digests,
    tiers_said,
    wait_until_step,
)

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
EVERY = 6  # save interval, steps: about a second, longer than a copy takes here


def committed(cluster: LocalCluster, at_least: int) -> dict[str, Any]:
    """The status' checkpoints once a step >= `at_least` is committed on every rank's 2 nodes."""

    def probe() -> dict[str, Any] | None:
        tiers = cluster.status()["checkpoints"]
        step = tiers["committed"]
        return tiers if step is not None and step >= at_least else None

    found: dict[str, Any] = wait_for(probe, 90, f"a committed step >= {at_least}")
    return found


def test_a_lost_node_resumes_from_its_peers_memory_at_the_committed_step_bitwise(
    redis_server: RedisServer, job_id: str, tmp_path: Path, shm: Path
) -> None:
    nodes = ("a", "b", "c", "d")
    with fsdp_cluster(
        redis_server,
        job_id,
        tmp_path,
        shm,
        steps=400,
        nodes=4,
        replicas=1,
        persist=False,
        every=EVERY,
    ) as cluster:
        cluster.min_nodes = 3
        cluster.start(*nodes)
        wait_until_step(cluster, 1, 3 * EVERY)
        before = committed(cluster, 2 * EVERY)
        assert before["replicas"] == 1 and before["under_replicated"] == []
        cluster.kill_tree("c")  # the node is gone: its agent, its worker, and its tmpfs
        for lost in shm.glob(f"c.{job_id}*"):
            shutil.rmtree(lost)
        cluster.wait_status(
            lambda d: d["state"] == "running" and d["world_size"] == 3, 90, "world 3"
        )
        generation: int = cluster.status()["generation"]
        back = restored(cluster, generation)
        assert back["world"] == 3
        assert back["step"] >= before["committed"]  # nothing committed is lost
        assert back["digest"] == saved_digests(cluster, generation - 1)[back["step"]]
        assert tiers_said(cluster, generation, 3) == {"memory"}  # from peers, not from disk
        wait_until_step(cluster, generation, back["step"] + 2 * EVERY)
        # Re-protected: the new world's saves are committed on 2 nodes again.
        after = committed(cluster, back["step"] + EVERY)
        assert after["under_replicated"] == []
