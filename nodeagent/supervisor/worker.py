"""One worker of a group (supervisor/group.py): the record the Supervisor keeps of its process,
and what is done to one worker: read what it said over its channels, signal it, kill it, tell
whether anything it started may still run, dump its stacks, and the Failure its exit makes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from nodeagent.channel import beats
from nodeagent.channel.control import ControlFile, ControlFileError
from nodeagent.config.identity import WorkerUser
from nodeagent.model.job import Failure, WorkerInfo
from nodeagent.supervisor import cgroups
from nodeagent.supervisor.errorfile import read_error_file
from nodeagent.supervisor.fence import Group
from nodeagent.supervisor.ranklogs import RankLog, last_lines, open_log
from nodeagent.supervisor.spares import die_with
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import Activity
from nodeagent.supervisor.usage import activity_of, cpu_of

log = logging.getLogger(__name__)


@dataclass
class Worker:
    spec: WorkerSpec
    popen: subprocess.Popen[bytes] | None
    returncode: int | None = None
    descendants: list[psutil.Process] = field(default_factory=list)
    preloaded: bool = False  # runs in an interpreter started ahead of time (job.preload)
    group: Group | None = None  # its process group, for the fence keeper
    pump: threading.Thread | None = None  # copies its output to its log
    log: RankLog | None = None  # where the pump writes (a survivor moves to its new rank's)
    channel: ControlFile | None = None  # in_place: the worker's control channel
    generation: int = 0  # the generation it takes part in (a survivor's changes)
    kept: bool = False  # an in_place survivor carried into this generation
    abandoned: bool = False  # killed for not leaving its generation in time
    group_termed: bool = False  # a stop sent SIGTERM to its whole process group
    depth: int = 0  # the runtime's processes above a containerised worker (Spawner.depth)
    cgroup: str | None = None  # its container's, once found (cgroups.container_cgroup)
    settled: threading.Event | None = None  # set: nothing of it can run any more (_await_exit)
    finished: bool = False  # it said it reached its end before it exited (has_finished)
    warmup: bool = False  # started outside any generation to replace a failed one; unassigned
    warm_until: float = 0.0  # a warm-up not parked by then is killed (its own reform_timeout)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def worker_pid(self) -> int | None:
        """The process that runs the worker's code: its main process, or, in a container, the
        worker inside (its `podman run` process only proxies), None until it runs. Read anew
        each time (a few /proc reads): while the container starts, the runtime's own processes
        stand where the worker will. The container's cgroup is looked up once it exists."""
        if self.group is None or not self.group.cidfile or self.returncode is not None:
            return self.pid
        if self.cgroup is None:
            self.cgroup = cgroups.container_cgroup(self.group.cidfile)
        return cgroups.main_process(self.cgroup, self.depth) if self.cgroup else None

    def stopped(self) -> bool:
        """Its worker process is stopped by a signal (SIGSTOP, SIGTSTP: state T; a tracer's
        stop is not counted): it cannot be waiting for a peer, it is the one stuck."""
        pid = self.worker_pid()
        if pid is None:
            return False
        try:
            return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)
        except psutil.Error:
            return False

    def cpu_seconds(self) -> float | None:
        """The CPU seconds its worker process has used (supervisor/usage.py); None: gone."""
        pid = self.worker_pid()
        return None if pid is None else cpu_of(pid)

    def activity(self) -> Activity | None:
        """Whether its worker does no work of its own (supervisor/usage.py); None: not
        readable."""
        pid = self.worker_pid()
        return None if pid is None else activity_of(pid)

    def has_finished(self) -> bool:
        """It reported that its training returned in its generation: through its in_place
        channel (one aligned word, read whole, so nothing to retry or refuse), or, any worker,
        through its progress file (`progress.finished()`, the integrations')."""
        if self.channel is not None and self.channel.finished_generation() >= self.generation:
            return True
        beat = beats.read(self.spec.progress_path)
        return beat is not None and beat.finished

    def has_left(self) -> bool:
        """It reported leaving its generation's process group (in_place workers only)."""
        if self.channel is None:
            return False
        try:
            return self.channel.report().left_generation >= self.generation
        except ControlFileError as exc:
            log.warning("rank %d: unreadable control channel: %s", self.spec.rank, exc)
            return False

    # -- signals ---------------------------------------------------------------------------

    def terminate(self) -> None:
        """A stop: remember what its main process started, SIGTERM that process (or, once it
        has exited, the rest of its group), and SIGCONT the group (a stopped process must see
        the TERM)."""
        if self.popen is None:
            return
        try:
            self.descendants = psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.Error:
            self.descendants = []
        if self.returncode is None:
            signal_process(self.popen.pid, signal.SIGTERM)
        else:
            self.term_group()
        signal_group(self.popen.pid, signal.SIGCONT)

    def term_group(self) -> None:
        """SIGTERM what a stopped worker's main process left in its group (once)."""
        if self.popen is None or self.group_termed:
            return
        self.group_termed = True
        signal_group(self.popen.pid, signal.SIGTERM)
        signal_group(self.popen.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL its process group, and its container (which is not in the group)."""
        if self.popen is not None:
            signal_group(self.popen.pid, signal.SIGKILL)
        if self.group is not None and self.group.cidfile:
            cgroups.kill_container(self.group.cidfile)  # a container is not in the group

    def kill_all(self) -> None:
        """SIGKILL its group, its container and every descendant seen at the stop."""
        if self.popen is None:
            return
        self.kill()
        for proc in self.descendants:
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def alive(self) -> bool:
        """Anything it started may still run: its main process, a live (non-zombie) process of
        its group or among the descendants seen at the stop, or its container."""
        if self.popen is None:
            return False
        if self.returncode is None or group_alive(self.popen.pid):
            return True
        if self.settled is not None and not self.settled.is_set():
            return True  # its container is being removed
        if (
            self.group is not None
            and self.group.cidfile
            and cgroups.container_alive(self.group.cidfile)
        ):
            return True  # its container (conmon's child, not in the group) still runs
        return any(process_alive(p) for p in self.descendants)

    def drop(self) -> None:
        """Forget it: its progress file if it never beat, its cidfile, its channel."""
        beats.discard_unused(self.spec.progress_path)
        if self.group is not None and self.group.cidfile:
            with contextlib.suppress(OSError):  # its container has exited (podman removed it)
                os.unlink(self.group.cidfile)
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def dump_stacks(self, user: WorkerUser | None = None) -> str:
        """Capture a hung worker's stacks into its log: py-spy (run as `user`, the job's) if
        installed and able, else SIGUSR1 (the worker helper registers faulthandler on it; a
        stopped process dumps when it is continued)."""
        if self.popen is None or self.returncode is not None:
            return "worker already exited"
        pid = self.popen.pid
        try:
            dump: str | None = py_spy_dump(pid, user=user)
        except OSError:
            dump = None
        if dump is not None:
            with open_log(self.spec.log_path) as log_file:
                log_file.write(
                    f"--- nodeagent: no progress; py-spy dump of pid {pid}\n{dump}\n".encode()
                )
            return dump
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
        return "sent SIGUSR1: faulthandler's dump is in the rank's log"

    # -- what it reports ---------------------------------------------------------------------

    def cause(self, early: bool) -> str | None:
        """What the failed rank said of its death: the exception its @record wrote, else, when
        it exited with an error `early` (within EARLY_FAILURE_S of its start: an import error,
        a bad argument), its last lines of output."""
        error_file = self.spec.error_file
        if error_file is not None and (cause := read_error_file(error_file)):
            return cause
        if not early or (self.returncode or 0) < 0:
            return None  # late, or killed by a signal: its last lines are not why it died
        if self.pump is not None:  # let it copy the last lines (a child may hold the pipe)
            self.pump.join(0.2)
        return last_lines(self.spec.log_path)

    def failure(self, generation: int, node: str, cause: str | None) -> Failure:
        """The failure its exit makes (it has exited)."""
        code = self.returncode or 0
        return Failure(
            generation=generation,
            node=node,
            rank=self.spec.rank,
            kind="signal" if code < 0 else "exit_code",
            exit_code=code if code >= 0 else None,
            signal=signal_name(code),
            cause=cause,
            log=str(self.spec.log_path),
        )

    def info(self, stopping: bool, released: bool) -> WorkerInfo:
        """Its line in the node's report: its state as the group's stop or release sees it."""
        if self.returncode is None and stopping:
            state = "stopping"
        elif self.returncode is None and released:
            state = "parked" if self.has_left() else "warming" if self.warmup else "leaving"
        elif self.returncode is None:
            state = "running"
        else:
            state = "exited" if self.returncode == 0 or self.finished else "failed"
        return WorkerInfo(
            self.spec.rank, self.spec.local_rank, self.worker_pid(), state, self.returncode
        )


def live(workers: Sequence[Worker]) -> list[Worker]:
    """Workers whose main process was started and has not been reaped."""
    return [w for w in workers if w.popen is not None and w.returncode is None]


def unleft(workers: Sequence[Worker]) -> list[Worker]:
    """Live workers still in their generation's process group."""
    return [w for w in live(workers) if not w.has_left()]


def signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False  # only zombies are left: they run nothing


def process_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_process(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def py_spy_dump(
    pid: int, native: bool = False, user: WorkerUser | None = None, timeout: float = 10.0
) -> str:
    """py-spy's dump of `pid`'s Python stacks (`native`: with its native frames), taken while
    py-spy stops it, for milliseconds; run as `user`, the job's (who may trace their own
    processes; the agent's unit keeps no CAP_SYS_PTRACE), in `/`, with no variable of the
    agent's, killed with the agent's thread that waits for it.

    Raises:
        OSError: py-spy is missing, timed out, or cannot read it (not Python, a stopped
            process, tracing refused): its words.
    """
    beside = Path(sys.executable).with_name("py-spy")  # installed in the agent's virtualenv
    py_spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if py_spy is None:
        raise OSError("py-spy is not installed beside the agent")
    argv = [py_spy, "dump", "--pid", str(pid), *(["--native"] if native else [])]
    switch = user is not None and user.switch
    try:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd="/",
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
            user=user.uid if user is not None and switch else None,
            group=user.gid if user is not None and switch else None,
            extra_groups=list(user.groups) if user is not None and switch else None,
            preexec_fn=die_with(os.getpid()),
        )
    except subprocess.TimeoutExpired:
        raise OSError(f"py-spy took longer than {timeout:g} s") from None
    if result.returncode != 0 or not result.stdout:
        raise OSError(f"py-spy: {_py_spy_error(result.stderr or result.stdout)}")
    return result.stdout


def _py_spy_error(said: str) -> str:
    """py-spy's error and its first cause, without its backtrace. Pure."""
    lines = [line.strip() for line in said.strip().splitlines() if line.strip()]
    if not lines:
        return "it failed and said nothing"
    first = lines[0].removeprefix("Error: ")
    if "Caused by:" in lines[:-1]:
        cause = lines[lines.index("Caused by:") + 1].partition(": ")[2]
        return f"{first} ({cause})" if cause else first
    return first
