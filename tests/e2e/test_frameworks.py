"""End to end: a Lightning job (examples/train_lightning.py), a transformers Trainer job
(examples/train_transformers.py), DDP on gloo, and torchtitan's components with its checkpoint
manager (examples/train_torchtitan.py, FSDP2: a node's loss reshards the survivors' and the
peers' copies), one worker a node, with nodeagent.integrations under real agents and the memory
tier with a copy of each save on a peer (restart mode: the framework owns its process group).
A worker killed, a whole node lost, a node back, a node drained: each new generation resumes
from memory at or after the step committed when the fault came (the drain: at the very step its
stop saved), bit for bit the state saved, with the framework's own progress: the same batch and
learning rate at the next step (torchtitan's batch only at the world its loader saved).

Lightning goes through all four. The others go through the faults whose handling is their own
(CI's time is spent where it finds something): transformers restores after a kill and saves as
it stops at a drain; torchtitan reshards FSDP2 to the survivors after a loss and back as the node
returns. The agent's side of every fault is the same for each framework."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster import LocalCluster, RedisServer, local_cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
EVERY = 5  # the tier's save interval, steps
TIMING = {
    "heartbeat_interval": "250ms",
    "lease_ttl": "5s",  # not lapsed by a loaded machine's late beat
    "stop_grace_period": "20s",
    "join_settle": "300ms",
}


def records(cluster: LocalCluster) -> list[dict[str, Any]]:
    found = []
    for path in sorted(cluster.records_dir.glob("[0-9]*.jsonl")):
        found += [json.loads(text) for text in path.read_text().splitlines()]
    return sorted(found, key=lambda x: x["t"])


def of(cluster: LocalCluster, event: str, generation: int) -> list[dict[str, Any]]:
    return [x for x in records(cluster) if x["event"] == event and x["generation"] == generation]


def stepping(cluster: LocalCluster, world: int, after: int, steps: int = 3) -> int:
    """The newest generation after `after` running at `world`, once each rank took `steps`
    steps. A generation superseded at the same world before it got there is followed: a loaded
    machine can lapse a lease (seen in CI: generation 1 went by, a node's heartbeat late)."""
    generation: int = cluster.wait_running(world, 150, after_generation=after)["generation"]

    def probe() -> bool:
        nonlocal generation
        taken = of(cluster, "step", generation)
        if all(sum(1 for x in taken if x["rank"] == r) >= steps for r in range(world)):
            return True
        doc = cluster.status()
        if doc["state"] == "running" and doc["world_size"] == world:
            generation = max(generation, doc["generation"])
        return False

    try:
        wait_for(probe, 150, f"every rank stepping at world {world} after generation {after}")
    except AssertionError as exc:  # what the agents saw: a restart, a rank stuck
        raise AssertionError(f"{exc}\n{cluster.diagnostics()}") from None
    return generation


def resumed(cluster: LocalCluster, before: int, now: int) -> tuple[int, int]:
    """Every rank of generation `now` restored one step, saved by an earlier generation: bit
    for bit its state then, with its epoch going on from there, and the same batch and learning
    rate next as when it was first trained. The step restored, and the last `before` took."""
    restored = of(cluster, "restored", now)
    assert len({x["step"] for x in restored}) == 1, restored
    step = restored[0]["step"]
    trained: dict[int, dict[str, Any]] = {}  # step -> rank 0's line, the latest generation's
    for x in records(cluster):
        if x["event"] == "step" and x["rank"] == 0 and x["generation"] < now:
            trained[x["step"]] = x
    assert step in trained, (step, sorted(trained))
    assert {x["hash"] for x in restored} == {trained[step]["hash"]}
    if "epoch" in restored[0]:  # the next epoch's, when the step ended the epoch
        epoch = trained[step]["epoch"]
        assert {x["epoch"] for x in restored} <= {epoch, epoch + 1}
    first = next(x for x in of(cluster, "step", now) if x["rank"] == 0)
    assert first["step"] == step + 1
    if step + 1 in trained:  # the schedule went on where it was; at the same world, the data
        then = trained[step + 1]
        assert first["lr"] == then["lr"]
        if first["world"] == then["world"]:
            assert first["batch_sum"] == then["batch_sum"]
    last = max(x["step"] for x in of(cluster, "step", before) if x["rank"] == 0)
    return step, last


def committed(cluster: LocalCluster) -> int:
    """The step committed now (held on two nodes), once there is one."""

    def probe() -> int | None:
        step: int | None = cluster.status()["checkpoints"]["committed"]
        return step

    found: int = wait_for(probe, 90, "a committed step")
    return found


FAULTS = {
    "lightning": ("kill", "loss", "join", "drain"),
    "transformers": ("kill", "drain"),
    "torchtitan": ("kill", "loss", "join"),
}


@pytest.mark.parametrize("framework", list(FAULTS))
def test_a_framework_resumes_from_the_memory_tier_after_each_of_its_faults(
    redis_server: RedisServer, job_id: str, tmp_path: Path, shm: Path, framework: str
) -> None:
    faults = FAULTS[framework]
    pytest.importorskip(framework)
    with local_cluster(
        redis_server.url,
        tmp_path,
        job=job_id,
        min_nodes=2,
        max_nodes=3,
        target_nodes=3,
        max_restarts=5,
        timing=TIMING,
        entrypoint=[sys.executable, str(ROOT / "examples" / f"train_{framework}.py")],
        job_options={
            "checkpoint": {
                "memory_size": "64MiB",
                "memory_dir": str(shm),
                "replicas": 1,
                "replication": {"auth": "none"},
            },
        },
    ) as cluster:
        cluster.job_options["env"] = {
            "RECORD_DIR": str(cluster.records_dir),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "MAX_STEPS": "100000",
            "SAVE_EVERY": str(EVERY),
            "STEP_TIME_S": "0.2",
            "OUTPUT_DIR": str(tmp_path / "output"),
            "DUMP_DIR": str(tmp_path / "dump"),
        }
        cluster.start("a", "b", "c")
        first = stepping(cluster, 3, 0, steps=2 * EVERY + 2)

        before = committed(cluster)  # a worker killed: every rank restarts
        os.kill(cluster.worker_pids(cluster.status()["members"][-1])[0], signal.SIGKILL)
        latest = stepping(cluster, 3, first)
        step, last = resumed(cluster, first, latest)
        assert step >= before and last - step <= 2 * EVERY, (before, step, last)
        world = 3

        if "loss" in faults:
            before = committed(cluster)  # a whole node: its agent, worker and tmpfs
            lost = cluster.status()["members"][-1]
            cluster.kill_tree(lost)
            for gone in shm.glob(f"{lost}.{cluster.job}*"):
                shutil.rmtree(gone)
            smaller = stepping(cluster, 2, latest)
            step, last = resumed(cluster, latest, smaller)
            assert step >= before and last - step <= 2 * EVERY, (before, step, last)
            latest, world = smaller, 2

        if "join" in faults:
            # Back, empty: it joins. The others save the step they reached as they stop, but a
            # newcomer brings only the committed step from its peers (docs/checkpoints.md).
            before = committed(cluster)
            cluster.start(lost)
            joined = stepping(cluster, 3, latest)
            step, last = resumed(cluster, latest, joined)
            assert step >= before and last - step <= 2 * EVERY, (before, step, last)
            latest, world = joined, 3

        if "drain" in faults:
            # A drain: every rank saves the step it reached as the framework stops on SIGTERM,
            # and the drained node hands its save to a node that stays: not one step lost.
            assert cluster.ctl("drain", cluster.status()["members"][-1]).returncode == 0
            after = stepping(cluster, world - 1, latest)
            step, last = resumed(cluster, latest, after)
            assert step == last, f"lost {last - step} steps at a drain"
            said = [e for e in cluster.events() if e["type"] == "checkpoint_restored"]
            assert {e["data"]["tier"] for e in said if e["generation"] == after} == {"memory"}
