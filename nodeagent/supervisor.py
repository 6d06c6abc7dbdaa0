"""The node's worker processes: spawn, watch, stop. The only module that starts processes.

Each worker gets its own session and process group, so a stop reaches everything it forked.
Stopping never blocks the agent's loop: `stop()` sends SIGTERM and sets a deadline, `poll()`
escalates to SIGKILL once it passes, so heartbeats go on while workers save a checkpoint.
A group counts as gone only when its main processes are reaped and no live (non-zombie)
process is left in their process groups or among the descendants seen at stop time.
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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from nodeagent import progress
from nodeagent.errorfile import read_error_file
from nodeagent.fencing import Group, start_ticks
from nodeagent.identity import WorkerUser
from nodeagent.launch import WorkerSpec
from nodeagent.logs import Echo
from nodeagent.model import CAUSE_MAX, Failure, WorkerInfo
from nodeagent.node import GroupPhase, GroupStatus
from nodeagent.preload import PRESTART_DELAY_S, Spawner

log = logging.getLogger(__name__)
SPAWN_FAILED = 127  # the shell's "command not found"
EARLY_FAILURE_S = 10.0  # a rank failing this soon after its start is shown with its last lines


def last_lines(path: Path, count: int = 3) -> str | None:
    """The last `count` non-empty lines of a log, joined with ' | ', at most CAUSE_MAX chars."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()][-count:]
    return " | ".join(lines)[-CAUSE_MAX:] or None


@dataclass(frozen=True)
class WorkerExit:
    """A worker's main process ended. `expected` when the agent had asked it to stop."""

    generation: int
    rank: int
    local_rank: int
    exit_code: int | None
    signal: str | None
    expected: bool
    cause: str | None = None  # a failure's root cause or last lines (Supervisor._cause)


@dataclass
class _Worker:
    spec: WorkerSpec
    popen: subprocess.Popen[bytes] | None
    returncode: int | None = None
    descendants: list[psutil.Process] = field(default_factory=list)
    preloaded: bool = False  # runs in an interpreter started ahead of time (job.preload)
    group: Group | None = None  # its process group, for the fence keeper
    pump: threading.Thread | None = None  # copies its output to its log

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None


def _signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _group_alive(pgid: int) -> bool:
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


def _process_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _py_spy_dump(pid: int) -> str | None:
    """py-spy's dump of `pid`, or None if py-spy is missing or cannot read it (a stopped
    process, no ptrace permission)."""
    beside = Path(sys.executable).with_name("py-spy")  # installed in the agent's virtualenv
    py_spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if py_spy is None:
        return None
    try:
        result = subprocess.run(
            [py_spy, "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 and result.stdout else None


LOG_MODE = 0o640  # worker logs are the agent's: the worker writes them only through its pipe
DIR_MODE = 0o750  # a generation's directory: the agent's, searchable by the workers' group


def _open_log(path: Path) -> IO[bytes]:
    """A rank's log, for appending, 0640 whatever the umask (or an older file's mode)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, LOG_MODE)
    os.fchmod(fd, LOG_MODE)
    return os.fdopen(fd, "ab")


def _worker_files(spec: WorkerSpec, user: WorkerUser | None) -> IO[bytes]:
    """The generation's directory, the worker's progress file and its log (returned, open).

    A worker that runs as another user must reach its progress file to map it, and write its
    error file: the job's and the generation's directories get the worker's group (0750) and
    those two files become the worker's. Nothing else there is readable to it: logs stay the
    agent's (0640).
    """
    directory = spec.log_path.parent
    directory.mkdir(parents=True, exist_ok=True)
    other = user if user is not None and user.switch else None
    if other is not None:
        for path in (directory.parent, directory):
            os.chown(path, -1, other.gid)
            os.chmod(path, DIR_MODE)
    progress.create(spec.progress_path, owner=other.uid if other is not None else None)
    if other is not None and spec.error_file is not None:  # @record writes it on failure;
        progress.worker_file(spec.error_file, other.uid)  # empty reads as no error file
    return _open_log(spec.log_path)


class RankLog:
    """Where a rank's output goes: its generation's file (`<job>/<generation>/rank-R.log`) and
    the rank's one file across generations (`<job>/rank-R.log`, appended after a banner line
    naming the generation and node), the one to follow (`nodeagentctl logs --rank R`)."""

    def __init__(self, spec: WorkerSpec, generation_log: IO[bytes], banner: str) -> None:
        self._files = (generation_log, _open_log(stable_log_path(spec.log_path)))
        self._files[1].write(f"{banner}\n".encode())
        self._files[1].flush()

    def write(self, data: bytes) -> None:
        for f in self._files:
            f.write(data)
            f.flush()

    def close(self) -> None:
        for f in self._files:
            f.close()


def stable_log_path(generation_log: Path) -> Path:
    """`<log_dir>/<job>/rank-R.log` for `<log_dir>/<job>/<generation>/rank-R.log`."""
    return generation_log.parent.parent / generation_log.name


def banner(generation: int, node: str, spec: WorkerSpec, now: float) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return (
        f"=== nodeagent: generation {generation}, rank {spec.rank} "
        f"(local {spec.local_rank}) on {node}, {when} ==="
    )


def _pump(stream: IO[bytes], log: RankLog, rank: int, echo: Echo) -> None:
    """Copy a worker's output, line by line, to its logs and the agent's output."""
    try:
        with stream:
            for line in iter(stream.readline, b""):
                log.write(line)
                echo(rank, line.decode("utf-8", "replace").rstrip("\n"))
    finally:
        log.close()


class Supervisor:
    """One generation's worker group at a time."""

    def __init__(
        self,
        echo: Echo,
        wake: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        spawner: Spawner | None = None,
    ) -> None:
        self._echo = echo
        self._wake = wake
        self._clock = clock
        self._spawner = spawner or Spawner()
        self._generation: int | None = None
        self._workers: list[_Worker] = []
        self._stop_deadline: float | None = None
        self._killed = False
        self._failure: Failure | None = None
        self._started_at = 0.0
        self._node = ""

    # -- starting --------------------------------------------------------------------------

    def start(self, generation: int, node: str, specs: Sequence[WorkerSpec]) -> int:
        """Start one generation's workers; how many run in preloaded interpreters."""
        if self.status().active:
            raise RuntimeError("start() while the previous group is still active")
        self._discard_unused_progress()
        self._generation, self._node = generation, node
        self._started_at = self._clock()
        self._stop_deadline, self._killed, self._failure = None, False, None
        self._workers = [self._spawn(spec) for spec in specs]
        self._spawner.plan(specs, self._clock() + PRESTART_DELAY_S)
        return sum(w.preloaded for w in self._workers)

    def _spawn(self, spec: WorkerSpec) -> _Worker:
        title = banner(self._generation or 0, self._node, spec, time.time())
        log_file = RankLog(spec, _worker_files(spec, self._spawner.user), title)  # pump closes
        try:
            popen, preloaded = self._spawner.spawn(spec)
        except OSError as exc:
            message = f"cannot start {spec.argv[0]!r}: {exc.strerror or exc}"
            log_file.write(message.encode() + b"\n")
            log_file.close()
            self._echo(spec.rank, message)
            worker = _Worker(spec, None, returncode=SPAWN_FAILED)
            self._note_failure(worker)
            self._wake()
            return worker
        assert popen.stdout is not None
        pump = threading.Thread(
            target=_pump,
            args=(popen.stdout, log_file, spec.rank, self._echo),
            name=f"log-rank-{spec.rank}",
            daemon=True,
        )
        pump.start()
        threading.Thread(
            target=self._await_exit, args=(popen,), name=f"wait-rank-{spec.rank}", daemon=True
        ).start()
        started = start_ticks(popen.pid)
        group = Group(popen.pid, started) if started is not None else None
        return _Worker(spec, popen, preloaded=preloaded, group=group, pump=pump)

    def _await_exit(self, popen: subprocess.Popen[bytes]) -> None:
        popen.wait()
        self._wake()

    # -- stopping --------------------------------------------------------------------------

    def stop(self, grace_s: float) -> None:
        """SIGTERM every worker's process group now; SIGKILL what is left after `grace_s`."""
        deadline = self._clock() + grace_s
        if self._stop_deadline is not None:
            self._stop_deadline = min(self._stop_deadline, deadline)
            return
        self._stop_deadline = deadline
        for worker in self._workers:
            if worker.popen is None:
                continue
            try:
                worker.descendants = psutil.Process(worker.popen.pid).children(recursive=True)
            except psutil.Error:
                worker.descendants = []
            _signal_group(worker.popen.pid, signal.SIGTERM)
            _signal_group(worker.popen.pid, signal.SIGCONT)  # a stopped process must see TERM

    def kill(self) -> None:
        """SIGKILL everything at once (a second SIGTERM to the agent, or fencing at the limit)."""
        if self._stop_deadline is None:
            self.stop(0.0)
        self._stop_deadline = self._clock()
        self._escalate()

    def _escalate(self) -> None:
        self._killed = True
        for worker in self._workers:
            if worker.popen is None:
                continue
            _signal_group(worker.popen.pid, signal.SIGKILL)
            for proc in worker.descendants:
                with contextlib.suppress(psutil.Error):
                    proc.kill()

    # -- watching --------------------------------------------------------------------------

    def poll(self) -> list[WorkerExit]:
        """Reap exited workers, escalate overdue stops; return exits not reported before."""
        self._spawner.tick(self._clock())
        exits = []
        for worker in self._workers:
            if worker.popen is None or worker.returncode is not None:
                continue
            code = worker.popen.poll()
            if code is None:
                continue
            worker.returncode = code
            expected = self._stop_deadline is not None
            cause = None
            if not expected and code != 0:
                cause = self._cause(worker)
                self._note_failure(worker, cause)
            exits.append(
                WorkerExit(
                    generation=self._generation or 0,
                    rank=worker.spec.rank,
                    local_rank=worker.spec.local_rank,
                    exit_code=code if code >= 0 else None,
                    signal=_signal_name(code),
                    expected=expected,
                    cause=cause,
                )
            )
        overdue = self._stop_deadline is not None and self._clock() >= self._stop_deadline
        mains_done = all(w.returncode is not None for w in self._workers)
        if self._workers and not self._killed and (overdue or mains_done) and self._alive():
            if mains_done and not overdue:
                log.warning("worker processes left children behind; killing them")
            self._escalate()
        return exits

    def mark_failed(self, local_rank: int, kind: str, code: int | None = None) -> None:
        """Record a failure the exit code does not show: kind "hang" (no progress) or "xid"
        (an application XID on its GPU; `code` is the XID)."""
        worker = next(w for w in self._workers if w.spec.local_rank == local_rank)
        if self._failure is None:
            self._failure = Failure(
                generation=self._generation or 0,
                node=self._node,
                rank=worker.spec.rank,
                kind=kind,
                exit_code=code,
            )

    def dump_stacks(self, local_rank: int) -> str:
        """Capture a hung worker's stacks into its log: py-spy if installed and able, else
        SIGUSR1 (the worker helper registers faulthandler on it; a stopped process dumps when
        it is continued)."""
        worker = next(w for w in self._workers if w.spec.local_rank == local_rank)
        if worker.popen is None or worker.returncode is not None:
            return "worker already exited"
        pid = worker.popen.pid
        dump = _py_spy_dump(pid)
        if dump is not None:
            with _open_log(worker.spec.log_path) as log_file:
                log_file.write(
                    f"--- nodeagent: no progress; py-spy dump of pid {pid}\n{dump}\n".encode()
                )
            return dump
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
        return "sent SIGUSR1: faulthandler's dump is in the rank's log"

    def _note_failure(self, worker: _Worker, cause: str | None = None) -> None:
        if self._failure is not None or worker.returncode is None:
            return
        code = worker.returncode
        self._failure = Failure(
            generation=self._generation or 0,
            node=self._node,
            rank=worker.spec.rank,
            kind="signal" if code < 0 else "exit_code",
            exit_code=code if code >= 0 else None,
            signal=_signal_name(code),
            cause=cause,
            log=str(worker.spec.log_path),
        )

    def _cause(self, worker: _Worker) -> str | None:
        """What the failed rank said of its death: the exception its @record wrote, else, when
        it exited with an error within EARLY_FAILURE_S of its start (an import error, a bad
        argument), its last lines of output."""
        error_file = worker.spec.error_file
        if error_file is not None and (cause := read_error_file(error_file)):
            return cause
        if self._clock() - self._started_at > EARLY_FAILURE_S or (worker.returncode or 0) < 0:
            return None  # late, or killed by a signal: its last lines are not why it died
        if worker.pump is not None:  # let it copy the last lines (a child may hold the pipe)
            worker.pump.join(0.2)
        return last_lines(worker.spec.log_path)

    def _alive(self) -> bool:
        for worker in self._workers:
            if worker.popen is None:
                continue
            if worker.returncode is None or _group_alive(worker.popen.pid):
                return True
            if any(_process_alive(p) for p in worker.descendants):
                return True
        return False

    def status(self) -> GroupStatus:
        if not self._workers:
            return GroupStatus()
        if self._alive():
            phase = GroupPhase.STOPPING if self._stop_deadline is not None else GroupPhase.RUNNING
        else:
            phase = GroupPhase.EXITED
        # Workers that exit 0 because we asked them to stop have not finished the job.
        succeeded = self._stop_deadline is None and all(w.returncode == 0 for w in self._workers)
        return GroupStatus(self._generation, phase, self._failure, succeeded)

    def close(self) -> None:
        """Release what outlives a group (preloaded interpreters); the agent is leaving."""
        self._spawner.close()
        self._discard_unused_progress()

    def _discard_unused_progress(self) -> None:
        """The group has ended (replaced, or the agent leaves): remove the progress files its
        workers never beat into, so only scripts that call beat() leave one behind."""
        for worker in self._workers:
            progress.discard_unused(worker.spec.progress_path)

    def next_deadline(self) -> float | None:
        """When poll() must run next to escalate a stop, if a stop is pending."""
        if self._stop_deadline is None or self._killed or not self._alive():
            return None
        return self._stop_deadline

    def groups(self) -> tuple[Group, ...]:
        """The process groups of this generation that may still run (for the fence keeper)."""
        if not self._workers or not self._alive():
            return ()
        return tuple(w.group for w in self._workers if w.group is not None)

    def workers(self) -> tuple[WorkerInfo, ...]:
        infos = []
        for w in self._workers:
            if w.returncode is None:
                state = "stopping" if self._stop_deadline is not None else "running"
            else:
                state = "exited" if w.returncode == 0 else "failed"
            infos.append(WorkerInfo(w.spec.rank, w.spec.local_rank, w.pid, state, w.returncode))
        return tuple(infos)
