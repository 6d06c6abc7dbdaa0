"""What each worker process is started with: torchrun's environment, argv, cwd, log file. Pure.

Only the job record's membership and counters come from Redis (the generation, this node's group
rank, the members, MASTER_ADDR/PORT once the store has verified them against the rank-0 member's
own report, the restart count). Everything that decides what runs and how much of it comes from
this node's config and nothing else: the entrypoint, env, working and log directories, and the
number of workers per node (a record that says otherwise is reported by the store, not obeyed).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nodeagent.config import Config
from nodeagent.model import JobRecord

# What torchrun sets for every worker (decision 8): a torchrun script needs nothing else.
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
)
# Inherited from systemd; a worker that sees them could ping or notify as if it were the agent.
STRIPPED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    local_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    log_path: Path
    progress_path: Path
    gpus: tuple[int, ...] = ()


def pick_free_port(address: str) -> int:
    """A TCP port free on `address` now; offered as MASTER_PORT if this node becomes rank 0."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((address, 0))
            return int(sock.getsockname()[1])
    except OSError:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])


def log_path(log_dir: str, job: str, generation: int, rank: int) -> Path:
    return Path(log_dir) / job / str(generation) / f"rank-{rank}.log"


def progress_path(log_dir: str, job: str, generation: int, rank: int) -> Path:
    return Path(log_dir) / job / str(generation) / f"rank-{rank}.progress"


def worker_env(
    base: Mapping[str, str],
    config: Config,
    record: JobRecord,
    group_rank: int,
    local_rank: int,
) -> dict[str, str]:
    """The environment torchrun would give this worker, plus NODEAGENT_* and job.env."""
    nproc = config.job.nproc_per_node
    rank = group_rank * nproc + local_rank
    world = len(record.members) * nproc
    env = {k: v for k, v in base.items() if k not in STRIPPED_ENV}
    env.update(config.job.env)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(group_rank),
            "GROUP_WORLD_SIZE": str(len(record.members)),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world),
            "ROLE_NAME": "default",
            "MASTER_ADDR": record.master_addr,
            "MASTER_PORT": str(record.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(record.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(record.max_restarts),
            "TORCHELASTIC_RUN_ID": config.job.id,
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "NODEAGENT_JOB_ID": config.job.id,
            "NODEAGENT_GENERATION": str(record.generation),
            "NODEAGENT_NODE": config.node.name,
            "NODEAGENT_STOP_GRACE_S": f"{config.timing.stop_grace_period:g}",
            "NODEAGENT_PROGRESS_FILE": str(
                progress_path(config.log_dir, config.job.id, record.generation, rank)
            ),
        }
    )
    return env


def worker_specs(
    base_env: Mapping[str, str],
    config: Config,
    record: JobRecord,
    group_rank: int,
    usable_gpus: tuple[int, ...] | None = None,
) -> list[WorkerSpec]:
    """One spec per local rank. With GPU monitoring, local rank i gets the i-th slice of
    `gpus_per_worker` usable GPUs as CUDA_VISIBLE_DEVICES. The number of local ranks is this
    node's job.nproc_per_node, whatever the record says."""
    nproc = config.job.nproc_per_node
    per_worker = config.job.gpus_per_worker
    specs = []
    for local_rank in range(nproc):
        rank = group_rank * nproc + local_rank
        env = worker_env(base_env, config, record, group_rank, local_rank)
        gpus: tuple[int, ...] = ()
        if usable_gpus is not None and per_worker > 0:
            gpus = usable_gpus[local_rank * per_worker : (local_rank + 1) * per_worker]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        specs.append(
            WorkerSpec(
                rank=rank,
                local_rank=local_rank,
                argv=config.job.entrypoint,
                env=env,
                cwd=config.job.working_dir,
                log_path=log_path(config.log_dir, config.job.id, record.generation, rank),
                progress_path=Path(env["NODEAGENT_PROGRESS_FILE"]),
                gpus=gpus,
            )
        )
    return specs
