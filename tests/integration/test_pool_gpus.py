"""GPUs in the pool (issue 66), with real agents, a real redis-server and fake NVML nodes of 8
GPUs each: every node advertises its units (UUID, model, memory); a job that asks for GPUs
goes only where enough are offered, its workers see only theirs, `nodes` says who holds each,
and its accounting record counts GPU-hours by what it held."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.config.values import size_text
from tests.helpers.cluster import WORKER, RedisServer, wait_for
from tests.helpers.devicenodes import (
    allowed_only,
    delegated_cgroup,
    device_nodes,
    drop_in_caps,
    in_cgroup,
)
from tests.helpers.gpus import gpu
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(180)
MODEL, MEMORY = "NVIDIA H100 80GB HBM3", 81559


def eight_gpus(path: Path) -> dict[str, Any]:
    gpus = [{**gpu(i), "name": MODEL, "memory_mib": MEMORY} for i in range(8)]
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    return {"health": {"gpu": "on", "interval": "100ms", "fake_gpus": str(path)}}


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        for node in "ab":
            cluster.node_options[node] = eight_gpus(tmp_path / f"gpus-{node}.yaml")
        yield cluster


def units(pool: PoolCluster) -> dict[str, list[dict[str, Any]]]:
    result = pool.ctl("nodes", "--json")
    assert result.returncode == 0, result.stderr
    return {row["name"]: row["gpus"] for row in json.loads(result.stdout)["nodes"]}


def shares(pool: PoolCluster) -> dict[str, dict[str, int]]:
    result = pool.ctl("nodes", "--json")
    assert result.returncode == 0, result.stderr
    return {row["name"]: row["shares"] for row in json.loads(result.stdout)["nodes"]}


def every_node_offers(
    pool: PoolCluster, count: int, *only: str
) -> dict[str, list[dict[str, Any]]] | None:
    """The nodes' units once every node (of `only`, if named) offers `count`."""
    found = units(pool)
    chosen = [offered for node, offered in found.items() if not only or node in only]
    return found if all(len(offered) == count for offered in chosen) else None


def started(pool: PoolCluster, job: str, count: int) -> list[dict[str, Any]] | None:
    path = pool.job_records(job) / "records.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    found = [r for r in map(json.loads, filter(None, lines)) if r["event"] == "start"]
    return found if len(found) >= count else None


def first_start(pool: PoolCluster, job: str) -> dict[str, Any]:
    return wait_for(lambda: started(pool, job, 1), 30, f"{job}'s worker to start")[0]


def holding(pool: PoolCluster, node: str, jobs: set[str]) -> set[str] | None:
    held = {unit["job"] for unit in units(pool)[node]}
    return held if held == jobs else None


def test_nodes_advertise_their_gpus_and_a_job_holds_what_it_asked_for(
    pool: PoolCluster, job_id: str, tmp_path: Path
) -> None:
    pool.start("a", "b")
    pool.wait_nodes(2)
    offered = wait_for(lambda: every_node_offers(pool, 8), 30, "8 GPUs a node")
    assert offered["a"][3] == {
        "uuid": "GPU-fake-3",
        "model": MODEL,
        "memory_mib": MEMORY,
        "job": None,
    }

    pair = f"{job_id}-pair"[:63]
    pool.submit(pair, "1", "--nproc-per-node", "2", "--gpus-per-node", "2")
    row = pool.wait_job(pair, "running", world=2)
    node = next(n for n, held in shares(pool).items() if pair in held)
    starts = wait_for(lambda: started(pool, pair, 2), 30, "its workers' starts")
    assert sorted(s["cuda"] for s in starts) == ["GPU-fake-0", "GPU-fake-1"]  # each its own
    held = wait_for(
        lambda: [u["uuid"] for u in units(pool)[node] if u["job"] == pair] or None, 30, "holders"
    )
    assert held == ["GPU-fake-0", "GPU-fake-1"]
    table = pool.ctl("nodes", "--gpus")
    assert table.returncode == 0 and "GPU-fake-1" in table.stdout and pair in table.stdout
    assert "2/8" in pool.ctl("nodes").stdout

    big = f"{job_id}-big"[:63]
    pool.submit(big, "1", "--gpus-per-node", "16")
    says = "2 offer fewer than 16 GPUs"
    wait_for(lambda: says in pool.jobs()[big]["reason"], 30, "why it waits")

    (pool.job_records(pair) / f"exit-{row['generation']}").write_text("0")
    pool.wait_job(pair, "succeeded")
    database = tmp_path / "state" / "accounting.sqlite"

    def record() -> tuple[Any, ...] | None:
        query = "SELECT nodes, node_hours, gpu_hours, record FROM nodeagent_jobs WHERE job = ?"
        try:
            with sqlite3.connect(database) as db:
                found: tuple[Any, ...] | None = db.execute(query, (pair,)).fetchone()
                return found
        except sqlite3.OperationalError:  # no table yet
            return None

    nodes, node_hours, gpu_hours, kept = wait_for(record, 30, "its accounting record")
    assert (nodes, json.loads(kept)["gpus"]) == (1, 2)
    assert node_hours > 0 and gpu_hours == pytest.approx(2 * node_hours)
    # history says it too, from the pool and from the database (issue 81)
    for where in ("none", f"sqlite:///{database}"):
        said = pool.ctl("history", "--accounting", where, "--json")
        assert said.returncode == 0, said.stderr
        (row,) = [r for r in json.loads(said.stdout)["jobs"] if r["job"] == pair]
        hours = pytest.approx(2 * row["node_hours"], abs=3e-4)  # (each rounded to 4 places)
        assert row["gpus"] == 2 and row["gpu_hours"] == hours, row
    assert "GPU-H" in pool.ctl("history").stdout


def test_the_scheduler_counts_each_node_s_memory_as_it_counts_its_gpus(
    pool: PoolCluster, job_id: str
) -> None:
    """Each agent says what its jobs share in memory (the machine's, or its cgroup's, less the
    reserve): two 1-GPU jobs that each ask for 60 % of it go to two nodes, though one node has
    the GPUs for both; one that asks for more than any node has waits, saying so."""
    pool.start("a", "b")
    pool.wait_nodes(2)

    def offering() -> list[dict[str, Any]] | None:
        """The nodes' rows once each says its memory and its 8 GPUs (its share per GPU)."""
        rows = json.loads(pool.ctl("nodes", "--json").stdout)["nodes"]
        return rows if all(r["memory"] and len(r["gpus"]) == 8 for r in rows) else None

    rows = wait_for(offering, 30, "the nodes' memory")
    assert len(rows) == 2 and all(r["mem_per_gpu"] == r["memory"] // 8 for r in rows), rows
    least = min(r["memory"] for r in rows)
    assert size_text(least) in pool.ctl("nodes").stdout  # the MEMORY column
    mib = least * 6 // 10 >> 20
    first, second = f"{job_id}-first"[:63], f"{job_id}-second"[:63]
    for name in (first, second):
        pool.submit(name, "1", "--gpus-per-node", "1", "--mem", f"{mib}MiB")
        pool.wait_job(name, "running", world=1)
    held = shares(pool)
    assert sorted(n for n, jobs in held.items() if jobs) == ["a", "b"], held

    huge = f"{job_id}-huge"[:63]
    pool.submit(huge, "1", "--gpus-per-node", "1", "--mem", f"{(least >> 20) + 1024}MiB")
    says = "have less memory for jobs than it asks for"
    reason = wait_for(
        lambda: next((r for r in [pool.jobs()[huge]["reason"]] if says in r), None),
        30,
        "why it waits",
    )
    assert "2 have less memory" in reason, reason


@pytest.fixture
def cgroups() -> Iterator[dict[str, Path]]:
    """A cgroup for each node's agent to confine its jobs' devices below (tests/helpers/
    devicenodes.py); asked for before `pool`, so that it goes after the agents."""
    with contextlib.ExitStack() as stack:
        yield {node: stack.enter_context(delegated_cgroup()) for node in "abc"}


MINOR = 10  # GPU i's device node is nvidia<MINOR + i>: the minor NVML gives, not the index


def constrained(pool: PoolCluster, node: str, cgroup: Path, gpus: Path) -> None:
    """`node` with eight GPUs, constraining its jobs' devices, run as the unit with the
    drop-in would run it: its capabilities, from a cgroup of its own."""
    options = eight_gpus(gpus)
    listed = yaml.safe_load(gpus.read_text())["gpus"]
    gpus.write_text(
        yaml.safe_dump({"gpus": [{**g, "minor": MINOR + i} for i, g in enumerate(listed)]})
    )
    options["health"]["constrain_devices"] = True
    pool.node_options[node] = options
    pool.prefixes[node] = in_cgroup(cgroup)
    pool.caps[node] = drop_in_caps()


def test_eight_one_gpu_jobs_share_a_node_each_on_its_own_gpu_and_a_crash_stays_in_its_job(
    cgroups: dict[str, Path], pool: PoolCluster, job_id: str, tmp_path: Path
) -> None:
    """Issue 66's pool: eight one-GPU jobs packed onto one 8-GPU node, each worker seeing only
    its own GPU, by CUDA_VISIBLE_DEVICES and by the device cgroup (it may open its own GPU's
    device node and no other), beside a two-node job that holds two whole nodes (all eight
    GPUs' nodes); a worker killed in one of the eight re-forms that job alone: every other job
    keeps its generation and processes."""
    for node, cgroup in cgroups.items():
        constrained(pool, node, cgroup, tmp_path / f"gpus-{node}.yaml")
    pool.start("a", "b", "c")
    pool.wait_nodes(3)
    wait_for(lambda: every_node_offers(pool, 8), 30, "8 GPUs a node")
    minors = range(MINOR, MINOR + 8)
    with device_nodes(minors) as devices:
        ones = [f"{job_id}-{i}"[-63:] for i in range(8)]
        for name in ones:
            pool.submit(name, "1", "--gpus-per-node", "1", "--env", f"DEVICES_DIR={devices}")
        whole = f"{job_id}-whole"[-63:]
        pool.submit(whole, "2", "--env", f"DEVICES_DIR={devices}")
        _eight_and_a_whole(pool, ones, whole, minors)


def _eight_and_a_whole(pool: PoolCluster, ones: list[str], whole: str, minors: range) -> None:
    rows = {name: pool.wait_job(name, "running", world=1, timeout=60) for name in ones}
    pool.wait_job(whole, "running", world=2, timeout=60)
    (shared,) = {n for n, held in shares(pool).items() if held}
    assert shares(pool)[shared] == dict.fromkeys(ones, 1)
    placed = pool.placements()
    assert sorted(n for n, j in placed.items() if j == whole) == sorted({"a", "b", "c"} - {shared})
    first = {name: first_start(pool, name) for name in ones}
    assert sorted(s["cuda"] for s in first.values()) == [f"GPU-fake-{i}" for i in range(8)]
    assert {s["node"] for s in first.values()} == {shared}
    for start in first.values():
        own = f"nvidia{MINOR + int(start['cuda'].removeprefix('GPU-fake-'))}"
        assert start["devices"] == allowed_only(minors, own), start
    for start in wait_for(lambda: started(pool, whole, 2), 30, "the whole job's workers"):
        assert start["devices"] == allowed_only(minors, *(f"nvidia{m}" for m in minors))
    holders = wait_for(lambda: holding(pool, shared, set(ones)), 30, "each GPU's holder")
    assert holders == set(ones)
    # The node's one log: each line names the job whose agent logged it (runtime/jobrun.py
    # switches the context as each job's agent acts), and each job's master is its own.
    log = pool.agents[shared].log().splitlines()
    for name, start in first.items():
        said = [
            line
            for line in log
            if f"starting 1 workers: ranks 0-0 of 1, master {start['master']}" in line
        ]
        assert said and all(f" job={name} gen=" in line for line in said), (name, said)

    victim, others = ones[3], [n for n in ones if n != ones[3]]
    os.kill(first[victim]["pid"], signal.SIGKILL)
    pool.wait_job(victim, "running", world=1, after=rows[victim]["generation"], timeout=60)
    again = wait_for(lambda: started(pool, victim, 2), 30, "its worker started again")
    assert again[-1]["cuda"] == first[victim]["cuda"]  # its own GPU, kept
    now = pool.jobs()
    assert {n: now[n]["generation"] for n in others} == {n: rows[n]["generation"] for n in others}
    for name in others:  # one start each: never restarted, their workers still running
        assert len(started(pool, name, 1) or ()) == 1
        os.kill(first[name]["pid"], 0)


def test_a_failing_gpu_takes_only_its_holder_off_the_node(
    pool: PoolCluster, job_id: str, tmp_path: Path
) -> None:
    """Two one-GPU jobs packed onto node a: GPU 0 (x's) fails. x's agent drains a from x, the
    node refuses x from then on, and the pool re-places x on b; y keeps its generation and its
    worker; a no longer offers the failed GPU."""
    pool.start("a", "b")
    pool.wait_nodes(2)
    wait_for(lambda: every_node_offers(pool, 8), 30, "8 GPUs a node")
    x, y = f"{job_id}-x"[-63:], f"{job_id}-y"[-63:]
    pool.submit(x, "1", "--gpus-per-node", "1")
    row_x = pool.wait_job(x, "running", world=1)
    pool.submit(y, "1", "--gpus-per-node", "1")
    row_y = pool.wait_job(y, "running", world=1)
    assert shares(pool)["a"] == {x: 1, y: 1}
    first_x, first_y = first_start(pool, x), first_start(pool, y)
    assert (first_x["cuda"], first_y["cuda"]) == ("GPU-fake-0", "GPU-fake-1")

    path = tmp_path / "gpus-a.yaml"
    state = yaml.safe_load(path.read_text())
    state["gpus"][0]["ecc_uncorrected_volatile"] = 3  # uncorrectable ECC: the GPU drains
    time.sleep(0.02)  # a new mtime: FakeNvml reads it again
    path.write_text(yaml.safe_dump(state))
    pool.wait_job(x, "running", world=1, after=row_x["generation"], timeout=60)
    wait_for(lambda: shares(pool).get("b") == {x: 1}, 30, "x moved to b")
    offered = wait_for(lambda: every_node_offers(pool, 7, "a"), 30, "a offering 7 GPUs")
    assert "GPU-fake-0" not in {unit["uuid"] for unit in offered["a"]}
    assert pool.jobs()[y]["generation"] == row_y["generation"]
    assert len(started(pool, y, 1) or ()) == 1
    os.kill(first_y["pid"], 0)  # y's worker: the same process, still running

    # The node's verdict, job or not (issue 81: `nodes` said ok, `health` wanted a job)
    rows = {r["name"]: r for r in json.loads(pool.ctl("nodes", "--json").stdout)["nodes"]}
    assert rows["a"]["health"].startswith("GPU 0 unhealthy: "), rows["a"]
    assert rows["b"]["health"] == "ok" and rows["b"]["gpu"]["available"], rows["b"]
    assert "GPU 0 unh~" in pool.ctl("nodes").stdout  # the HEALTH column, cut to its width
    said = pool.ctl("health", "--node", "a")
    assert said.returncode == 0, said.stderr
    assert said.stdout.startswith("GPU 0: unhealthy") and "GPU 1: healthy" in said.stdout, said
    doc = json.loads(pool.ctl("health", "--node", "a", "--json").stdout)
    assert [g["health"] for g in doc["gpu"]["gpus"]] == ["unhealthy", *["healthy"] * 7], doc
    assert pool.ctl("health", "--node", "nowhere").returncode == 3


def test_a_node_killed_re_forms_every_job_it_served(pool: PoolCluster, job_id: str) -> None:
    pool.start("a", "b")
    pool.wait_nodes(2)
    wait_for(lambda: every_node_offers(pool, 8), 30, "8 GPUs a node")
    jobs = [f"{job_id}-{n}"[-63:] for n in ("x", "y")]
    for name in jobs:
        pool.submit(name, "1:2", "--gpus-per-node", "1")
    rows = {name: pool.wait_job(name, "running", world=2, timeout=60) for name in jobs}
    assert shares(pool) == {"a": dict.fromkeys(jobs, 1), "b": dict.fromkeys(jobs, 1)}
    pool.kill_tree("b")
    for name in jobs:
        pool.wait_job(name, "running", world=1, after=rows[name]["generation"], timeout=60)


def test_a_queue_below_its_gpu_share_takes_back_exactly_the_units_it_needs(
    pool: PoolCluster, job_id: str
) -> None:
    """a and b full: batch's job (priority 10, min 1 node) holds 4 GPUs of each, keep's (min 2
    nodes) the other 4 of each. research, guaranteed 4 GPUs, submits a 4-GPU job: it takes
    batch's share of one node, holding exactly the units batch gave up there, batch
    goes on on the other node, and keep keeps its generation and its worker."""
    pool.start("a", "b")
    pool.wait_nodes(2)
    wait_for(lambda: every_node_offers(pool, 8), 30, "8 GPUs a node")
    for queue, more in (("research", ("--gpu-guaranteed", "4")), ("batch", ())):
        made = pool.ctl("queue", "create", queue, *more)
        assert made.returncode == 0, made.stderr
    assert "warning" not in made.stdout  # 4 GPUs promised, 16 offered
    batch, keep = f"{job_id}-batch"[-63:], f"{job_id}-keep"[-63:]
    pool.submit(batch, "1:2", "--gpus-per-node", "4", "--queue", "batch", "--priority", "10")
    pool.wait_job(batch, "running", world=2, timeout=60)
    pool.submit(keep, "2", "--gpus-per-node", "4")
    row_keep = pool.wait_job(keep, "running", world=2, timeout=60)
    assert shares(pool) == {n: {batch: 4, keep: 4} for n in "ab"}
    given_up = wait_for(
        lambda: {u["uuid"] for u in units(pool)["a"] if u["job"] == batch} or None, 30, "holders"
    )
    keep_pids = {s["pid"] for s in wait_for(lambda: started(pool, keep, 2), 30, "keep's workers")}

    claim = f"{job_id}-claim"[-63:]
    pool.submit(claim, "1", "--gpus-per-node", "4", "--queue", "research")
    pool.wait_job(claim, "running", world=1, timeout=60)
    assert shares(pool) == {"a": {keep: 4, claim: 4}, "b": {batch: 4, keep: 4}}
    says = pool.jobs()[batch]["reason"]
    assert f"went to job {claim} (queue research below its guaranteed 4 GPUs)" in says, says
    taken = wait_for(
        lambda: {u["uuid"] for u in units(pool)["a"] if u["job"] == claim} or None, 30, "holders"
    )
    assert taken == given_up
    assert first_start(pool, claim)["cuda"] in given_up  # its worker: one of them (local rank 0)
    pool.wait_job(batch, "running", world=1, timeout=60)
    assert pool.jobs()[keep]["generation"] == row_keep["generation"]
    for pid in keep_pids:  # keep's workers: the same processes, still running
        os.kill(pid, 0)
    listing = {r["queue"]: r for r in json.loads(pool.ctl("queue", "list", "--json").stdout)[
        "queues"]}  # fmt: skip
    assert (listing["research"]["gpus"], listing["research"]["gpu_guaranteed"]) == (4, 4)


def test_a_gpu_job_of_higher_priority_takes_a_node_from_a_whole_node_job(
    pool: PoolCluster, job_id: str
) -> None:
    """w holds a and b whole (min 1); h (priority 5, 4 GPUs) takes one of them: w's agent
    leaves it and w goes on on the other, h's worker runs there on 4 of its units."""
    pool.start("a", "b")
    pool.wait_nodes(2)
    wait_for(lambda: every_node_offers(pool, 8), 30, "8 GPUs a node")
    whole, high = f"{job_id}-w"[-63:], f"{job_id}-h"[-63:]
    pool.submit(whole, "1:2")
    pool.wait_job(whole, "running", world=2, timeout=60)
    pool.submit(high, "1", "--gpus-per-node", "4", "--priority", "5")
    pool.wait_job(high, "running", world=1, timeout=60)
    (node,) = [n for n, held in shares(pool).items() if held == {high: 4}]
    assert pool.placements()[node] != whole
    says = pool.jobs()[whole]["reason"]
    assert says == f"shrunk 2 -> 1 nodes for job {high}: priority 5 > 0", says
    pool.wait_job(whole, "running", world=1, timeout=60)
    start = first_start(pool, high)
    assert start["node"] == node and start["cuda"] in {f"GPU-fake-{i}" for i in range(4)}


def test_a_preemptible_job_sharing_a_node_is_evicted_for_a_whole_node_job_and_resumes(
    pool: PoolCluster, job_id: str
) -> None:
    """spot (preemptible, 4 GPUs) shares a, steady (4 GPUs, not preemptible) shares b. vip
    (whole node, priority 10) evicts spot and takes a; steady is untouched; once vip ends,
    spot is admitted again, in a later generation, charged no restart."""
    pool.start("a", "b")
    pool.wait_nodes(2)
    wait_for(lambda: every_node_offers(pool, 8), 30, "8 GPUs a node")
    spot, steady = f"{job_id}-spot"[-63:], f"{job_id}-steady"[-63:]
    pool.submit(spot, "1", "--gpus-per-node", "8", "--preemptible")
    first = pool.wait_job(spot, "running", world=1, timeout=60)
    pool.submit(steady, "1", "--gpus-per-node", "4")
    row_steady = pool.wait_job(steady, "running", world=1, timeout=60)
    (node,) = [n for n, held in shares(pool).items() if spot in held]
    vip = f"{job_id}-vip"[-63:]
    pool.submit(vip, "1", "--priority", "10")
    pool.wait_job(vip, "running", world=1, timeout=60)
    assert pool.placements()[node] == vip
    evicted = pool.wait_job(spot, "pending")
    assert evicted["reason"].startswith(f"evicted by job {vip} (priority 10 > 0)"), evicted
    assert pool.jobs()[steady]["generation"] == row_steady["generation"]
    row = pool.jobs()[vip]
    (pool.job_records(vip) / f"exit-{row['generation']}").write_text("0")
    pool.wait_job(vip, "succeeded", timeout=60)
    again = pool.wait_job(spot, "running", world=1, timeout=60)
    assert again["generation"] > first["generation"] and again["restarts"] == first["restarts"]


def test_a_job_sharing_nodes_that_replaces_slow_ones_gets_a_standby_share(
    pool: PoolCluster, job_id: str, tmp_path: Path
) -> None:
    """slow_node.policy: replace at target 1 node with 2 GPUs: the pool lends it 2 units of the
    other node, whose agent joins the job and stands by (docs/slow-nodes.md)."""
    pool.start("a", "b")
    pool.wait_nodes(2)
    wait_for(lambda: every_node_offers(pool, 8), 30, "8 GPUs a node")
    spec = {
        "id": job_id,
        "entrypoint": [sys.executable, str(WORKER)],
        "min_nodes": 1,
        "max_nodes": 2,
        "target_nodes": 1,
        "gpus_per_node": 2,
        "env": {"RECORD_DIR": str(pool.job_records(job_id))},
        "slow_node": {"policy": "replace"},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    submitted = pool.ctl("submit", str(path))
    assert submitted.returncode == 0, submitted.stderr
    wait_for(lambda: shares(pool) == {n: {job_id: 2} for n in "ab"} or None, 60, "a standby")

    def standby() -> dict[str, Any] | None:
        done = pool.ctl("--job", job_id, "status", "--json")
        doc: dict[str, Any] = json.loads(done.stdout) if done.returncode == 0 else {}
        states = sorted(n["state"] for n in doc.get("nodes", ()))
        return doc if states == ["running", "standby"] and doc["world_size"] == 1 else None

    doc = wait_for(standby, 60, "one member, one standby")
    assert len(doc["members"]) == 1


def test_a_gpu_quota_holds_under_a_burst_of_submissions(pool: PoolCluster, job_id: str) -> None:
    """research may hold 4 GPUs: six one-GPU jobs submitted at once, four run (packed on one
    node), two wait saying why, and one of them starts when a running one ends."""
    pool.start("a", "b")
    pool.wait_nodes(2)
    wait_for(lambda: every_node_offers(pool, 8), 30, "8 GPUs a node")
    made = pool.ctl("queue", "create", "research", "--gpu-quota", "4")
    assert made.returncode == 0, made.stderr
    names = [f"{job_id}-{i}"[-63:] for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(len(names)) as burst:
        list(burst.map(lambda n: pool.submit(n, "1", "--gpus-per-node", "1", "--queue",
                                             "research"), names))  # fmt: skip

    def settled() -> dict[str, dict[str, Any]] | None:
        rows = {n: pool.jobs()[n] for n in names}
        running = [n for n, r in rows.items() if r["state"] == "running"]
        return rows if len(running) == 4 and len(rows) == 6 else None

    rows = wait_for(settled, 60, "four running")
    waiting = [n for n, r in rows.items() if r["state"] == "pending"]
    assert len(waiting) == 2
    for name in waiting:
        says = pool.jobs()[name]["reason"]
        assert says == "pending: queue research at its GPU quota of 4 (4 in use, it needs 1)", says
    (held,) = [held for held in shares(pool).values() if held]
    assert sorted(held) == sorted(n for n in names if n not in waiting)
    done = next(n for n in names if n not in waiting)
    row = pool.wait_job(done, "running", world=1)
    (pool.job_records(done) / f"exit-{row['generation']}").write_text("0")
    pool.wait_job(done, "succeeded", timeout=60)
    wait_for(lambda: [n for n in waiting if pool.jobs()[n]["state"] == "running"], 60, "one more")
    assert sum(1 for n in names if pool.jobs()[n]["state"] == "running") == 4
