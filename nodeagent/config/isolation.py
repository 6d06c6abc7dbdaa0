"""The node's `isolation:` section: what keeps the jobs that share a node apart (docs/isolation.md).

Each job's bare workers on a node run in a cgroup of the job's own (supervisor/jobcgroup.py)
with what the job may use written in it: memory (its ask, `job.mem` or `job.mem_per_gpu`, else
this node's default share per GPU), processes, and CPU time by weight. `cgroups` says what the
node does when it cannot: `required` (the default) refuses to start (exit 78) naming the
controller it lacks, `available` runs with what it has and says what is missing, `off` makes no
job cgroups at all (`nodeagent launch`, a torchrun drop-in run as its user, is off). `shm`:
`private` (the default) gives each job's workers a /dev/shm of their own, gone with the job
(supervisor/jobspace.py); `shared` leaves them the node's. `cpu_binding`: `closest` (the
default) starts each worker on the CPUs NVML says are near its GPUs.

And the job's own memory asks (`job.mem`, `job.mem_per_gpu`), checked here for the floor a
worker needs to start at all, as Slurm's `--mem` and `--mem-per-gpu` are.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.config.values import Section, choice, parse_size, positive_int, size_text
from nodeagent.errors import ConfigError

CGROUP_MODES = ("required", "available", "off")
SHM_MODES = ("private", "shared")
CPU_BINDINGS = ("closest", "off")
PIDS_MAX = 32768  # a job's processes and threads on one node (a fork bomb stops there)
MIN_WORKER_MEMORY = 128 * 1024**2  # no Python worker starts in less
MIN_PIDS = 64  # an interpreter's threads, and torch's own pools, per worker


@dataclass(frozen=True)
class IsolationConfig:
    """isolation: what each job on this node may use (sizes in bytes)."""

    cgroups: str = "required"
    # Kept from every job: the system, the agent, the copies of peers' saves it holds (None:
    # a tenth of the node's memory).
    reserved_memory: int | None = None
    # A job's memory per GPU it holds when it asks none (None: what is left after the reserve,
    # shared evenly between the node's GPUs; a node without GPUs gives a job all of it).
    mem_per_gpu: int | None = None
    swap: int = 0  # swap a job may use beside its memory
    pids_max: int = PIDS_MAX
    shm: str = "private"  # each job's own /dev/shm, or the node's (shared)
    cpu_binding: str = "closest"  # a worker on the CPUs near its GPUs (NVML), or anywhere

    @property
    def on(self) -> bool:
        return self.cgroups != "off"


def load_isolation(section: Section) -> IsolationConfig:
    """isolation:, validated.

    Raises:
        ConfigError: naming the first invalid key.
    """
    raw = section.raw("cgroups")
    if raw is False:  # YAML makes a bare `off` a boolean
        mode = "off"
    else:
        mode = choice(
            section,
            "cgroups",
            CGROUP_MODES,
            "required",
            "required: every controller, or the agent does not start; available: what the node has",
        )
    config = IsolationConfig(
        cgroups=mode,
        reserved_memory=_optional_size(section, "reserved_memory"),
        mem_per_gpu=_optional_size(section, "mem_per_gpu"),
        swap=_size_or_zero(section, "swap"),
        pids_max=positive_int(section, "pids_max", PIDS_MAX, minimum=MIN_PIDS),
        shm=choice(
            section,
            "shm",
            SHM_MODES,
            "private",
            "private: each job's own /dev/shm, gone with it; shared: the node's",
        ),
        cpu_binding=choice(
            section,
            "cpu_binding",
            CPU_BINDINGS,
            "closest",
            "closest: each worker on the CPUs near its GPUs, as Slurm's --gpu-bind=closest; "
            "off: anywhere",
        ),
    )
    if config.mem_per_gpu is not None and config.mem_per_gpu < MIN_WORKER_MEMORY:
        raise ConfigError(
            section.key("mem_per_gpu"),
            f"{size_text(config.mem_per_gpu)} is below the {size_text(MIN_WORKER_MEMORY)} a "
            "worker needs to start",
        )
    section.reject_unknown()
    return config


def _optional_size(section: Section, name: str) -> int | None:
    raw = section.raw(name)
    if raw is None or raw == "auto":
        return None
    return parse_size(raw, section.key(name))


def _size_or_zero(section: Section, name: str) -> int:
    raw = section.raw(name)
    return 0 if raw in (None, 0, "0") else parse_size(raw, section.key(name))


def job_memory(section: Section, workers: int) -> tuple[int | None, int | None]:
    """A job's memory ask: (`mem`, a node's whole; `mem_per_gpu`), at most one of them, each
    enough for `workers` workers to start.

    Raises:
        ConfigError: both given, or one too small to start the workers.
    """
    mem = _optional_size(section, "mem")
    per_gpu = _optional_size(section, "mem_per_gpu")
    if mem is not None and per_gpu is not None:
        raise ConfigError(
            section.key("mem"),
            "give mem (a node's whole) or mem_per_gpu, not both (as sbatch's --mem and "
            "--mem-per-gpu)",
        )
    floor = MIN_WORKER_MEMORY * workers
    if mem is not None and mem < floor:
        raise ConfigError(
            section.key("mem"),
            f"{size_text(mem)} is below what {workers} workers need to start: at least "
            f"{size_text(floor)} ({size_text(MIN_WORKER_MEMORY)} each)",
        )
    if per_gpu is not None and per_gpu < MIN_WORKER_MEMORY:
        raise ConfigError(
            section.key("mem_per_gpu"),
            f"{size_text(per_gpu)} is below the {size_text(MIN_WORKER_MEMORY)} a worker needs "
            "to start",
        )
    return mem, per_gpu
