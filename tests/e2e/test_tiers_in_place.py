"""End to end: a sharded (FSDP2) job with `recovery: in_place` and the checkpoint tiers, real
agents, a real Redis, gloo on CPU (examples/train_fsdp.py --in-place). When a worker is killed
the survivors keep their processes and every rank resumes from the memory tier, with the state
saved; a scale re-forms the job in place, every rank saving the step it reached first, and the
new world reshards it from the persistent tier: no step lost, bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.cluster import LocalCluster, RedisServer
from tests.helpers.fsdp import (
    EVERY,
    events,
    formed,
    fsdp_cluster,
    lines,
    pids,
    restored,
    saved_digests,
    tiers_said,
    wait_until_step,
)

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def last_saved(cluster: LocalCluster, generation: int) -> dict[int, int]:
    """Rank -> the last step it saved in `generation`."""
    found: dict[int, int] = {}
    for x in lines(cluster, generation):
        if x["event"] == "saved":
            found[x["rank"]] = max(found.get(x["rank"], 0), x["step"])
    return found


def next_generation(cluster: LocalCluster, after: int, world: int) -> int:
    cluster.wait_status(
        lambda d: d["generation"] > after and d["state"] == "running" and d["world_size"] == world,
        90,
        f"a generation after {after} at world {world}",
    )
    generation: int = cluster.status()["generation"]
    return generation


def test_survivors_of_a_killed_worker_keep_their_processes_and_resume_from_memory(
    redis_server: RedisServer, job_id: str, tmp_path: Path, shm: Path
) -> None:
    with fsdp_cluster(redis_server, job_id, tmp_path, shm, steps=60, in_place=True) as cluster:
        cluster.start("a", "b", "c")
        first = formed(cluster, 3, 10)
        before = pids(cluster, first)
        victim = psutil.Process(cluster.worker_pids("b")[0])
        victim.kill()
        victim.wait(10)
        generation = next_generation(cluster, first, 3)
        back = restored(cluster, generation)
        after = pids(cluster, generation)
        assert after[0] == before[0] and after[2] == before[2]  # survivors: the same processes
        assert after[1] != before[1]  # the killed rank: a new one
        saved = saved_digests(cluster, generation - 1)
        assert back["digest"] == saved[back["step"]]  # the state saved, bit for bit
        assert tiers_said(cluster, generation, 3) == {"memory"}
        wait_until_step(cluster, generation, back["step"] + 4)
        assert cluster.status()["restart_count"] == 1


def test_scale_in_place_saves_the_step_reached_and_reshards_it_bitwise(
    redis_server: RedisServer, job_id: str, tmp_path: Path, shm: Path
) -> None:
    with fsdp_cluster(redis_server, job_id, tmp_path, shm, steps=400, in_place=True) as cluster:
        cluster.start("a", "b", "c")
        first = generation = formed(cluster, 3, 2 * EVERY + 1)
        for target in (2, 3):
            before = generation
            kept = pids(cluster, before)
            assert cluster.ctl("scale", str(target)).returncode == 0
            generation = next_generation(cluster, before, target)
            back: dict[str, Any] = restored(cluster, generation)
            reached = last_saved(cluster, before)
            # Every rank saved the step it had reached when told to leave: none is lost.
            assert set(reached.values()) == {back["step"]}, reached
            assert back["world"] == target
            assert back["digest"] == saved_digests(cluster, before)[back["step"]]
            assert tiers_said(cluster, generation, target) == {"persistent"}  # resharded
            now = pids(cluster, generation)
            survivors = set(now.values()) & set(kept.values())
            assert len(survivors) == min(target, len(kept))  # nobody restarted who stayed
            wait_until_step(cluster, generation, back["step"] + 2)
        said = events(cluster, "checkpoint_restored")
        assert {e["data"]["tier"] for e in said if e["generation"] > first} == {"persistent"}
        cluster.ctl("stop")
        cluster.wait_status(lambda d: d["state"] == "stopped", 60, "the job to stop")
