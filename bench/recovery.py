"""Recovery from faults, nodeagent and torchrun side by side: same workload, same faults, one run.

K=3 simulated nodes on this machine, one worker each, run examples/train_ddp.py (DDP, gloo, CPU,
~30 ms a step, a checkpoint every 10 steps), launched by
- `nodeagent`: three agents and a real redis-server (heartbeat 1 s, lease 5 s, hang_timeout 10 s);
- `nodeagent+preload`: the same with `job.preload: [torch, torch._dynamo]`, the fault injected
  once the spare interpreters are ready (a job's steady state);
- `nodeagent+inplace`: the same agents, timing and preload with `job.recovery: in_place` and
  `timing.reform_timeout: 10s` (as long as hang_timeout), running examples/train_elastic.py
  instead (nodeagent.worker.elastic, a commit every step, the same ~30 ms step and a checkpoint
  every 10 steps): survivors keep their processes, only missing ranks are started (preloaded);
- `nodeagent+inplace-lease`: the same with `timing.peer_interval: off`, the members' watch of each
  other off (docs/design.md, "Fast detection"): a lost node is found when its lease lapses, as
  before the watch;
- `nodeagent+inplace-cold`: `nodeagent+inplace` without `job.preload`: a failed worker's
  replacement starts cold (imports torch), warming up while the survivors go on without its
  node (docs/worker.md, in-place step 5);
- `nodeagent+container`: `nodeagent` with the workers in a container image (the podman service, a
  small image the bench imports with the machine's Python and torch mounted read only, as
  tests/helpers/images.py builds it): what a container adds to a recovery. Its workers log
  their pids inside the containers' pid namespaces (the same in every container): a run is told
  by its log file, pid and generation instead, and survivors restarted are not counted;
- `torchrun`: three `torchrun --nnodes=1:3 --rdzv-backend=c10d` launchers at their defaults
  (monitor interval 0.1 s);
- `torchrun-best`: the same with the best settings a torchrun user has: the rendezvous store not
  shared with the workers (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), keep-alive 1 s x 5 and a 1 s
  last call (the same 5 s to declare a node dead as nodeagent's lease), and a 10 s process-group
  timeout in the workload (the same 10 s as nodeagent's hang_timeout);
- `torchft`: torchft (its lighthouse off the nodes, one replica group a node under torchft's own
  torchrun with restarts) running the same MLP through torchft's Manager, DDP and Optimizer
  wrappers, bench/peers/torchft_train.py in a virtual environment of its own
  (build/venv-torchft): survivors keep their processes, a newcomer heals from a peer
  (bench/peers/torchft_launch.py says how it is started); the lighthouse's heartbeat timeout at
  its default, 5 s. The light workload only: --heavy does not apply to it;
- `torchft-1s`: the same with a heartbeat timeout of 1 s;
- `torchft+hookfix`, `torchft-1s+hookfix`: the same with torchft's DDP comm hook replaced by one
  that survives a failed all-reduce (torchft's asserts, killing every survivor that was in an
  all-reduce with the lost peer: bench/peers/torchft_train.py, tolerant_hook);
- `dlrover`: DLRover (its job master off the nodes, `dlrover-run` on each node, a virtual
  environment of its own, build/venv-dlrover) running the same MLP as examples/train_ddp.py with
  DLRover's flash checkpoint to memory every 10 steps, bench/peers/dlrover_train.py: every fault
  restarts every node's training processes, which load the node's last checkpoint from memory
  (bench/peers/dlrover_launch.py says how it is started); DLRover's defaults (the master's
  rendezvous waits 60 s for a lost node) and the 120 s gloo timeout of DLRover's examples. The
  light workload only;
- `dlrover-fast`: the same with a 1 s rendezvous last call (`--rdzv-conf lastcall_timeout=1`),
  a flash checkpoint to memory every step and a 10 s gloo timeout (torchrun-best's);
- `lightning`, `transformers` (with `--frameworks`): `nodeagent`'s agents running a Lightning or
  a transformers `Trainer` fit (bench/frameworks_train.py: an MLP of 1024 x 4, 3.2 M parameters
  and AdamW, 38 MB of state; a step of 0.5 s of sleep, standing for a GPU's, over its compute)
  with the framework's own checkpoints every FRAMEWORK_DISK_EVERY steps to a directory every
  node shares, resumed as the framework's users do;
- `lightning+tier`, `transformers+tier`: the same with nodeagent.integrations' callback, a save
  into the memory tier every FRAMEWORK_TIER_EVERY steps with a copy on a peer, restored from
  memory (restart mode: the framework owns its process group).

Each repetition is a fresh job: train to step 15, inject one fault, wait up to --bound seconds.
A system whose survivors go on without the whole world coming back (torchft leaves a stopped
worker where it is, outside its quorum) is counted "survivors only" WORLD_WAIT_S after its
survivors stepped again: their figures (survivors stepping, stalled) are kept, the others are not.
Everything is measured on one clock from the workload's own log lines, the same way for every
launcher, except detection:
- detect:     fault -> the launcher noticed (nodeagent: the event naming the fault, in Redis time;
              torchrun: the first log line of a surviving launcher after the fault);
- restart:    -> the last worker of the new world began running the script;
- import:     -> the last finished importing torch;
- init:       -> the last finished init_process_group;
- first step: -> every rank of the new world finished its first step (= recovery time);
- survivors:  -> every worker the fault did not hit stepped again, in place (any world: with a
              warm-up, first at the smaller one), "-" where survivors restart;
- stalled:    the time a survivor did not train from the fault to a second after the whole
              world was back (the window, less its steps at its pace before the fault: a
              warm-up's second re-form, a newcomer's heal counted too), the most of any.
For in-place (and torchft, whose generation is its quorum's id, and DLRover, whose generation is
its agents' restart count and which restarts every process) the new world is the first
generation after the fault in which every rank stepped. Survivors do not restart, import or
init: restart and import are those of the processes started for it (a replacement, a joiner),
"-" when none was; init ends when every rank has joined the new group and synced (its "synced"
line: init_process_group, then the state of the rank with the highest commit broadcast to all),
so init holds what a restart spends loading the checkpoint, which for the other systems falls in
first step; first step is the same: every rank of the new world finished a step in the new
generation.
Also the save's stall (the framework systems): the median over rank 0's saves before the fault
of how much longer the two step intervals around a save step took than two at the pace of the
other steps (the save lands in one of them: Lightning's and the callbacks' in the step's own,
`Trainer`'s own save in the next), and that over the save interval, the stall a step.
Also the steps lost (the last step trained before the fault minus the step resumed from: the
checkpoint's, or for in-place the commit the first generation after the fault synced), the
survivors restarted (workers of the old world that the fault did not hit but that are not in the
new world: replaced although alive; 0 is in-place's goal), and the outcome: recovered, job lost
(every launcher exited) or not recovered within the bound.

`--heavy`: the same with a model and optimizer of about 1 GiB (an MLP of 9 hidden layers of 4096
units, 134 M parameters, SGD momentum: 2 x 537 MB), a checkpoint every HEAVY_EVERY steps, the
fault at step HEAVY_EVERY + 2 and hang_timeout and reform_timeout 30 s (a step takes ~4 s here,
a save ~6 s), by default for nodeagent+preload (a restart loads the checkpoint) and
nodeagent+inplace (survivors keep their state, newcomers receive it from a peer), three faults,
three repetitions.

    .venv/bin/python bench/recovery.py [--reps 5] [--faults worker_sigkill,...] [--systems ...]
    .venv/bin/python bench/recovery.py --heavy
    .venv/bin/python bench/recovery.py --frameworks

`--frameworks`: the framework systems, the fault at step FRAMEWORK_TRAIN_TO (mid-way through the
disk's interval), a worker kill and a node kill, three repetitions.

Writes bench/results/recovery.json (recovery-heavy.json, recovery-frameworks.json) after each
fault and prints a table for docs/benchmarks.md; `--table FILE` prints the table of a results
file again.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peers.dlrover_launch import DlroverLaunch, DlroverSettings  # noqa: E402
from bench.peers.torchft_launch import TorchftLaunch, TorchftSettings  # noqa: E402
from nodeagent.supervisor.spares import SPARE_MODULE  # noqa: E402
from tests.helpers.cluster import (  # noqa: E402
    LocalCluster,
    RedisServer,
    free_port,
    local_cluster,
    wait_for,
)
from tests.helpers.images import (  # noqa: E402
    build_image,
    clean_containers,
    container_processes,
    containers_section,
    host_software_mounts,
    remove_image,
)
from tests.helpers.training import training_entrypoint  # noqa: E402

NODES = ("a", "b", "c")
EVERY = 10
HEAVY_EVERY = 5  # a 1 GiB save takes seconds, so does a step: the fault comes at step 7
TRAIN_TO = 15  # the step every rank reaches before the fault (HEAVY_EVERY + 2 with --heavy)
STEP_TIME = 0.03
HEAVY_MODEL = ("--hidden", "4096", "--layers", "9")  # 134 M parameters, 537 MB; momentum too
ELASTIC = ROOT / "examples" / "train_elastic.py"
NODEAGENT_TIMING = {
    "heartbeat_interval": "1s",
    "lease_ttl": "5s",
    "stop_grace_period": "30s",
    "hang_timeout": "10s",
}
REFORM_TIMEOUT = "10s"  # nodeagent+inplace: a survivor stuck in a collective, killed as hung
TORCHRUN_BEST_RDZV = "keep_alive_interval=1,keep_alive_max_attempt=5,last_call_timeout=1"
TORCHRUN_BEST_PG_TIMEOUT = "10"
PRELOAD = ("torch", "torch._dynamo")  # torch.optim imports torch._dynamo: 1.4 s more
TORCHFT_VENV = ROOT / "build" / "venv-torchft"
# system -> (the lighthouse's heartbeat timeout, None for its default 5 s; the comm hook fixed)
TORCHFT_SYSTEMS = {
    "torchft": (None, False),
    "torchft-1s": (1000, False),
    "torchft+hookfix": (None, True),
    "torchft-1s+hookfix": (1000, True),
}
DLROVER_VENV = ROOT / "build" / "venv-dlrover"
# system -> (the rendezvous' lastcall_timeout, None for its default 60 s; steps between flash
# checkpoints to memory; the workload's gloo timeout in seconds)
DLROVER_SYSTEMS: dict[str, tuple[int | None, int, float]] = {
    "dlrover": (None, EVERY, 120.0),  # 120 s: DLRover's examples/pytorch (fcp_demo, mnist)
    "dlrover-fast": (1, 1, float(TORCHRUN_BEST_PG_TIMEOUT)),
}
FRAMEWORK_TRAIN = ROOT / "bench" / "frameworks_train.py"
# system -> (the framework, with nodeagent.integrations' callback)
FRAMEWORK_SYSTEMS = {
    "lightning": ("lightning", False),
    "lightning+tier": ("lightning", True),
    "transformers": ("transformers", False),
    "transformers+tier": ("transformers", True),
}
FRAMEWORK_DISK_EVERY = 20  # the framework's own checkpoints (the interval issue 54 measured)
FRAMEWORK_TIER_EVERY = 5  # the memory tier's
FRAMEWORK_TRAIN_TO = 30
FRAMEWORK_STEP_TIME = 0.5
# A save is committed within about a second at 40 MB and this heartbeat (docs/benchmarks.md,
# "Commit latency"), 3 s at 1 s: below the tier's interval of 5 steps (4 s here) either way.
FRAMEWORK_TIMING = (("heartbeat_interval", "250ms"),)
FRAMEWORK_FAULTS = ("worker_sigkill", "node_sigkill_other")


@dataclass(frozen=True)
class Workload:
    """What every system trains: the light default or --heavy."""

    every: int = EVERY
    train_to: int = TRAIN_TO
    model: tuple[str, ...] = ()
    timing: tuple[tuple[str, str], ...] = ()  # nodeagent's, over NODEAGENT_TIMING
    step_time: float = STEP_TIME  # seconds of sleep a step, on top of its compute

    def argv(self, system: str, directory: Path) -> list[str]:
        checkpoints = str(directory / "checkpoints")
        if system in FRAMEWORK_SYSTEMS:
            framework, tier = FRAMEWORK_SYSTEMS[system]
            return [
                *(sys.executable, str(FRAMEWORK_TRAIN), "--framework", framework),
                *(["--tier"] if tier else []),
                *("--every", str(self.every_of(system)), "--checkpoint-dir", checkpoints),
                *("--step-time", str(self.step_time), *self.model),
            ]
        if not inplace_system(system):
            entrypoint = training_entrypoint(directory, 100_000, self.every, self.step_time)
            return [*entrypoint, *self.model]
        return [
            *(sys.executable, str(ELASTIC), "--steps", "100000", "--checkpoint-dir", checkpoints),
            *("--checkpoint-every", str(self.every), "--step-time", str(self.step_time)),
            *self.model,
        ]

    def every_of(self, system: str) -> int:
        """Steps between saves: the memory tier's for a framework with the integration."""
        tiered = system in FRAMEWORK_SYSTEMS and FRAMEWORK_SYSTEMS[system][1]
        return FRAMEWORK_TIER_EVERY if tiered else self.every


def inplace_system(system: str) -> bool:
    """nodeagent+inplace, or nodeagent+inplace-lease (its members' watch off)."""
    return system.startswith("nodeagent+inplace")


def keeps_survivors(system: str) -> bool:
    """Measured in place: the survivors keep their processes (nodeagent+inplace*, torchft*).
    DLRover's do not, but its workload says when each process synced as torchft's does, so it
    is measured the same way: the new world is the first generation after the fault in which
    every rank stepped, survivors restarted counted from the pids."""
    return inplace_system(system) or system in TORCHFT_SYSTEMS or system in DLROVER_SYSTEMS


LIGHT = Workload()
# A heavy step takes ~4 s and a 1 GiB save ~6 s, a beat gap of over 10 s: not hangs.
HEAVY_TIMING = (("hang_timeout", "30s"), ("reform_timeout", "30s"))
HEAVY = Workload(HEAVY_EVERY, HEAVY_EVERY + 2, HEAVY_MODEL, HEAVY_TIMING)
# A GPU's step, as a sleep: the host's cores are free meanwhile for what saves and copies do.
FRAMEWORKS = Workload(
    FRAMEWORK_DISK_EVERY,
    FRAMEWORK_TRAIN_TO,
    ("--hidden", "1024", "--layers", "4"),
    FRAMEWORK_TIMING,
    FRAMEWORK_STEP_TIME,
)


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
    contained: bool = False  # the workers run in containers (not the agent's children)

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
        found = []
        for log in root.glob("*/rank-*.log"):
            lines = workload_lines(iter(log.read_text(errors="replace").splitlines()))
            if self.contained:  # every container's worker is the same pid in its namespace
                for line in lines:
                    line["pid"] = zlib.crc32(f"{log}:{line['pid']}:{line.get('gen')}".encode())
            found += lines
        return found

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
        found = [agent, *agent.children(recursive=True)]
        if self.contained:
            for pid in container_processes(self.cluster.job, node):
                with contextlib.suppress(psutil.Error):
                    found.append(psutil.Process(pid))
        return found


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
    workload: Workload
    port: int = field(default_factory=free_port)
    launchers: dict[str, _Launcher] = field(default_factory=dict)
    nnodes: str = f"1:{len(NODES)}"  # torchrun's --nnodes (min:max)

    def start(self, *names: str) -> None:
        env = {**os.environ, "LOGLEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
        argv = [
            str(Path(sys.executable).with_name("torchrun")),
            f"--nnodes={self.nnodes}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            "--rdzv-id=bench",
            "--max-restarts=10",
            "--monitor-interval=0.1",
        ]
        workload = self.workload.argv("torchrun", self.directory)[1:]
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


def training_process(launch: Launch, node: str) -> psutil.Process:
    """The node's training process (a preloaded one runs the script in a spare interpreter; a
    containerised one is the python in its container)."""
    if isinstance(launch, NodeagentLaunch) and launch.contained:
        return next(
            p for p in launch.processes(node)[1:] if "train_ddp.py" in " ".join(p.cmdline())
        )
    stepping = {line["pid"] for line in launch.lines() if line.get("event") == "step"}
    return next(p for p in launch.processes(node)[1:] if p.pid in stepping)


def signal_all(procs: list[psutil.Process], sig: signal.Signals) -> list[psutil.Process]:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
    return procs


# Each returns the processes it hit (a whole node for a node fault): the workers among them are
# no survivors; the harness sends them SIGCONT once the run is over, for those it froze.
def kill_worker(launch: Launch) -> list[psutil.Process]:
    return signal_all([training_process(launch, launch.other_node())], signal.SIGKILL)


def stop_worker(launch: Launch) -> list[psutil.Process]:
    return signal_all([training_process(launch, launch.other_node())], signal.SIGSTOP)


def hang_worker_main_thread(launch: Launch) -> list[psutil.Process]:
    """A rank stuck while its process runs: its main thread made to call libc's sleep() for a
    day wherever it was (gdb, given no symbols so that it stops the process for a moment only,
    then killed, which detaches it); its other threads (torch's, gloo's, torchft's Manager and
    its heartbeats) go on. Neither stopped by a signal nor dead."""
    proc = training_process(launch, launch.other_node())
    call = f"call ((unsigned int (*)(unsigned int)){_libc_sleep(proc.pid):#x})(86400)"
    command = ["gdb", "-nx", "-batch", "-p", str(proc.pid), "-ex", "set auto-solib-add off"]
    gdb = subprocess.Popen(
        [*command, "-ex", call], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        held, seen = 0, False

        def asleep() -> bool:
            """Five reads in a row (not the moment before gdb stopped it), or traced once and
            gone since: a system found it stuck (gdb's attach holds it stopped, then its call
            sleeps) before the reads did, and killed it."""
            nonlocal held, seen
            seen = seen or _traced(proc.pid)
            if _called_sleep(proc.pid):
                held += 1
                return held >= 5
            held = 0
            return seen and _gone(proc)

        wait_for(asleep, 30, "the main thread to sleep")
    finally:
        gdb.kill()
        gdb.wait()
    return [proc]


def _libc_sleep(pid: int) -> int:
    """Where libc's sleep() is in the process: its libc's base address plus the symbol's."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    first = next(line.split() for line in maps if line.endswith("/libc.so.6"))
    base, library = int(first[0].split("-")[0], 16), first[-1]
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", library], capture_output=True, text=True, check=True
    ).stdout
    defined = (line.split() for line in symbols.splitlines())
    offset = next(int(fields[0], 16) for fields in defined if fields[-1].startswith("sleep@@"))
    return base + offset


def _called_sleep(pid: int) -> bool:
    """gdb's call runs: the process is traced, running again, its main thread asleep."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
    return _tracer(status) and "\nState:\tS" in status and "nanosleep" in wchan


def _traced(pid: int) -> bool:
    try:
        return _tracer(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return False


def _tracer(status: str) -> bool:
    return re.search(r"^TracerPid:\s*[1-9]", status, re.MULTILINE) is not None


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_rank0_node(launch: Launch) -> list[psutil.Process]:
    return signal_all(launch.processes(launch.rank0_node()), signal.SIGKILL)


def kill_other_node(launch: Launch) -> list[psutil.Process]:
    return signal_all(launch.processes(launch.other_node()), signal.SIGKILL)


def stop_other_node(launch: Launch) -> list[psutil.Process]:
    return signal_all(launch.processes(launch.other_node()), signal.SIGSTOP)


def terminate_other_node(launch: Launch) -> list[psutil.Process]:
    node = launch.processes(launch.other_node())
    signal_all(node[:1], signal.SIGTERM)  # the launcher; it stops its workers
    return node


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
    "worker_main_thread_hang": Fault(3, 3, "worker_hung", hang_worker_main_thread),
    "node_sigkill_rank0": Fault(3, 2, "node_lost", kill_rank0_node),
    "node_sigkill_other": Fault(3, 2, "node_lost", kill_other_node),
    "node_sigstop_other": Fault(3, 2, "node_lost", stop_other_node),
    "node_sigterm": Fault(3, 2, "node_leaving", terminate_other_node),
    "scale_up_join": Fault(2, 3, "node_joined", join_node),
}
HEAVY_FAULTS = ("worker_sigkill", "node_sigkill_other", "scale_up_join")
DEFAULT_SYSTEMS = ("nodeagent", "torchrun", "torchrun-best")
HEAVY_SYSTEMS = ("nodeagent+preload", "nodeagent+inplace")


# -- measuring, from the workload's log lines ---------------------------------------------------


def _new_world(
    lines: list[dict[str, Any]], t0: float, world: int, in_place: bool
) -> tuple[set[tuple[int, int]], dict[int, dict[str, Any]]]:
    """(the (pid, generation) runs that began after t0, every rank's first step in the earliest
    generation after t0 whose `world` ranks all stepped; {} if none has yet).

    A run began after t0 when its process did (a restart) or, for in-place, when it synced
    after t0 (a survivor's new generation too). torchrun's workers all say generation 0."""
    if in_place:
        new = {(x["pid"], x["gen"]) for x in lines if x.get("event") == "synced" and x["t"] >= t0}
    else:
        late = {x["pid"] for x in lines if x.get("event") == "initialized" and x["began"] >= t0}
        new = {(x["pid"], x.get("gen", 0)) for x in lines if x["pid"] in late}
    firsts: dict[int, dict[int, dict[str, Any]]] = {}
    for line in sorted(lines, key=lambda x: x["t"]):
        key = (line["pid"], line.get("gen", 0))
        if line.get("event") == "step" and key in new and line["world"] == world:
            firsts.setdefault(key[1], {}).setdefault(line["rank"], line)
    complete = [g for g in sorted(firsts) if set(firsts[g]) == set(range(world))]
    return new, firsts[complete[0]] if complete else {}


def measure(
    lines: list[dict[str, Any]],
    t0: float,
    world: int,
    noticed: float | None,
    in_place: bool = False,
) -> dict[str, Any] | None:
    """The phases of the recovery to `world` after a fault at t0, or None if not recovered."""
    new, firsts = _new_world(lines, t0, world, in_place)
    if not firsts:
        return None
    pids = {line["pid"] for line in firsts.values()}
    gen = next(iter(firsts.values())).get("gen", 0)
    starts = {x["pid"]: x for x in lines if x.get("event") in ("initialized", "imported")}
    started = [starts[p] for p in pids if p in starts and starts[p]["began"] >= t0]
    began = max((x["began"] for x in started), default=None)
    imported = max((x["imported"] for x in started), default=None)
    if in_place:  # joined the new group and synced the state
        joined = [x for x in lines if x.get("event") == "synced" and (x["pid"], x["gen"]) in new]
        ready = [x for x in joined if x["pid"] in pids and x["gen"] == gen]
        initialized = max(x["t"] for x in ready)
        resumed = min(x["step"] for x in joined)  # the first generation after the fault's
    else:
        initialized = max(starts[p]["t"] for p in pids)
        resumed = max(
            (x["step"] for x in lines if x.get("event") == "resumed" and x["pid"] in pids),
            default=0,
        )
    first_step = max(line["t"] for line in firsts.values())
    old_steps = [
        x["step"]
        for x in lines
        if x.get("event") == "step" and (x["pid"], x.get("gen", 0)) not in new
    ]
    detect = noticed if noticed is not None and noticed <= (began or initialized) else None
    before_init = imported if started else detect
    return {
        "detect_s": None if detect is None else detect - t0,
        "restart_s": None if detect is None or began is None else began - detect,
        "import_s": None if began is None or imported is None else imported - began,
        "init_s": None if before_init is None else initialized - before_init,
        "first_step_s": first_step - initialized,
        "total_s": first_step - t0,
        "steps_lost": max(old_steps, default=0) - resumed,
        "pids": sorted(pids),
    }


def _training(launch: Launch, world: int, step: int) -> bool:
    steps = [
        line
        for line in launch.lines()
        if line.get("event") == "step" and line["world"] == world and line["step"] >= step
    ]
    return len({line["rank"] for line in steps}) == world


@contextlib.contextmanager
def launched(
    system: str, server: RedisServer, directory: Path, job: str, workload: Workload
) -> Iterator[Launch]:
    if system in TORCHFT_SYSTEMS:
        heartbeat_ms, hook_fix = TORCHFT_SYSTEMS[system]
        settings = TorchftSettings(TORCHFT_VENV, heartbeat_ms, hook_fix, STEP_TIME)
        torchft = TorchftLaunch(directory, settings)
        try:
            yield torchft
        finally:
            torchft.stop()
    elif system in DLROVER_SYSTEMS:
        dlrover = DlroverLaunch(directory, dlrover_settings(system), job)
        try:
            yield dlrover
        finally:
            dlrover.stop()
    elif system.startswith("nodeagent") or system in FRAMEWORK_SYSTEMS:
        preload = system == "nodeagent+preload" or (
            inplace_system(system) and not system.endswith("-cold")
        )
        options: dict[str, Any] = {"preload": list(PRELOAD)} if preload else {}
        memory = Path("/dev/shm") / f"nodeagent-bench-{job}"
        if FRAMEWORK_SYSTEMS.get(system, ("", False))[1]:
            options["checkpoint"] = {
                "memory_size": "512MiB",
                "memory_dir": str(memory),
                "replicas": 1,
                "replication": {"auth": "none"},
            }
        timing = dict(NODEAGENT_TIMING)
        if inplace_system(system):
            options["recovery"] = "in_place"
            timing["reform_timeout"] = REFORM_TIMEOUT
        if system.endswith("-lease"):  # the members' watch off: a lost node found by its lease
            timing["peer_interval"] = "off"
        timing.update(workload.timing)
        contained = system == "nodeagent+container"
        node_options: dict[str, Any] = {}
        if contained:
            image = build_image(job)
            options["container"] = {"image": image, "mounts": host_software_mounts(directory)}
            node_options["containers"] = containers_section(directory)
        with (
            contextlib.ExitStack() as cleanup,
            local_cluster(
                server.url,
                directory,
                job=job,
                max_nodes=len(NODES),
                target_nodes=len(NODES),
                max_restarts=10,
                timing=timing,
                entrypoint=workload.argv(system, directory),
                job_options=options,
                node_options=node_options,
            ) as cluster,
        ):
            cleanup.callback(shutil.rmtree, memory, ignore_errors=True)
            if contained:
                cleanup.callback(remove_image, image)
                cleanup.callback(clean_containers, job)  # what a killed node's agent left running
            yield NodeagentLaunch(cluster, preload=preload, contained=contained)
    else:
        launch = TorchrunLaunch(directory, best=system == "torchrun-best", workload=workload)
        try:
            yield launch
        finally:
            launch.stop()


def _alive_workers(lines: list[dict[str, Any]]) -> set[int]:
    """The training processes that have stepped and still run (not zombies)."""
    alive = set()
    for pid in {line["pid"] for line in lines if line.get("event") == "step"}:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
    return alive


def one_run(
    system: str,
    fault_name: str,
    rep: int,
    server: RedisServer,
    tmp: Path,
    bound: float,
    workload: Workload = LIGHT,
) -> dict[str, Any]:
    fault = FAULTS[fault_name]
    in_place = keeps_survivors(system)
    directory = tmp / f"{system}-{fault_name}-{rep}"
    directory.mkdir(parents=True)
    job = f"bench-{system}-{fault_name}-{rep}-{os.getpid()}".replace("_", "-").replace("+", "-")
    with launched(system, server, directory, job, workload) as launch:
        launch.start(*NODES[: fault.before])
        wait_for(
            lambda: _training(launch, fault.before, workload.train_to), 300, f"{system} training"
        )
        launch.settle()
        old = _alive_workers(launch.lines())
        t0 = time.time()
        hit = fault.inject(launch)
        survivors = old - {proc.pid for proc in hit}
        row = None
        outcome = "not recovered"
        stepping = None  # in place: when every survivor stepped again, at whatever world
        while time.time() < t0 + bound:
            lines = launch.lines()
            row = measure(lines, t0, fault.after, launch.noticed(t0, fault.cause), in_place)
            if row is not None:
                outcome = "recovered"
                break
            if launch.all_exited():
                outcome = "job lost"
                break
            if in_place and stepping is None:
                stepping = survivors_stepping(lines, t0, survivors)
            if stepping is not None and time.time() > t0 + stepping + WORLD_WAIT_S:
                outcome = "survivors only"  # torchft leaves a stopped worker where it is
                break
            time.sleep(0.5)
        if row is not None and row["detect_s"] is None:  # the log came in after the first step
            time.sleep(1)
            row = measure(
                launch.lines(), t0, fault.after, launch.noticed(t0, fault.cause), in_place
            )
        signal_all(hit, signal.SIGCONT)
        if row is None and stepping is not None and outcome == "survivors only":
            lines = launch.lines()
            row = {"survivors_s": stepping, "pids": sorted(survivors)}  # none restarted
            row["stalled_s"] = survivors_stalled(lines, t0, survivors, t0 + stepping)
        elif row is not None and in_place:  # the stall window's tail, while the job still runs
            time.sleep(STALL_TAIL_S + 0.5)
            lines = launch.lines()
            row["survivors_s"] = survivors_stepping(lines, t0, survivors)
            row["stalled_s"] = survivors_stalled(lines, t0, survivors, t0 + row["total_s"])
        if row is not None and system in FRAMEWORK_SYSTEMS:
            stall = save_stall(launch.lines(), t0, workload.every_of(system))
            row["save_stall_s"] = stall
            row["stall_per_step_s"] = None if stall is None else stall / workload.every_of(system)
    if row is not None and system == "nodeagent+container":  # no host pids to follow
        row.pop("pids")
    elif row is not None:
        row["survivors_restarted"] = len(survivors - set(row.pop("pids")))
    return {"outcome": outcome, **(row or {})}


def save_stall(lines: list[dict[str, Any]], t0: float, every: int) -> float | None:
    """The median over rank 0's saves before the fault at t0 (each after a step s that is a
    multiple of `every`) of how much longer the intervals s-1 -> s -> s+1 took than two at the
    median pace of the intervals with no save in them; None without such a save."""
    times = {
        x["step"]: x["t"]
        for x in lines
        if x.get("event") == "step" and x["rank"] == 0 and x["t"] < t0
    }
    plain = [
        times[s] - times[s - 1]
        for s in times
        if s - 1 in times and s % every not in (0, 1) and s > 3  # the first steps warm up
    ]
    stalls = [
        times[s + 1] - times[s - 1]
        for s in times
        if s % every == 0 and s - 1 in times and s + 1 in times and s > 3
    ]
    if not plain or not stalls:
        return None
    return max(0.0, float(statistics.median(stalls) - 2 * statistics.median(plain)))


# A fault that leaves its world short (torchft leaves a stopped worker where it is, out of its
# quorum): the survivors' figures are taken this long after they stepped again.
WORLD_WAIT_S = 15.0
KEPT_KEYS = ("survivors_s", "stalled_s")  # also of a run whose survivors went on short
STALL_TAIL_S = 1.0  # how long after the whole world is back a survivor's stalls still count


def survivors_stalled(
    lines: list[dict[str, Any]], t0: float, survivors: set[int], back: float
) -> float | None:
    """The most any survivor did not train from the fault at t0 until STALL_TAIL_S after the
    whole world was back (`back`): the window less its steps there at its median pace of the
    ten steps before the fault. None without such a pace."""
    worst = None
    end = back + STALL_TAIL_S
    for pid in survivors:
        times = sorted(x["t"] for x in lines if x.get("event") == "step" and x["pid"] == pid)
        before = [t for t in times if t < t0][-11:]
        if len(before) < 3:
            return None
        pace = statistics.median(b - a for a, b in itertools.pairwise(before))
        taken = sum(1 for t in times if t0 <= t < end)
        stalled = max(0.0, (end - t0) - taken * pace)
        worst = stalled if worst is None else max(worst, stalled)
    return worst


def survivors_stepping(lines: list[dict[str, Any]], t0: float, survivors: set[int]) -> float | None:
    """Seconds from the fault at t0 until every survivor stepped in a generation after it (in
    place, at whatever world: with a warm-up the job first goes on without the newcomer's
    node); None if one has not, or was restarted."""
    synced = {(x["pid"], x["gen"]) for x in lines if x.get("event") == "synced" and x["t"] >= t0}
    firsts: dict[int, float] = {}
    for line in lines:
        key = (line["pid"], line.get("gen", 0))
        if line.get("event") == "step" and line["pid"] in survivors and key in synced:
            firsts[line["pid"]] = min(firsts.get(line["pid"], line["t"]), line["t"])
    if not survivors or set(firsts) != survivors:
        return None
    return max(firsts.values()) - t0


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    recovered = [r for r in runs if r["outcome"] == "recovered"]
    kept = [r for r in runs if r["outcome"] in ("recovered", "survivors only")]
    out: dict[str, Any] = {
        "recovered": len(recovered),
        "runs": len(runs),
        "outcomes": sorted({r["outcome"] for r in runs}),
    }
    for key in (
        "detect_s",
        "restart_s",
        "import_s",
        "init_s",
        "first_step_s",
        "total_s",
        "survivors_s",
        "stalled_s",
        "save_stall_s",
        "stall_per_step_s",
    ):
        values = [
            r[key] for r in (kept if key in KEPT_KEYS else recovered) if r.get(key) is not None
        ]
        if values:
            out[key] = {
                "min": round(min(values), 3),
                "median": round(statistics.median(values), 3),
                "max": round(max(values), 3),
            }
    for key in ("steps_lost", "survivors_restarted"):
        counts = [r[key] for r in recovered if key in r]
        if counts:
            out[key] = statistics.median(counts)
    return out


def table(results: dict[str, Any]) -> str:
    rows = [
        "| fault | launcher | recovered | total: min / median / max | detect | restart | import "
        "| init | first step | steps lost | survivors restarted | survivors stepping "
        "| survivors stalled | save's stall: a save / a step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
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
            stall = (
                f"{s['save_stall_s']['median'] * 1000:.0f} ms / "
                f"{s['stall_per_step_s']['median'] * 1000:.1f} ms"
                if "save_stall_s" in s
                else "-"
            )
            rows.append(
                f"| {fault} | {system} | {s['recovered']}/{s['runs']}{failed} | {total} "
                f"| {med('detect_s')} | {med('restart_s')} | {med('import_s')} | {med('init_s')} "
                f"| {med('first_step_s')} | {s.get('steps_lost', '-')} "
                f"| {s.get('survivors_restarted', '-')} | {med('survivors_s')} "
                f"| {med('stalled_s')} | {stall} |"
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


def torchft_settings() -> dict[str, Any]:
    """The lighthouse's and each node's command lines and the versions in torchft's venv."""
    probe = "import importlib.metadata as m; print(m.version('torchft'), m.version('torch'))"
    python = str(TORCHFT_VENV / "bin" / "python")
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True)
    torchft, torch = found.stdout.split()
    settings = TorchftSettings(TORCHFT_VENV, step_time=STEP_TIME)
    return {
        "torchft": torchft,
        "torch": torch,
        "lighthouse": " ".join(settings.lighthouse_argv(0)[1:]),
        "heartbeat_timeout_ms": {s: ms or 5000 for s, (ms, _) in TORCHFT_SYSTEMS.items()},
        "hook_fix": [s for s, (_, fix) in TORCHFT_SYSTEMS.items() if fix],
        "node": " ".join(settings.node_argv("NODE")[1:]),
    }


def dlrover_settings(system: str) -> DlroverSettings:
    lastcall, save_every, pg_timeout = DLROVER_SYSTEMS[system]
    return DlroverSettings(DLROVER_VENV, lastcall, save_every, pg_timeout, STEP_TIME)


def dlrover_report() -> dict[str, Any]:
    """The master's and each node's command lines and the versions in DLRover's venv."""
    probe = "import importlib.metadata as m; print(m.version('dlrover'), m.version('torch'))"
    python = str(DLROVER_VENV / "bin" / "python")
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True)
    dlrover, torch = found.stdout.split()
    run = Path("RUN")
    return {
        "dlrover": dlrover,
        "torch": torch,
        "master": " ".join(dlrover_settings("dlrover").master_argv(0, "JOB")[1:]),
        "node": {
            s: " ".join(dlrover_settings(s).node_argv(run / "checkpoints", run / "logs")[1:])
            for s in DLROVER_SYSTEMS
        },
        "node_env": "NODE_RANK=i NODE_ID=i DLROVER_MASTER_ADDR=127.0.0.1:PORT "
        "ELASTIC_JOB_NAME=JOB-NODE",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heavy", action="store_true", help="a model and optimizer of 1 GiB")
    parser.add_argument(
        "--frameworks", action="store_true", help="Lightning and transformers, with the tier or not"
    )
    parser.add_argument("--reps", type=int, help="default 5, 3 with --heavy")
    parser.add_argument("--faults", help="default all, with --heavy: " + ",".join(HEAVY_FAULTS))
    parser.add_argument(
        "--systems",
        help=f"default {','.join(DEFAULT_SYSTEMS)}; with --heavy {','.join(HEAVY_SYSTEMS)}; "
        f"with --frameworks {','.join(FRAMEWORK_SYSTEMS)}",
    )
    parser.add_argument("--bound", type=float, default=90.0, help="seconds to wait for recovery")
    parser.add_argument(
        "--out", help="default bench/results/recovery.json (-heavy.json, -frameworks.json)"
    )
    parser.add_argument("--table", metavar="JSON", help="only print the table of a results file")
    parser.add_argument("--keep", metavar="DIR", help="keep every run's logs in DIR")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return
    faults: tuple[str, ...] = tuple(FAULTS)
    systems: tuple[str, ...] = DEFAULT_SYSTEMS
    workload, reps, name = LIGHT, 5, "recovery"
    if args.heavy:
        workload, reps, faults, systems, name = (
            HEAVY,
            3,
            HEAVY_FAULTS,
            HEAVY_SYSTEMS,
            "recovery-heavy",
        )
    elif args.frameworks:
        workload, reps, faults, name = FRAMEWORKS, 3, FRAMEWORK_FAULTS, "recovery-frameworks"
        systems = tuple(FRAMEWORK_SYSTEMS)
    reps = args.reps or reps
    faults = tuple(args.faults.split(",")) if args.faults else faults
    systems = tuple(args.systems.split(",")) if args.systems else systems
    out = Path(args.out or ROOT / "bench" / "results" / f"{name}.json")
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": versions(),
        "nodeagent_timing": {**NODEAGENT_TIMING, **dict(workload.timing)},
        "torchrun_best": {
            "env": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
            "rdzv_conf": TORCHRUN_BEST_RDZV,
            "pg_timeout_s": TORCHRUN_BEST_PG_TIMEOUT,
        },
        "reform_timeout": dict(workload.timing).get("reform_timeout", REFORM_TIMEOUT),
        "checkpoint_every": {s: workload.every_of(s) for s in systems},
        "fault_at_step": workload.train_to,
        "model": " ".join(workload.model) or "--hidden 64 --layers 1",
        "bound_s": args.bound,
        "reps": reps,
        "cells": {},
    }
    if any(s in TORCHFT_SYSTEMS for s in systems):
        results["torchft"] = torchft_settings()
    if any(s in DLROVER_SYSTEMS for s in systems):
        results["dlrover"] = dlrover_report()
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(tempfile.TemporaryDirectory())
        Path(tmp).mkdir(parents=True, exist_ok=True)
        server = RedisServer(Path(tmp))
        server.start()
        try:
            for fault in faults:
                runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
                for rep in range(reps):
                    for system in systems:  # interleaved, so a noisy minute hits every launcher
                        try:
                            run = one_run(
                                system, fault, rep, server, Path(tmp), args.bound, workload
                            )
                        except Exception as exc:  # keep the other cells; say what broke
                            run = {"outcome": f"harness error: {exc!r}"[:300]}
                        runs[system].append(run)
                        print(f"{fault} {system} {rep + 1}/{reps}: {json.dumps(run)}", flush=True)
                results["cells"][fault] = {
                    s: {"runs": r, "summary": summarize(r)} for s, r in runs.items()
                }
                out.write_text(json.dumps(results, indent=1) + "\n")
        finally:
            server.stop()
    print("\n" + table(results))


if __name__ == "__main__":
    main()
