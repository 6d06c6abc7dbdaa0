"""Faults in bursts (issue 41, part 6): four agents, FSDP2 training on gloo, two copies of each
save (`replicas: 2`). Two nodes are lost at once (rank 0's among them); within a second of the
survivors' restore, one of their workers is killed before its first save at the new world
(the burst that restored the start before issue 41: the survivors had dropped the old ranks'
saves that were all that was whole of the step just restored). Each re-form restores from
memory a step no older than the one committed before it, bit for bit, never the start.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers.cluster import LocalCluster, RedisServer, wait_for
from tests.helpers.fsdp import (
    committed,
    formed,
    fsdp_cluster,
    lines,
    lose,
    resumed_from_memory,
)
from tests.helpers.munge import MungeDaemon

pytest.importorskip("torch")
pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(420)]
EVERY = 6  # save interval, steps: about a second
NODES = ("a", "b", "c", "d")


@pytest.fixture
def shm(job_id: str) -> Iterator[Path]:
    path = Path("/dev/shm") / f"nodeagent-bursts-{job_id}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def kill_worker_at_once(cluster: LocalCluster, generation: int, node: str) -> None:
    """SIGKILL `node`'s worker of `generation` as soon as every rank printed its restore."""

    def restored_everywhere() -> bool:
        found = [x for x in lines(cluster, generation) if x["event"] == "restored"]
        return bool(found) and len(found) >= found[0]["world"]

    wait_for(restored_everywhere, 120, f"generation {generation} to restore")
    for pid in cluster.worker_pids(node):
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def test_two_nodes_lost_at_once_then_a_worker_crash_never_restore_the_start(
    redis_server: RedisServer, job_id: str, tmp_path: Path, shm: Path, munged: MungeDaemon
) -> None:
    with fsdp_cluster(
        redis_server,
        job_id,
        tmp_path,
        shm,
        steps=400,
        nodes=len(NODES),
        replicas=2,
        persist=False,
        every=EVERY,
        model=("--width", "256", "--layers", "4"),
        munge_socket=munged.socket,
    ) as cluster:
        cluster.min_nodes = 2
        cluster.start(*NODES)
        formed(cluster, len(NODES), 3 * EVERY)
        before = committed(cluster, 2 * EVERY)["committed"]
        members = cluster.status()["members"]
        lost = [str(members[0]), str(members[-1])]  # rank 0's node and another, at once
        for name in lost:
            lose(cluster, shm, name)
        first = resumed_from_memory(cluster, 2, before)
        generation = cluster.status()["generation"]
        survivor = next(name for name in NODES if name not in lost)
        kill_worker_at_once(cluster, generation, survivor)
        cluster.wait_status(
            lambda d: d["generation"] > generation and d["state"] == "running",
            90,
            "the re-form after the crash",
        )
        again = resumed_from_memory(cluster, 2, first)
        assert again >= first > 0
