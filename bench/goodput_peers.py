"""Goodput beside torchft and torchrun: one fault schedule, replicated DDP, every system in turn.

bench/goodput.py measures one FSDP2 job with no replica of any shard, which torchft cannot run
(it heals a lost replica group from a live one). This one runs the workload every system here
can: bench/recovery.py's, three simulated nodes on this machine, one DDP replica each (gloo,
CPU, the MLP 16 -> 64 -> 1 with 0.03 s of sleep a step), launched as bench/recovery.py
launches it for
- `nodeagent+inplace`: in place, survivors keep their processes, a replacement preloaded;
- `nodeagent`: restart mode (every worker restarts from the last checkpoint, every 10 steps);
- `torchft-1s+hookfix`: torchft 0.2.0, lighthouse heartbeat timeout 1 s (its tuned setting),
  its DDP comm hook made to survive a failed all-reduce (bench/peers/torchft_train.py);
- `torchrun-best`: torchrun with bench/recovery.py's best settings (keep-alive 1 s x 5, last
  call 1 s, a 10 s process-group timeout).
DLRover is left out: its virtual environment is not built here (bench/recovery.py prices its
recoveries per fault, 9-23 s tuned).

The schedule (--seed): one fault every PERIOD_S from FIRST_S after the window opens, for
--minutes, the kinds dealt evenly (worker kill, node kill, hung worker, frozen node, slow node)
and shuffled by the seed, the same for every system:
- worker kill: SIGKILL of a worker;
- node kill: SIGKILL of a node's agent (launcher) and worker; the node comes back BACK_S later
  as a fresh agent (launcher) under its name;
- hung worker: SIGSTOP of a worker, never continued (a hang does not end by itself);
- frozen node: SIGSTOP of a node's agent (launcher) and worker, SIGCONT after FREEZE_S;
- slow node: a worker held to SLOW_SHARE of a CPU for SLOW_S (tests/helpers/throttle.py).
Each hits the node bench/recovery.py's faults hit (`other_node()`: neither rank 0's nor, for
torchrun, the store's), or another such node if that one holds a hung worker (a later fault
there would end the hang for the system that left it), else it is skipped (said in the results).

Measured from the workers' own step lines, the same way for every system:
- clean step: the median step interval at world 3 in the WARM_S before the window;
- useful steps: the last step trained in the window, on the timeline that survived (a step
  trained again after a restore counts once, at its last training), less the step at its start;
- ETTR: useful steps x clean step / window;
- goodput: the same with each useful step weighted by the share of the replicas that trained it
  (a step at world 2 of 3 trained 2/3 of the samples): the work kept, as a share of what the
  system itself trains in the window without a fault (ETTR alone can pass 100 %: a step at a
  smaller world is faster on this machine's two cores);
- work: the same work as a share of what the fastest system's clean step would train in the
  window (torchft's Manager makes its every step slower; this counts that too);
- per fault: pause (the fault until the next step of any rank), world back (until a step at
  world 3 again; - if not before the next fault).

    sudo .venv/bin/python bench/goodput_peers.py --minutes 5 --out bench/results/goodput-peers.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.recovery import (  # noqa: E402
    LIGHT,
    NODES,
    Launch,
    launched,
    signal_all,
    training_process,
    versions,
)
from tests.helpers import throttle  # noqa: E402
from tests.helpers.cluster import RedisServer, wait_for  # noqa: E402

SYSTEMS = ("nodeagent+inplace", "nodeagent", "torchft-1s+hookfix", "torchrun-best")
KINDS = ("worker_kill", "node_kill", "hung_worker", "frozen_node", "slow_node")
PERIOD_S = 30.0
FIRST_S = 5.0
BACK_S = 10.0
FREEZE_S = 15.0
SLOW_S = 20.0
SLOW_SHARE = 0.3
WARM_S = 20.0
WORLD = len(NODES)


def schedule(seed: int, minutes: float) -> list[tuple[float, str]]:
    """(seconds after the window opens, kind) for every fault."""
    count = int((minutes * 60 - FIRST_S) // PERIOD_S) + 1
    kinds = [KINDS[i % len(KINDS)] for i in range(count)]
    random.Random(seed).shuffle(kinds)
    return [(FIRST_S + i * PERIOD_S, kind) for i, kind in enumerate(kinds)]


@dataclass
class Player:
    """Plays the schedule on one launch: the faults, and what each undoes later."""

    launch: Launch
    hung: dict[str, psutil.Process] = field(default_factory=dict)  # a worker stopped for good
    later: list[tuple[float, Callable[[], object]]] = field(default_factory=list)
    stopped: list[psutil.Process] = field(default_factory=list)
    throttles: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def target(self) -> str | None:
        """The node bench/recovery.py's faults hit, unless it still holds a hung worker (the
        system left it there): then another that is not rank 0's, if any."""
        hung = {node for node, proc in self.hung.items() if _stopped(proc)}
        node = self.launch.other_node()
        if node not in hung:
            return node
        rank0 = self.launch.rank0_node()
        return next((n for n in reversed(NODES) if n not in {*hung, rank0, node}), None)

    def inject(self, kind: str) -> str | None:
        """The fault of `kind` on a target node; that node, or None if there was none."""
        node = self.target()
        if node is None:
            return None
        now = time.time()
        if kind == "worker_kill":
            training_process(self.launch, node).kill()
        elif kind == "hung_worker":
            proc = training_process(self.launch, node)
            proc.suspend()
            self.stopped.append(proc)
            self.hung[node] = proc
        elif kind == "node_kill":
            signal_all(self.launch.processes(node), signal.SIGKILL)
            self.later.append((now + BACK_S, lambda: self.launch.start(node)))
        elif kind == "frozen_node":
            procs = signal_all(self.launch.processes(node), signal.SIGSTOP)
            self.later.append((now + FREEZE_S, lambda: signal_all(procs, signal.SIGCONT)))
        elif kind == "slow_node":
            pid = training_process(self.launch, node).pid
            name = f"nodeagent-goodput-{os.getpid()}-{int(now)}"
            group = contextlib.ExitStack()
            group.enter_context(throttle.throttled(name, [pid], SLOW_SHARE))
            self.throttles.callback(group.close)
            self.later.append((now + SLOW_S, group.close))
        return node

    def due(self) -> None:
        now = time.time()
        for entry in [e for e in self.later if e[0] <= now]:
            self.later.remove(entry)
            with contextlib.suppress(Exception):
                entry[1]()

    def close(self) -> None:
        for _, undo in self.later:
            with contextlib.suppress(Exception):
                undo()
        self.throttles.close()
        signal_all(self.stopped, signal.SIGCONT)


def _stopped(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() == psutil.STATUS_STOPPED)
    except psutil.Error:
        return False


def steps_of(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((x for x in lines if x.get("event") == "step"), key=lambda x: x["t"])


def clean_step(steps: list[dict[str, Any]], t0: float) -> float:
    """The median interval between one rank's steps at the whole world in WARM_S before t0."""
    times: dict[int, list[float]] = {}
    for x in steps:
        if t0 - WARM_S <= x["t"] < t0 and x["world"] == WORLD:
            times.setdefault(x["pid"], []).append(x["t"])
    gaps = [b - a for ts in times.values() for a, b in itertools.pairwise(ts)]
    return float(statistics.median(gaps))


def account(steps: list[dict[str, Any]], t0: float, end: float, clean: float) -> dict[str, Any]:
    """Useful steps, ETTR and goodput of the window [t0, end) (the module docstring), on rank
    0's timeline: DDP starts every new world from rank 0's parameters, so its step is the
    model's (a rank that started afresh counts from 0 until then, and where it became rank 0,
    the model did too)."""
    steps = [x for x in steps if x["rank"] == 0]
    before = [x["step"] for x in steps if x["t"] < t0]
    start = max(before, default=0)
    inside = [x for x in steps if t0 <= x["t"] < end]
    if not inside:
        return {"useful_steps": 0, "ettr": 0.0, "goodput": 0.0}
    last = inside[-1]["step"]
    world_of: dict[int, int] = {}
    for x in inside:  # later trainings of a step overwrite earlier ones
        world_of[x["step"]] = x["world"]
    useful = [s for s in range(start + 1, last + 1) if s in world_of]
    window = end - t0
    return {
        "start_step": start,
        "end_step": last,
        "useful_steps": len(useful),
        "ettr": round(len(useful) * clean / window, 4),
        "goodput": round(sum(world_of[s] / WORLD for s in useful) * clean / window, 4),
    }


def costs(
    steps: list[dict[str, Any]], played: list[dict[str, Any]], end: float
) -> list[dict[str, Any]]:
    """Each fault's pause and the time until the whole world stepped again."""
    out = []
    for i, fault in enumerate(played):
        at = fault["at"]
        until = played[i + 1]["at"] if i + 1 < len(played) else end
        after = [x for x in steps if at < x["t"] < until]
        whole = [x["t"] for x in after if x["world"] == WORLD]
        out.append(
            {
                **fault,
                "pause_s": round(after[0]["t"] - at, 3) if after else None,
                "world_back_s": round(whole[0] - at, 3) if whole else None,
            }
        )
    return out


@contextlib.contextmanager
def one_system(system: str, server: RedisServer, tmp: Path) -> Iterator[Launch]:
    directory = tmp / system.replace("+", "-")
    directory.mkdir()
    job = f"goodput-{system}-{os.getpid()}".replace("+", "-")
    with launched(system, server, directory, job, LIGHT) as launch:
        launch.start(*NODES)
        wait_for(
            lambda: len([x for x in steps_of(launch.lines()) if x["world"] == WORLD]) > 300,
            300,
            f"{system} training at world {WORLD}",
        )
        launch.settle()
        time.sleep(WARM_S)
        yield launch


def run_system(
    system: str, server: RedisServer, tmp: Path, plan: list[tuple[float, str]], minutes: float
) -> dict[str, Any]:
    with one_system(system, server, tmp) as launch:
        player = Player(launch)
        played: list[dict[str, Any]] = []
        t0 = time.time()
        end = t0 + minutes * 60
        try:
            for offset, kind in plan:
                while time.time() < t0 + offset:
                    player.due()
                    time.sleep(0.05)
                try:
                    node = player.inject(kind)
                except (psutil.Error, StopIteration, RuntimeError) as exc:  # no worker stepping
                    print(f"{system}: {kind} not injected: {exc!r}", flush=True)
                    node = None
                played.append({"kind": kind, "node": node, "at": time.time()})
                print(f"{system} +{offset:.0f}s {kind} on {node}", flush=True)
            while time.time() < end:
                player.due()
                time.sleep(0.1)
            lines = launch.lines()
        finally:
            player.close()
    steps = steps_of(lines)
    clean = clean_step(steps, t0)
    return {
        "clean_step_s": round(clean, 4),
        **account(steps, t0, end, clean),
        "faults": [{**f, "at": round(f["at"] - t0, 2)} for f in costs(steps, played, end)],
    }


def table(results: dict[str, Any]) -> str:
    rows = [
        "| system | goodput | work at the fastest clean pace | ETTR | useful steps | clean step "
        "| faults skipped |",
        "|---|---|---|---|---|---|---|",
    ]
    fastest = min(r["clean_step_s"] for r in results["systems"].values())
    for system, r in results["systems"].items():
        skipped = sum(1 for f in r["faults"] if f["node"] is None)
        work = r["goodput"] * fastest / r["clean_step_s"]
        rows.append(
            f"| {system} | **{r['goodput']:.1%}** | {work:.1%} | {r['ettr']:.1%} "
            f"| {r['useful_steps']} | {r['clean_step_s'] * 1000:.1f} ms | {skipped} |"
        )
    rows += ["", "| fault | " + " | ".join(results["systems"]) + " |"]
    rows.append("|---|" + "---|" * len(results["systems"]))
    for i, (offset, kind) in enumerate(results["schedule"]):
        cells = []
        for r in results["systems"].values():
            f = r["faults"][i]
            pause = "-" if f["pause_s"] is None else f"{f['pause_s']:.2f}"
            back = "-" if f["world_back_s"] is None else f"{f['world_back_s']:.2f}"
            cells.append(f"{pause} / {back}")
        rows.append(f"| +{offset:.0f}s {kind} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=64)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/goodput-peers.json")
    parser.add_argument("--table", type=Path, help="only print the tables of a results file")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    if why := throttle.available():
        sys.exit(f"the slow node needs the CPU controller: {why}")
    plan = schedule(args.seed, args.minutes)
    results: dict[str, Any] = {
        "minutes": args.minutes,
        "seed": args.seed,
        "schedule": plan,
        "versions": versions(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "systems": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            for system in args.systems.split(","):
                results["systems"][system] = run_system(
                    system, server, Path(tmp), plan, args.minutes
                )
                args.out.write_text(json.dumps(results, indent=2) + "\n")
        finally:
            server.stop()
    print(table(results))


if __name__ == "__main__":
    main()
