"""A sharded job losing a whole node: resumed from its peers' memory (replicas) against from the
persistent tier (issue 27).

    .venv/bin/python bench/node_loss.py [--reps 3] [--width 1024 --layers 16]
    .venv/bin/python bench/node_loss.py --width 2304 --memory-size 1GiB --out ...  # about 1 GB

Four agents on this machine and a real redis-server, one worker each, run
examples/train_fsdp.py (FSDP2, gloo, CPU; by default an MLP of 16 hidden layers of 1024 units
with Adam: about 200 MB of state over the 4 ranks), a save into the memory tier every EVERY
steps, a copy to the persistent tier every second save, with the timing of the end-to-end tests
(heartbeat 250 ms, lease 3 s):
- `memtier`: `replicas: 1`: each save copied by the agents to the next node of the ring; a node
  lost resumes from memory at world 3 (the survivors bring what they lack, DCP reshards);
- `disk`: `replicas: 0`: the same job without copies; a node lost resumes from the persistent
  tier's newest whole step (restart from disk);
- `torchrun`: four `torchrun --nnodes=3:4 --rdzv-backend=c10d` launchers (bench/recovery.py's,
  with its best rendezvous settings) run the same script, which saves with DCP to a directory
  on disk every EVERY steps (its own checkpoints: staged, then written from a thread); a node
  lost: the survivors' workers fail, torchrun restarts them at world 3 and they load the newest
  DCP checkpoint. Only another node than rank 0's: the node of rank 0 hosts the c10d store, and
  its loss ends a torchrun job (bench/recovery.py measures it); no scale (torchrun has none).
Each repetition is a fresh job: train to step TRAIN_TO, then lose a node (its agent and worker
SIGKILLed, its tmpfs wiped): the node of rank 0, or another; or `worker`: the worker of the last
member (torchrun: of a node that hosts neither the store nor rank 0) SIGKILLed, its agent and
tmpfs left (the job restarts at world 4: the agents from the node's own memory, torchrun every
worker from its DCP directory); or scale: `nodeagentctl scale 3`, two saves at world 3,
`nodeagentctl scale 4` (each measured from the command); or drain: `nodeagentctl drain` of the
last member (every rank saves as it stops; the job goes on at world 3, measured from the
command; no torchrun). On one clock,
from the workers' own lines:
- recovery:  loss -> every rank of the new generation finished a step;
- restore:   loss -> every rank of the new generation printed "restored" (its load included);
- steps lost: the newest step trained before the loss minus the step restored;
- tier: where the new generation restored from;
- step time: the median time between rank 0's steps before the loss (the copies run beside
  training: replication's slowdown is memtier's over disk's).
Writes bench/results/node-loss.json and prints medians.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.recovery import TorchrunLaunch, Workload, training_process  # noqa: E402
from bench.sharded_recovery import _generation_after, _stepped  # noqa: E402
from tests.helpers.cluster import LocalCluster, RedisServer, wait_for  # noqa: E402
from tests.helpers.fsdp import fsdp_cluster, lines, lose, tiers_said  # noqa: E402
from tests.helpers.munge import MungeDaemon  # noqa: E402

SYSTEMS = ("memtier", "disk", "torchrun")
FAULTS = ("node_rank0", "node_other", "worker", "scale", "drain")
TORCHRUN_FAULTS = ("node_other", "worker")  # rank 0's node takes the store: the job ends
NODES = ("a", "b", "c", "d")
EVERY = 5
TRAIN_TO = 27  # after the save of step 25, which only the memory tier holds (20 persisted)
KEYS = ("recovery_s", "restore_s", "steps_lost", "step_s")


def one(
    system: str,
    fault: str,
    redis: RedisServer,
    directory: Path,
    rep: int,
    model: tuple[str, ...],
    memory_size: str = "256MiB",
    munge_socket: str | None = None,
) -> list[dict[str, Any]]:
    """A fresh job trained to TRAIN_TO, then the fault: its results (two for `scale`)."""
    shm = Path(tempfile.mkdtemp(prefix="nodeagent-bench-", dir="/dev/shm"))
    shm.chmod(0o700)
    job = f"bench-loss-{system}-{fault.replace('_', '-')}-{rep}"
    replicas = 1 if system == "memtier" else 0
    with fsdp_cluster(
        redis,
        job,
        directory,
        shm,
        steps=100_000,
        nodes=len(NODES),
        replicas=replicas,
        every=EVERY,
        model=model,
        memory_size=memory_size,
        munge_socket=munge_socket,  # the plane as it runs on a pool: MUNGE both ways
    ) as cluster:
        cluster.min_nodes = 3
        cluster.start(*NODES)
        wait_for(
            lambda: any(x["event"] == "step" and x["step"] >= TRAIN_TO for x in lines(cluster, 1)),
            300,
            f"step {TRAIN_TO}",
        )
        if fault == "scale":
            down = _changed(cluster, system, "scale_down", 1, 3, lambda: cluster.ctl("scale", "3"))
            generation = cluster.status()["generation"]
            restored_at = down["restored_step"]
            wait_for(
                lambda: any(
                    x["event"] == "step" and x["step"] >= restored_at + 2 * EVERY
                    for x in lines(cluster, generation)
                ),
                300,
                "two saves at world 3",
            )
            up = _changed(
                cluster, system, "scale_up", generation, 4, lambda: cluster.ctl("scale", "4")
            )
            results = [down, up]
        elif fault == "drain":
            victim = str(cluster.status()["members"][-1])
            results = [_changed(cluster, system, fault, 1, 3, lambda: cluster.ctl("drain", victim))]
        elif fault == "worker":
            victim = str(cluster.status()["members"][-1])
            results = [
                _changed(cluster, system, fault, 1, 4, lambda: _kill_worker(cluster, victim))
            ]
        else:
            members = cluster.status()["members"]
            victim = str(members[0] if fault == "node_rank0" else members[-1])
            results = [_changed(cluster, system, fault, 1, 3, lambda: lose(cluster, shm, victim))]
        cluster.ctl("stop")
    shutil.rmtree(shm, ignore_errors=True)
    return results


def _kill_worker(cluster: LocalCluster, node: str) -> None:
    for pid in cluster.worker_pids(node):
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def _changed(
    cluster: LocalCluster,
    system: str,
    fault: str,
    generation: int,
    world: int,
    act: Callable[[], object],
) -> dict[str, Any]:
    """`act` on the job running `generation`; measured until every rank of the next, at
    `world`, has finished a step."""
    steps = sorted(
        x["t"] for x in lines(cluster, generation) if x["event"] == "step" and x["rank"] == 0
    )
    began = time.time()
    act()
    new = _generation_after(cluster, generation)
    firsts = wait_for(lambda: _stepped(cluster, new, world), 300, "every rank to step")
    trained = max(x["step"] for x in lines(cluster, generation) if x["event"] == "step")
    restored = [x for x in lines(cluster, new) if x["event"] == "restored"]
    return {
        "system": system,
        "fault": fault,
        "recovery_s": round(max(x["t"] for x in firsts) - began, 3),
        "restore_s": round(max(x["t"] for x in restored) - began, 3),
        "steps_lost": trained - restored[0]["step"],
        "restored_step": restored[0]["step"],
        "tier": sorted(tiers_said(cluster, new, world)),
        "step_s": round(statistics.median(b - a for a, b in itertools.pairwise(steps)), 4),
    }


@dataclass(frozen=True)
class FsdpWorkload(Workload):
    """examples/train_fsdp.py as fsdp_cluster runs it, its own DCP checkpoints in `directory`."""

    def argv(self, system: str, directory: Path) -> list[str]:
        return [
            *(sys.executable, str(ROOT / "examples" / "train_fsdp.py"), "--steps", "100000"),
            *("--save-every", str(EVERY), "--step-time", "0.15", "--digest"),
            *("--checkpoint-dir", str(directory / "checkpoints"), *self.model),
        ]


def one_torchrun(directory: Path, model: tuple[str, ...], fault: str) -> dict[str, Any]:
    """The torchrun system, losing a node that hosts neither the store nor rank 0 (`node_other`)
    or that node's worker (`worker`)."""
    launch = TorchrunLaunch(directory, True, FsdpWorkload(model=model), nnodes=f"3:{len(NODES)}")
    launch.start(*NODES)
    try:
        wait_for(
            lambda: any(x["event"] == "step" and x["step"] >= TRAIN_TO for x in launch.lines()),
            300,
            f"step {TRAIN_TO}",
        )
        before = launch.lines()
        rank0 = {x["pid"] for x in before if x["event"] == "restored" and x["rank"] == 0}
        store = launch.rank0_node()  # the c10d store's host
        victim = next(
            name
            for name in reversed(NODES)
            if name != store and not rank0 & {p.pid for p in launch.processes(name)}
        )
        processes = (
            launch.processes(victim)
            if fault == "node_other"
            else [training_process(launch, victim)]
        )
        world = 3 if fault == "node_other" else 4
        lost_at = time.time()
        for proc in processes:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        trained = max(x["step"] for x in before if x["event"] == "step")
        steps = sorted(x["t"] for x in before if x["event"] == "step" and x["rank"] == 0)

        def resumed() -> list[dict[str, Any]] | None:
            after = [x for x in launch.lines() if x["t"] > lost_at]
            back = {x["pid"]: x for x in after if x["event"] == "restored" and x["world"] == world}
            firsts = [
                min((x["t"] for x in after if x["pid"] == pid and x["event"] == "step"), default=0)
                for pid in back
            ]
            return [*back.values()] if len(back) == world and all(firsts) else None

        restored = wait_for(resumed, 300, f"every rank to step at world {world}")
        after = [x for x in launch.lines() if x["t"] > lost_at and x["event"] == "step"]
        firsts = [min(x["t"] for x in after if x["pid"] == r["pid"]) for r in restored]
        return {
            "system": "torchrun",
            "fault": fault,
            "recovery_s": round(max(firsts) - lost_at, 3),
            "restore_s": round(max(x["t"] for x in restored) - lost_at, 3),
            "steps_lost": trained - restored[0]["step"],
            "tier": ["disk (DCP, the script's own)"],
            "step_s": round(statistics.median(b - a for a, b in itertools.pairwise(steps)), 4),
        }
    finally:
        launch.stop()


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    cells = dict.fromkeys((r["system"], r["fault"]) for r in runs)
    return {
        f"{system} {fault}": {
            key: statistics.median(
                r[key] for r in runs if (r["system"], r["fault"]) == (system, fault)
            )
            for key in KEYS
        }
        for system, fault in cells
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument(
        "--memory-size", default="256MiB", help="job.checkpoint.memory_size: two saves of a rank"
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="default: all of them")
    parser.add_argument("--faults", default=",".join(FAULTS), help="default: all of them")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "node-loss.json"))
    args = parser.parse_args()
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    faults = [f for f in FAULTS if f in args.faults.split(",")]
    model = ("--width", str(args.width), "--layers", str(args.layers))
    runs: list[dict[str, Any]] = []
    path = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        redis.start()
        munged = MungeDaemon().start()
        try:
            for rep in range(args.reps):
                for fault in faults:
                    for system in systems:  # interleaved: the machine's noise hits them all
                        if system == "torchrun" and fault not in TORCHRUN_FAULTS:
                            continue
                        directory = Path(tmp) / f"{system}-{fault}-{rep}"
                        directory.mkdir()
                        if system == "torchrun":
                            made = [one_torchrun(directory, model, fault)]
                        else:
                            made = one(
                                system,
                                fault,
                                redis,
                                directory,
                                rep,
                                model,
                                args.memory_size,
                                munged.socket,
                            )
                        runs += made
                        for result in made:
                            print(json.dumps(result), flush=True)
                        found = {"reps": args.reps, "model": model, "runs": runs}
                        path.write_text(json.dumps(found, indent=1) + "\n")
        finally:
            munged.stop()
            redis.stop()
    table = medians(runs)
    results: dict[str, Any] = {"reps": args.reps, "model": model, "runs": runs, "medians": table}
    if {"memtier", "disk"} <= set(systems):
        disk = statistics.median(r["step_s"] for r in runs if r["system"] == "disk")
        memtier = statistics.median(r["step_s"] for r in runs if r["system"] == "memtier")
        results["replication_slowdown"] = round(memtier / disk - 1, 4)
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=1))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
