"""End to end: the checkpoint tiers with real agents, a real Redis and real FSDP2 training
(examples/train_fsdp.py, gloo on CPU). A worker SIGKILLed resumes from the memory tier, losing
no more than the save interval, with the very state saved; copies with a flipped bit are refused
and the persistent tier used; scale 3 -> 2 -> 3 reshards through the persistent tier, bitwise;
a job that ends leaves no memory tier behind."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from nodeagent.channel import manifests, tier
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.fsdp import (
    EVERY,
    events,
    first_restored,
    fsdp_cluster,
    newest_step,
    rank0,
    restored,
    saved_digests,
    tiers_said,
    wait_until_step,
)
from tests.helpers.scrape import job_labels, scrape

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_killed_worker_resumes_from_the_memory_tier_with_the_state_it_saved(
    redis_server: RedisServer, job_id: str, tmp_path: Path, shm: Path
) -> None:
    with fsdp_cluster(redis_server, job_id, tmp_path, shm, steps=36) as cluster:
        cluster.start("a", "b", "c")
        wait_for(lambda: newest_step(cluster, 1) >= 12, 120, "step 12")
        victim = psutil.Process(cluster.worker_pids("b")[0])
        victim.kill()
        victim.wait(10)
        last = newest_step(cluster, 1)
        cluster.wait_status(lambda d: d["generation"] >= 2 and d["state"] == "running", 60, "gen 2")
        generation, back = first_restored(cluster, 2)
        saved = saved_digests(cluster, generation - 1)
        assert back["step"] in saved
        assert back["digest"] == saved[back["step"]]  # the state saved, bit for bit
        assert last - back["step"] <= 2 * EVERY  # no more than the save interval (+ one in flight)
        [chosen] = [e for e in events(cluster, "restore_chosen") if e["generation"] == generation]
        saved_by = chosen["data"]["restore"][0]  # memory:STEP@the generation that saved it
        assert saved_by.startswith(f"memory:{back['step']}@")
        assert tiers_said(cluster, generation, 3) == {"memory"}
        shown = cluster.status()["checkpoints"]
        assert shown["restore"][0] == saved_by
        assert shown["persisted"] is not None and shown["persisted"] <= back["step"]
        printed = cluster.ctl("status").stdout
        assert f"this generation restores from {saved_by} > " in printed
        node_b = next(n for n in cluster.status()["nodes"] if n["name"] == "b")
        job = job_labels(job_id)

        def saving() -> dict[tuple[str, Any], float] | None:
            # The bytes are what b's memory tier holds verified now, the blocked time the newest
            # verified save's, kept while none is held (telemetry/checkpoints.py `held`): under
            # -n 2 one scrape showed an earlier save's time and 0 bytes, so both are waited
            # for, until the new generation's first save is verified.
            found = scrape(node_b["metrics"])
            blocked = found[("nodeagent_checkpoint_save_blocked_seconds", job)]
            held = found[("nodeagent_checkpoint_memory_bytes", job)]
            return found if blocked > 0 and held > 0 else None

        samples = wait_for(saving, 30, "b's metrics to show a verified save and its bytes")
        restores = ("nodeagent_checkpoint_restores_total", job_labels(job_id, tier="memory"))
        assert samples[restores] == 1
        lost = samples[("nodeagent_checkpoint_steps_lost", job)]
        assert 0 <= lost <= 2 * EVERY
        cluster.wait_status(lambda d: d["state"] == "succeeded", 180, "the job to succeed")
        assert cluster.status()["restart_count"] == 1
        wait_for(lambda: not any(shm.glob(f"*.{job_id}")), 30, "the memory tiers to go")
        assert tier.steps(tmp_path / "persist")  # the end of the job was persisted


def flip_every_slot(memory: Path) -> list[int]:
    """Flip one bit in every save of the memory tier `memory`; the steps damaged."""
    damaged = []
    for slot, _rank in tier.memory_saves(memory):
        if (slot / manifests.MANIFEST).exists():
            data = slot / "__0_0.distcp"
            raw = bytearray(data.read_bytes())
            raw[len(raw) // 3] ^= 0x01
            data.write_bytes(bytes(raw))
            damaged.append(manifests.read_manifest(slot).step)
    return sorted(damaged)


def test_flipped_bits_in_the_memory_tier_are_refused_and_the_persistent_tier_used(
    redis_server: RedisServer, job_id: str, tmp_path: Path, shm: Path
) -> None:
    with fsdp_cluster(redis_server, job_id, tmp_path, shm, steps=60) as cluster:
        cluster.start("a", "b", "c")

        def persisted_and_digested() -> bool:
            # The digest line follows the save through a gather of every rank's shards: freeze
            # b before rank 0 printed it and it never comes.
            # Persisted by every node: b froze once after a's and c's keepers had persisted a
            # step and before its own had, and no whole step was left to restore (CI).
            by_node: dict[str, set[int]] = {}
            for e in events(cluster, "checkpoint_persisted"):
                by_node.setdefault(e["node"], set()).add(e["data"]["step"])
            steps = set.intersection(*by_node.values()) if len(by_node) == 3 else set()
            return bool(steps & set(saved_digests(cluster, 1)))

        wait_for(persisted_and_digested, 120, "a persisted step whose digest rank 0 printed")
        victim = psutil.Process(cluster.worker_pids("b")[0])
        victim.suspend()  # it saves nothing more: its copies are the ones damaged
        damaged = flip_every_slot(shm / f"b.{job_id}")
        assert damaged  # (a save cut short by the freeze has no manifest: it holds nothing)
        victim.kill()
        cluster.wait_status(lambda d: d["generation"] >= 2 and d["state"] == "running", 60, "gen 2")
        generation, back = first_restored(cluster, 2)
        saved = saved_digests(cluster, generation - 1)
        assert tiers_said(cluster, generation, 3) == {"persistent"}
        assert back["digest"] == saved[back["step"]]
        # Refused, by b's agent when it verified them after the kill, or by the workers that
        # tried them (then never chosen again).
        refused = [e["message"] for e in events(cluster, "checkpoint_refused")]
        assert refused and all("checksum" in m for m in refused), refused
        # The copies the workers tried and refused are b's to drop: it verifies its tier again
        # and offers none of them again (a checksum condemns the copy, not the step).
        tried = {
            int(e["data"]["source"].split(":")[1].split("@")[0])
            for e in events(cluster, "checkpoint_refused")
            if e["data"].get("source", "").startswith("memory:")
        }

        def dropped() -> bool | None:
            lease = next(x for x in cluster.store.snapshot().leases if x.name == "b")
            held = lease.report.tier.memory if lease.report and lease.report.tier else ()
            return not {h.step for h in held if 1 in h.ranks} & tried & set(damaged) or None

        wait_for(dropped, 30, f"b to stop offering its damaged copies of {tried}")


def test_scale_down_and_up_reshard_through_the_persistent_tier_bitwise(
    redis_server: RedisServer, job_id: str, tmp_path: Path, shm: Path
) -> None:
    with fsdp_cluster(redis_server, job_id, tmp_path, shm, steps=200) as cluster:
        cluster.start("a", "b", "c")
        wait_for(lambda: newest_step(cluster, 1) >= 6, 120, "step 6")
        for target, world in ((2, 2), (3, 3)):
            before = cluster.status()["generation"]
            assert cluster.ctl("scale", str(target)).returncode == 0
            cluster.wait_status(
                lambda d, w=world, g=before: d["generation"] > g and d["world_size"] == w,
                90,
                f"world {world}",
            )
            generation = cluster.status()["generation"]
            back = restored(cluster, generation)
            stopped = [x["step"] for x in rank0(cluster, before, "stopped")]
            assert stopped == [back["step"]]  # the step the graceful stop saved: none lost
            assert back["world"] == world
            assert back["digest"] == saved_digests(cluster, before)[back["step"]]
            assert tiers_said(cluster, generation, world) == {"persistent"}
            wait_until_step(cluster, generation, back["step"] + 4)
        cluster.ctl("stop")
        cluster.wait_status(lambda d: d["state"] == "stopped", 60, "the job to stop")


def test_the_memory_tier_outlives_an_agent_restart(
    redis_server: RedisServer, job_id: str, tmp_path: Path, shm: Path
) -> None:
    """systemctl restart: the agent stops (its workers save and stop, the step is persisted),
    its memory tier stays; the new agent finds it, verifies it and reports it."""
    with fsdp_cluster(redis_server, job_id, tmp_path, shm, steps=200) as cluster:
        cluster.start("a", "b", "c")
        wait_for(lambda: newest_step(cluster, 1) >= 6, 120, "step 6")
        agent = cluster.agents["b"]
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(60) == 0
        memory = shm / f"b.{job_id}"
        kept = [manifests.verify(s).step for s, _ in tier.memory_saves(memory) if s.exists()]
        assert kept, f"b's memory tier went with its agent: {list(shm.glob('*'))}"
        cluster.start("b")

        def reported() -> list[int] | None:
            node = next((n for n in cluster.status()["nodes"] if n["name"] == "b"), None)
            held = node and node["tier"] and node["tier"]["memory"]
            return [held] if held is not None and held >= max(kept) else None

        wait_for(reported, 60, "the restarted agent to report the tier it found")
        cluster.ctl("stop")
        cluster.wait_status(lambda d: d["state"] == "stopped", 60, "the job to stop")
