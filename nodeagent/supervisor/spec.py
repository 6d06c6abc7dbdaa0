"""What each worker process is started with: torchrun's environment, argv, cwd, log file. Pure.

Only the job record's membership and counters come from Redis (the generation, this node's group
rank, the members, MASTER_ADDR/PORT once the store has verified them against the rank-0 member's
own report, the restart count). Everything that decides what runs and how much of it comes from
this node's config and nothing else: the entrypoint, env, working and log directories, and the
number of workers per node (a record that says otherwise is reported by the store, not obeyed).
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from nodeagent.channel import control, restore, tier
from nodeagent.channel.control import Assignment
from nodeagent.config.settings import Config
from nodeagent.model.job import JobRecord

log = logging.getLogger(__name__)

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
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
)
# Set as torchrun 2.13 sets them, unless the job (or the agent's own environment) already does:
# OMP_NUM_THREADS only with more than one worker per node, to keep them from oversubscribing.
TORCHRUN_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1"}
# torchrun's --signals-to-handle default: what a worker's @record turns into a SignalException.
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
# A bare program name that means the agent's configured interpreter (job.python).
BARE_PYTHONS = frozenset({"python", "python3"})
# Inherited from systemd; a worker that sees them could ping or notify as if it were the agent.
# And the agent's Redis password (nodeagentctl's variable, set for the agent by some operators):
# workers must not inherit the credentials that rewrite the job.
STRIPPED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "NODEAGENT_REDIS_PASSWORD")
# The agent's channel to its workers: only the agent sets them, never job.env or the agent's own
# environment (a job that named its own "memory tier" would have the agent bind that host path
# into its container, past the node's containers.mount_sources, and mislead the worker helper).
CHANNEL_ENV = (
    tier.MEMORY_ENV,
    tier.MEMORY_LIMIT_ENV,
    tier.PERSIST_ENV,
    tier.REPLICAS_ENV,
    restore.RESTORE_ENV,
    restore.RESTORE_REPORT_ENV,
    control.PATH_ENV,
    control.TIMEOUT_ENV,
)


# A worker's own files and channel: a command run beside it in the job (nodeagentctl run) is
# not told them, or it would beat, report and restore as if it were that worker.
WORKERS_OWN = frozenset(
    {"NODEAGENT_PROGRESS_FILE", "TORCHELASTIC_ERROR_FILE", "NODEAGENT_GENERATION", *CHANNEL_ENV}
)


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
    assignment: Assignment | None = None  # in_place jobs: what a survivor is told instead

    @property
    def control_path(self) -> Path | None:
        """The in-place channel (channel/control.py) the worker maps; None in restart mode."""
        path = self.env.get(control.PATH_ENV)
        return Path(path) if path else None

    @property
    def error_file(self) -> Path | None:
        """Where this worker's @record writes the exception it died of (errorfile.py reads it)."""
        path = self.env.get("TORCHELASTIC_ERROR_FILE")
        return Path(path) if path else None


WARMUP_FILES = {  # a warm-up's own files: the variable naming each, its name's suffix
    "NODEAGENT_PROGRESS_FILE": "progress",
    "TORCHELASTIC_ERROR_FILE": "error.json",
    control.PATH_ENV: "control",
    restore.RESTORE_REPORT_ENV: "restore.json",
}


def warmup_spec(spec: WorkerSpec, generation: int) -> WorkerSpec:
    """The spec of a warm-up replacing `spec`'s failed worker (supervisor/release.py): the same
    environment, that of `generation` (which it is told to leave before it starts), and files
    of its own beside the failed one's log (`rank-R.warmup.log`, `.progress`, ...), so that
    the failed one's log and error file keep why it died."""
    directory = spec.log_path.parent
    env = dict(spec.env)
    env["NODEAGENT_GENERATION"] = str(generation)
    for name, suffix in WARMUP_FILES.items():
        if env.get(name):
            env[name] = str(directory / f"rank-{spec.rank}.warmup.{suffix}")
    return replace(
        spec,
        env=env,
        log_path=directory / f"rank-{spec.rank}.warmup.log",
        progress_path=directory / f"rank-{spec.rank}.warmup.progress",
        assignment=None,
    )


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


def control_path(log_dir: str, job: str, generation: int, rank: int) -> Path:
    """An in_place worker's channel, beside its progress file (it keeps it for life)."""
    return Path(log_dir) / job / str(generation) / f"rank-{rank}.control"


def error_file_path(log_dir: str, job: str, generation: int, rank: int) -> Path:
    """TORCHELASTIC_ERROR_FILE: where the rank's @record writes the exception it died of."""
    return Path(log_dir) / job / str(generation) / f"rank-{rank}.error.json"


def resolve_argv(entrypoint: Sequence[str], python: str | None) -> tuple[str, ...]:
    """The argv a worker is exec'd with: a bare `python`/`python3` program becomes `python`
    (job.python) or, without one, the interpreter the agent runs under, as torchrun runs a
    script with its own sys.executable; any other program (a path, `python3.11`) is kept."""
    argv = tuple(entrypoint)
    if argv and argv[0] in BARE_PYTHONS:
        return (python or sys.executable, *argv[1:])
    return argv


def omp_warning(config: Config, base: Mapping[str, str]) -> str | None:
    """torchrun's warning when it sets OMP_NUM_THREADS=1 for the workers; None when it does not."""
    if config.job.nproc_per_node <= 1 or "OMP_NUM_THREADS" in {**base, **config.job.env}:
        return None
    return (
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to "
        "avoid your system being overloaded, please further tune the variable for optimal "
        "performance in your application as needed (job.env sets it)."
    )


def worker_env(
    base: Mapping[str, str],
    config: Config,
    record: JobRecord,
    group_rank: int,
    local_rank: int,
) -> dict[str, str]:
    """The environment torchrun would give this worker, plus NODEAGENT_* and job.env.

    job.env wins over the agent's environment, the torchrun and NODEAGENT_ variables over both
    (the agent's channel, CHANNEL_ENV, is set by the agent alone or not at all);
    TORCHRUN_DEFAULTS and PYTHONUNBUFFERED=1 (torchrun runs a Python entrypoint unbuffered, so
    output shows as it is printed) only where neither sets them."""
    nproc = config.job.nproc_per_node
    rank = group_rank * nproc + local_rank
    world = len(record.members) * nproc
    env = {k: v for k, v in {**base, **config.job.env}.items() if k not in STRIPPED_ENV}
    for name in CHANNEL_ENV:
        env.pop(name, None)
    env.setdefault(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", TORCHRUN_DEFAULTS["TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    )
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", TORCHRUN_DEFAULTS["OMP_NUM_THREADS"])
    env.setdefault("PYTHONUNBUFFERED", "1")
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
            "TORCHELASTIC_ERROR_FILE": str(
                error_file_path(config.log_dir, config.job.id, record.generation, rank)
            ),
            "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_TO_HANDLE,
            "NODEAGENT_JOB_ID": config.job.id,
            "NODEAGENT_GENERATION": str(record.generation),
            "NODEAGENT_NODE": config.node.name,
            "NODEAGENT_STOP_GRACE_S": f"{config.timing.stop_grace_period:g}",
            "NODEAGENT_PROGRESS_FILE": str(
                progress_path(config.log_dir, config.job.id, record.generation, rank)
            ),
        }
    )
    env.update(tier_env(config, record, rank))
    if config.job.in_place:
        path = control_path(config.log_dir, config.job.id, record.generation, rank)
        env[control.PATH_ENV] = str(path)
        env[control.TIMEOUT_ENV] = f"{config.timing.reform_timeout:g}"
    return env


def restore_report_path(log_dir: str, job: str, generation: int, rank: int) -> Path:
    """Where the rank says what it restored (nodeagent.worker.checkpointer; the agent reads it)."""
    return restore.report_path(Path(log_dir) / job, generation, rank)


def tier_env(config: Config, record: JobRecord, rank: int) -> dict[str, str]:
    """The checkpoint tiers' variables (job.checkpoint; none without it): this node's memory
    tier, what one rank's save may take there, its replica area, the persistent tier, the
    leader's restore order for this generation and where to say what was restored."""
    checkpoint = config.job.checkpoint
    if checkpoint is None:
        return {}
    env = {
        tier.MEMORY_ENV: checkpoint.memory_tier(config.node.name, config.job.id),
        tier.MEMORY_LIMIT_ENV: str(checkpoint.rank_limit(config.job.nproc_per_node)),
        restore.RESTORE_REPORT_ENV: str(
            restore_report_path(config.log_dir, config.job.id, record.generation, rank)
        ),
    }
    if checkpoint.persist_dir is not None:
        env[tier.PERSIST_ENV] = checkpoint.persist_dir
    if checkpoint.replicas:
        env[tier.REPLICAS_ENV] = checkpoint.replica_area(config.node.name, config.job.id)
    if record.checkpoint is not None and record.checkpoint.restore:
        env[restore.RESTORE_ENV] = " ".join(record.checkpoint.restore)
    return env


def assignment(config: Config, record: JobRecord, group_rank: int, local_rank: int) -> Assignment:
    """What an in_place survivor that is now `local_rank` of group `group_rank` is told: the
    same values worker_env gives a new worker (the restore order too)."""
    nproc, members = config.job.nproc_per_node, len(record.members)
    tiers = record.checkpoint if config.job.checkpoint is not None else None
    return Assignment(
        generation=record.generation,
        rank=group_rank * nproc + local_rank,
        local_rank=local_rank,
        world_size=members * nproc,
        local_world_size=nproc,
        group_rank=group_rank,
        group_world_size=members,
        master_addr=record.master_addr,
        master_port=record.master_port,
        restart_count=record.restart_count,
        restore=" ".join(tiers.restore) if tiers is not None else "",
    )


def task_env(base: Mapping[str, str], rank: int, size: int) -> dict[str, str]:
    """What a command run across the job's nodes is told of its place (nodeagentctl run, as
    srun's tasks, one a node): task `rank` of `size`, by torchrun's names, Slurm's and, as
    torchrun's own options (PET_*: its --nnodes, --node-rank, --master-addr, --master-port),
    so that `torchrun --nproc-per-node N train.py` needs nothing else. The master is the one
    `base` (the job's worker here) was told. Pure."""
    master = {k: base[k] for k in ("MASTER_ADDR", "MASTER_PORT") if k in base}
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "NODE_RANK": str(rank),
        "SLURM_PROCID": str(rank),
        "SLURM_NODEID": str(rank),
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": str(size),
        "PET_NNODES": str(size),
        "PET_NODE_RANK": str(rank),
        **{f"PET_{k}": v for k, v in master.items()},
    }


def visible_devices_of(devices: Sequence[tuple[int, str]]) -> dict[str, str]:
    """What tells CUDA (and NVIDIA's container tools) which GPUs a worker has: their UUIDs
    (`GPU-...`, `MIG-...`), which name one device whatever order CUDA counts in; else NVML's
    indices, with CUDA told to count in NVML's order (PCI bus order: CUDA's default, fastest
    first, may differ, and a worker would get another GPU than the one judged healthy)."""
    if all(uuid for _, uuid in devices):
        visible = ",".join(uuid for _, uuid in devices)
    else:
        visible = ",".join(str(index) for index, _ in devices)
    return {
        "CUDA_VISIBLE_DEVICES": visible,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NVIDIA_VISIBLE_DEVICES": visible,  # what NVIDIA's container tools read, by the same names
    }


def worker_specs(
    base_env: Mapping[str, str],
    config: Config,
    record: JobRecord,
    group_rank: int,
    usable_gpus: Sequence[tuple[int, str]] | None = None,
) -> list[WorkerSpec]:
    """One spec per local rank. With GPU monitoring, local rank i gets the i-th slice of
    `gpus_per_worker` of `usable_gpus` ((NVML index, UUID) each: a GPU, or a MIG instance of a
    GPU in MIG mode) as CUDA_VISIBLE_DEVICES, by UUID where each has one (visible_devices_of).
    The number of local ranks is this node's job.nproc_per_node, whatever the record says. A
    worker in a container gets none of `base_env` (the agent's environment) but the variables
    the node's `containers.env` names: its image's ENV (PATH above all) stands, and only
    torchrun's variables, nodeagent's and the job's `env` are set over it."""
    nproc = config.job.nproc_per_node
    per_worker = config.job.gpus_per_worker
    if config.job.container is not None:  # the image's own ENV stands (PATH, HOME, conda's)
        base_env = {k: base_env[k] for k in config.containers.env if k in base_env}
    warning = omp_warning(config, base_env)
    if warning is not None:
        log.warning(warning)
    argv = resolve_argv(config.job.entrypoint, config.job.python)
    if config.job.container is not None and config.job.python is None:
        argv = tuple(config.job.entrypoint)  # the image's own python, found on its PATH
    specs = []
    for local_rank in range(nproc):
        rank = group_rank * nproc + local_rank
        env = worker_env(base_env, config, record, group_rank, local_rank)
        gpus: tuple[int, ...] = ()
        if usable_gpus is not None and per_worker > 0:
            handed = usable_gpus[local_rank * per_worker : (local_rank + 1) * per_worker]
            gpus = tuple(index for index, _ in handed)
            env.update(visible_devices_of(handed))
        specs.append(
            WorkerSpec(
                rank=rank,
                local_rank=local_rank,
                argv=argv,
                env=env,
                cwd=config.job.working_dir,
                log_path=log_path(config.log_dir, config.job.id, record.generation, rank),
                progress_path=Path(env["NODEAGENT_PROGRESS_FILE"]),
                gpus=gpus,
                assignment=assignment(config, record, group_rank, local_rank)
                if config.job.in_place
                else None,
            )
        )
    return specs
