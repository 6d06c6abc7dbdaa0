"""Goodput under a fault schedule: one FSDP2 job for a fixed wall time while faults arrive at
random, under nodeagent (restart and in place) and torchrun, the same schedule for each (issue 41).

    .venv/bin/python bench/goodput.py [--minutes 5] [--mean-s 45] [--seed 41] [--systems ...]

Four simulated nodes on this machine, one worker each, run examples/train_fsdp.py (FSDP2, gloo,
CPU, by default an MLP of 16 hidden layers of 1024 units with Adam: about 200 MB of state over
the 4 ranks, 0.15 s of extra step time, as bench/node_loss.py), launched by
- `nodeagent-restart`: four agents and a real redis-server (tests/helpers/fsdp.py's cluster:
  heartbeat 250 ms, lease 3 s, the plane authenticated with MUNGE), the memory tier with
  `replicas: 1` (each save copied to the next node) and the persistent tier every second save,
  min_nodes 3; a failure restarts every worker, which restore from memory;
- `nodeagent-inplace`: the same with `job.recovery: in_place` and the script's --in-place
  (survivors keep their processes; only missing ranks start);
- `torchrun`: four `torchrun --nnodes=3:4 --rdzv-backend=c10d` launchers with bench/recovery.py's
  best settings (the store not shared with the workers, keep-alive 1 s x 5, last call 1 s), the
  script saving DCP to a directory on disk (its own Checkpointer: staged, written from a thread).
All three get the same 10 s process-group timeout (the script's --pg-timeout: a collective
with a frozen peer fails after it, which is how torchrun learns of a freeze at all), nodeagent
`reform_timeout: 20s` (time for a survivor to leave and be told its next generation), and
restarts without a limit a run can reach (torchrun's --max-restarts, nodeagent's max_restarts).

The save interval of each system follows Young/Daly: interval = sqrt(2 C M), M the schedule's
mean time between faults and C the measured cost of one save. C comes from a fault-free
calibration run of the same system (a save every CAL_EVERY steps, CAL_STEPS steps): the
median over its saves of the step interval holding the save minus the clean step time (the
median step interval), and at least the median time the script says a save blocked its step
(`blocked` in its "saved" lines). The interval in steps is that time over the clean step time,
at least 1. The clean step time is also the one the goodput is counted in.

The schedule (--seed): exponential inter-arrival times of mean --mean-s over the --minutes
window, each fault a worker kill, a node loss or a node freeze, drawn evenly. A node loss kills
the node's agent (launcher) and worker and wipes its tmpfs (nodeagent's memory tier and copies);
after BACK_S the node comes back under the same name as a fresh agent (launcher), so the job
returns to 4 nodes. A node freeze SIGSTOPs the node's agent (launcher) and everything under it,
SIGCONT after FREEZE_S. At most one node is out at a time: a node fault drawn while another node
is out or within SETTLE_S of its return becomes a worker kill (the schedule says which). Every
fault hits a node other than rank 0's: a node drawn among the others (a fraction drawn with the
schedule picks one from those eligible then); for torchrun also not the node whose launcher
hosts the c10d store (its loss ends a torchrun job, bench/recovery.py measures that).

Each system runs a fresh job: trained to WARM_STEPS at world 4, then the window opens (T0) and
the schedule plays for --minutes. Measured on one clock from the workers' JSON lines, and from
nodeagent's events or torchrun's own log lines for detection:
- useful steps: the step reached at the window's end on the timeline that survived (a restore
  after it that went back below it counts) minus the step at T0;
- effective training time ratio: useful steps x clean step time / window;
- per fault (and per node return or thaw, which re-forms the job again): detect (fault ->
  nodeagent's event naming it, worker_failed or node_lost; torchrun: a surviving launcher's
  first log line after it), restart (-> the last new training process of the new world began:
  its create_time, sampled every 0.5 s while it lives; none for in-place survivors), start+restore
  (-> every rank of the new world printed "restored": import, process group, model, load; the
  script prints nothing between), first step (-> every rank stepped), down (fault -> every rank
  stepped; for a return or thaw, from the job's last step before that re-form), steps lost (the
  newest step trained before the restore minus the step restored). A fault's re-form is the
  first (world, generation) after it whose every rank restored and stepped (a fault during a
  re-form shares it: shown as such, not counted twice); a return's or thaw's the first after
  the last one counted, unless it began after the next action (then the node was folded into
  the re-form before). A fault not recovered counts down to the window's end;
- checkpoint stalls: the sum over the window's saves of the longest `blocked` of any rank;
  saves the memory tier skipped (copies behind) are counted, their staging is not in the sum.
The table splits the window into useful time, time down, lost steps trained again, stalls and
the rest (steps slower than clean: copies, a world of 3).

Writes bench/results/goodput.json (--out) after each system and prints the tables. With
--keep DIR every job's files stay in DIR, and beside each measured job's a measured.json: the
workers' lines, the training processes' start times, torchrun's launchers' logs, the actions.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.recovery import (  # noqa: E402
    NodeagentLaunch,
    TorchrunLaunch,
    Workload,
    versions,
    workload_lines,
)
from tests.helpers.cluster import RedisServer, wait_for  # noqa: E402
from tests.helpers.fsdp import fsdp_cluster, lose  # noqa: E402
from tests.helpers.munge import MungeDaemon  # noqa: E402

SYSTEMS = ("nodeagent-restart", "nodeagent-inplace", "torchrun")
KINDS = ("worker_kill", "node_loss", "node_freeze")
NODES = ("a", "b", "c", "d")
BACK_S = 10.0  # a lost node comes back (fresh) this long after
FREEZE_S = 15.0  # a frozen node is thawed this long after
SETTLE_S = 10.0  # after a node is back, before another node may go out
WARM_STEPS = 3  # every rank at world 4 past this step: the window opens
CAL_EVERY = 5
CAL_STEPS = 25
STEP_TIME = "0.15"
PG_TIMEOUT = "10"
REFORM_TIMEOUT = "20s"  # nodeagent: a survivor leaves (its collective times out first), waits
MAX_RESTARTS = 1000  # never reached in a run
TAIL_S = 120.0  # after the window: until the job steps again (a restore may go back)
CAUSES = {"worker_kill": "worker_failed", "node_loss": "node_lost", "node_freeze": "node_lost"}


# -- the schedule --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    at_s: float  # after the window opened
    kind: str
    pick: float  # which of the eligible nodes: a fraction of their number
    drawn: str  # the kind drawn (a node fault while another node is out becomes a worker kill)


def schedule(seed: int, mean_s: float, window_s: float) -> list[Fault]:
    """Poisson arrivals over the window, at most one node out at a time."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    at, busy_until = 0.0, -1.0
    while True:
        at += rng.expovariate(1 / mean_s)
        if at >= window_s:
            return faults
        drawn, pick = rng.choice(KINDS), rng.random()
        kind = drawn
        if drawn != "worker_kill":
            if at < busy_until:
                kind = "worker_kill"
            else:
                busy_until = at + (BACK_S if drawn == "node_loss" else FREEZE_S) + SETTLE_S
        faults.append(Fault(round(at, 3), kind, round(pick, 4), drawn))


@dataclass(frozen=True)
class Action:
    at_s: float
    what: str  # a fault's kind, or "node_back" / "thaw" (its end)
    fault: int  # its index in the schedule


def actions(faults: list[Fault]) -> list[Action]:
    out = [Action(f.at_s, f.kind, i) for i, f in enumerate(faults)]
    out += [
        Action(f.at_s + BACK_S, "node_back", i)
        for i, f in enumerate(faults)
        if f.kind == "node_loss"
    ]
    out += [
        Action(f.at_s + FREEZE_S, "thaw", i)
        for i, f in enumerate(faults)
        if f.kind == "node_freeze"
    ]
    return sorted(out, key=lambda a: a.at_s)


# -- the systems ---------------------------------------------------------------------------------


def script_argv(every: int, model: tuple[str, ...], directory: Path, nodeagent: bool) -> list[str]:
    """examples/train_fsdp.py saving every `every` steps (its own DCP saves in `directory`)."""
    argv = [
        *(sys.executable, str(ROOT / "examples" / "train_fsdp.py"), "--steps", "100000"),
        *("--save-every", str(every), "--step-time", STEP_TIME),
        *("--checkpoint-dir", str(directory), *model),
    ]
    return [*argv, "--pg-timeout", PG_TIMEOUT] if nodeagent else argv  # TorchrunLaunch adds it


@dataclass(frozen=True)
class TorchrunScript(Workload):
    """The script under TorchrunLaunch (best settings, which add --pg-timeout)."""

    def argv(self, system: str, directory: Path) -> list[str]:
        script = script_argv(self.every, self.model, directory / "checkpoints", nodeagent=False)
        # TorchrunLaunch drops argv[0] and puts the rest after its own options: the first here
        # is one more of them, over its --max-restarts=10 (torchrun's parser keeps the last).
        return [script[0], f"--max-restarts={MAX_RESTARTS}", *script[1:]]


class Job(Protocol):
    def lines(self) -> list[dict[str, Any]]: ...
    def noticed(self, t0: float, kind: str) -> float | None: ...
    def spared(self) -> set[str]: ...
    def kill_worker(self, node: str) -> int: ...
    def lose(self, node: str) -> None: ...
    def processes(self, node: str) -> list[psutil.Process]: ...
    def back(self, node: str) -> None: ...
    def launcher_logs(self) -> dict[str, list[str]]: ...


def _kill(procs: list[psutil.Process], sig: signal.Signals = signal.SIGKILL) -> int:
    hit = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
            hit += 1
    return hit


def _rank0_pid(lines: list[dict[str, Any]]) -> int | None:
    rank0 = [x for x in lines if x.get("event") == "restored" and x.get("rank") == 0]
    return max(rank0, key=lambda x: x["t"])["pid"] if rank0 else None


@dataclass
class NodeagentJob:
    launch: NodeagentLaunch
    shm: Path
    rank0: str = NODES[0]  # the node of rank 0, as the status last said

    def lines(self) -> list[dict[str, Any]]:
        root = self.launch.cluster.directory / "logs" / self.launch.cluster.job
        texts = (
            text
            for log in sorted(root.glob("*/rank-*.log"))
            for text in log.read_text(errors="replace").splitlines()
        )
        return workload_lines(texts)

    def noticed(self, t0: float, kind: str) -> float | None:
        return self.launch.noticed(t0, CAUSES.get(kind, "node_joined"))

    def spared(self) -> set[str]:
        members = self.launch.cluster.status()["members"]  # none while the job re-forms
        self.rank0 = str(members[0]) if members else self.rank0
        return {self.rank0}

    def kill_worker(self, node: str) -> int:
        pids = self.launch.cluster.worker_pids(node)
        return _kill([psutil.Process(p) for p in pids])

    def lose(self, node: str) -> None:
        lose(self.launch.cluster, self.shm, node)

    def processes(self, node: str) -> list[psutil.Process]:
        return self.launch.processes(node)

    def back(self, node: str) -> None:
        self.launch.start(node)

    def launcher_logs(self) -> dict[str, list[str]]:
        return {}  # the agents' own logs are in the job's directory


@dataclass
class TorchrunJob:
    launch: TorchrunLaunch
    gone: list[list[str]] = field(default_factory=list)  # stdout of launchers lost

    def lines(self) -> list[dict[str, Any]]:
        old = (text for stdout in self.gone for text in list(stdout))
        return [*workload_lines(old), *self.launch.lines()]

    def noticed(self, t0: float, kind: str) -> float | None:
        return self.launch.noticed(t0, kind)

    def spared(self) -> set[str]:
        spared = {self.launch.rank0_node()}  # the c10d store's host
        pid = _rank0_pid(self.lines())
        for name in self.launch.launchers:
            with contextlib.suppress(psutil.Error):
                if pid in {p.pid for p in self.launch.processes(name)}:
                    spared.add(name)
        return spared

    def kill_worker(self, node: str) -> int:
        return _kill(self.launch.launcher(node).children())

    def lose(self, node: str) -> None:
        _kill(self.launch.processes(node))
        self.launch.launchers[node].popen.wait(10)

    def processes(self, node: str) -> list[psutil.Process]:
        return self.launch.processes(node)

    def back(self, node: str) -> None:
        self.gone.append(self.launch.launchers[node].stdout)
        self.launch.start(node)

    def launcher_logs(self) -> dict[str, list[str]]:
        """What each launcher (the newest of each node) wrote itself, with arrival times."""
        launchers = self.launch.launchers.items()
        return {n: [f"{at:.3f} {text}" for at, text in lr.stderr] for n, lr in launchers}


@contextlib.contextmanager
def launched(
    system: str, every: int, model: tuple[str, ...], redis: RedisServer, munge: str, tmp: Path
) -> Iterator[Job]:
    """A fresh job of `system` on the four nodes, saving every `every` steps."""
    if system == "torchrun":
        workload = TorchrunScript(every=every, model=model)
        torchrun = TorchrunLaunch(tmp, True, workload, nnodes=f"3:{len(NODES)}")
        try:
            torchrun.start(*NODES)
            yield TorchrunJob(torchrun)
        finally:
            torchrun.stop()
        return
    shm = Path(tempfile.mkdtemp(prefix="nodeagent-goodput-", dir="/dev/shm"))
    shm.chmod(0o700)
    in_place = system == "nodeagent-inplace"
    job = f"goodput-{system}-{every}-{os.getpid()}-{int(time.time())}"
    try:
        with fsdp_cluster(
            redis, job, tmp, shm, 100_000, len(NODES), in_place, 1, munge_socket=munge
        ) as cluster:
            argv = script_argv(every, model, tmp / "script", nodeagent=True)
            cluster.entrypoint = [*argv, "--in-place"] if in_place else argv
            cluster.min_nodes = 3
            cluster.max_restarts = MAX_RESTARTS
            cluster.timing = {**cluster.timing, "reform_timeout": REFORM_TIMEOUT}
            cluster.start(*NODES)
            try:
                yield NodeagentJob(NodeagentLaunch(cluster), shm)
            finally:
                cluster.ctl("stop")
    finally:
        shutil.rmtree(shm, ignore_errors=True)


# -- measuring -----------------------------------------------------------------------------------


def _of(lines: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return sorted((x for x in lines if x.get("event") == event), key=lambda x: x["t"])


def _at_world(lines: list[dict[str, Any]], world: int, step: int) -> bool:
    ranks = {x["rank"] for x in _of(lines, "step") if x["world"] == world and x["step"] >= step}
    return len(ranks) == world


def rank0_intervals(lines: list[dict[str, Any]], first: int) -> dict[int, float]:
    """Step -> the time rank 0 took from the step before to it (one process, from `first`)."""
    steps = [x for x in _of(lines, "step") if x["rank"] == 0 and x["step"] >= first]
    return {b["step"]: b["t"] - a["t"] for a, b in itertools.pairwise(steps)}


def calibrate(lines: list[dict[str, Any]], mean_s: float) -> dict[str, Any]:
    """Clean step time, one save's cost and the Young/Daly interval from a fault-free run."""
    gaps = rank0_intervals(lines, WARM_STEPS)
    clean = statistics.median(gaps.values())
    excess = [gaps[s + 1] - clean for s in gaps if s % CAL_EVERY == 0 and s + 1 in gaps]
    saved = [x for x in _of(lines, "saved") if x["step"] >= WARM_STEPS]
    blocked = statistics.median(_blocked(saved).values()) if saved else 0.0
    cost = max(statistics.median(excess) if excess else 0.0, blocked)
    interval_s = math.sqrt(2 * cost * mean_s)
    return {
        "clean_step_s": round(clean, 4),
        "save_excess_s": round(statistics.median(excess), 4) if excess else None,
        "save_blocked_s": round(blocked, 4),
        "save_cost_s": round(cost, 4),
        "young_daly_s": round(interval_s, 3),
        "every": max(1, round(interval_s / clean)),
        "steps": len(gaps),
    }


def _blocked(saved: list[dict[str, Any]]) -> dict[tuple[int, int], float]:
    """(world, step) -> the longest a rank's step was blocked by that save."""
    out: dict[tuple[int, int], float] = {}
    for x in saved:
        key = (x["world"], x["step"])
        out[key] = max(out.get(key, 0.0), x.get("blocked", 0.0))
    return out


def progress(lines: list[dict[str, Any]], at: float, rollback: bool) -> int:
    """The step the job had reached at `at`: the newest step line's, and with `rollback` no
    more than any restore after it went back to (those steps did not survive)."""
    steps = [x for x in _of(lines, "step") if x["t"] <= at]
    if not steps:
        return 0
    newest = max(int(x["step"]) for x in steps if x["t"] >= steps[-1]["t"] - 0.05)
    later = [int(x["step"]) for x in _of(lines, "restored") if x["t"] > steps[-1]["t"]]
    return min([newest, *later]) if rollback else newest


def _firsts(lines: list[dict[str, Any]], wave: list[dict[str, Any]]) -> list[float | None]:
    """Each restored rank's first step after its restore (None: it never stepped)."""
    steps = _of(lines, "step")
    return [
        next((s["t"] for s in steps if s["pid"] == x["pid"] and s["t"] > x["t"]), None)
        for x in wave
    ]


def _wave(lines: list[dict[str, Any]], after: float) -> list[dict[str, Any]]:
    """The re-form that ended what happened at `after`: the first (world, generation) after it
    whose every rank restored and stepped (torchrun's workers all say generation 0: one per
    world); failing that, the first whose every rank restored. Its "restored" lines."""
    groups: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for x in _of(lines, "restored"):
        if x["t"] > after:
            groups.setdefault((x["world"], x.get("gen", 0)), {}).setdefault(x["rank"], x)
    whole = [list(g.values()) for (world, _), g in groups.items() if len(g) == world]
    whole.sort(key=lambda g: min(x["t"] for x in g))
    stepped = [g for g in whole if all(_firsts(lines, g))]
    return stepped[0] if stepped else whole[0] if whole else []


def recovery(
    lines: list[dict[str, Any]],
    at: float,
    after: float,
    noticed: float | None,
    births: dict[int, float],
    rejoin: bool,
) -> dict[str, Any]:
    """The re-form after an action at `at`, the first whose restore began after `after`: its
    phases, the steps it lost (the newest step of the timeline it ended, since the restore
    before it, minus the step restored). A return or thaw (`rejoin`) is timed from the job's
    last step before that re-form: the node's own start is not in it."""
    wave = _wave(lines, after)
    if not wave:  # down from `at` to the window's end, unless a return or thaw (folded)
        return {"outcome": "no restore seen", "down": (at, math.inf)}
    began, restored_at = min(x["t"] for x in wave), max(x["t"] for x in wave)
    firsts = _firsts(lines, wave)
    before = [s for s in _of(lines, "step") if s["t"] < began]
    previous = [x for x in _of(lines, "restored") if x["t"] <= after]
    since = previous[-1] if previous else {"t": 0.0, "step": 0}
    trained = max((s["step"] for s in before if s["t"] > since["t"]), default=since["step"])
    restored_step = min(x["step"] for x in wave)
    detect = noticed if noticed is not None and noticed <= began else None
    paused = before[-1]["t"] if before else at
    start = paused if rejoin else detect if detect is not None else at
    born = paused if rejoin else at
    newest = [births[x["pid"]] for x in wave if births.get(x["pid"], 0.0) > born]
    started = max(newest, default=None)
    row: dict[str, Any] = {
        "outcome": "recovered" if all(firsts) else "restored, not stepping",
        "world": wave[0]["world"],
        "generation": wave[0].get("gen", 0),
        "restored_step": restored_step,
        "steps_lost": max(0, trained - restored_step),
        "detect_s": None if detect is None else round(detect - at, 3),
        "restart_s": None if started is None else round(started - start, 3),
        "restore_s": round(restored_at - (start if started is None else started), 3),
        "began": began,
        "ended": restored_at,
    }
    stepped = max((t for t in firsts if t is not None), default=math.inf)
    if all(firsts):
        row |= {
            "first_step_s": round(stepped - restored_at, 3),
            "down_s": round(stepped - (paused if rejoin else at), 3),
        }
    row["down"] = (paused if rejoin else at, stepped)  # not stepping: to the window's end
    return row


def _union(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by the spans."""
    total, reach = 0.0, lo
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total


def account(
    lines: list[dict[str, Any]],
    t0: float,
    t1: float,
    clean: float,
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    """The window [t0, t1]: goodput and where the rest of the time went."""
    start, end = progress(lines, t0, rollback=False), progress(lines, t1, rollback=True)
    useful = end - start
    window = t1 - t0
    saved = [x for x in _of(lines, "saved") if t0 <= x["t"] <= t1]
    skipped = {(x["world"], x["step"]) for x in _of(lines, "skipped") if t0 <= x["t"] <= t1}
    stalls = sum(_blocked(saved).values())
    counted = [e for e in events if "down" in e]  # each re-form once, those that stepped
    down = _union([e["down"] for e in counted], t0, t1)
    lost = sum(e.get("steps_lost", 0) for e in events)
    faults = [e for e in events if e["what"] in KINDS]
    return {
        "window_s": round(window, 3),
        "step_at_start": start,
        "step_at_end": end,
        "useful_steps": useful,
        "clean_step_s": clean,
        "effective_ratio": round(useful * clean / window, 4),
        "faults_applied": sum(1 for e in faults if "outcome" in e),
        "steps_lost": lost,
        "detect_s": round(sum(e.get("detect_s") or 0.0 for e in counted), 3),
        "restart_s": round(sum(e.get("restart_s") or 0.0 for e in counted), 3),
        "restore_s": round(sum(e.get("restore_s", 0.0) for e in counted), 3),
        "first_step_s": round(sum(e.get("first_step_s", 0.0) for e in counted), 3),
        "down_s": round(down, 3),
        "retrained_s": round(lost * clean, 3),
        "saves": len(_blocked(saved)),
        "saves_skipped": len(skipped),
        "stalls_s": round(stalls, 3),
        "rest_s": round(window - useful * clean - down - lost * clean - stalls, 3),
    }


# -- one system ----------------------------------------------------------------------------------


class Births:
    """When each training process of a job began (its create_time), sampled on a thread: most
    are gone by the time the run is measured. `mark`: a string of their command lines."""

    def __init__(self, mark: str, period_s: float = 0.5) -> None:
        self.mark = mark
        self.period_s = period_s
        self.began: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="births", daemon=True)

    def __enter__(self) -> Births:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            for proc in psutil.process_iter(["cmdline", "create_time"]):
                command = " ".join(proc.info["cmdline"] or [])
                if "train_fsdp.py" in command and self.mark in command:
                    self.began.setdefault(proc.pid, proc.info["create_time"])


@dataclass
class Faults:
    """What the faults did to one job: the nodes out, the processes frozen, the log."""

    job: Job
    out: dict[int, str] = field(default_factory=dict)  # fault -> the node it took out
    frozen: dict[int, list[psutil.Process]] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)

    def apply(self, action: Action, fault: Fault) -> None:
        at = time.time()
        try:
            did = self._do(action, fault)
        except Exception as exc:  # a process gone meanwhile, a status read during a re-form
            did = f"failed: {exc!r}"[:200]
        self.log.append({"at_s": action.at_s, "what": action.what, "fault": action.fault, "t": at})
        self.log[-1]["applied"] = did
        print(f"  {at - self.log[0]['t'] + self.log[0]['at_s']:7.1f} s {did}", flush=True)

    def _do(self, action: Action, fault: Fault) -> str:
        if action.what in ("node_back", "thaw") and action.fault not in self.out:
            return ""  # the fault hit nothing
        if action.what == "node_back":
            node = self.out.pop(action.fault)
            self.job.back(node)
            return f"node {node} back"
        if action.what == "thaw":
            _kill(self.frozen.pop(action.fault), signal.SIGCONT)
            return f"node {self.out.pop(action.fault)} thawed"
        spared = self.job.spared()
        eligible = [n for n in NODES if n not in spared and n not in self.out.values()]
        if not eligible:
            return ""
        node = eligible[int(fault.pick * len(eligible))]
        if action.what == "worker_kill":
            killed = self.job.kill_worker(node)
            return f"worker of {node} killed ({killed} processes)" if killed else ""
        self.out[action.fault] = node
        if action.what == "node_loss":
            self.job.lose(node)
            return f"node {node} lost"
        self.frozen[action.fault] = self.job.processes(node)
        _kill(self.frozen[action.fault], signal.SIGSTOP)
        return f"node {node} frozen ({len(self.frozen[action.fault])} processes)"

    def thaw_all(self) -> None:
        for procs in self.frozen.values():
            _kill(procs, signal.SIGCONT)
        self.frozen.clear()


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


def _settled(job: Job, after: float) -> bool:
    """The job stepped after `after` and after its newest restore."""
    lines = job.lines()
    steps, restored = _of(lines, "step"), _of(lines, "restored")
    newest = restored[-1]["t"] if restored else 0.0
    return bool(steps) and steps[-1]["t"] > max(after, newest + 1.0)


def _measured(
    job: Job, log: list[dict[str, Any]], lines: list[dict[str, Any]], births: dict[int, float]
) -> list[dict[str, Any]]:
    """Every action that did something, with the re-form that ended it."""
    noticed = [
        job.noticed(e["t"], e["what"]) if e["what"] in KINDS and e["applied"] else None for e in log
    ]
    return attribute(log, lines, noticed, births)


def attribute(
    log: list[dict[str, Any]],
    lines: list[dict[str, Any]],
    noticed: list[float | None],
    births: dict[int, float],
) -> list[dict[str, Any]]:
    """Each action with the re-form that ended it. A fault's is the first re-form after it
    that stepped (a fault during a re-form shares it); a return's or thaw's (the node joins
    again) the first one after the last counted, unless that one began after the next action:
    then the join was folded into the re-form before it."""
    events: list[dict[str, Any]] = []
    seen: set[float] = set()
    last = 0.0  # when every rank of the last re-form counted had restored
    for i, entry in enumerate(log):
        if not entry["applied"] or entry["applied"].startswith("failed"):
            events.append(entry)
            continue
        rejoin = entry["what"] not in KINDS
        after = max(entry["t"], last) if rejoin else entry["t"]
        row = recovery(lines, entry["t"], after, noticed[i], births, rejoin)
        began, ended = row.pop("began", None), row.pop("ended", None)
        following = [e["t"] for e in log[i + 1 :] if e["applied"]]
        if rejoin and (began is None or (following and began > following[0])):
            row = {"outcome": "folded into the re-form before it"}
        elif began is not None and began in seen:
            row = {"outcome": "in the re-form of an earlier action"}
        elif began is not None and ended is not None:
            seen.add(began)
            last = max(last, ended)
        events.append({**entry, **row})
    return events


@dataclass
class Bench:
    """What every job shares: Redis, munged, a directory, the model."""

    redis: RedisServer
    munge: str
    tmp: Path
    model: tuple[str, ...]
    runs: int = 0

    @contextlib.contextmanager
    def launch(self, system: str, every: int) -> Iterator[tuple[Job, Births]]:
        self.runs += 1
        directory = self.tmp / f"{self.runs}-{system}"
        directory.mkdir()
        with (
            Births(str(directory)) as births,
            launched(system, every, self.model, self.redis, self.munge, directory) as job,
        ):
            yield job, births

    def calibrate(self, system: str, mean_s: float) -> dict[str, Any]:
        """A fault-free run of `system`, a save every CAL_EVERY steps: its step and save cost."""
        with self.launch(system, CAL_EVERY) as (job, _):
            last = WARM_STEPS + CAL_STEPS
            wait_for(lambda: _at_world(job.lines(), len(NODES), last), 600, f"step {last}")
            return calibrate(job.lines(), mean_s)


def run_system(
    bench: Bench, system: str, every: int, faults: list[Fault], window_s: float, clean: float
) -> dict[str, Any]:
    """A fresh job of `system` under the schedule for `window_s`; the window's account."""
    with bench.launch(system, every) as (job, births):
        wait_for(lambda: _at_world(job.lines(), len(NODES), WARM_STEPS), 300, "the job at 4")
        t0 = time.time()
        load = os.getloadavg()
        played = Faults(job)
        played.log.append({"at_s": 0.0, "what": "window", "fault": -1, "t": t0, "applied": ""})
        for action in actions(faults):
            if action.at_s >= window_s:
                break
            _sleep_until(t0 + action.at_s)
            played.apply(action, faults[action.fault])
        _sleep_until(t0 + window_s)
        t1 = time.time()
        played.thaw_all()
        with contextlib.suppress(AssertionError):  # a job that never steps again: as it is
            wait_for(lambda: _settled(job, t1), TAIL_S, "the job to step after the window")
        lines = job.lines()
        events = _measured(job, played.log[1:], lines, births.began)
        raw = {"lines": lines, "births": births.began, "launchers": job.launcher_logs()}
        raw["events"] = events  # all of it kept with --keep, to look again
        (bench.tmp / f"{bench.runs}-{system}" / "measured.json").write_text(json.dumps(raw))
        end_load = os.getloadavg()
    return {
        "every": every,
        "load_at_start": [round(x, 2) for x in load],
        "load_at_end": [round(x, 2) for x in end_load],
        "account": account(lines, t0, t1, clean, events),
        "window_start": t0,
        "events": [{k: v for k, v in e.items() if k != "down"} for e in events],
    }


# -- the tables ----------------------------------------------------------------------------------


def _s(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def table(results: dict[str, Any]) -> str:
    rows = [
        "| system | save every (cost) | clean step | useful steps | effective ratio | faults hit "
        "| down | detect | restart | start+restore | first step | steps lost (again) "
        "| stalls (saves, skipped) | rest |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for system, cell in results["systems"].items():
        a, cal = cell["account"], cell["calibration"]
        rows.append(
            f"| {system} | {cell['every']} steps ({cal['save_cost_s']:.2f} s) "
            f"| {a['clean_step_s']:.3f} s | {a['useful_steps']} | **{a['effective_ratio']:.1%}** "
            f"| {a['faults_applied']} | {a['down_s']:.1f} s | {a['detect_s']:.1f} s "
            f"| {a['restart_s']:.1f} s | {a['restore_s']:.1f} s | {a['first_step_s']:.1f} s "
            f"| {a['steps_lost']} ({a['retrained_s']:.1f} s) | {a['stalls_s']:.1f} s "
            f"({a['saves']}, {a['saves_skipped']}) | {a['rest_s']:.1f} s |"
        )
    return "\n".join(rows)


def _cell(e: dict[str, Any]) -> str:
    if not e.get("applied"):
        return "nothing to hit"
    if "down_s" not in e:
        return f"{e['applied']}: {e.get('outcome', '-')}"
    phases = "/".join(_s(e.get(k)) for k in ("detect_s", "restart_s", "restore_s", "first_step_s"))
    return f"{e['applied']}: down {e['down_s']:.1f} ({phases}), lost {e['steps_lost']}"


def fault_table(results: dict[str, Any]) -> str:
    """Every action, what each system did with it: down (detect/restart/start+restore/first
    step) in seconds and the steps lost."""
    systems = list(results["systems"])
    rows = ["| at | action | " + " | ".join(systems) + " |", "|---|---|" + "---|" * len(systems)]
    by_action: dict[tuple[float, str], dict[str, dict[str, Any]]] = {}
    for system in systems:
        for e in results["systems"][system]["events"]:
            by_action.setdefault((e["at_s"], e["what"]), {})[system] = e
    for (at, what), cells in sorted(by_action.items()):
        shown = [_cell(cells.get(system, {})) for system in systems]
        rows.append(f"| {at:.1f} s | {what} | " + " | ".join(shown) + " |")
    return "\n".join(rows)


def _commit() -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    return found.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="the window of each system")
    parser.add_argument("--mean-s", type=float, default=45.0, help="mean time between faults")
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="default: all three")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "goodput.json"))
    parser.add_argument("--table", metavar="JSON", help="only print the tables of a results file")
    parser.add_argument("--keep", metavar="DIR", help="keep every job's logs in DIR")
    args = parser.parse_args()
    if args.table:
        found = json.loads(Path(args.table).read_text())
        print(table(found) + "\n\n" + fault_table(found))
        return
    window_s = args.minutes * 60
    faults = schedule(args.seed, args.mean_s, window_s)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "machine": versions(),
        "argv": sys.argv[1:],
        "model": ["--width", str(args.width), "--layers", str(args.layers)],
        "window_s": window_s,
        "mean_s": args.mean_s,
        "seed": args.seed,
        "settings": {
            "back_s": BACK_S,
            "freeze_s": FREEZE_S,
            "settle_s": SETTLE_S,
            "pg_timeout_s": float(PG_TIMEOUT),
            "step_time_s": float(STEP_TIME),
            "calibration": f"a save every {CAL_EVERY} steps, {CAL_STEPS} steps",
        },
        "schedule": [asdict(f) for f in faults],
        "load_at_start": [round(x, 2) for x in os.getloadavg()],
        "systems": {},
    }
    for f in faults:
        print(f"{f.at_s:7.1f} s {f.kind}" + (f" (drawn: {f.drawn})" if f.drawn != f.kind else ""))
    out = Path(args.out)
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(tempfile.TemporaryDirectory())
        Path(tmp).mkdir(parents=True, exist_ok=True)
        redis = RedisServer(Path(tmp))
        redis.start()
        munged = MungeDaemon().start()
        bench = Bench(redis, munged.socket, Path(tmp), tuple(results["model"]))
        try:
            for system in args.systems.split(","):
                cal = bench.calibrate(system, args.mean_s)
                print(f"{system}: {json.dumps(cal)}", flush=True)
                cell = run_system(
                    bench, system, cal["every"], faults, window_s, cal["clean_step_s"]
                )
                results["systems"][system] = {"calibration": cal, **cell}
                print(f"{system}: {json.dumps(cell['account'])}", flush=True)
                out.write_text(json.dumps(results, indent=1) + "\n")
        finally:
            munged.stop()
            redis.stop()
    results["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out.write_text(json.dumps(results, indent=1) + "\n")
    print("\n" + table(results) + "\n\n" + fault_table(results))


if __name__ == "__main__":
    main()
