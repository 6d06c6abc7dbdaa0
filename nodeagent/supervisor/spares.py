"""Worker interpreters started before they are needed (`job.preload`), so a restart skips imports.

Importing torch takes seconds (1.5 s here, and torch.optim pulls in torch._dynamo for 1.4 s
more), paid again by every worker of every generation. With `job.preload: [torch,
torch._dynamo]` the agent keeps one spare interpreter per local rank that has already imported
them (nodeagent/worker/preloaded.py) and hands it the next generation's environment instead of
starting a fresh process.

A spare is used only if it was started with the same interpreter, options, working directory and
environment, apart from the variables that change every generation (rank, world size, master,
generation...). Anything else (a GPU left CUDA_VISIBLE_DEVICES, a dead spare) means a cold start,
never a worker with the wrong environment. Spares are started a few seconds after a group starts,
not beside it, so their imports do not slow the group's own start-up.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import struct
import subprocess
import termios
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from nodeagent.config.entrypoint import split_python
from nodeagent.config.identity import WorkerUser
from nodeagent.supervisor.container import Containers
from nodeagent.supervisor.deathsig import bind_to
from nodeagent.supervisor.devices import JobDevices
from nodeagent.supervisor.jobcgroup import JobCgroup, JobCgroupError
from nodeagent.supervisor.jobspace import JobSpace, JobSpaceError, join
from nodeagent.supervisor.spec import TORCHRUN_VARIABLES, WorkerSpec

log = logging.getLogger(__name__)
PRESTART_DELAY_S = 5.0
SPARE_MODULE = "nodeagent.worker.preloaded"  # what a spare runs: `python -m SPARE_MODULE ...`
_PER_GENERATION = frozenset(TORCHRUN_VARIABLES) | {"TORCHELASTIC_USE_AGENT_STORE"}


def static_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a spare must have been started with: everything but the per-generation variables."""
    return {
        k: v for k, v in env.items() if k not in _PER_GENERATION and not k.startswith("NODEAGENT_")
    }


def die_with(
    parent: int,
    cwd: str | None = None,
    tell: int = -1,
    cgroups: tuple[int, ...] = (),
    oom_adjust: int = -1,
    space: int = 0,
    cpus: tuple[int, ...] = (),
    terminal: bool = False,
) -> Callable[[], None]:
    """Runs in the child before exec, after the switch to the job's user: the kernel SIGKILLs
    it when the agent dies, even by SIGKILL (PR_SET_PDEATHSIG survives exec); with `cgroups`
    (each `cgroup.procs` of its job's cgroup the agent opened), it moves itself into them
    (supervisor/jobcgroup.py); with `oom_adjust` (/proc/self/oom_score_adj, opened here), it
    gives up the agent's protection from the OOM killer (the unit's OOMScoreAdjust=): a worker
    is as likely as any process to be chosen, the agent less; with `space` (the pid of its
    job's /dev/shm holder, supervisor/jobspace.py), it enters the job's namespaces; with
    `cpus`, it runs on those (near its GPUs: a placement, not a wall, so a refusal is let
    be); with `cwd`, it enters that directory as the user; with `terminal`, its stdin (a
    pseudo-terminal's end) becomes its session's controlling terminal. What fails is written
    to `tell` (which step, its errno) and the child fails (Popen raises SubprocessError). Only a few
    plain system calls here."""

    def preexec() -> None:
        bind_to(parent)
        step = _TERMINAL
        try:
            if terminal:
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            step = _CGROUP
            for fd in cgroups:
                os.write(fd, b"0")
            if oom_adjust >= 0:  # raising it back to 0 needs no privilege
                adjust = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(adjust, b"%d" % oom_adjust)
                finally:
                    os.close(adjust)
            if space:
                step = _SPACE
                join(space)
                bind_to(parent)  # entering a user namespace cleared the parent-death signal
            if cpus:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, cpus)
            step = _WORKDIR
            if cwd is not None:
                os.chdir(cwd)
        except OSError as exc:
            os.write(tell, step + (exc.errno or 0).to_bytes(4, "little"))
            raise

    return preexec


_CGROUP, _SPACE, _WORKDIR, _TERMINAL = b"c", b"s", b"w", b"t"  # the step of preexec that failed


def _own_oom_adjust(path: Path = Path("/proc/self/oom_score_adj")) -> int:
    """This process's oom_score_adj (0: unreadable)."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _start(
    argv: Sequence[str],
    env: dict[str, str],
    cwd: str | None,
    stdin: int,
    user: WorkerUser | None = None,
    cgroups: tuple[int, ...] = (),
    space: int = 0,
    cpus: tuple[int, ...] = (),
    terminal: int = -1,
) -> subprocess.Popen[bytes]:
    """A worker-to-be in its own session (so a stop reaches all it forks), output on one pipe,
    running as `user` when the agent switches users, killed by the kernel if the agent dies,
    in the job's namespaces when it has a /dev/shm of its own (`space`: its holder's pid),
    on a pseudo-terminal's end, its controlling terminal, where `terminal` is one (>= 0: stdin,
    stdout and stderr all on it), in the job's cgroup when it has one (`cgroups`: its
    `cgroup.procs` in each hierarchy,
    open, close on exec: preexec_fn runs before CPython closes the fds, and the worker must not
    keep them, or it could move any process into the cgroup with the agent's credentials).

    The order in the child matters: CPython changes to `cwd`, then applies setgroups, setregid
    and setreuid, then calls preexec_fn. The kernel clears a parent-death signal when the
    credentials change, so PR_SET_PDEATHSIG is set in preexec_fn. And the working directory is
    entered there too, as the job's user: the agent is root without CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH (the unit drops them), so it cannot enter the user's own 0700 home, and
    on a root-squashed NFS home root could not even with them.

    Raises:
        OSError: it could not be started; `WorkdirError` when the user cannot enter `cwd`,
            `JobCgroupError` when it cannot enter its job's cgroup, `JobSpaceError` its
            job's namespaces.
    """
    switch = user is not None and user.switch
    ids = (user.uid, user.gid, list(user.groups)) if user and switch else (None, None, None)
    as_user = cwd if switch else None
    told, tell = (
        os.pipe2(os.O_CLOEXEC) if as_user or cgroups or space or terminal >= 0 else (-1, -1)
    )
    adjust = _own_oom_adjust()
    try:
        on = terminal >= 0
        return subprocess.Popen(
            argv,
            env=env,
            cwd=None if as_user else cwd,
            stdin=terminal if on else stdin,
            stdout=terminal if on else subprocess.PIPE,
            stderr=terminal if on else subprocess.STDOUT,
            start_new_session=True,
            user=ids[0],
            group=ids[1],
            extra_groups=ids[2],
            preexec_fn=die_with(
                os.getpid(), as_user, tell, cgroups, 0 if adjust < 0 else -1, space, cpus, on
            ),
        )
    except subprocess.SubprocessError:  # only preexec_fn raises it
        os.close(tell)
        tell = -1
        said = os.read(told, 5)
        code = int.from_bytes(said[1:] or b"\0", "little")
        if said[:1] == _CGROUP:
            raise JobCgroupError(
                code, f"cannot enter its job's cgroup: {os.strerror(code)}"
            ) from None
        if said[:1] == _TERMINAL:
            raise OSError(code, f"cannot take its terminal: {os.strerror(code)}") from None
        if said[:1] == _SPACE:
            raise JobSpaceError(
                code, f"cannot enter its job's /dev/shm: {os.strerror(code)}"
            ) from None
        assert user is not None and cwd is not None
        raise WorkdirError(code, cwd, user.name) from None
    finally:
        for fd in (told, tell):
            if fd >= 0:
                os.close(fd)


class WorkdirError(OSError):
    """The job's user cannot enter the workers' working directory (errno from chdir)."""

    def __init__(self, code: int, directory: str, user: str) -> None:
        reason = os.strerror(code) if code else "failed"
        super().__init__(
            code, f"cannot enter its working directory {directory} as user {user}: {reason}"
        )


@dataclass
class _Spare:
    popen: subprocess.Popen[bytes]
    interpreter: tuple[str, ...]
    env: dict[str, str]
    cwd: str | None

    def fits(self, spec: WorkerSpec) -> bool:
        return (
            self.interpreter == split_python(spec.argv)[0]
            and self.env == static_env(spec.env)
            and self.cwd == spec.cwd
        )

    def last_words(self) -> str:
        """The last line a spare that died wrote (an ImportError, say), without blocking."""
        if self.popen.stdout is None:
            return ""
        os.set_blocking(self.popen.stdout.fileno(), False)
        try:
            out = self.popen.stdout.read(65536) or b""
        except OSError:
            return ""
        lines = out.decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else ""

    def discard(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        if self.popen.stdin:
            self.popen.stdin.close()
        if self.popen.stdout:
            self.popen.stdout.close()


class Spawner:
    """Starts a worker process: a fresh one, or a preloaded spare when `modules` is not empty,
    as `user` (config.job.user; None: as the agent, with its environment); or, for a job with
    `containers`, the runtime's process that runs the worker in the job's image."""

    def __init__(
        self,
        modules: Sequence[str] = (),
        user: WorkerUser | None = None,
        containers: Containers | None = None,
        cgroup: JobCgroup | None = None,
        devices: JobDevices | None = None,
        space: JobSpace | None = None,
        cpus_of: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None,
    ) -> None:
        """`cgroup`: the job's, which its bare workers start in (a container's is its
        runtime's); `devices`: the device program attached to it (CDI keeps a container's);
        `space`: the job's /dev/shm and temp directory (a container has its own); `cpus_of`:
        the CPUs a worker of these GPUs runs on (empty: any; isolation.cpu_binding)."""
        self._modules = tuple(modules) if containers is None else ()
        self.user = user
        self.containers = containers
        self.cgroup = cgroup if containers is None else None
        self._devices = devices if containers is None else None
        self.space = space if containers is None else None
        self._cpus_of = cpus_of if containers is None else None
        self._spares: dict[int, _Spare] = {}
        self._planned: tuple[float, Sequence[WorkerSpec]] | None = None
        self._making = threading.Lock()  # the job's cgroup and namespaces, made once
        self._closed = False  # then nothing makes them again (a late command, a late login)

    def spawn(self, spec: WorkerSpec) -> tuple[subprocess.Popen[bytes], bool]:
        """The worker for `spec`, stdout and stderr on one pipe, and whether it runs in a
        preloaded interpreter. Raises OSError if it cannot be started."""
        with self._making:
            space = self._space()
        spec = self._as_user(spec)
        if self.containers is not None:
            try:
                argv, env = self.containers.command(spec)
            except ValueError as exc:
                raise OSError(f"cannot start its container: {exc}") from None
            return _start(argv, env, None, subprocess.DEVNULL), False  # podman: root's
        spare = self._spares.pop(spec.local_rank, None)
        if spare is not None:
            if spare.popen.poll() is None and spare.fits(spec):
                return self._adopt(spare, spec), True
            if spare.popen.poll() is None:
                reason = "was started for another environment"
            else:
                reason = f"had exited ({spare.last_words() or spare.popen.returncode})"
            log.warning(
                "preloaded interpreter of local rank %d %s; starting cold", spec.local_rank, reason
            )
            spare.discard()
        with self._making:
            cgroup = self._cgroup()
        env, user = dict(spec.env), self.user
        return _start(
            spec.argv, env, spec.cwd, subprocess.DEVNULL, user, cgroup, space, self._cpus(spec)
        ), False

    def command(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        window: tuple[int, int] | None = None,
        stdin: bool = False,
    ) -> tuple[subprocess.Popen[bytes], int]:
        """A command its user runs in the job (nodeagentctl run), started as a worker is: as
        the workers' user, in the job's cgroup and namespaces, in a session of its own, killed
        by the kernel if the agent's thread that started it ends; its output on one pipe and
        its stdin a pipe (`stdin`) or closed, or, with `window` (rows, columns), on a
        pseudo-terminal of that size, its controlling terminal, handed to its user. Never a
        spare; never in a container. The popen, and the terminal's end the agent keeps (-1:
        none).

        Raises:
            OSError: it cannot be started (a job whose workers run in containers: none is).
        """
        if self.containers is not None:
            raise OSError("the job's workers run in containers: no command is started beside them")
        with self._making:
            space, cgroup = self._space(), self._cgroup()
        env = self._user_env(env)
        if window is None:
            given = subprocess.PIPE if stdin else subprocess.DEVNULL
            return _start(argv, env, cwd, given, self.user, cgroup, space), -1
        ours, theirs = os.openpty()
        try:
            fcntl.ioctl(ours, termios.TIOCSWINSZ, struct.pack("HHHH", *window, 0, 0))
            if self.user is not None and self.user.switch:
                os.fchown(theirs, self.user.uid, -1)  # theirs to open again (/dev/pts/N)
            env.setdefault("TERM", "xterm-256color")
            popen = _start(
                argv, env, cwd, subprocess.DEVNULL, self.user, cgroup, space, terminal=theirs
            )
        except BaseException:
            os.close(ours)
            raise
        finally:
            os.close(theirs)
        return popen, ours

    def adopt(self, pid: int) -> None:
        """Take process `pid` into the job's cgroup in each hierarchy (a login of the job's
        user: runtime/logins.py): what it starts afterwards is born there, bounded and ended
        with the job. Not into its namespaces: a process cannot be moved into those.

        Raises:
            OSError: the job has no cgroup here (its workers run in containers, or the node
                keeps none), it has left, or the kernel refused.
        """
        if self.cgroup is None:
            why = "its workers run in containers" if self.containers else "it has no cgroup here"
            raise OSError(errno.ENOTSUP, why)
        with self._making:
            self._cgroup()
            self.cgroup.enter(pid)

    def _cgroup(self) -> tuple[int, ...]:
        """The job's cgroup's `cgroup.procs` in each hierarchy, made and, with a device
        program, confined to the GPUs the job holds now (none: no cgroup). Under `_making`.

        Raises:
            JobCgroupError, DeviceCgroupError: it cannot be set up.
            OSError: the job has left the node (ESRCH).
        """
        if self._closed:
            raise OSError(errno.ESRCH, "the job has left this node")
        if self.cgroup is None:
            return ()
        self.cgroup.make()
        if self._devices is not None:
            self._devices.refresh()
        return self.cgroup.procs_fds()

    def _cpus(self, spec: WorkerSpec) -> tuple[int, ...]:
        return self._cpus_of(spec.gpus) if self._cpus_of is not None and spec.gpus else ()

    def _space(self) -> int:
        """The pid of the holder of the job's namespaces, started if need be (0: none). Under
        `_making`.

        Raises:
            JobSpaceError: it cannot be made.
            OSError: the job has left the node (ESRCH).
        """
        if self._closed:
            raise OSError(errno.ESRCH, "the job has left this node")
        return self.space.make() if self.space is not None else 0

    def oom_kills(self) -> int:
        """The processes the OOM killer took in the job's cgroup so far (0: no cgroup)."""
        return self.cgroup.oom_kills() if self.cgroup is not None else 0

    @property
    def memory_limit(self) -> int | None:
        """What the job's workers on this node may use together (None: no limit)."""
        limits = self.cgroup.limits if self.cgroup is not None else None
        return limits.memory if limits is not None else None

    def has_spare(self, spec: WorkerSpec) -> bool:
        """A live preloaded interpreter that `spec`'s worker would start in."""
        spare = self._spares.get(spec.local_rank)
        return spare is not None and spare.popen.poll() is None and spare.fits(self._as_user(spec))

    def cidfile(self, spec: WorkerSpec) -> str:
        """Where `spec`'s container id is written, if it runs in one ("" if not): the agent
        fences it by that container's cgroup."""
        return str(self.containers.cidfile(spec)) if self.containers is not None else ""

    def remove_container(self, spec: WorkerSpec) -> None:
        """Remove the container `spec`'s worker was started in, if any (blocks: not in the
        agent's loop)."""
        if self.containers is not None:
            self.containers.remove(spec)

    @property
    def depth(self) -> int:
        """How far below the top of its container's cgroup the worker's code runs (0: not in a
        container, it is the spawned process; cgroups.main_process)."""
        return self.containers.runtime.worker_depth if self.containers is not None else 0

    def _as_user(self, spec: WorkerSpec) -> WorkerSpec:
        """`spec` with the user's HOME, USER and LOGNAME (those job.env does not set), and
        TMPDIR, the job's own temp directory, unless job.env sets one."""
        env = self._user_env(spec.env)
        return spec if env == spec.env else replace(spec, env=env)

    def _user_env(self, env: Mapping[str, str]) -> dict[str, str]:
        given = env
        env = {**env, **(self.user.env if self.user is not None else {})}
        tmpdir = self.space.tmpdir if self.space is not None else None
        if tmpdir is not None and "TMPDIR" not in given:
            env["TMPDIR"] = str(tmpdir)
        return env

    def _adopt(self, spare: _Spare, spec: WorkerSpec) -> subprocess.Popen[bytes]:
        order = {"args": split_python(spec.argv)[1], "env": dict(spec.env), "cwd": spec.cwd}
        assert spare.popen.stdin is not None
        try:
            spare.popen.stdin.write(json.dumps(order).encode() + b"\n")
            spare.popen.stdin.close()
        except OSError:  # it died just now: its exit is reported like any worker's
            pass
        return spare.popen

    def plan(self, specs: Sequence[WorkerSpec], at: float) -> None:
        """Have spares for the next generation of these local ranks ready, starting at `at`."""
        if self._modules:
            self._planned = (at, specs)

    def tick(self, now: float) -> None:
        """Start the planned spares once their time has come."""
        if self._planned is None or now < self._planned[0]:
            return
        specs, self._planned = self._planned[1], None
        for spec in specs:
            if spec.local_rank not in self._spares:
                try:
                    self._spares[spec.local_rank] = self._start_spare(spec)
                except OSError as exc:
                    log.warning("cannot preload an interpreter: %s", exc)
                    return

    def _start_spare(self, spec: WorkerSpec) -> _Spare:
        with self._making:
            space, cgroup = self._space(), self._cgroup()
        spec = self._as_user(spec)
        interpreter = split_python(spec.argv)[0]
        env = static_env(spec.env)
        argv = [*interpreter, "-m", SPARE_MODULE, *self._modules]
        cpus = self._cpus(spec)
        popen = _start(argv, env, spec.cwd, subprocess.PIPE, self.user, cgroup, space, cpus)
        return _Spare(popen, interpreter, env, spec.cwd)

    def spare_pids(self) -> list[int]:
        """The spare interpreters started and not used yet."""
        return [spare.popen.pid for spare in self._spares.values()]

    def close(self) -> None:
        """Stop every spare (the agent is leaving)."""
        self._planned = None
        for spare in self._spares.values():
            spare.discard()
        self._spares.clear()
        if self.containers is not None:
            self.containers.close()
        with self._making:  # not while a command's start makes them (Spawner.command)
            self._closed = True
            if self._devices is not None:
                self._devices.close()
            if self.space is not None:
                self.space.close()
            if self.cgroup is not None:
                self.cgroup.close()
