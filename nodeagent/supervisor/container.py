"""A worker in the job's own image: the container runtime's commands (podman), and its pulls.

The agent stays outside. Each worker is one `podman run` in the foreground: its output is the
worker's output, its exit the worker's exit, SIGTERM and SIGUSR1 reach the worker through
podman's signal proxy and the container's init (`--init`: a script needs no PID 1 handling).

The agent is a client of the node's podman service (`podman system service`, Debian's
`podman.socket`; `containers.socket`): the service, outside the agent's systemd sandbox, unpacks
images, makes the container's mounts and namespaces and its cgroup, so the agent's unit keeps
every restriction it has without containers (docs/pool.md, "systemd"). What escapes the
`podman run` process (conmon and the container are the service's) is fenced by the container's
cgroup, found from the id `--cidfile` writes (cgroups.py).

Root's podman, each worker with `--user` set to the job's uid, gid and groups: the workload holds
no more than a bare worker (`--cap-drop=all`, `no-new-privileges`), while the image store,
the runtime's configuration and the cgroups stay root's. A rootless podman run as the job's user
would read its configuration from the user's home (the user would choose the runtime root's
agent starts) and cannot fence by cgroup on a cgroup v1 node.

Nothing of the job reaches podman itself: it runs with the agent's PATH and HOME only, and the
worker's environment goes in through an env file only root reads (`podman --remote` reads it and
sends the variables; job.env in podman's own environment would let the job name podman's
configuration: CONTAINERS_CONF, HOME). The host's network (the process group's rendezvous,
NCCL), the job's own /dev/shm directory on this node (shared by its containers here, as NCCL's
shared-memory transport needs), and the agent's files bound at the same paths (the job's log
directory with the progress, control and error files, the checkpoint tiers), so torchrun's
environment is exactly as outside. GPUs by CDI (`--device=nvidia.com/gpu=<UUID>`, the NVIDIA
container toolkit's generated spec).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nodeagent.channel import beneath, tier
from nodeagent.config.container import ContainerRule, ContainerSpec
from nodeagent.config.identity import WorkerUser
from nodeagent.model.resources import Limits, cpu_shares
from nodeagent.supervisor import cgroups
from nodeagent.supervisor.spec import WorkerSpec

log = logging.getLogger(__name__)

AGENT_ENV = ("PATH", "HOME")  # all podman itself is given of the agent's environment
ASK_TIMEOUT_S = 10.0  # the service's cgroup manager, asked in the agent's loop (WatchdogSec=30s)
RETRY_S = 30.0  # a service that could not be asked is asked again after this
REMOVE_TIMEOUT_S = 30.0  # a worker's container removed after it exited (not in the loop)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UUID_PREFIXES = ("GPU-", "MIG-")


class PullFailed(Exception):
    """An image could not be pulled: the message is the runtime's reason."""


@dataclass(frozen=True)
class Launch:
    """One worker's container: what `run_argv` needs besides the node's rule and the job's spec."""

    name: str  # the container's name: unique a spawn
    cidfile: Path  # where podman writes the container's id (cgroups.container_cgroup)
    cgroup_parent: str  # cgroups.parent_flag
    env_file: Path
    workdir: str | None
    user: WorkerUser | None
    binds: tuple[str, ...]  # host paths bound at the same path (the agent's files)
    shm_dir: str | None  # the job's /dev/shm on this node
    gpus: tuple[str, ...]  # CDI names: UUIDs (GPU-..., MIG-...) or indices
    argv: tuple[str, ...]
    share: Share | None = None  # its part of the job's limits on the node (None: none)


@dataclass(frozen=True)
class Share:
    """One worker container's part of its job's limits on the node (model/resources.py): the
    job's memory, swap, processes and CPU weight divided evenly between its workers there (each
    container is limited alone: podman makes its cgroup), and the job's own cores."""

    memory: int
    swap: int
    pids: int
    cpu_shares: int  # cgroup v1's scale, which podman takes on v2 too (as cpu.weight)
    cpus: tuple[int, ...]  # (): any

    @classmethod
    def of(cls, limits: Limits, workers: int) -> Share:
        n = max(workers, 1)
        shares = cpu_shares(limits.cpu_weight / n)
        return cls(
            limits.memory // n, limits.swap // n, max(1, limits.pids // n), shares, limits.cpus
        )

    def flags(self) -> list[str]:
        """podman run's: `--memory-swap` is memory and swap together."""
        flags = [
            f"--memory={self.memory}",
            f"--memory-swap={self.memory + self.swap}",
            f"--pids-limit={self.pids}",
            f"--cpu-shares={self.cpu_shares}",
        ]
        return flags + ([f"--cpuset-cpus={','.join(map(str, self.cpus))}"] if self.cpus else [])


class ContainerRuntime(Protocol):
    """What the supervisor needs of a container runtime (podman here; Apptainer or enroot
    would be another class: docs/pool.md, "Your own software", says what each would run).

    `worker_depth`: how many generations of the runtime's own processes stand above the worker
    in its container's cgroup (what the agent reads a worker's CPU figures from:
    cgroups.main_process)."""

    worker_depth: int

    def cgroup_parent(self) -> str: ...
    def run_argv(self, launch: Launch) -> list[str]: ...
    def remove(self, *names: str) -> None: ...
    def present(self, image: str) -> bool: ...
    def pull(self, image: str, timeout_s: float) -> None: ...


class Podman:
    """A client of the node's podman service, with the node's settings (`containers:`) and the
    job's image and mounts."""

    worker_depth = 1  # the container's init (--init), then the worker

    def __init__(
        self,
        rule: ContainerRule,
        spec: ContainerSpec,
        program: str = "podman",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rule = rule
        self._spec = spec
        self._program = program
        self._clock = clock
        self._parent: str | None = None
        self._unreachable: tuple[float, str] | None = None  # when asking failed, and why

    def _global(self) -> list[str]:
        return [self._program, "--remote", f"--url=unix://{self._rule.socket}"]

    def _call(self, args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Raises OSError (no podman) or subprocess.TimeoutExpired."""
        return subprocess.run(
            [*self._global(), *args],
            capture_output=True,
            text=True,
            env=agent_env(os.environ),
            timeout=timeout_s,
            check=False,
        )

    def cgroup_parent(self) -> str:
        """`--cgroup-parent` for the service's cgroup manager, asked once (the first worker's
        start). A service that could not be asked is not asked again for RETRY_S: each rank's
        start fails at once, and the agent's loop never waits on it longer than ASK_TIMEOUT_S.

        Raises:
            OSError: the service cannot be asked (not running, no podman), with why.
        """
        if self._parent is not None:
            return self._parent
        if self._unreachable is not None and self._clock() < self._unreachable[0] + RETRY_S:
            raise OSError(self._unreachable[1])
        why = f"the podman service at {self._rule.socket}"
        try:
            result = self._call(["info", "--format={{.Host.CgroupManager}}"], ASK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            result, why = None, f"{why} did not answer in {ASK_TIMEOUT_S:g}s"
        except OSError as exc:
            result, why = None, f"cannot run {self._program}: {exc.strerror or exc}"
        if result is not None and result.returncode == 0:
            self._parent = cgroups.parent_flag(result.stdout.strip())
            return self._parent
        if result is not None:
            why = f"{why}: {_last(result)}"
        self._unreachable = (self._clock(), why)
        raise OSError(why)

    def run_argv(self, launch: Launch) -> list[str]:
        """The `podman run` command line of one worker. Flags as `--flag=value`: podman 4.3
        drops a space-separated `--ulimit` after `--rootfs`."""
        argv = [
            *self._global(),
            "run",
            "--rm",
            f"--name={launch.name}",
            f"--cidfile={launch.cidfile}",
            "--init",
            "--pull=never",  # pulled before the workers start, as a phase of its own
            "--network=host",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            f"--cgroup-parent={launch.cgroup_parent}",
            f"--env-file={launch.env_file}",
            "--label=nodeagent.worker=1",
        ]
        argv += [f"--ulimit={u}" for u in self._rule.ulimits]
        argv += launch.share.flags() if launch.share is not None else []
        user = launch.user
        if user is not None and user.switch:
            argv.append(f"--user={user.uid}:{user.gid}")
            argv += [f"--group-add={g}" for g in user.groups if g != user.gid]
        if launch.workdir:
            argv.append(f"--workdir={launch.workdir}")
        if launch.shm_dir:
            argv.append(f"--volume={launch.shm_dir}:/dev/shm")
        # A directory the job mounts itself (a submitted job's persist_dir, judged as a mount:
        # model/spec.run_config) is bound once, from the source judged.
        mounted = {m.target for m in self._spec.mounts}
        argv += [f"--volume={path}:{path}" for path in launch.binds if path not in mounted]
        argv += [f"--volume={m.spelled()}" for m in self._spec.mounts]
        argv += [f"--device=nvidia.com/gpu={gpu}" for gpu in launch.gpus]
        argv += [f"--device={device}" for device in self._rule.devices]
        return [*argv, self._spec.image, *launch.argv]

    def remove(self, *names: str) -> None:
        """Remove containers `names` whatever their state, killing what runs in them. The
        service takes a container's lock for it, as for a start: once this returns, a start the
        worker's `podman run` asked for before it was killed has failed or been undone (a
        create still in flight, not yet named, is not: Containers.close asks again).
        Raises nothing: a service that cannot be reached cannot start anything either."""
        said = ", ".join(names)
        for _ in range(2):  # a container that stops as podman kills it: "could not be stopped
            try:  # ... container state improper: stopped", left there; asked again, removed
                result = self._call(
                    ["rm", "--force", "--time=0", "--ignore", *names], REMOVE_TIMEOUT_S
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("cannot remove container %s: %s", said, exc)
                return
            if result.returncode == 0:
                return
            log.warning("cannot remove container %s: %s", said, _last(result))

    def present(self, image: str) -> bool:
        """Whether `image` is in the node's store (False also when podman cannot say)."""
        try:
            return self._call(["image", "exists", image], 60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def pull(self, image: str, timeout_s: float) -> None:
        """Raises PullFailed with the runtime's last line, or when `timeout_s` passed."""
        try:
            result = self._call(["pull", "--quiet", image], timeout_s)
        except subprocess.TimeoutExpired:
            raise PullFailed(f"no image after {timeout_s:g}s (containers.pull_timeout)") from None
        except OSError as exc:
            raise PullFailed(f"cannot run {self._program}: {exc.strerror or exc}") from None
        if result.returncode != 0:
            raise PullFailed(_last(result))


def _last(result: subprocess.CompletedProcess[str]) -> str:
    """A podman call's last line of output: its reason."""
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {result.returncode}"


def agent_env(environ: Mapping[str, str]) -> dict[str, str]:
    """podman's own environment: the agent's PATH and HOME, nothing of the job's."""
    env = {k: environ[k] for k in AGENT_ENV if k in environ}
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def cdi_names(visible: str | None) -> tuple[str, ...]:
    """The CDI device names of a worker's CUDA_VISIBLE_DEVICES (UUIDs where the agent knows
    them, else NVML indices, which the toolkit's spec also names)."""
    if not visible:
        return ()
    return tuple(item for item in visible.split(",") if item)


def write_env_file(path: Path, env: Mapping[str, str]) -> None:
    """`env` as an env file at `path` (mode 0600, in a directory only root enters).

    Raises:
        ValueError: naming a variable an env file cannot carry (a line break would make it
            another variable).
    """
    bad = sorted(k for k, v in env.items() if "\n" in v or "\n" in k or "=" in k)
    if bad:
        raise ValueError(f"variables an env file cannot carry (a line break or '='): {bad}")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.writelines(f"{k}={v}\n" for k, v in env.items())


def binds_of(env: Mapping[str, str], names: Sequence[str]) -> tuple[str, ...]:
    """The directories of the agent's files a worker's environment names (`names`: variables
    that hold a directory), existing ones only, each once."""
    found: list[str] = []
    for name in names:
        value = env.get(name)
        if value and os.path.isdir(value) and value not in found:
            found.append(value)
    return tuple(found)


# Variables of a worker's environment that name a directory of the agent's to bind in.
TIER_DIRS = (tier.MEMORY_ENV, tier.REPLICAS_ENV, tier.PERSIST_ENV)

# Makes a directory of the job's on this node (path, mode, owner uid and gid), refusing a link,
# a parent another user may write, or one marked as another job's (runtime/jobrun.py, with
# checkpoint/space.py make_marked). Raises OSError.
MakeDir = Callable[[Path, int, int, int], None]
# The job's /dev/shm: its user's with the agent's group, so that the agent, which holds no
# CAP_DAC_OVERRIDE under its unit, can remove what the workers left in it (channel/beneath.py).
SHM_MODE = 0o770


def job_prefix(job: str) -> str:
    """What the names of `job`'s containers start with. The job id's length comes first: ids
    and node names may hold '-', and job `a-b` on node `c` must not be named as job `a` on
    node `b-c`."""
    return f"nodeagent-{len(job)}-{job}-"


def container_name(job: str, node: str, generation: int, rank: int) -> str:
    return f"{job_prefix(job)}{node}-g{generation}-rank{rank}"


class Containers:
    """One job's containerised workers on this node: each spawn's command and environment.

    Two directories of the job's on this node (under memory_dir, a tmpfs: they outlive an
    agent's restart, not the machine's, like the containers): `shm_dir`, the job's /dev/shm (its
    user's alone), and `run_dir`, root's alone: each worker's env file and cidfile. A cidfile
    must outlive the agent: the leftovers record names it, and a restarted agent fences by it.
    """

    def __init__(
        self,
        runtime: ContainerRuntime,
        node: str,
        job: str,
        shm_dir: Path,
        run_dir: Path,
        user: WorkerUser | None,
        make_dir: MakeDir,
        share: Share | None = None,
    ) -> None:
        """`share`: each worker container's part of the job's limits (None: none)."""
        self.runtime = runtime
        self._node, self._job = node, job
        self._shm_dir, self._run_dir = shm_dir, run_dir
        self._user = user
        self._make_dir = make_dir
        self._share = share
        self._launched: dict[str, None] = {}  # every container name it ran, in order

    def name(self, spec: WorkerSpec) -> str:
        """The container's name: one per spawn (a rank starts once a generation), whatever
        other agents on this machine run (`container_name`)."""
        generation = int(spec.env.get("NODEAGENT_GENERATION", "0"))
        return container_name(self._job, self._node, generation, spec.rank)

    def remove(self, spec: WorkerSpec) -> None:
        """Remove the container of `spec`'s spawn through the service (Podman.remove)."""
        self.runtime.remove(self.name(spec))

    def cidfile(self, spec: WorkerSpec) -> Path:
        return self._run_dir / f"{self.name(spec)}{cgroups.CIDFILE_SUFFIX}"

    def command(self, spec: WorkerSpec) -> tuple[list[str], dict[str, str]]:
        """`podman run`'s argv and its own environment for `spec`'s worker.

        Raises:
            OSError: a directory of the job's cannot be made, or the runtime cannot be asked.
            ValueError: a variable an env file cannot carry.
        """
        user = self._user
        uid = user.uid if user is not None and user.switch else -1
        self._make_dir(self._shm_dir, SHM_MODE, uid, os.getegid())
        self._make_dir(self._run_dir, 0o700, os.geteuid(), os.getegid())
        name = self.name(spec)
        env_file = self._run_dir / f"{name}.env"
        write_env_file(env_file, spec.env)
        cidfile = self.cidfile(spec)
        with contextlib.suppress(FileNotFoundError):
            cidfile.unlink()  # podman refuses to write over one
        self._launched[name] = None
        binds = (str(spec.log_path.parent.parent), *binds_of(spec.env, TIER_DIRS))
        launch = Launch(
            name=name,
            cidfile=cidfile,
            cgroup_parent=self.runtime.cgroup_parent(),
            env_file=env_file,
            workdir=spec.cwd,
            user=user,
            binds=binds,
            shm_dir=str(self._shm_dir),
            gpus=cdi_names(spec.env.get("CUDA_VISIBLE_DEVICES")) if spec.gpus else (),
            argv=spec.argv,
            share=self._share,
        )
        return self.runtime.run_argv(launch), agent_env(os.environ)

    def close(self) -> None:
        """The job's agent leaves this node (its workers are gone): every container it ran is
        removed once more (a `podman run` killed while the service still created its
        container leaves it `Created`, after the worker's own removal found no such name;
        seen in CI-like runs), and its env files, cidfiles and /dev/shm go."""
        if self._launched:
            self.runtime.remove(*self._launched)
            self._launched.clear()
        shutil.rmtree(self._run_dir, ignore_errors=True)
        beneath.remove_tree(self._shm_dir)
