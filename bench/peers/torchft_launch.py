"""torchft as bench/recovery.py runs it: a lighthouse and one replica group a node.

The lighthouse is a process of its own, off the nodes (killing a node never kills it), started
with `--min_replicas 1 --quorum_tick_ms 100`, its default join timeout (60 s: a quorum waits that
long for a heartbeating replica that has not asked to join) and, by default, its default heartbeat
timeout (5 s; `torchft-1s`: 1 s). Each node is torchft's venv's torchrun (`--nproc-per-node 1
--max-restarts 10 --monitor-interval 0.1`, its own single-node c10d rendezvous, as upstream's
train_ddp.py is launched) in a session of its own, like a machine: a node fault kills it and its
worker; a worker fault kills the worker, which torchrun starts again and which heals from a peer
(torchft itself starts no process). Each node's output goes to NODE.out and NODE.err in the
run's directory, the lighthouse's to lighthouse.log.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.helpers.cluster import free_port

SCRIPT = Path(__file__).with_name("torchft_train.py")
LIGHTHOUSE_OPTIONS = ("--min_replicas", "1", "--quorum_tick_ms", "100")
TORCHRUN_OPTIONS = (
    "--nnodes=1",
    "--nproc-per-node=1",
    "--rdzv-backend=c10d",
    "--max-restarts=10",
    "--monitor-interval=0.1",
)
Popen = subprocess.Popen[bytes]


@dataclass(frozen=True)
class TorchftSettings:
    """What a torchft system sets: the venv it runs in, the lighthouse's heartbeat timeout and
    whether the workload replaces torchft's DDP comm hook (torchft_train.tolerant_hook)."""

    venv: Path
    heartbeat_timeout_ms: int | None = None  # None: the lighthouse's default (5000)
    hook_fix: bool = False
    step_time: float = 0.03

    def lighthouse_argv(self, port: int) -> list[str]:
        argv = [str(self.venv / "bin" / "torchft_lighthouse"), *LIGHTHOUSE_OPTIONS]
        if self.heartbeat_timeout_ms is not None:
            argv += ["--heartbeat_timeout_ms", str(self.heartbeat_timeout_ms)]
        return [*argv, "--bind", f"127.0.0.1:{port}"]

    def node_argv(self, name: str) -> list[str]:
        rendezvous = (f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id=torchft-{name}")
        script = [str(SCRIPT), "--step-time", str(self.step_time)]
        script += ["--hook-fix"] if self.hook_fix else []
        return [str(self.venv / "bin" / "torchrun"), *TORCHRUN_OPTIONS, *rendezvous, *script]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class TorchftLaunch:
    """A torchft job for the harness: the lighthouse, then one torchrun per node started."""

    directory: Path
    settings: TorchftSettings
    port: int = field(default_factory=free_port)
    lighthouse: Popen | None = None
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

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(PYTHONUNBUFFERED="1", TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{self.port}")
        return env

    def start(self, *names: str) -> None:
        if self.lighthouse is None:
            argv = self.settings.lighthouse_argv(self.port)
            self.lighthouse = self._spawn(argv, "lighthouse.log", "lighthouse.log", self._env())
            deadline = time.time() + 30
            while not _listening(self.port):
                if self.lighthouse.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the torchft lighthouse did not listen on {self.port}")
                time.sleep(0.1)
        for name in names:
            env = {**self._env(), "REPLICA_GROUP_ID": str(len(self.nodes))}
            argv = self.settings.node_argv(name)
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
        """Not separable: the survivors' all-reduce fails, the lighthouse waits for a heartbeat
        to lapse; no single line says "noticed"."""
        return None

    def all_exited(self) -> bool:
        return all(popen.poll() is not None for popen in self.nodes.values())

    def rank0_node(self) -> str:
        return next(iter(self.nodes))  # replica group 0

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
        for popen in [*self.nodes.values(), *([self.lighthouse] if self.lighthouse else [])]:
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(10)
        for proc in psutil.process_iter(["cwd"]):  # workers of a killed torchrun, if any
            with contextlib.suppress(psutil.Error):
                if proc.info["cwd"] == str(self.directory):
                    proc.kill()
