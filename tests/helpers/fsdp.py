"""Real FSDP2 training under real agents with the checkpoint tiers (examples/train_fsdp.py):
the cluster, and what its workers printed (one JSON line per event)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Protocol

from tests.helpers.cluster import LocalCluster, local_cluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
EVERY = 2  # save interval, steps
TIMING = {
    "heartbeat_interval": "250ms",
    "lease_ttl": "3s",  # a loaded CI machine must not lapse it
    "stop_grace_period": "20s",
    "join_settle": "300ms",
}


class Redis(Protocol):
    """A Redis the agents reach at `url` (tests.helpers.cluster's, or the chaos suite's)."""

    @property
    def url(self) -> str: ...


def fsdp_cluster(
    redis: Redis,
    job_id: str,
    tmp_path: Path,
    shm: Path,
    steps: int,
    nodes: int = 3,
    in_place: bool = False,
    replicas: int = 0,
    nproc: int = 1,
    persist: bool = True,
    every: int = EVERY,
    env: dict[str, str] | None = None,
    model: tuple[str, ...] = (),
    max_rate: str | None = None,
    memory_size: str = "256MiB",
    munge_socket: str | None = None,
    job: dict[str, Any] | None = None,
    **cluster: Any,
) -> Any:
    """Agents running examples/train_fsdp.py with the memory and persistent tiers (in_place:
    job.recovery in_place, the script under elastic.run); `env`: more of the workers'
    environment; `model`: the script's model options (--width, --layers); `max_rate`:
    job.checkpoint.replication.max_rate; `memory_size`: job.checkpoint's (two saves of a
    rank's state, with room to spare: the default fits the tests' small models);
    `munge_socket`: the munged the checkpoint plane authenticates peers with (none given: the
    config says replication.auth: none); `cluster`: more LocalCluster fields (nodes in network
    namespaces); `job`: more of the job section (its container, its user)."""
    entrypoint = [
        sys.executable,
        str(ROOT / "examples" / "train_fsdp.py"),
        *("--steps", str(steps), "--save-every", str(every), "--step-time", "0.15"),
        *("--digest", "--checkpoint-dir", str(tmp_path / "script")),
        *(("--in-place",) if in_place else ()),
        *model,
    ]
    checkpoint: dict[str, Any] = {
        "memory_size": memory_size,
        "memory_dir": str(shm),
        "persist_every": 2,
        "replicas": replicas,  # 0: the tests of one node's tiers are not raced by copies
    }
    if persist:
        checkpoint["persist_dir"] = str(tmp_path / "persist")
    replication: dict[str, Any] = {"auth": "munge" if munge_socket else "none"}
    if max_rate is not None:
        replication["max_rate"] = max_rate
    checkpoint["replication"] = replication
    if munge_socket is not None:
        cluster["pool"] = {"munge_socket": munge_socket}
    return local_cluster(
        redis.url,
        tmp_path,
        job=job_id,
        min_nodes=2,
        max_nodes=nodes,
        target_nodes=nodes,
        max_restarts=5,
        nproc=nproc,
        timing=TIMING,
        entrypoint=entrypoint,
        job_options={
            "checkpoint": checkpoint,
            "env": {"OMP_NUM_THREADS": "1", **(env or {})},
            **({"recovery": "in_place"} if in_place else {}),
            **(job or {}),
        },
        **cluster,
    )


def lines(cluster: LocalCluster, generation: int) -> list[dict[str, Any]]:
    """Every JSON line the workers of `generation` printed."""
    found = []
    for log in sorted((cluster.directory / "logs" / cluster.job / str(generation)).glob("*.log")):
        for text in log.read_text(errors="replace").splitlines():
            if text.startswith("{"):
                found.append(json.loads(text))
    return found


def rank0(cluster: LocalCluster, generation: int, event: str) -> list[dict[str, Any]]:
    return [x for x in lines(cluster, generation) if x["event"] == event and x["rank"] == 0]


def pids(cluster: LocalCluster, generation: int) -> dict[int, int]:
    """Rank -> the pid of the process that printed its lines in `generation`."""
    return {x["rank"]: x["pid"] for x in lines(cluster, generation) if x["event"] == "restored"}


def saved_digests(cluster: LocalCluster, upto: int) -> dict[int, str]:
    return {x["step"]: x["digest"] for g in range(1, upto + 1) for x in rank0(cluster, g, "saved")}


def newest_step(cluster: LocalCluster, generation: int) -> int:
    return max((x["step"] for x in rank0(cluster, generation, "step")), default=0)


def _restore(cluster: LocalCluster, generation: int) -> dict[str, Any] | None:
    """Rank 0's restore in `generation`, if every rank restored the same step."""
    found = [x for x in lines(cluster, generation) if x["event"] == "restored"]
    if not found or len(found) < found[0]["world"]:
        return None
    assert len({x["step"] for x in found}) == 1, f"ranks restored different steps: {found}"
    return next(x for x in found if x["rank"] == 0)


def restored(cluster: LocalCluster, generation: int) -> dict[str, Any]:
    """Rank 0's restore in `generation`, once every rank restored the same step."""
    try:
        return wait_for(
            lambda: _restore(cluster, generation), 120, f"generation {generation} to restore"
        )
    except AssertionError as exc:  # what the agents did meanwhile (CI once waited out the 120 s)
        raise AssertionError(f"{exc}\n{cluster.diagnostics()}") from None


def first_restored(cluster: LocalCluster, since: int) -> tuple[int, dict[str, Any]]:
    """The first generation from `since` on whose ranks all restored, and rank 0's restore. A
    generation can be replaced before its ranks restore (a lease that lapsed on a loaded
    machine: CI once went from 2 to 3 within 2 s, and 2 never restored)."""

    def probe() -> tuple[int, dict[str, Any]] | None:
        for generation in range(since, int(cluster.status()["generation"]) + 1):
            found = _restore(cluster, generation)
            if found is not None:
                return generation, found
        return None

    try:
        return wait_for(probe, 120, f"a generation from {since} on to restore")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.diagnostics()}") from None


def wait_until_step(cluster: LocalCluster, generation: int, step: int) -> None:
    wait_for(lambda: newest_step(cluster, generation) >= step, 90, f"step {step}")


def formed(cluster: LocalCluster, world: int, step: int) -> int:
    """The generation that runs all `world` started nodes, once its rank 0 printed `step`. On a
    loaded machine an agent can start after the join settle (300 ms) has formed a smaller world
    of the others, and a generation at `world` can be replaced before its rank 0 gets to
    `step` (CI once waited 90 s on a generation already gone): the generation a test first acts
    on is whichever runs at `world` when its rank 0 gets there."""
    cluster.wait_running(world, 120)

    def there() -> int | None:
        doc = cluster.status()
        if doc["state"] != "running" or doc["world_size"] != world:
            return None
        generation = int(doc["generation"])
        return generation if newest_step(cluster, generation) >= step else None

    try:
        return wait_for(there, 120, f"rank 0 at step {step} in a generation at world {world}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.diagnostics()}") from None


def events(cluster: LocalCluster, kind: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events() if e["type"] == kind]


def tiers_said(cluster: LocalCluster, generation: int, nodes: int) -> set[str]:
    """The tiers every node's agent said its ranks restored `generation` from (it reads the
    workers' reports at its next tick: wait for all `nodes`)."""

    def probe() -> list[dict[str, Any]] | None:
        said = [e for e in events(cluster, "checkpoint_restored") if e["generation"] == generation]
        return said if len(said) >= nodes else None

    return {e["data"]["tier"] for e in wait_for(probe, 30, f"{nodes} restore events")}


def committed(cluster: LocalCluster, at_least: int) -> dict[str, Any]:
    """The status' checkpoints once a step >= `at_least` is committed (on replicas + 1 nodes)."""

    def probe() -> dict[str, Any] | None:
        tiers = cluster.status()["checkpoints"]
        step = tiers["committed"]
        return tiers if step is not None and step >= at_least else None

    found: dict[str, Any] = wait_for(probe, 90, f"a committed step >= {at_least}")
    return found


def lose(cluster: LocalCluster, shm: Path, node: str) -> None:
    """The node is gone: its agent, its worker, and its tmpfs (memory tier and replica area)."""
    cluster.kill_tree(node)
    for lost in shm.glob(f"{node}.{cluster.job}*"):
        shutil.rmtree(lost)


def resumed_from_memory(cluster: LocalCluster, world: int, committed_step: int) -> int:
    """Wait for the job at `world`; check that every node restored from memory, at a step no
    older than `committed_step`, bit for bit the state saved there. The step."""
    cluster.wait_status(
        lambda d: d["state"] == "running" and d["world_size"] == world, 90, f"world {world}"
    )
    generation: int = cluster.status()["generation"]
    while True:  # the newest generation at `world`: one can be superseded before it restores
        try:
            back = restored(cluster, generation)
            break
        except AssertionError:  # (seen in CI: a chaos run's generation 3 went by unrestored)
            doc = cluster.status()
            if doc["generation"] == generation or doc["world_size"] != world:
                raise
            generation = doc["generation"]
    assert back["world"] == world
    # nothing committed is lost (else: what the restore was offered, what copies failed)
    said = [e for e in cluster.events() if e["type"].startswith("checkpoint")]
    assert back["step"] >= committed_step, (back, cluster.status()["checkpoints"], said[-8:])
    assert back["digest"] == saved_digests(cluster, generation - 1)[back["step"]]
    assert tiers_said(cluster, generation, world) == {"memory"}  # from peers, not from disk
    step: int = back["step"]
    return step
