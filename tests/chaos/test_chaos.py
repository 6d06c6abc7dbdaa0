"""The core promise under real faults: no two generations ever train at once, and the job recovers.

Each scenario runs three agents in network namespaces against redis-server in a hub namespace
(lease 3 s with heartbeat 0.5 s, or the defaults 5 s / 1 s: each scenario at the lease its
`lease` mark names, the two alternating over the suite; `--all-leases` runs each at both),
injects one fault, and asserts:
- recovery: the job runs again, at full size once the fault is gone;
- zero overlap between generations, within the probes' 20 ms resolution;
- for a node cut off or frozen: its worker was SIGTERMed (a grace to checkpoint) and dead
  before its lease deadline in Redis time.
`pytest -m chaos --all-leases --reps N` repeats every scenario N times at both leases.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.coord.keys import JobKeys
from nodeagent.job.lease import KEEPER_TERM_AT, KILL_AT
from tests.chaos import netns
from tests.chaos.harness import ChaosJob, Life, RedisInHub, Sentinels, network
from tests.helpers.cluster import wait_for

WHY_NOT = netns.unavailable()
pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(WHY_NOT is not None, reason=f"chaos suite: {WHY_NOT}"),
]


@pytest.fixture
def chaos(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[ChaosJob, RedisInHub]]:
    lease = float(request.param)
    with network() as net:
        server = RedisInHub(net, tmp_path)
        server.start()
        job = ChaosJob(net, tmp_path, server.url, server.control_url, lease)
        try:
            yield job, server
        finally:
            job.close()
            server.kill()


def _assert_fenced_in_time(job: ChaosJob, life: Life, scenario: str) -> None:
    """SIGTERM came first, with a real grace when the lease allows one, and death came before
    the lease could lapse."""
    job.note(scenario, life)
    margin = job.margin(life)
    assert margin > 0, f"{life.node}'s worker outlived its lease by {-margin:.3f}s"
    assert life.grace is not None, f"{life.node}'s worker was killed without a SIGTERM"
    # The agent fences at FENCE_AT, its keeper (for a frozen agent) at KEEPER_TERM_AT; both
    # SIGKILL at KILL_AT. 0.1 s: the loop and the probe's own resolution on a busy machine.
    expected = min(job.failure_grace_s, (KILL_AT - KEEPER_TERM_AT) * job.lease_s)
    assert life.grace >= expected - 0.1, f"grace {life.grace:.3f}s < {expected:.3f}s"


def _partition(job: ChaosJob, role: str) -> None:
    gen = job.start()
    victim = job.leader() if role == "leader" else job.follower()
    job.net.cut(victim)
    life = job.wait_probe_dead(victim, gen)
    survivors_gen = job.wait_world(2, after=gen)
    _assert_fenced_in_time(job, life, f"partition of the {role}")
    job.net.heal(victim)
    job.wait_world(3, after=survivors_gen)
    # A node cut off is held out by the two others before its lease lapses (a leader is
    # deposed first): its worker may still run (it cannot hear of the new generation), until
    # it fences itself, checked above; check_no_overlap allows that and nothing else.
    job.check_no_overlap()


@pytest.mark.lease(3.0)
def test_silent_partition_of_a_follower(chaos: tuple[ChaosJob, RedisInHub], rep: int) -> None:
    job, _ = chaos
    _partition(job, "follower")


@pytest.mark.lease(5.0)
def test_silent_partition_of_the_leader(chaos: tuple[ChaosJob, RedisInHub], rep: int) -> None:
    job, _ = chaos
    _partition(job, "leader")


@pytest.mark.lease(3.0)
def test_agent_frozen_for_three_leases(chaos: tuple[ChaosJob, RedisInHub], rep: int) -> None:
    """SIGSTOP of the leader's agent alone: its fence keeper stops its worker in time."""
    job, _ = chaos
    gen = job.start()
    victim = job.leader()
    os.kill(job.agent_pid(victim), signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        life = job.wait_probe_dead(victim, gen)
        survivors_gen = job.wait_world(2, after=gen)
        time.sleep(max(0.0, 3 * job.lease_s - (time.monotonic() - frozen)))
    finally:
        os.kill(job.agent_pid(victim), signal.SIGCONT)
    _assert_fenced_in_time(job, life, "agent frozen")
    job.wait_world(3, after=survivors_gen)
    job.check_no_overlap()


@pytest.mark.lease(5.0)
def test_agent_killed_and_restarted_without_systemd(
    chaos: tuple[ChaosJob, RedisInHub], rep: int
) -> None:
    """SIGKILL of a follower's agent alone, started again by hand 5 s later."""
    job, _ = chaos
    gen = job.start()
    victim = job.follower()
    job.cluster.agents[victim].proc.kill()
    job.cluster.agents[victim].proc.wait(10)
    killed = time.time()
    life = job.wait_probe_dead(victim, gen)
    assert life.end - killed < 0.5, "the worker outlived its agent"
    assert job.margin(life) > 0
    survivors_gen = job.wait_world(2, after=gen)
    time.sleep(max(0.0, 5.0 - (time.time() - killed)))
    job.cluster.start(victim)
    job.wait_world(3, after=survivors_gen)
    job.check_no_overlap()


@pytest.mark.lease(5.0)
def test_a_node_cut_off_from_its_peers_alone_is_held_out_and_stops_its_worker(
    chaos: tuple[ChaosJob, RedisInHub], rep: int
) -> None:
    """Fast detection's hard case: a follower drops every packet of the two other nodes (and
    they its), silently, but still reaches Redis, so its lease holds. The two others, hearing
    no beat (job/accrual.py), hold it out and re-form without it; it reads the new generation
    and stops its worker (its lease never lapses). Nothing it does counts: it is no member of
    any generation while it is cut off, its worker is in no group with the new one, and the
    job grows back to three once it is heard again."""
    job, _ = chaos
    gen = job.start()
    victim = job.follower()
    job.net.isolate(victim)
    try:
        survivors_gen = job.wait_world(2, after=gen)
        life = job.wait_probe_dead(victim, gen)
        assert job.held_out() == {victim}
        assert job.margin(life) > 0  # its lease never lapsed: renewed all along
        events = job.cluster.events()
        assert not [e for e in events if e["type"] in ("node_reaped", "node_fenced")]
        time.sleep(3.0)  # still silent to its peers: not chosen again
        status = job.cluster.status()
        assert victim not in status["members"] and status["generation"] == survivors_gen
    finally:
        job.net.rejoin(victim)
    job.wait_world(3, after=survivors_gen)
    job.check_no_overlap(held_out={victim})


def _all_fenced(job: ChaosJob, gen: int, scenario: str, ride_s: float = 0.0) -> None:
    for node in ("a", "b", "c"):
        life = job.wait_probe_dead(node, gen)
        if ride_s:  # dead before a leader could count it lost: its lease and its ride
            job.note(scenario, life)
            assert job.margin(life, ride_s) > 0, f"{node}'s worker outlived its ride"
            assert life.grace is not None and life.grace >= job.failure_grace_s - 0.1
        else:
            _assert_fenced_in_time(job, life, scenario)


def _rode_through(job: ChaosJob, gen: int) -> None:
    """Every member said it rode through and went on; nothing restarted."""
    wait_for(
        lambda: len([e for e in job.cluster.events() if e["type"] == "node_rode_through"]) == 3,
        30,
        "every member to say it rode through",
    )
    job.undisturbed(gen)
    job.check_no_overlap()


@pytest.mark.lease(3.0)
def test_redis_frozen_is_ridden_through(chaos: tuple[ChaosJob, RedisInHub], rep: int) -> None:
    """SIGSTOP of redis-server for three leases: every member hears the others training, so
    each trains on past its fence point; Redis back, the same generation goes on."""
    job, server = chaos
    gen = job.start()
    server.signal(signal.SIGSTOP)
    try:
        time.sleep(3 * job.lease_s)
        job.undisturbed(gen, redis_up=False)
    finally:
        server.signal(signal.SIGCONT)
    _rode_through(job, gen)


@pytest.mark.lease(3.0)
def test_redis_frozen_past_the_ride_fences_every_member(
    tmp_path: Path, lease: float, rep: int
) -> None:
    """ride_through at its least (the lease): Redis stopped for four leases. Every member
    fences itself at its ride's end, each worker dead before a leader could count it lost
    (its lease deadline plus the ride), and the job re-forms once Redis is back."""
    with network() as net:
        server = RedisInHub(net, tmp_path)
        server.start()
        job = ChaosJob(
            net, tmp_path, server.url, server.control_url, lease, ride_through=f"{lease}s"
        )
        try:
            gen = job.start()
            server.signal(signal.SIGSTOP)
            try:
                time.sleep(4 * job.lease_s)
                _all_fenced(job, gen, "redis frozen past the ride", ride_s=job.lease_s)
            finally:
                server.signal(signal.SIGCONT)
            job.wait_world(3, after=gen)
            job.check_no_overlap()
        finally:
            job.close()
            server.kill()


@pytest.mark.lease(5.0)
def test_redis_down_and_restarted_empty(chaos: tuple[ChaosJob, RedisInHub], rep: int) -> None:
    """Redis killed, back empty two leases later (no persistence): the members ride through,
    and the leader writes the record back from what they run."""
    job, server = chaos
    gen = job.start()
    server.kill()
    time.sleep(2 * job.lease_s)
    job.undisturbed(gen, redis_up=False)
    server.start()  # same address, no data
    wait_for(lambda: job.cluster.status()["reason"] == "resumed", 30, "the record written back")
    _rode_through(job, gen)


@pytest.mark.lease(3.0)
def test_a_node_cut_off_from_redis_alone_rides_through_while_its_peers_hear_it(
    chaos: tuple[ChaosJob, RedisInHub], rep: int
) -> None:
    """A follower's packets to and from Redis dropped for three leases, silently; it still
    hears the others, who reach Redis: it trains on, the leader awaits it past its lease
    instead of re-forming, and it comes back into the same generation."""
    job, _ = chaos
    gen = job.start()
    victim = job.follower()
    job.net.cut_from_redis(victim)
    try:
        time.sleep(3 * job.lease_s)
        job.undisturbed(gen)
    finally:
        job.net.reach_redis(victim)
    wait_for(
        lambda: (
            [e["node"] for e in job.cluster.events() if e["type"] == "node_rode_through"]
            == [victim]
        ),
        30,
        f"{victim} to say it rode through",
    )
    job.undisturbed(gen)
    job.check_no_overlap()


def _sentinel_failover(tmp_path: Path, lease: float, freeze: bool) -> None:
    """A primary, a replica and three sentinels; the primary killed (or frozen until a
    sentinel promoted the replica, then resumed: it becomes a replica, losing what it took
    meanwhile). The agents ride through and follow the new primary: nothing restarts."""
    with network() as net:
        primary = RedisInHub(net, tmp_path, port=6379)
        primary.start()
        replica = RedisInHub(
            net, tmp_path, port=6380, extra=("--replicaof", net.hub_address, "6379")
        )
        replica.start()
        sentinels = Sentinels(net, tmp_path, primary)
        sentinels.start()
        job = ChaosJob(net, tmp_path, sentinels.url, primary.control_url, lease)
        try:
            gen = job.start()
            wait_for(
                lambda: replica.client().info("replication").get("master_link_status") == "up",
                20,
                "the replica to sync",
            )
            if freeze:
                primary.signal(signal.SIGSTOP)
            else:
                primary.kill()
            wait_for(
                lambda: replica.client().info("replication").get("role") == "master",
                30,
                "a sentinel to promote the replica",
            )
            promoted = time.time()
            if freeze:
                primary.signal(signal.SIGCONT)
            job.cluster.connect_control(replica.control_url)
            keys = JobKeys("nodeagent", "chaos")

            def renewed_on_new_primary() -> bool:
                leases: Any = replica.client().zrange(keys.leases, 0, -1, withscores=True)
                fresh = [float(score) / 1000 > promoted + lease for _, score in leases]
                return len(fresh) == 3 and all(fresh)

            wait_for(renewed_on_new_primary, 60, "every agent to renew its lease there")
            job.undisturbed(gen)
            job.check_no_overlap()
        finally:
            job.close()
            sentinels.stop()
            replica.kill()
            primary.kill()


@pytest.mark.lease(3.0)
def test_sentinel_failover(tmp_path: Path, lease: float, rep: int) -> None:
    _sentinel_failover(tmp_path, lease, freeze=False)


@pytest.mark.lease(5.0)
def test_sentinel_failover_of_a_frozen_primary(tmp_path: Path, lease: float, rep: int) -> None:
    _sentinel_failover(tmp_path, lease, freeze=True)
