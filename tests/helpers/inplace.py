"""What the in-place e2e tests share: the records tests/helpers/elastic_worker.py writes, and
waiting for a re-formed generation whose members all step."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.job.accrual import MIN_SAMPLES
from tests.helpers.cluster import LocalCluster, wait_for
from tests.helpers.scrape import scrape

PROGRESS = "nodeagent_worker_last_progress_timestamp_seconds"


class Lines:
    """What the workers recorded, by process."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def all(self, event: str) -> list[dict[str, Any]]:
        found = []
        for path in sorted(self.directory.glob("[0-9]*.jsonl")):
            for text in path.read_text().splitlines():
                line = json.loads(text)
                if line["event"] == event:
                    found.append(line)
        return found

    def steps(self, pid: int) -> list[dict[str, Any]]:
        return [line for line in self.all("step") if line["pid"] == pid]

    def stepping(self, pids: list[int], generation: int) -> bool:
        """Every one of `pids` has taken two steps in `generation`."""
        steps = [line for line in self.all("step") if line["gen"] == generation]
        return all(sum(1 for s in steps if s["pid"] == pid) >= 2 for pid in pids)


def workers(cluster: LocalCluster, *nodes: str) -> dict[str, int]:
    """Each node's one worker process."""
    return {node: cluster.worker_pids(node)[0] for node in nodes}


@dataclass
class Formed:
    generation: int
    members: list[str]


def reformed(cluster: LocalCluster, world: int, after: int) -> int:
    """Wait for a generation after `after` running at `world` with every member's worker
    stepping in it; its number. A loaded machine may re-form once more meanwhile (a warm-up
    joining, a rendezvous timing out): the wait follows the job to its newest generation at
    `world` rather than wait for one that will never step again (CI, once, at a job's start).
    What the test asserts of its re-forms (who was lost, who was kept) still holds of it."""
    doc = cluster.wait_running(world, 90, after_generation=after)
    now = Formed(int(doc["generation"]), list(doc["members"]))
    lines = Lines(cluster.records_dir)

    def stepping() -> bool:
        doc = cluster.status()
        newer = doc["generation"] is not None and int(doc["generation"]) > now.generation
        if newer and doc["state"] == "running" and doc["world_size"] == world:
            now.generation, now.members = int(doc["generation"]), list(doc["members"])
        try:
            pids = list(workers(cluster, *now.members).values())
        except IndexError:  # a member between two workers
            return False
        return lines.stepping(pids, now.generation)

    try:
        wait_for(stepping, 90, f"every rank stepping at world {world} after generation {after}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: at {now}\n{cluster.diagnostics()}") from None
    return now.generation


def kept_through(cluster: LocalCluster, before: dict[str, int]) -> dict[str, int]:
    """The members' worker processes now; those of `before` that are still members must be the
    same processes (kept through the re-form, not restarted)."""
    now = workers(cluster, *cluster.status()["members"])
    survivors = {n: p for n, p in before.items() if n in now}
    if before:
        assert survivors, f"no member of {sorted(before)} is one any more"
        restarted = sorted(n for n in survivors if now[n] != survivors[n])
        assert not restarted, f"{restarted} restarted\n{cluster.diagnostics()}"
    return now


def step_times_learnt(cluster: LocalCluster) -> None:
    """Wait until every member's agent has read its rank's beat move often enough to judge its
    step times (job/stalls.py): a stall before that is left to hang_timeout. Each read that
    saw a new beat sets the agent's progress gauge to it, so MIN_SAMPLES + 1 values seen here
    (a scrape may miss some, never invent one) mean at least MIN_SAMPLES intervals learnt."""
    nodes = {n["name"]: n["metrics"] for n in cluster.status()["nodes"]}
    seen: dict[str, set[float]] = {name: set() for name in nodes}

    def learnt() -> bool:
        for name, address in nodes.items():
            samples = scrape(address)
            seen[name] |= {v for (metric, _), v in samples.items() if metric == PROGRESS}
        return all(len(values) > MIN_SAMPLES for values in seen.values())

    wait_for(learnt, 90, f"{MIN_SAMPLES + 1} beats read on every member")
