"""What the booted-node tests do with an in-place DDP job of a user's (examples/train_elastic.py)
on the nodes of tests/helpers/booted.py: submit it, wait for its generations, read what its
ranks printed on every node, find its workers, and check that no committed step was lost."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from typing import Any

from tests.helpers.booted import ROOT, BootedPool, Node
from tests.helpers.cluster import wait_for

PYTHON = ROOT / ".venv" / "bin" / "python"
SCRIPT = "train_elastic.py"


def submit_elastic(pool: BootedPool, job: str, user: str) -> None:
    spec = {
        "id": job,
        "entrypoint": [
            str(PYTHON),
            str(ROOT / "examples" / SCRIPT),
            *("--steps", "100000", "--step-time", "0.1", "--print-every", "1"),
            *("--checkpoint-dir", f"/tmp/{job}-checkpoints", "--pg-timeout", "60"),
        ],
        "recovery": "in_place",
        "min_nodes": 2,
        "max_nodes": 3,
        "target_nodes": 3,
        "max_restarts": 10,
        "env": {"OMP_NUM_THREADS": "1"},
    }
    path = f"/tmp/{job}.json"
    pool.node("n1").sh(f"echo {shlex.quote(json.dumps(spec))} > {path} && chmod 644 {path}")
    pool.ctl("submit", path, user=user)


def status(pool: BootedPool, job: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(pool.ctl("--job", job, "status", "--json"))
    return found


def running(pool: BootedPool, job: str, after: int, world: int = 3) -> int:
    """The generation of `job` once it runs at `world` in a generation after `after`."""

    def probe() -> int | None:
        found = status(pool, job)
        good = found["state"] == "running" and found["world_size"] == world
        return found["generation"] if good and found["generation"] > after else None

    return wait_for(probe, 240, f"{job} running at world {world} after generation {after}")


def rank_lines(nodes: Iterable[Node], job: str) -> list[dict[str, Any]]:
    """Every JSON line the job's ranks printed, on `nodes` (one `podman exec` a node)."""
    found = []
    for node in nodes:
        text = node.sh(f"cat /var/log/nodeagent/{job}/*/rank-*.log", check=False).stdout
        found += [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return found


def workers(node: Node, user: str) -> set[int]:
    done = node.sh(f"pgrep -u {user} -f {SCRIPT}", check=False)
    return {int(pid) for pid in done.stdout.split()}


def stepped(pool: BootedPool, job: str, generation: int, steps: int) -> None:
    """Wait until every rank of `generation` printed `steps` steps in it."""

    def probe() -> bool:
        lines = [x for x in rank_lines(pool.nodes, job) if x.get("gen") == generation]
        synced = {x["rank"]: x["step"] for x in lines if x["event"] == "synced"}
        last = {x["rank"]: x["step"] for x in lines if x["event"] == "step"}
        return bool(synced) and all(last.get(r, -1) >= s + steps for r, s in synced.items())

    wait_for(probe, 180, f"{job}'s generation {generation} to train {steps} steps")


def no_step_lost(lines: list[dict[str, Any]], upto: int, graceful: bool) -> None:
    """Each generation after the first went on from a step no older than any step printed
    before it by a rank that lives on, or by any rank when every re-form was `graceful`. A
    rank prints a step once it committed it (train_elastic.py); a rank stopped gracefully
    (restart, drain, its keeper's SIGTERM) stops after such a step, and its peers cannot go
    past it (each step all-reduces)."""
    first = min(x["gen"] for x in lines if x["event"] == "synced")
    for generation in range(first + 1, upto + 1):
        synced = [x for x in lines if x["event"] == "synced" and x["gen"] == generation]
        if not synced:
            continue  # re-formed again before a rank synced
        kept = {x["pid"] for x in synced}
        before = [
            x["step"]
            for x in lines
            if x["event"] == "step" and x["gen"] < generation and (graceful or x["pid"] in kept)
        ]
        went_on = {x["step"] for x in synced}
        assert len(went_on) == 1, f"generation {generation}'s ranks synced {went_on}"
        assert went_on.pop() >= max(before, default=-1), (generation, max(before), synced)
