"""End to end, a slow node: real agents, a real Redis, real training in place (a DDP model and an
FSDP2-sharded layer, gloo), one node's workers throttled by the kernel's CPU controller
(tests/helpers/throttle.py).

The script marks nothing: the agents see the throttled rank by what the kernel says of it (it
waits for a CPU most of each step, while its peers sleep in the all-reduce waiting for it). The
leader names it slow, and with `policy: replace` drains it: the spare takes its place in place,
the other members keep their processes, and the job steps at its healthy pace again.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import throttle
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.inplace import Lines, kept_through, reformed, workers
from tests.helpers.slowjob import NODES, slow_node_job

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WINDOW_S, WINDOWS = 2.0, 3
SHARE = 0.15  # of one CPU: the throttled rank's work takes several times its peers'
# Named slow within this of the throttle (docs/slow-nodes.md: windows x window, plus the window
# under way and the leader's own window, plus a loaded machine's slack).
DETECT_S = (WINDOWS + 2) * WINDOW_S + 10


GAPS = 10  # a median of at least this many steps


def steps(lines: Lines, generation: int, since: float, until: float) -> list[float]:
    """When rank 0 stepped in `generation`, within [since, until] (this machine's clock)."""
    return sorted(
        line["t"]
        for line in lines.all("step")
        if line["gen"] == generation and line["rank"] == 0 and since <= line["t"] <= until
    )


def step_time(lines: Lines, generation: int, since: float, until: float) -> float:
    """The median time between rank 0's consecutive steps in `generation`, within [since,
    until]."""
    gaps = [b - a for a, b in itertools.pairwise(steps(lines, generation, since, until))]
    assert len(gaps) >= GAPS, f"only {len(gaps)} steps of rank 0 in generation {generation}"
    return float(statistics.median(gaps))


AFTER_WINDOWS = 6


def measure(lines: Lines, generation: int, seconds: float) -> float:
    """The step time over `seconds`, or longer until GAPS steps were seen (a loaded machine
    steps slower: seen in CI, 8 steps in 4 s just after the spare joined)."""
    start = time.time()
    time.sleep(seconds)
    wait_for(
        lambda: len(steps(lines, generation, start, time.time())) > GAPS,
        60,
        f"{GAPS} steps of rank 0 in generation {generation}",
    )
    return step_time(lines, generation, start, time.time())


@pytest.mark.skipif(throttle.available() is not None, reason=str(throttle.available()))
def test_a_throttled_node_is_named_slow_and_replaced_by_the_spare_in_place(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    with slow_node_job(redis_server.url, tmp_path, job_id, "replace", WINDOW_S, WINDOWS) as cluster:
        lines = Lines(cluster.records_dir)
        cluster.start(*NODES)  # target 3: the last to join stands by as the spare
        gen = first = reformed(cluster, 3, 0)
        members = cluster.status()["members"]
        victim, kept = members[1], [members[0], members[2]]
        (spare,) = set(NODES) - set(members)
        alive = kept_through(cluster, {})
        time.sleep(3 * WINDOW_S)  # a few windows at the healthy pace (the leader learns it)
        healthy = measure(lines, gen, 4.0)
        assert not [e for e in cluster.events() if e["type"] == "node_slow"]

        throttled_at = time.time()
        with throttle.throttled(f"nodeagent-test-{job_id}", [alive[victim]], SHARE):
            slow = wait_for(
                lambda: [e for e in cluster.events() if e["type"] == "node_slow"],
                DETECT_S + 30,
                "a node named slow",
            )
            named_after = time.time() - throttled_at
            assert [e["node"] for e in slow] == [victim], cluster.diagnostics()
            # The text marks it too (issue 81): SLOW while the verdict stands, then, once the
            # policy has cordoned it for its replacement (CI: already by this read), its cordon.
            said = cluster.ctl("status").stdout
            marked = [
                line for line in said.splitlines() if "SLOW (" in line or "cordoned: slow:" in line
            ]
            assert marked and all("its peers' median" in line for line in marked), said
            during = step_time(lines, gen, throttled_at + WINDOW_S, time.time())
            gen = reformed(cluster, 3, gen)
        doc = cluster.status()
        assert doc["members"] == [*kept, spare]
        alive = kept_through(cluster, alive)  # the others kept their processes
        # The drained node's agent waits between its beats: its loop once spun on a hang check
        # due since its worker stopped (74 % of a CPU, beside the job it had left: the job's
        # step time stayed 1.7x its healthy pace here, 1.3x on a 16-core machine).
        agent = psutil.Process(cluster.agents[victim].proc.pid)
        before = sum(agent.cpu_times()[:2])
        time.sleep(3.0)
        busy = (sum(agent.cpu_times()[:2]) - before) / 3.0
        assert busy < 0.25, f"the drained node's agent used {busy:.0%} of a CPU"
        drained = next(n for n in doc["nodes"] if n["name"] == victim)
        assert drained["cordon"]["by"] == "slow-node" and drained["cordon"]["drain"]
        assert drained["cordon"]["reason"].startswith("slow: busy")
        announced = [e for e in cluster.events() if e["type"] == "generation_announced"]
        assert announced[-1]["data"]["reason"] == "slow_node"
        time.sleep(2.0)  # the newcomer's first steps
        # The best of up to AFTER_WINDOWS windows: the other test worker's load can slow any one
        # of them (seen in CI: healthy 116 ms, throttled 317, one window after 330).
        windows: list[float] = []
        while len(windows) < AFTER_WINDOWS and (
            not windows or min(windows) - healthy > 0.5 * (during - healthy)
        ):
            windows.append(measure(lines, gen, 4.0))
        after = min(windows)
        report = (
            f"step time healthy {healthy * 1000:.1f} ms, throttled {during * 1000:.1f} ms, "
            f"after the replacement {after * 1000:.1f} ms (best of {len(windows)} windows); "
            f"named slow after {named_after:.1f} s"
        )
        print(report)
        assert during > 1.5 * healthy, report  # the throttle slowed the whole job
        # Back at the healthy pace: within 10 % on a quiet machine (bench/slow_node.py,
        # docs/benchmarks.md; at most 1.03x in the runs of this test alone here). CI runs another
        # test worker beside this one, whose load differs between the measurements (seen:
        # 1.30x, and 1.75x: healthy 23.7 ms, throttled 92.5, after 41.5): here, at least half
        # of the slowdown is gone (a job that kept the slow node steps at the throttled pace).
        assert after - healthy <= 0.5 * (during - healthy), report
        assert named_after <= DETECT_S, report
        assert not [e for e in cluster.events() if e["type"] == "node_slow" and e["node"] != victim]
        assert workers(cluster, *kept) == {n: alive[n] for n in kept}

        # Then a worker killed and a node lost: where did the job's time go?
        os.kill(alive[spare], signal.SIGKILL)
        gen = reformed(cluster, 3, gen)
        cluster.kill_tree(kept[1])
        gen = reformed(cluster, 2, gen)
        time.sleep(2.0)
        shown = cluster.ctl("show", job_id, "--json")
        assert shown.returncode == 0, shown.stderr
        found = json.loads(shown.stdout)["goodput"]
        parts = found["parts"]
        print({"wall_s": found["wall_s"], "ettr": found["ettr"], **parts})
        assert sum(parts.values()) == pytest.approx(found["wall_s"], abs=0.01), found
        # From the generation the test began with: on a loaded machine (CI) the job once formed
        # before its third node had registered, and took it in at once (node_joined).
        reasons = [r["reason"] for r in found["reforms"] if r["generation"] > first]
        # The killed worker's replacement warms up (no preload): the job goes on without its
        # node and takes it back once it is ready (node_joined), unless it was ready first. On
        # a loaded machine (CI, another test worker beside this one) a node was once also lost
        # and joined again in between: accounted like any re-form, which is what this checks.
        assert reasons[:2] == ["slow_node", "worker_failed"] and reasons[-1] == "node_lost", found
        assert set(reasons[2:-1]) <= {"node_joined", "node_lost"}, found
        # The slow ranks' time: from `windows` windows before the node was named slow to the
        # re-form, the share of each step the job would not have spent at its healthy pace
        # (model/goodput.py). At least half of what the test's own step times say; not the
        # throttled stretch itself: another test worker's load slows the healthy pace too
        # (seen in CI: healthy 47.8 ms, throttled 98.2 ms; 2.66 s counted of 9.8 s throttled).
        expected = WINDOWS * WINDOW_S * (1 - healthy / during)
        assert 0.5 * expected < parts["slow_ranks"] < named_after + 2 * WINDOW_S, (expected, found)
        assert 0 < found["ettr"] < 1 and found["unaccounted"] == [], found
