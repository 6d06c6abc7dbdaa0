"""Replicas under a real partition (issue 27): three agents in network namespaces, each its
replica listener bound to its namespace's address, FSDP2 training on gloo across the bridge.

A node holding copies of its peers' saves is cut off. Its copies stop counting with its
membership: the survivors resume at world 2 from what they hold between them (memory, at a
step no older than the one committed before the cut, bit for bit), and their new saves are
committed and fully replicated while it is still cut off, on the two of them alone. Healed, it
rejoins, and the world of 3 resumes from memory again: the copies it kept of the abandoned
timeline are not restored.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos import netns
from tests.chaos.harness import RedisInHub, network
from tests.helpers.fsdp import committed, formed, fsdp_cluster, resumed_from_memory
from tests.helpers.munge import MungeDaemon

pytest.importorskip("torch")
WHY_NOT = netns.unavailable()
pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(WHY_NOT is not None, reason=f"chaos suite: {WHY_NOT}"),
]
EVERY = 6  # save interval, steps: about a second, longer than a copy takes here
NODES = ("a", "b", "c")


@pytest.fixture
def shm(job_id: str) -> Iterator[Path]:
    path = Path("/dev/shm") / f"nodeagent-chaos-{job_id}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_partitioned_nodes_copies_are_not_counted_while_it_is_cut_off(
    tmp_path: Path, job_id: str, shm: Path, munged: MungeDaemon
) -> None:
    with network() as net:
        server = RedisInHub(net, tmp_path)
        server.start()
        addresses = {name: net.add_node(name) for name in NODES}
        try:
            with fsdp_cluster(
                server,
                job_id,
                tmp_path / "job",
                shm,
                steps=600,
                replicas=1,
                persist=False,
                every=EVERY,
                env={"GLOO_SOCKET_IFNAME": "eth0"},  # each namespace's link to the bridge
                addresses=addresses,
                prefixes={name: net.prefix(net.nodes[name][0]) for name in NODES},
                control_url=server.control_url,
                munge_socket=munged.socket,
            ) as cluster:
                cluster.start(*NODES)
                formed(cluster, len(NODES), 3 * EVERY)
                before = committed(cluster, 2 * EVERY)
                assert before["under_replicated"] == []
                leader = str(cluster.status()["leader"]).split(" ", 1)[0]
                victim = next(n for n in NODES if n != leader)
                net.cut(victim)
                step = resumed_from_memory(cluster, 2, before["committed"])
                cut_off = committed(cluster, step + EVERY)  # a and b's copies alone
                assert cut_off["under_replicated"] == [], cut_off
                assert cluster.status()["world_size"] == 2, "healed too early: the cut held"
                net.heal(victim)  # it rejoins: the job grows back to its target
                resumed_from_memory(cluster, 3, cut_off["committed"])
        finally:
            server.kill()
