"""A worker in the job's own image: the container runtime's commands (podman), and its pulls.

The agent stays outside. Each worker is one `podman run` in the foreground: its output is the
worker's output, its exit the worker's exit, SIGTERM and SIGUSR1 reach the worker through
podman's signal proxy and the container's init (`--init`: a script needs no PID 1 handling).
What escapes the `podman run` process (conmon and the container are not its children) is
fenced by the cgroup the container is started in (`--cgroup-parent`, cgroups.py).

Root's podman, each worker with `--user` set to the job's uid, gid and groups: the workload holds
no more than a bare worker (`--cap-drop=all`, `no-new-privileges`), while the image store,
the runtime's configuration and the cgroups stay root's. A rootless podman run as the job's user
would read its configuration from the user's home (the user would choose the runtime root's
agent starts) and cannot fence by cgroup on a cgroup v1 node.

Nothing of the job reaches podman itself: it runs with the agent's PATH and HOME only, and the
worker's environment goes in through an env file only root reads (job.env in podman's own
environment would let the job name podman's configuration: CONTAINERS_CONF, HOME). The host's
network (the process group's rendezvous, NCCL), the job's own /dev/shm directory on this node
(shared by its containers here, as NCCL's shared-memory transport needs), and the agent's files
bound at the same paths (the job's log directory with the progress, control and error files, the
checkpoint tiers), so torchrun's environment is exactly as outside. GPUs by CDI
(`--device=nvidia.com/gpu=<UUID>`, the NVIDIA container toolkit's generated spec).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nodeagent.channel import tier
from nodeagent.config.container import ContainerRule, ContainerSpec
from nodeagent.config.identity import WorkerUser
from nodeagent.supervisor import cgroups
from nodeagent.supervisor.spec import WorkerSpec

AGENT_ENV = ("PATH", "HOME")  # all podman itself is given of the agent's environment
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UUID_PREFIXES = ("GPU-", "MIG-")


class PullFailed(Exception):
    """An image could not be pulled: the message is the runtime's reason."""


@dataclass(frozen=True)
class Launch:
    """One worker's container: what `run_argv` needs besides the node's rule and the job's spec."""

    name: str  # the container's name: unique a spawn
    cgroup: str  # cgroups.worker_cgroup
    env_file: Path
    workdir: str | None
    user: WorkerUser | None
    binds: tuple[str, ...]  # host paths bound at the same path (the agent's files)
    shm_dir: str | None  # the job's /dev/shm on this node
    gpus: tuple[str, ...]  # CDI names: UUIDs (GPU-..., MIG-...) or indices
    argv: tuple[str, ...]


class ContainerRuntime(Protocol):
    """What the supervisor needs of a container runtime (podman here; Apptainer or enroot
    would be another class: docs/pool.md, "Your own software", says what each would run).

    `worker_depth`: how many generations of the runtime's own processes stand above the worker
    in its cgroup (what the agent reads a worker's CPU figures from: cgroups.main_process)."""

    worker_depth: int

    def run_argv(self, launch: Launch) -> list[str]: ...
    def present(self, image: str) -> bool: ...
    def pull(self, image: str, timeout_s: float) -> None: ...
    def remove(self, name: str) -> None: ...


class Podman:
    """Root's podman with the node's settings (`containers:`) and the job's image and mounts."""

    worker_depth = 2  # conmon, then the container's init (--init), then the worker

    def __init__(self, rule: ContainerRule, spec: ContainerSpec, program: str = "podman") -> None:
        self._rule = rule
        self._spec = spec
        self._program = program

    def _global(self) -> list[str]:
        runtime = [f"--runtime={self._rule.oci_runtime}"] if self._rule.oci_runtime else []
        return [self._program, *runtime, "--cgroup-manager=cgroupfs"]

    def run_argv(self, launch: Launch) -> list[str]:
        """The `podman run` command line of one worker. Flags as `--flag=value`: podman 4.3
        drops a space-separated `--ulimit` after `--rootfs`."""
        argv = [
            *self._global(),
            "run",
            "--rm",
            f"--name={launch.name}",
            "--init",
            "--pull=never",  # pulled before the workers start, as a phase of its own
            "--network=host",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            f"--cgroup-parent=/{launch.cgroup}",
            f"--env-file={launch.env_file}",
            "--label=nodeagent.worker=1",
        ]
        argv += [f"--ulimit={u}" for u in self._rule.ulimits]
        user = launch.user
        if user is not None and user.switch:
            argv.append(f"--user={user.uid}:{user.gid}")
            argv += [f"--group-add={g}" for g in user.groups if g != user.gid]
        if launch.workdir:
            argv.append(f"--workdir={launch.workdir}")
        if launch.shm_dir:
            argv.append(f"--volume={launch.shm_dir}:/dev/shm")
        argv += [f"--volume={path}:{path}" for path in launch.binds]
        argv += [f"--volume={m.spelled()}" for m in self._spec.mounts]
        argv += [f"--device=nvidia.com/gpu={gpu}" for gpu in launch.gpus]
        argv += [f"--device={device}" for device in self._rule.devices]
        return [*argv, self._spec.image, *launch.argv]

    def present(self, image: str) -> bool:
        """Whether `image` is in the node's store (False also when podman cannot say)."""
        try:
            result = subprocess.run(
                [*self._global(), "image", "exists", image],
                capture_output=True,
                env=agent_env(os.environ),
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0

    def pull(self, image: str, timeout_s: float) -> None:
        """Raises PullFailed with the runtime's last line, or when `timeout_s` passed."""
        try:
            result = subprocess.run(
                [*self._global(), "pull", "--quiet", image],
                capture_output=True,
                text=True,
                env=agent_env(os.environ),
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise PullFailed(f"no image after {timeout_s:g}s (containers.pull_timeout)") from None
        except OSError as exc:
            raise PullFailed(f"cannot run {self._program}: {exc.strerror or exc}") from None
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines()
            raise PullFailed(lines[-1] if lines else f"exit code {result.returncode}")

    def remove(self, name: str) -> None:
        """Forget a container whose `podman run` was killed (its --rm never ran)."""
        subprocess.run(
            [*self._global(), "rm", "--force", "--ignore", name],
            capture_output=True,
            env=agent_env(os.environ),
            timeout=60,
            check=False,
        )


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


class EnvFiles:
    """The workers' env files: in a directory only root enters, each removed once its worker
    has started (podman reads it at once) or when the job's agent leaves."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="nodeagent-env-"))
        os.chmod(self._dir, 0o700)

    def write(self, name: str, env: Mapping[str, str]) -> Path:
        """Raises ValueError naming a variable whose value holds a line break (an env file
        cannot carry it: it would become another variable)."""
        bad = sorted(k for k, v in env.items() if "\n" in v or "\n" in k or "=" in k)
        if bad:
            raise ValueError(f"variables an env file cannot carry (a line break or '='): {bad}")
        path = self._dir / f"{name}.env"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(f"{k}={v}\n" for k, v in env.items())
        return path

    def close(self) -> None:
        for path in self._dir.glob("*.env"):
            with contextlib.suppress(OSError):
                path.unlink()
        with contextlib.suppress(OSError):
            self._dir.rmdir()


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


class Containers:
    """One job's containerised workers on this node: each spawn's command, environment and
    cgroup; the job's /dev/shm directory here (`shm_dir`, the job's user's alone)."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        node: str,
        job: str,
        shm_dir: Path,
        user: WorkerUser | None,
    ) -> None:
        self.runtime = runtime
        self._node, self._job = node, job
        self._shm_dir = shm_dir
        self._user = user
        self._env_files = EnvFiles()

    def cgroup(self, spec: WorkerSpec) -> str:
        generation = int(spec.env.get("NODEAGENT_GENERATION", "0"))
        return cgroups.worker_cgroup(self._job, self._node, generation, spec.rank)

    def command(self, spec: WorkerSpec) -> tuple[list[str], dict[str, str]]:
        """`podman run`'s argv and its own environment for `spec`'s worker.

        Raises:
            OSError: the job's /dev/shm directory or the env file cannot be made.
            ValueError: a variable an env file cannot carry.
        """
        self._make_shm_dir()
        cgroup = self.cgroup(spec)
        name = cgroup.replace("/", "-")
        env_file = self._env_files.write(name, spec.env)
        binds = (str(spec.log_path.parent.parent), *binds_of(spec.env, TIER_DIRS))
        launch = Launch(
            name=name,
            cgroup=cgroup,
            env_file=env_file,
            workdir=spec.cwd,
            user=self._user,
            binds=binds,
            shm_dir=str(self._shm_dir),
            gpus=cdi_names(spec.env.get("CUDA_VISIBLE_DEVICES")) if spec.gpus else (),
            argv=spec.argv,
        )
        return self.runtime.run_argv(launch), agent_env(os.environ)

    def _make_shm_dir(self) -> None:
        self._shm_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        user = self._user
        if user is not None and user.switch:
            os.chown(self._shm_dir, user.uid, user.gid)

    def close(self) -> None:
        """The job's agent leaves this node: its env files and its /dev/shm go."""
        self._env_files.close()
        shutil.rmtree(self._shm_dir, ignore_errors=True)
