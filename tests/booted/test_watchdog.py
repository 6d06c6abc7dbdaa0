"""Issue 51: an agent frozen (SIGSTOP) under the shipped unit: its fence keeper stops its worker
before its lease lapses, the job's other members re-form without it, and the unit's watchdog
(`WatchdogSec=30s`) kills and restarts it, after which the job grows back onto it.

Last of the booted tests (its file sorts last): here the restart takes about two minutes, not
35 s. The nodes are containers on this machine's cgroup v1, where systemd inside gets no word
that a unit's cgroup emptied; after the watchdog's SIGABRT it kills what the agent left (its
keeper) and then waits out TimeoutStopSec (90 s) before it restarts the unit. A node booted on
cgroup v2 (Debian 12's default) is told at once.
"""

from __future__ import annotations

import pytest

from tests.helpers.booted import BootedPool
from tests.helpers.bootedjobs import running, stepped, submit_elastic, workers
from tests.helpers.cluster import wait_for

pytestmark = [pytest.mark.booted, pytest.mark.timeout(600)]


def test_a_frozen_agent_is_fenced_and_restarted_by_the_watchdog(pool: BootedPool) -> None:
    job, user = "frozen-bob", "bob"
    submit_elastic(pool, job, user)
    generation = running(pool, job, after=0)
    stepped(pool, job, generation, 3)
    n1, _n2, n3 = pool.nodes
    kept = workers(n1, user)
    frozen = n3.main_pid()
    since = n3.now()
    n3.sh(f"kill -STOP {frozen}")
    wait_for(lambda: not workers(n3, user), 60, "n3's keeper to stop its worker")
    running(pool, job, after=generation, world=2)  # the others go on without it

    def restarted() -> bool:
        return n3.main_pid() not in (0, frozen)

    wait_for(restarted, 240, "the watchdog to restart n3's agent")
    said = n3.sh(f"journalctl --no-pager -u nodeagent --since '{since}'").stdout
    assert "Watchdog timeout" in said, said[-3000:]
    generation = running(pool, job, after=generation)
    stepped(pool, job, generation, 3)
    assert workers(n1, user) == kept, "n1's worker did not survive n3's freeze"
    assert workers(n3, user)  # a new one, in the job again
    pool.ctl("cancel", job, user=user)
