"""DLRover as bench/recovery.py runs it: a job master off the nodes and `dlrover-run` on each node.

DLRover without Kubernetes: its job master is `python -m dlrover.python.master.main --platform
local` (what `dlrover-run --standalone` starts for one node, dlrover/trainer/torch/elastic_run.py,
_launch_dlrover_local_master), here a process of its own off the nodes (killing a node never
kills it), told the job has 3 nodes. Each node is DLRover's venv's `dlrover-run --nnodes=1:3
--nproc-per-node=1 --max-restarts=10` with NODE_RANK, NODE_ID and DLROVER_MASTER_ADDR set, as
DLRover documents for a job whose nodes another system starts (docs/blogs/flash_checkpoint.md,
"Run a Distributed Job on a k8s Cluster", the Kubeflow case; docs/tutorial/check_node_health.md),
in a session of its own, like a machine: a node fault kills or freezes its agent and worker.
Every fault restarts the training processes of every node (DLRover's ElasticTrainingAgent is
torchelastic's: a failed worker, or a node waiting in the master's rendezvous, restarts the
worker group); a restarted process loads the node's last flash checkpoint from the shared memory
the agent keeps (bench/peers/dlrover_train.py).

Each node has a job name of its own (ELASTIC_JOB_NAME, which dlrover-run makes the run id): the
flash checkpoint's shared memory and local sockets are named after it (/dev/shm/NAME_ckpt_shm_0,
/tmp/ckpt_sock/NAME/), so three nodes on one machine do not share them as they would share
nothing on three machines. DLRover's event files go to the run's directory. Each node's output
goes to NODE.out and NODE.err in the run's directory, the master's to master.log.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.helpers.cluster import free_port

SCRIPT = Path(__file__).with_name("dlrover_train.py")
NODES = 3
MASTER_OPTIONS = ("--platform", "local", "--node_num", str(NODES), "--xpu_type", "cpu")
RUN_OPTIONS = (f"--nnodes=1:{NODES}", "--nproc-per-node=1", "--max-restarts=10")
Popen = subprocess.Popen[bytes]

# An agent's own lines that say it noticed a fault (dlrover/python/elastic_agent/torch/
# training.py): a worker of its node failed, or a node waits in the master's rendezvous.
NOTICED = re.compile(r"\] (The worker fails with|\[[^]]*\] Detected \d+ new nodes)")
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[[A-Z]+\] ")


@dataclass(frozen=True)
class DlroverSettings:
    """What a DLRover system sets: its venv, the master's rendezvous last call (None for
    DLRover's default, 60 s), the steps between flash checkpoints to memory and the workload's
    gloo timeout."""

    venv: Path
    lastcall_timeout_s: int | None = None
    save_every: int = 10
    pg_timeout_s: float = 120.0
    step_time: float = 0.03

    def master_argv(self, port: int, job: str) -> list[str]:
        python = str(self.venv / "bin" / "python")
        module = ("-u", "-m", "dlrover.python.master.main")
        return [python, *module, *MASTER_OPTIONS, "--job_name", job, "--port", str(port)]

    def node_argv(self, checkpoints: Path, logs: Path) -> list[str]:
        argv = [str(self.venv / "bin" / "dlrover-run"), *RUN_OPTIONS, f"--log-dir={logs}"]
        if self.lastcall_timeout_s is not None:
            argv.append(f"--rdzv-conf=lastcall_timeout={self.lastcall_timeout_s}")
        script = [str(SCRIPT), "--checkpoint-dir", str(checkpoints)]
        script += ["--save-every", str(self.save_every), "--pg-timeout", str(self.pg_timeout_s)]
        return [*argv, *script, "--step-time", str(self.step_time)]


def log_time(text: str) -> float | None:
    """The time of a DLRover log line ("[2026-11-26 09:16:19,275] [ERROR] ...", local time)."""
    match = STAMP.match(text)
    if match is None:
        return None
    stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def first_notice(texts: Iterable[str], t0: float) -> float | None:
    """When an agent's log first says, at or after t0, that it noticed a fault."""
    for text in texts:
        at = log_time(text)
        if at is not None and at >= t0 - 0.001 and NOTICED.search(text):
            return at  # the log's stamps are in milliseconds; t0 is not rounded
    return None


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class DlroverLaunch:
    """A DLRover job for the harness: the master, then one dlrover-run per node started."""

    directory: Path
    settings: DlroverSettings
    job: str = "bench"
    port: int = field(default_factory=free_port)
    master: Popen | None = None
    nodes: dict[str, Popen] = field(default_factory=dict)

    def _spawn(self, argv: list[str], out: str, err: str, env: dict[str, str]) -> Popen:
        with open(self.directory / out, "ab") as stdout, open(self.directory / err, "ab") as stderr:
            return subprocess.Popen(
                argv,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                env=env,
                cwd=self.directory,
            )

    def _env(self, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            PYTHONUNBUFFERED="1",
            DLROVER_MASTER_ADDR=f"127.0.0.1:{self.port}",
            DLROVER_EVENT_FILE_DIR=str(self.directory / f"events-{name}"),
        )
        return env

    def node_job(self, name: str) -> str:
        return f"{self.job}-{name}"

    def start(self, *names: str) -> None:
        if self.master is None:
            argv = self.settings.master_argv(self.port, self.job)
            self.master = self._spawn(argv, "master.log", "master.log", self._env("master"))
            deadline = time.time() + 60
            while not _listening(self.port):
                if self.master.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the DLRover master did not listen on {self.port}")
                time.sleep(0.1)
        for name in names:  # a node started again (after a kill) keeps its rank
            rank = str(list(self.nodes).index(name) if name in self.nodes else len(self.nodes))
            env = {**self._env(name), "NODE_RANK": rank, "NODE_ID": rank}
            env["ELASTIC_JOB_NAME"] = self.node_job(name)
            argv = self.settings.node_argv(
                self.directory / f"checkpoints-{name}", self.directory / f"logs-{name}"
            )
            self.nodes[name] = self._spawn(argv, f"{name}.out", f"{name}.err", env)

    def settle(self) -> None:
        pass

    def lines(self) -> list[dict[str, Any]]:
        found = []
        for name in self.nodes:
            for text in (self.directory / f"{name}.out").read_text(errors="replace").splitlines():
                if text.startswith("{"):
                    with contextlib.suppress(ValueError):
                        found.append(json.loads(text))
        return found

    def noticed(self, t0: float, cause: str) -> float | None:
        """The first line of an agent not hit by the fault (not killed, not stopped) that says
        a worker failed or a node waits to rejoin."""
        firsts = []
        for name, popen in self.nodes.items():
            with contextlib.suppress(psutil.Error):
                if popen.poll() is not None or self.launcher(name).status() in (
                    psutil.STATUS_STOPPED,
                    psutil.STATUS_ZOMBIE,
                ):
                    continue
            err = (self.directory / f"{name}.err").read_text(errors="replace").splitlines()
            at = first_notice(err, t0)
            if at is not None:
                firsts.append(at)
        return min(firsts, default=None)

    def all_exited(self) -> bool:
        return all(popen.poll() is not None for popen in self.nodes.values())

    def rank0_node(self) -> str:
        """The node of rank 0 (which also holds the workers' TCPStore): node rank 0's."""
        return next(iter(self.nodes))

    def other_node(self) -> str:
        return list(self.nodes)[-1]

    def launcher(self, node: str) -> psutil.Process:
        return psutil.Process(self.nodes[node].pid)

    def processes(self, node: str) -> list[psutil.Process]:
        launcher = self.launcher(node)
        return [launcher, *launcher.children(recursive=True)]

    def stop(self) -> None:
        for name, popen in self.nodes.items():
            if popen.poll() is None:
                with contextlib.suppress(psutil.Error):
                    for proc in self.processes(name):
                        proc.kill()
        for popen in [*self.nodes.values(), *([self.master] if self.master else [])]:
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(10)
        for proc in psutil.process_iter(["cmdline"]):  # workers of a killed agent, if any
            with contextlib.suppress(psutil.Error):
                if str(self.directory) in " ".join(proc.info["cmdline"] or []):
                    proc.kill()
        for name in self.nodes:  # what a killed agent leaves behind
            node_job = self.node_job(name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{node_job}_ckpt_shm_0")
            shutil.rmtree(f"/tmp/ckpt_sock/{node_job}", ignore_errors=True)
