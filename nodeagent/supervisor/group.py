"""The node's worker processes: spawn, watch, stop. The only module that starts processes.

Each worker gets its own session and process group, so a stop reaches everything it forked.
Stopping never blocks the agent's loop: `stop()` sends SIGTERM to each worker's main process
and sets a deadline, `poll()` escalates to SIGKILL once it passes, so heartbeats go on while
workers save a checkpoint. The rest of a worker's group (a DataLoader's worker processes, which
die at SIGTERM and take their main process down with "DataLoader worker ... killed by signal")
is left alone until its main process exits (then SIGTERM; a shell wrapper's child, say) or the
grace ends (SIGKILL).
A group counts as gone only when its main processes are reaped and no live (non-zombie)
process is left in their process groups or among the descendants seen at stop time.

In-place recovery (job.recovery: in_place): `release()` tells every worker over its control channel
(nodeagent.channel.control) to leave its generation's process group; the group is PARKED once every
live worker has reported leaving, and the next `start()` hands survivors their new ranks and spawns
only the local ranks with no survivor. A survivor that has not left by the release deadline is
killed, and its local rank is spawned anew.

Warm-ups (`warm_ups`, in place): while the group is released, a local rank whose worker failed
and has no preloaded spare gets its replacement at once, outside any generation: a worker of the
old generation's environment told, before it starts, to leave that generation. It imports and
sets up while the job goes on without this node, reaches `elastic.run`, and parks like a
survivor; the status counts it as warming until then (the leader does not wait for a warming
node: job/plan.py), and the next `start()` hands it its rank as it does a survivor's.
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
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from nodeagent.channel import beats, control
from nodeagent.channel.control import ControlFile, ControlFileError
from nodeagent.model.job import Failure, WorkerInfo
from nodeagent.supervisor import cgroups
from nodeagent.supervisor.errorfile import read_error_file
from nodeagent.supervisor.fence import Group, start_ticks
from nodeagent.supervisor.ranklogs import (
    Echo,
    RankLog,
    banner,
    generation_log,
    last_lines,
    open_log,
    pump_output,
    restore_report,
    worker_files,
)
from nodeagent.supervisor.spares import PRESTART_DELAY_S, Spawner
from nodeagent.supervisor.spec import WorkerSpec, warmup_spec
from nodeagent.supervisor.status import GroupPhase, GroupStatus, Started, WorkerExit

log = logging.getLogger(__name__)
SPAWN_FAILED = 127  # the shell's "command not found"
RELEASE_POLL_S = 0.002  # how often a release's watcher reads the workers' channels
LEFTOVER_POLL_S = 0.05  # how often a stop looks whether what a main process left has exited
EARLY_FAILURE_S = 10.0  # a rank failing this soon after its start is shown with its last lines


@dataclass
class _Worker:
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


def _signal_process(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


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


# Failures (Supervisor.mark_failed) of a worker that will not leave its group when told to.
_STUCK = frozenset({"hang", "xid"})
# What a worker is told once, at its start, and keeps for life (an in_place survivor too): its
# files, and its GPUs (its CUDA context lives on them).
_LIFELONG = (
    "NODEAGENT_PROGRESS_FILE",
    "TORCHELASTIC_ERROR_FILE",
    control.PATH_ENV,
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
)


class Supervisor:
    """One generation's worker group at a time."""

    def __init__(
        self,
        echo: Echo,
        wake: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        spawner: Spawner | None = None,
        warm_ups: bool = False,
    ) -> None:
        self._echo = echo
        self._warm_ups = warm_ups
        self._warmed: set[int] = set()  # local ranks given a warm-up since the last release
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
        self._release_deadline: float | None = None  # set by release(): in_place re-forming
        self._release_timeout = 0.0

    # -- starting --------------------------------------------------------------------------

    def start(self, generation: int, node: str, specs: Sequence[WorkerSpec]) -> Started:
        """Start one generation's workers. In_place survivors (a PARKED group) take their
        local rank's assignment instead of a new process."""
        if self.status().active:
            raise RuntimeError("start() while the previous group is still active")
        survivors = {w.spec.local_rank: w for w in self._survivors()}
        for worker in self._workers:
            if worker not in survivors.values():
                self._drop(worker)
        self._generation, self._node = generation, node
        self._started_at = self._clock()
        self._stop_deadline, self._killed, self._failure = None, False, None
        self._release_deadline = None
        workers = []
        warmed = sum(1 for w in survivors.values() if w.warmup)
        for spec in specs:
            survivor = survivors.pop(spec.local_rank, None)
            workers.append(self._spawn(spec) if survivor is None else self._keep(survivor, spec))
        for unused in survivors.values():  # fewer local ranks than before: cannot happen today
            workers.append(unused)
        self._workers = workers
        self._spawner.plan(specs, self._clock() + PRESTART_DELAY_S)
        return Started(
            tuple(w.spec for w in workers),
            preloaded=sum(w.preloaded for w in workers),
            kept=sum(w.kept for w in workers),
            warmed=warmed,
        )

    def _live(self) -> list[_Worker]:
        """Workers whose main process was started and has not been reaped."""
        return [w for w in self._workers if w.popen is not None and w.returncode is None]

    def _survivors(self) -> list[_Worker]:
        """In_place workers that are alive and in no generation's group: they can be kept (a
        warm-up still starting takes its assignment when it reaches `elastic.run`)."""
        return [w for w in self._live() if not w.abandoned and (w.warmup or w.has_left())]

    def _drop(self, worker: _Worker) -> None:
        beats.discard_unused(worker.spec.progress_path)
        if worker.group is not None and worker.group.cidfile:
            with contextlib.suppress(OSError):  # its container has exited (podman removed it)
                os.unlink(worker.group.cidfile)
        if worker.channel is not None:
            worker.channel.close()
            worker.channel = None

    def _keep(self, survivor: _Worker, spec: WorkerSpec) -> _Worker:
        """Hand an in_place survivor `spec`'s assignment; it keeps its own progress file,
        channel and error file (they are in its environment), and logs to its new rank's."""
        assert spec.assignment is not None and survivor.channel is not None
        old = survivor.spec
        kept = replace(
            spec,
            progress_path=old.progress_path,
            gpus=old.gpus,
            env={**spec.env, **{k: old.env[k] for k in _LIFELONG if k in old.env}},
        )
        title = banner(spec.assignment.generation, self._node, spec, time.time())
        if survivor.log is not None:
            survivor.log.switch(kept, generation_log(kept, self._spawner.user), title)
        restore_report(kept, self._spawner.user)
        survivor.channel.assign(spec.assignment)
        survivor.spec, survivor.generation = kept, spec.assignment.generation
        survivor.kept, survivor.preloaded = not survivor.warmup, False
        survivor.warmup = False
        return survivor

    def _spawn(self, spec: WorkerSpec, outside: int | None = None) -> _Worker:
        """Start `spec`'s worker into this group's generation, or, `outside` one (a warm-up),
        told to leave generation `outside` before it can read anything else."""
        generation = (self._generation or 0) if outside is None else outside
        title = banner(generation, self._node, spec, time.time())
        log_file = RankLog(spec, worker_files(spec, self._spawner.user), title)  # pump closes
        channel = ControlFile(spec.control_path) if spec.control_path is not None else None
        if channel is not None and outside is not None:
            channel.leave(outside)
        try:
            popen, preloaded = self._spawner.spawn(spec)
        except OSError as exc:
            message = f"cannot start {spec.argv[0]!r}: {exc.strerror or exc}"
            log_file.write(message.encode() + b"\n")
            log_file.close()
            if channel is not None:
                channel.close()
            self._echo(spec.rank, message)
            worker = _Worker(spec, None, returncode=SPAWN_FAILED, generation=generation)
            if outside is None:
                self._note_failure(worker)
            self._wake()
            return worker
        assert popen.stdout is not None
        pump = threading.Thread(
            target=pump_output,
            args=(popen.stdout, log_file, spec.rank, self._echo),
            name=f"log-rank-{spec.rank}",
            daemon=True,
        )
        pump.start()
        cidfile = self._spawner.cidfile(spec)
        settled = threading.Event() if cidfile else None  # bare: gone with its process group
        threading.Thread(
            target=self._await_exit,
            args=(popen, spec, settled),
            name=f"wait-rank-{spec.rank}",
            daemon=True,
        ).start()
        started = start_ticks(popen.pid)
        group = Group(popen.pid, started, cidfile) if started is not None else None
        return _Worker(
            spec,
            popen,
            preloaded=preloaded,
            group=group,
            pump=pump,
            log=log_file,
            channel=channel,
            generation=generation,
            depth=self._spawner.depth,
            settled=settled,
            warmup=outside is not None,
        )

    def _await_exit(
        self, popen: subprocess.Popen[bytes], spec: WorkerSpec, settled: threading.Event | None
    ) -> None:
        """Wake the agent when the worker's process exits; for a containerised worker, then
        remove its container through the service (a start its `podman run` asked for before
        it was killed could otherwise still come) and wake the agent again: until then the
        worker is not gone (`_alive`)."""
        popen.wait()
        self._wake()
        if settled is not None:
            self._spawner.remove_container(spec)
            settled.set()
            self._wake()

    # -- re-forming in place -----------------------------------------------------------------

    def release(self, timeout_s: float) -> None:
        """Tell every in_place worker to leave its generation's process group (they keep
        running); kill those that have not left after `timeout_s` (poll() does)."""
        if self._release_deadline is not None or self._stop_deadline is not None:
            return
        self._release_deadline = self._clock() + timeout_s
        self._release_timeout = timeout_s
        self._warmed.clear()
        culprit = self._failure.rank if self._failure and self._failure.kind in _STUCK else None
        for worker in self._workers:
            if worker.returncode is None and worker.spec.rank == culprit:
                worker.abandoned = True  # hung, or its GPU failed: it would not leave
                self._kill_worker(worker)
            elif worker.channel is not None and worker.returncode is None:
                try:
                    worker.channel.leave(worker.generation)
                except (ControlFileError, ValueError) as exc:
                    log.warning(
                        "rank %d: cannot write its channel (%s): killing it", worker.spec.rank, exc
                    )
                    self._kill_worker(worker)
        waiting = [w for w in self._unleft() if not w.abandoned]
        if waiting:
            threading.Thread(
                target=self._watch_leaving, args=(waiting,), name="release-watch", daemon=True
            ).start()
        self._warm()

    def _warm(self) -> None:
        """Start a warm-up (the module docstring) for each local rank whose worker failed while
        the group is released, once a release; none for a rank with a preloaded spare (it
        starts in the next generation at once) or for a warm-up that failed itself (its rank
        starts in the next generation as any other, cold, and fails there if it must)."""
        deadline = self._release_deadline
        if not self._warm_ups or deadline is None or self._stop_deadline is not None:
            return
        if self._clock() >= deadline:  # a survivor that gave up waiting: the next start's
            return
        if self._failure is not None and self._failure.kind == "xid":  # its GPU: cordoned
            return
        live = {w.spec.local_rank for w in self._live()}
        for dead in list(self._workers):
            rank = dead.spec.local_rank
            failed = dead.returncode is not None and dead.returncode != 0 and not dead.finished
            if not failed or dead.warmup or rank in live or rank in self._warmed:
                continue
            self._warmed.add(rank)
            spec = warmup_spec(dead.spec, dead.generation)
            if self._spawner.has_spare(spec):
                continue
            log.info(
                "rank %d: its replacement warms up outside generation %d", rank, dead.generation
            )
            worker = self._spawn(spec, outside=dead.generation)
            worker.warm_until = self._clock() + self._release_timeout
            self._workers.append(worker)
            live.add(rank)
            if worker.returncode is None:
                threading.Thread(
                    target=self._watch_leaving, args=([worker],), name="warm-watch", daemon=True
                ).start()

    def _watch_leaving(self, waiting: list[_Worker]) -> None:
        """Wake the agent as workers report leaving: a report is a write to shared memory,
        which wakes nobody (an exit does, through _await_exit). Polls the channels every
        RELEASE_POLL_S until each has left or exited, or the release deadline has passed;
        only reads (the agent's loop acts)."""
        deadline = self._release_deadline
        while waiting and deadline is not None and self._clock() < deadline:
            time.sleep(RELEASE_POLL_S)
            still = [w for w in waiting if w.returncode is None and not w.has_left()]
            if len(still) < len(waiting):
                self._wake()
            waiting = still

    def _unleft(self) -> list[_Worker]:
        """Live workers still in their generation's process group."""
        return [w for w in self._live() if not w.has_left()]

    def _kill_worker(self, worker: _Worker) -> None:
        if worker.popen is not None:
            _signal_group(worker.popen.pid, signal.SIGKILL)
        if worker.group is not None and worker.group.cidfile:
            cgroups.kill_container(worker.group.cidfile)  # a container is not in the group

    def _enforce_release(self) -> None:
        """Past the release deadline: kill each worker still in its old process group (blocked
        in a collective with a frozen peer: gloo cannot be aborted). Its local rank starts anew."""
        if self._release_deadline is None:
            return
        now = self._clock()
        for worker in self._unleft():
            if worker.abandoned:
                continue
            if worker.warmup and now >= worker.warm_until:
                log.warning(
                    "local rank %d: its warm-up (pid %d) did not reach elastic.run in "
                    "reform_timeout: killing it; the rank starts with the next generation",
                    *(worker.spec.local_rank, worker.pid),
                )
            elif worker.warmup or now < self._release_deadline:
                continue
            else:
                log.warning(
                    "rank %d (pid %d) did not leave generation %d in reform_timeout: killing it",
                    *(worker.spec.rank, worker.pid, worker.generation),
                )
            worker.abandoned = True
            self._kill_worker(worker)

    # -- stopping --------------------------------------------------------------------------

    def stop(self, grace_s: float) -> None:
        """SIGTERM every worker's main process now, the rest of its process group once the
        main process has exited; SIGKILL what is left after `grace_s`.

        Only the main process is told at first: a script saving its emergency checkpoint
        still needs its DataLoader's worker processes (they die at SIGTERM, and the main
        process with them). Everything else still dies by the deadline, which fencing sets.
        """
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
            if worker.returncode is None:
                _signal_process(worker.popen.pid, signal.SIGTERM)
            else:
                self._term_group(worker)
            _signal_group(worker.popen.pid, signal.SIGCONT)  # a stopped process must see TERM

    def signal(self, name: str) -> None:
        """Send SIG`name` (USR1) to every running worker's main process (a time limit's
        warning: sbatch --signal); its children are the script's to tell."""
        sig = signal.Signals[f"SIG{name}"]
        for worker in self._workers:
            if worker.popen is not None and worker.returncode is None:
                _signal_process(worker.popen.pid, sig)

    def _term_group(self, worker: _Worker) -> None:
        """SIGTERM what a stopped worker's main process left in its group (once)."""
        if worker.popen is None or worker.group_termed:
            return
        worker.group_termed = True
        _signal_group(worker.popen.pid, signal.SIGTERM)
        _signal_group(worker.popen.pid, signal.SIGCONT)

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
            self._kill_worker(worker)
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
            # Told to stop, or to leave in place: an exit then is not a failure of the generation
            # (an in_place survivor that exits instead is started anew with the next one).
            expected = self._stop_deadline is not None or self._release_deadline is not None
            cause = None
            worker.finished = code != 0 and not expected and worker.has_finished()
            if worker.finished:
                log.warning(
                    "rank %d reached its end (its training returned), then exited with %s: "
                    "counted as finished",
                    worker.spec.rank,
                    _signal_name(code) or f"exit code {code}",
                )
            elif not expected and code != 0:
                cause = self._cause(worker)
                self._note_failure(worker, cause)
            if worker.warmup and not worker.has_left():
                log.warning(
                    "local rank %d: its warm-up exited (%s) before it was ready; the rank starts "
                    "with the next generation",
                    *(worker.spec.local_rank, _signal_name(code) or f"exit code {code}"),
                )
            exits.append(
                WorkerExit(
                    generation=self._generation or 0,
                    rank=worker.spec.rank,
                    local_rank=worker.spec.local_rank,
                    exit_code=code if code >= 0 else None,
                    signal=_signal_name(code),
                    expected=expected,
                    cause=cause,
                    finished=worker.finished,
                )
            )
        self._warm()
        self._enforce_release()
        stopping = self._stop_deadline is not None
        if stopping:
            for worker in self._workers:
                if worker.returncode is not None:
                    self._term_group(worker)
        overdue = stopping and self._clock() >= (self._stop_deadline or 0.0)
        mains_done = all(w.returncode is not None for w in self._workers)
        leftovers = mains_done and not stopping  # a stop's leftovers have until its deadline
        if self._workers and not self._killed and (overdue or leftovers) and self._alive():
            if leftovers:
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
            with open_log(worker.spec.log_path) as log_file:
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
            if worker.settled is not None and not worker.settled.is_set():
                return True  # its container is being removed
            if (
                worker.group is not None
                and worker.group.cidfile
                and cgroups.container_alive(worker.group.cidfile)
            ):
                return True  # its container (conmon's child, not in the group) still runs
            if any(_process_alive(p) for p in worker.descendants):
                return True
        return False

    def status(self) -> GroupStatus:
        if not self._workers:
            return GroupStatus()
        if not self._alive():
            phase = GroupPhase.EXITED
        elif self._stop_deadline is not None:
            phase = GroupPhase.STOPPING
        elif self._release_deadline is not None:
            live = self._live()
            left = all(w.warmup or w.has_left() for w in live) and bool(live)
            phase = GroupPhase.PARKED if left else GroupPhase.RELEASING
        else:
            phase = GroupPhase.RUNNING
        # Workers that exit 0 because we asked them to stop have not finished the job.
        asked = self._stop_deadline is not None or self._release_deadline is not None
        succeeded = not asked and all(w.returncode == 0 or w.finished for w in self._workers)
        warming = sum(1 for w in self._live() if w.warmup and not w.abandoned and not w.has_left())
        released = self._release_deadline is not None
        return GroupStatus(self._generation, phase, self._failure, succeeded, warming, released)

    def close(self) -> None:
        """Release what outlives a group (preloaded interpreters); the agent is leaving."""
        self._spawner.close()
        self._discard_unused_progress()

    def _discard_unused_progress(self) -> None:
        """The group has ended (the agent leaves): remove the progress files its workers never
        beat into, so only scripts that call beat() leave one behind."""
        for worker in self._workers:
            self._drop(worker)

    def next_deadline(self) -> float | None:
        """When poll() must run next: to escalate a stop, or to kill a survivor that has not
        left its generation in time."""
        if self._killed or not self._alive():
            return None
        if self._stop_deadline is not None:
            if any(w.group_termed for w in self._workers):  # their exits wake nobody
                return min(self._stop_deadline, self._clock() + LEFTOVER_POLL_S)
            return self._stop_deadline
        waiting = [w for w in self._unleft() if not w.abandoned]
        if self._release_deadline is not None and waiting:  # (a killed one's exit wakes it)
            return min(w.warm_until if w.warmup else self._release_deadline for w in waiting)
        return None

    def groups(self) -> tuple[Group, ...]:
        """The process groups of this generation that may still run (for the fence keeper)."""
        if not self._workers or not self._alive():
            return ()
        return tuple(w.group for w in self._workers if w.group is not None)

    def workers(self) -> tuple[WorkerInfo, ...]:
        infos = []
        for w in self._workers:
            if w.returncode is None and self._stop_deadline is not None:
                state = "stopping"
            elif w.returncode is None and self._release_deadline is not None:
                state = "parked" if w.has_left() else "warming" if w.warmup else "leaving"
            elif w.returncode is None:
                state = "running"
            else:
                state = "exited" if w.returncode == 0 or w.finished else "failed"
            infos.append(
                WorkerInfo(w.spec.rank, w.spec.local_rank, w.worker_pid(), state, w.returncode)
            )
        return tuple(infos)
