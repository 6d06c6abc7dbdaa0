"""Recovery from faults, nodeagent and torchrun side by side: same workload, same faults, one run.

K=3 simulated nodes on this machine, one worker each, run examples/train_ddp.py (DDP, gloo, CPU,
~30 ms a step, a checkpoint every 10 steps), launched by
- `nodeagent`: three agents and a real redis-server (heartbeat 1 s, lease 5 s, hang_timeout 10 s);
- `nodeagent+preload`: the same with `job.preload: [torch, torch._dynamo]`, the fault injected
  once the spare interpreters are ready (a job's steady state);
- `torchrun`: three `torchrun --nnodes=1:3 --rdzv-backend=c10d` launchers at their defaults
  (monitor interval 0.1 s);
- `torchrun-best`: the same with the best settings a torchrun user has: the rendezvous store not
  shared with the workers (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), keep-alive 1 s x 5 and a 1 s
  last call (the same 5 s to declare a node dead as nodeagent's lease), and a 10 s process-group
  timeout in the workload (the same 10 s as nodeagent's hang_timeout).

Each repetition is a fresh job: train to step 15, inject one fault, wait up to --bound seconds.
Everything is measured on one clock from the workload's own log lines, the same way for every
launcher, except detection:
- detect:     fault -> the launcher noticed (nodeagent: the event naming the fault, in Redis time;
              torchrun: the first log line of a surviving launcher after the fault);
- restart:    -> the last worker of the new world began running the script;
- import:     -> the last finished importing torch;
- init:       -> the last finished init_process_group;
- first step: -> every rank of the new world finished its first step (= recovery time).
Also the steps lost (the last step trained before the fault minus the step resumed from) and the
outcome: recovered, job lost (every launcher exited) or not recovered within the bound.

    .venv/bin/python bench/recovery.py [--reps 5] [--faults worker_sigkill,...] [--systems ...]

Writes bench/results/recovery.json (after each fault) and prints a table for docs/benchmarks.md;
`--table FILE` prints the table of a results file again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.preload import SPARE_MODULE  # noqa: E402
from tests.helpers.cluster import (  # noqa: E402
    LocalCluster,
    RedisServer,
    free_port,
    local_cluster,
    wait_for,
)
from tests.helpers.training import training_entrypoint  # noqa: E402

NODES = ("a", "b", "c")
EVERY = 10
STEP_TIME = 0.03
NODEAGENT_TIMING = {
    "heartbeat_interval": "1s",
    "lease_ttl": "5s",
    "stop_grace_period": "30s",
    "hang_timeout": "10s",
}
TORCHRUN_BEST_RDZV = "keep_alive_interval=1,keep_alive_max_attempt=5,last_call_timeout=1"
TORCHRUN_BEST_PG_TIMEOUT = "10"
PRELOAD = ("torch", "torch._dynamo")  # torch.optim imports torch._dynamo: 1.4 s more


# -- what a launcher must offer the harness ------------------------------------------------------


class Launch(Protocol):
    def start(self, *names: str) -> None: ...
    def settle(self) -> None: ...
    def lines(self) -> list[dict[str, Any]]: ...
    def noticed(self, t0: float, cause: str) -> float | None: ...
    def all_exited(self) -> bool: ...
    def rank0_node(self) -> str: ...
    def other_node(self) -> str: ...
    def processes(self, node: str) -> list[psutil.Process]: ...
    def launcher(self, node: str) -> psutil.Process: ...


def workload_lines(texts: Iterator[str]) -> list[dict[str, Any]]:
    out = []
    for text in texts:
        if text.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(text))
    return out


def rank_of_pid(lines: list[dict[str, Any]]) -> dict[int, int]:
    return {line["pid"]: line["rank"] for line in lines if line.get("event") == "initialized"}


@dataclass
class NodeagentLaunch:
    cluster: LocalCluster
    preload: bool = False

    def start(self, *names: str) -> None:
        self.cluster.start(*names)

    def settle(self) -> None:
        """With preload, the steady state of a job: every node's spare interpreter is ready."""
        if not self.preload:
            return

        def ready() -> bool:
            try:
                spares = [
                    child
                    for agent in self.cluster.agents.values()
                    for child in psutil.Process(agent.proc.pid).children()
                    if SPARE_MODULE in child.cmdline()
                ]
                idle = all(p.cpu_percent(0.3) < 5 for p in spares)
            except psutil.Error:  # a process exited meanwhile
                return False
            return len(spares) == len(self.cluster.agents) and idle

        wait_for(ready, 60, "spare interpreters ready")

    def lines(self) -> list[dict[str, Any]]:
        root = self.cluster.directory / "logs" / self.cluster.job
        texts = (
            text
            for log in root.glob("*/rank-*.log")
            for text in log.read_text(errors="replace").splitlines()
        )
        return workload_lines(texts)

    def noticed(self, t0: float, cause: str) -> float | None:
        for event in self.cluster.store.events("-", count=10_000):
            at = (event.at_ms or 0) / 1000
            if at >= t0 and event.type == cause:
                return at
        return None

    def all_exited(self) -> bool:
        return not any(agent.alive() for agent in self.cluster.agents.values())

    def rank0_node(self) -> str:
        return str(self.cluster.status()["members"][0])

    def other_node(self) -> str:
        return str(self.cluster.status()["members"][-1])

    def launcher(self, node: str) -> psutil.Process:
        return psutil.Process(self.cluster.agents[node].proc.pid)

    def processes(self, node: str) -> list[psutil.Process]:
        agent = self.launcher(node)
        return [agent, *agent.children(recursive=True)]


GLOG = re.compile(r"^[IWEF]\d{4} [\d:.]+ +(\d+) ")


@dataclass
class _Launcher:
    popen: subprocess.Popen[str]
    stdout: list[str] = field(default_factory=list)
    stderr: list[tuple[float, str]] = field(default_factory=list)  # (arrival time, line)


def _read(stream: IO[str], sink: Callable[[str], None]) -> None:
    with stream:
        for text in iter(stream.readline, ""):
            sink(text.rstrip("\n"))


@dataclass
class TorchrunLaunch:
    """K torchrun launchers of one elastic job, each in its own session, like K machines."""

    directory: Path
    best: bool
    port: int = field(default_factory=free_port)
    launchers: dict[str, _Launcher] = field(default_factory=dict)

    def start(self, *names: str) -> None:
        env = {**os.environ, "LOGLEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
        argv = [
            str(Path(sys.executable).with_name("torchrun")),
            f"--nnodes=1:{len(NODES)}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            "--rdzv-id=bench",
            "--max-restarts=10",
            "--monitor-interval=0.1",
        ]
        workload = training_entrypoint(self.directory, 100_000, EVERY, STEP_TIME)[1:]
        if self.best:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            argv.append(f"--rdzv-conf={TORCHRUN_BEST_RDZV}")
            workload += ["--pg-timeout", TORCHRUN_BEST_PG_TIMEOUT]
        for name in names:
            popen = subprocess.Popen(
                [*argv, *workload],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
                env=env,
                cwd=self.directory,
            )
            launcher = _Launcher(popen)
            assert popen.stdout and popen.stderr
            threading.Thread(
                target=_read, args=(popen.stdout, launcher.stdout.append), daemon=True
            ).start()
            threading.Thread(
                target=_read,
                args=(popen.stderr, lambda s, lr=launcher: lr.stderr.append((time.time(), s))),
                daemon=True,
            ).start()
            self.launchers[name] = launcher

    def settle(self) -> None:
        pass

    def lines(self) -> list[dict[str, Any]]:
        return workload_lines(text for lr in self.launchers.values() for text in list(lr.stdout))

    def noticed(self, t0: float, cause: str) -> float | None:
        """The first log line a surviving launcher wrote itself (not its workers) after t0."""
        firsts = []
        for launcher in self.launchers.values():
            if launcher.popen.returncode is not None and launcher.popen.returncode < 0:
                continue  # killed by the fault
            own = str(launcher.popen.pid)
            for at, text in list(launcher.stderr):
                match = GLOG.match(text)
                if at >= t0 and match and match.group(1) == own:
                    firsts.append(at)
                    break
        return min(firsts, default=None)

    def all_exited(self) -> bool:
        return all(lr.popen.poll() is not None for lr in self.launchers.values())

    def launcher(self, node: str) -> psutil.Process:
        return psutil.Process(self.launchers[node].popen.pid)

    def processes(self, node: str) -> list[psutil.Process]:
        launcher = self.launcher(node)
        return [launcher, *launcher.children(recursive=True)]

    def _store_host(self) -> str:
        for name in self.launchers:
            with contextlib.suppress(psutil.Error):
                for conn in self.launcher(name).net_connections("tcp"):
                    if conn.status == psutil.CONN_LISTEN and conn.laddr.port == self.port:
                        return name
        raise RuntimeError("no launcher listens on the rendezvous port")

    def _rank0_host(self) -> str:
        ranks = rank_of_pid(self.lines())
        for name in self.launchers:
            for proc in self.processes(name):
                if ranks.get(proc.pid) == 0:
                    return name
        raise RuntimeError("no launcher runs rank 0")

    def rank0_node(self) -> str:
        """The node that hosts the c10d store: losing it is the worst case for torchrun."""
        return self._store_host()

    def other_node(self) -> str:
        special = {self._store_host(), self._rank0_host()}
        return next(n for n in reversed(list(self.launchers)) if n not in special)

    def stop(self) -> None:
        for name, launcher in self.launchers.items():
            if launcher.popen.poll() is None:
                with contextlib.suppress(psutil.Error):
                    for proc in self.processes(name):
                        proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                launcher.popen.wait(10)
        for proc in psutil.process_iter(["cmdline"]):  # orphaned workers of killed launchers
            with contextlib.suppress(psutil.Error):
                if str(self.directory) in " ".join(proc.info["cmdline"] or []):
                    proc.kill()


# -- the faults ---------------------------------------------------------------------------------


def _worker(launch: Launch, node: str) -> psutil.Process:
    return next(p for p in launch.processes(node)[1:] if "train_ddp.py" in " ".join(p.cmdline()))


def _signal_all(procs: list[psutil.Process], sig: signal.Signals) -> list[psutil.Process]:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
    return procs


# Each returns the processes it froze, to thaw once the run is over.
def kill_worker(launch: Launch) -> list[psutil.Process]:
    _signal_all([_worker(launch, launch.other_node())], signal.SIGKILL)
    return []


def stop_worker(launch: Launch) -> list[psutil.Process]:
    return _signal_all([_worker(launch, launch.other_node())], signal.SIGSTOP)


def kill_rank0_node(launch: Launch) -> list[psutil.Process]:
    _signal_all(launch.processes(launch.rank0_node()), signal.SIGKILL)
    return []


def kill_other_node(launch: Launch) -> list[psutil.Process]:
    _signal_all(launch.processes(launch.other_node()), signal.SIGKILL)
    return []


def stop_other_node(launch: Launch) -> list[psutil.Process]:
    return _signal_all(launch.processes(launch.other_node()), signal.SIGSTOP)


def terminate_other_node(launch: Launch) -> list[psutil.Process]:
    _signal_all([launch.launcher(launch.other_node())], signal.SIGTERM)
    return []


def join_node(launch: Launch) -> list[psutil.Process]:
    launch.start(NODES[2])
    return []


@dataclass(frozen=True)
class Fault:
    before: int  # world size when the fault is injected
    after: int  # world size of the recovered job
    cause: str  # the nodeagent event that names it
    inject: Callable[[Launch], list[psutil.Process]]


FAULTS: dict[str, Fault] = {
    "worker_sigkill": Fault(3, 3, "worker_failed", kill_worker),
    "worker_sigstop_hang": Fault(3, 3, "worker_hung", stop_worker),
    "node_sigkill_rank0": Fault(3, 2, "node_lost", kill_rank0_node),
    "node_sigkill_other": Fault(3, 2, "node_lost", kill_other_node),
    "node_sigstop_other": Fault(3, 2, "node_lost", stop_other_node),
    "node_sigterm": Fault(3, 2, "node_leaving", terminate_other_node),
    "scale_up_join": Fault(2, 3, "node_joined", join_node),
}


# -- measuring, from the workload's log lines ---------------------------------------------------


def measure(
    lines: list[dict[str, Any]], t0: float, world: int, noticed: float | None
) -> dict[str, Any] | None:
    """The phases of the recovery to `world` after a fault at t0, or None if not recovered."""
    inits = {line["pid"]: line for line in lines if line.get("event") == "initialized"}
    new = {pid for pid, line in inits.items() if line["began"] >= t0}
    firsts: dict[int, dict[str, Any]] = {}
    for line in sorted(lines, key=lambda x: x["t"]):
        if line.get("event") == "step" and line["pid"] in new and line["world"] == world:
            firsts.setdefault(line["rank"], line)
    if set(firsts) != set(range(world)):
        return None
    pids = [line["pid"] for line in firsts.values()]
    began = max(inits[p]["began"] for p in pids)
    imported = max(inits[p]["imported"] for p in pids)
    initialized = max(inits[p]["t"] for p in pids)
    first_step = max(line["t"] for line in firsts.values())
    old_steps = [
        line["step"]
        for line in lines
        if line.get("event") == "step" and line["pid"] in inits and line["pid"] not in new
    ]
    resumed = [
        line["step"] for line in lines if line.get("event") == "resumed" and line["pid"] in pids
    ]
    detect = noticed if noticed is not None and noticed <= began else None
    return {
        "detect_s": None if detect is None else detect - t0,
        "restart_s": None if detect is None else began - detect,
        "import_s": imported - began,
        "init_s": initialized - imported,
        "first_step_s": first_step - initialized,
        "total_s": first_step - t0,
        "steps_lost": max(old_steps, default=0) - max(resumed, default=0),
    }


def _training(launch: Launch, world: int) -> bool:
    steps = [
        line
        for line in launch.lines()
        if line.get("event") == "step" and line["world"] == world and line["step"] >= 15
    ]
    return len({line["rank"] for line in steps}) == world


@contextlib.contextmanager
def launched(system: str, server: RedisServer, directory: Path, job: str) -> Iterator[Launch]:
    if system.startswith("nodeagent"):
        with local_cluster(
            server.url,
            directory,
            job=job,
            max_nodes=len(NODES),
            target_nodes=len(NODES),
            max_restarts=10,
            timing=NODEAGENT_TIMING,
            entrypoint=training_entrypoint(directory, 100_000, EVERY, STEP_TIME),
            job_options={"preload": list(PRELOAD)} if system == "nodeagent+preload" else {},
        ) as cluster:
            yield NodeagentLaunch(cluster, preload=system == "nodeagent+preload")
    else:
        launch = TorchrunLaunch(directory, best=system == "torchrun-best")
        try:
            yield launch
        finally:
            launch.stop()


def one_run(
    system: str, fault_name: str, rep: int, server: RedisServer, tmp: Path, bound: float
) -> dict[str, Any]:
    fault = FAULTS[fault_name]
    directory = tmp / f"{system}-{fault_name}-{rep}"
    directory.mkdir(parents=True)
    job = f"bench-{fault_name}-{rep}-{os.getpid()}".replace("_", "-")
    with launched(system, server, directory, job) as launch:
        launch.start(*NODES[: fault.before])
        wait_for(lambda: _training(launch, fault.before), 180, f"{system} training")
        launch.settle()
        t0 = time.time()
        frozen = fault.inject(launch)
        row = None
        outcome = "not recovered"
        while time.time() < t0 + bound:
            row = measure(launch.lines(), t0, fault.after, launch.noticed(t0, fault.cause))
            if row is not None:
                outcome = "recovered"
                break
            if launch.all_exited():
                outcome = "job lost"
                break
            time.sleep(0.5)
        if row is not None and row["detect_s"] is None:  # the log came in after the first step
            time.sleep(1)
            row = measure(launch.lines(), t0, fault.after, launch.noticed(t0, fault.cause))
        _signal_all(frozen, signal.SIGCONT)
    return {"outcome": outcome, **(row or {})}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    recovered = [r for r in runs if r["outcome"] == "recovered"]
    out: dict[str, Any] = {
        "recovered": len(recovered),
        "runs": len(runs),
        "outcomes": sorted({r["outcome"] for r in runs}),
    }
    for key in ("detect_s", "restart_s", "import_s", "init_s", "first_step_s", "total_s"):
        values = [r[key] for r in recovered if r.get(key) is not None]
        if values:
            out[key] = {
                "min": round(min(values), 3),
                "median": round(statistics.median(values), 3),
                "max": round(max(values), 3),
            }
    lost = [r["steps_lost"] for r in recovered]
    if lost:
        out["steps_lost"] = statistics.median(lost)
    return out


def table(results: dict[str, Any]) -> str:
    rows = [
        "| fault | launcher | recovered | total: min / median / max | detect | restart | import "
        "| init | first step | steps lost |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fault, systems in results["cells"].items():
        for system, cell in systems.items():
            s = cell["summary"]

            def med(key: str, s: dict[str, Any] = s) -> str:
                return f"{s[key]['median']:.2f}" if key in s else "-"

            total = (
                f"{s['total_s']['min']:.2f} / **{s['total_s']['median']:.2f}** / "
                f"{s['total_s']['max']:.2f}"
                if "total_s" in s
                else "-"
            )
            failed = "" if s["recovered"] == s["runs"] else f" ({', '.join(s['outcomes'])})"
            rows.append(
                f"| {fault} | {system} | {s['recovered']}/{s['runs']}{failed} | {total} "
                f"| {med('detect_s')} | {med('restart_s')} | {med('import_s')} | {med('init_s')} "
                f"| {med('first_step_s')} | {s.get('steps_lost', '-')} |"
            )
    return "\n".join(rows)


def versions() -> dict[str, str]:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "kernel": platform.release(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": str(os.cpu_count()),
        "redis": subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.strip(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--systems", default="nodeagent,torchrun,torchrun-best")
    parser.add_argument("--bound", type=float, default=90.0, help="seconds to wait for recovery")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "recovery.json"))
    parser.add_argument("--table", metavar="JSON", help="only print the table of a results file")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return
    systems = args.systems.split(",")
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": versions(),
        "nodeagent_timing": NODEAGENT_TIMING,
        "torchrun_best": {
            "env": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
            "rdzv_conf": TORCHRUN_BEST_RDZV,
            "pg_timeout_s": TORCHRUN_BEST_PG_TIMEOUT,
        },
        "checkpoint_every": EVERY,
        "bound_s": args.bound,
        "reps": args.reps,
        "cells": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            for fault in args.faults.split(","):
                runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
                for rep in range(args.reps):
                    for system in systems:  # interleaved, so a noisy minute hits every launcher
                        try:
                            run = one_run(system, fault, rep, server, Path(tmp), args.bound)
                        except Exception as exc:  # keep the other cells; say what broke
                            run = {"outcome": f"harness error: {exc!r}"[:300]}
                        runs[system].append(run)
                        print(
                            f"{fault} {system} {rep + 1}/{args.reps}: {json.dumps(run)}", flush=True
                        )
                results["cells"][fault] = {
                    s: {"runs": r, "summary": summarize(r)} for s, r in runs.items()
                }
                Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        finally:
            server.stop()
    print("\n" + table(results))


if __name__ == "__main__":
    main()
