"""Issue 51: what operators do to running nodes, under the shipped unit on booted nodes (see
test_pool_nodes.py and tests/helpers/booted.py). An in-place DDP job of bob's lives through a
worker killed, `systemctl restart nodeagent`, and `ansible-playbook rolling-upgrade.yml`
installing a newer nodeagent on every node; the survivors of each re-form keep their processes
and no committed step is lost. (An agent frozen until the watchdog restarts it: test_watchdog.py,
last, for the minutes it takes here.)
"""

from __future__ import annotations

import json

import pytest

from nodeagent import __version__
from tests.helpers.booted import BootedPool, upgrade_wheel
from tests.helpers.bootedjobs import (
    SCRIPT,
    no_step_lost,
    rank_lines,
    running,
    stepped,
    submit_elastic,
    workers,
)

pytestmark = [pytest.mark.booted, pytest.mark.timeout(900)]


def test_an_in_place_job_keeps_its_survivors_through_a_worker_kill_and_an_agent_restart(
    pool: BootedPool,
) -> None:
    job, user = "elastic-bob", "bob"
    submit_elastic(pool, job, user)
    generation = running(pool, job, after=0)
    stepped(pool, job, generation, 5)
    n1, n2, n3 = pool.nodes
    before = {node.name: workers(node, user) for node in pool.nodes}
    assert all(len(pids) == 1 for pids in before.values()), before

    # A worker killed: the two others keep their processes, the new one is sent their state.
    n3.sh(f"pkill -KILL -u {user} -f {SCRIPT}")
    generation = running(pool, job, after=generation)
    stepped(pool, job, generation, 3)
    for node in (n1, n2):
        assert workers(node, user) == before[node.name], f"{node.name} lost its worker"
    assert workers(n3, user) != before["n3"]

    # `systemctl restart nodeagent`: the agent stops its worker gracefully and comes back.
    agent = n2.main_pid()
    kept = workers(n1, user)
    n2.systemctl("restart", "nodeagent")
    assert n2.main_pid() != agent
    generation = running(pool, job, after=generation)
    stepped(pool, job, generation, 3)
    assert workers(n1, user) == kept, "n1's worker did not survive n2's restart"

    no_step_lost(rank_lines(pool.nodes, job), generation, graceful=False)
    pool.ctl("cancel", job, user=user)


def test_a_rolling_upgrade_over_a_running_job_loses_no_step(pool: BootedPool) -> None:
    """rolling-upgrade.yml as its header says to run it, with a newer wheel: each node in turn
    is drained (its rank stops after a committed step, the others re-form without it),
    upgraded, restarted, and back in the pool, where the job grows onto it again."""
    job, user = "upgrade-bob", "bob"
    submit_elastic(pool, job, user)
    generation = running(pool, job, after=0)
    stepped(pool, job, generation, 5)
    wheel, version = upgrade_wheel(pool)
    assert version != __version__
    pool.playbook("rolling-upgrade.yml", extra={"nodeagent_package": str(wheel)})
    for node in pool.nodes:
        said = node.sh("/opt/nodeagent/venv/bin/nodeagent --version").stdout
        assert said.split() == ["nodeagent", version], said
    nodes = json.loads(pool.ctl("nodes", "--json"))["nodes"]
    assert {n["version"] for n in nodes} == {version}, nodes
    generation = running(pool, job, after=generation)  # on every node again, each upgraded
    stepped(pool, job, generation, 3)
    lines = rank_lines(pool.nodes, job)
    assert len({x["gen"] for x in lines if x["event"] == "synced"}) >= 4  # 3 drains at least
    no_step_lost(lines, generation, graceful=True)
    pool.ctl("cancel", job, user=user)
