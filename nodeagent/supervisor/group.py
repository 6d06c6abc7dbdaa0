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

In place (job.recovery: in_place), a group is released rather than stopped, its survivors kept
for the next generation, and a failed rank's replacement warms up meanwhile: release.py. One
worker's record, and what is done to one worker, is worker.py's.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from nodeagent.channel import control
from nodeagent.channel.control import ControlFile
from nodeagent.config.identity import WorkerUser
from nodeagent.config.values import size_text
from nodeagent.model.job import Failure, WorkerInfo
from nodeagent.supervisor.command import Command
from nodeagent.supervisor.fence import Group, start_ticks
from nodeagent.supervisor.ranklogs import (
    Echo,
    RankLog,
    banner,
    generation_log,
    pump_output,
    restore_report,
    worker_files,
)
from nodeagent.supervisor.release import Release
from nodeagent.supervisor.spares import PRESTART_DELAY_S, Spawner
from nodeagent.supervisor.spec import (
    WORKERS_OWN,
    WorkerSpec,
    task_env,
    visible_devices_of,
    warmup_spec,
)
from nodeagent.supervisor.status import Activity, GroupPhase, GroupStatus, Started, WorkerExit
from nodeagent.supervisor.worker import Worker, live, signal_name, signal_process, unleft

log = logging.getLogger(__name__)
SPAWN_FAILED = 127  # the shell's "command not found"
LEFTOVER_POLL_S = 0.05  # how often a stop looks whether what a main process left has exited
EARLY_FAILURE_S = 10.0  # a rank failing this soon after its start is shown with its last lines


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
        self._wake = wake
        self._clock = clock
        self._spawner = spawner or Spawner()
        self._generation: int | None = None
        self._workers: list[Worker] = []
        self._stop_deadline: float | None = None
        self._killed = False
        self._failure: Failure | None = None
        self._started_at = 0.0
        self._node = ""
        self._release: Release | None = None  # set by release(): in_place re-forming
        self._oom_kills = 0  # the job's cgroup's OOM kills when this generation started

    # -- starting --------------------------------------------------------------------------

    def start(self, generation: int, node: str, specs: Sequence[WorkerSpec]) -> Started:
        """Start one generation's workers. In_place survivors (a PARKED group) take their
        local rank's assignment instead of a new process."""
        if self.status().active:
            raise RuntimeError("start() while the previous group is still active")
        survivors = {w.spec.local_rank: w for w in self._survivors()}
        for worker in self._workers:
            if worker not in survivors.values():
                worker.drop()
        self._generation, self._node = generation, node
        self._started_at = self._clock()
        self._stop_deadline, self._killed, self._failure = None, False, None
        self._release = None
        self._oom_kills = self._spawner.oom_kills()
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

    def _survivors(self) -> list[Worker]:
        """In_place workers that are alive and in no generation's group: they can be kept (a
        warm-up still starting takes its assignment when it reaches `elastic.run`)."""
        return [w for w in live(self._workers) if not w.abandoned and (w.warmup or w.has_left())]

    def _keep(self, survivor: Worker, spec: WorkerSpec) -> Worker:
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

    def _spawn(self, spec: WorkerSpec, outside: int | None = None) -> Worker:
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
            worker = Worker(spec, None, returncode=SPAWN_FAILED, generation=generation)
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
        return Worker(
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

    # -- re-forming in place (release.py) ----------------------------------------------------

    def release(self, timeout_s: float) -> None:
        """Tell every in_place worker to leave its generation's process group (they keep
        running); kill those that have not left after `timeout_s` (poll() does)."""
        if self._release is not None or self._stop_deadline is not None:
            return
        release = self._release = Release(self._clock() + timeout_s, timeout_s)
        release.tell(self._workers, self._failure)
        waiting = [w for w in unleft(self._workers) if not w.abandoned]
        if waiting:
            release.watch(waiting, self._clock, self._wake, "release-watch")
        self._warm()

    def _warm(self) -> None:
        """Start a warm-up for each local rank whose worker failed while the group is released
        (Release.to_warm), but for one with a preloaded spare (it starts in the next
        generation at once)."""
        release = self._release
        if not self._warm_ups or release is None or self._stop_deadline is not None:
            return
        for dead in release.to_warm(self._workers, self._clock(), self._failure):
            spec = warmup_spec(dead.spec, dead.generation)
            if self._spawner.has_spare(spec):
                continue
            log.info(
                "rank %d: its replacement warms up outside generation %d",
                *(dead.spec.local_rank, dead.generation),
            )
            worker = self._spawn(spec, outside=dead.generation)
            worker.warm_until = self._clock() + release.timeout
            self._workers.append(worker)
            if worker.returncode is None:
                release.watch([worker], self._clock, self._wake, "warm-watch")

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
            worker.terminate()

    def signal(self, name: str) -> None:
        """Send SIG`name` (USR1) to every running worker's main process (a time limit's
        warning: sbatch --signal); its children are the script's to tell."""
        sig = signal.Signals[f"SIG{name}"]
        for worker in self._workers:
            if worker.popen is not None and worker.returncode is None:
                signal_process(worker.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL everything at once (a second SIGTERM to the agent, or fencing at the limit)."""
        if self._stop_deadline is None:
            self.stop(0.0)
        self._stop_deadline = self._clock()
        self._escalate()

    def _escalate(self) -> None:
        self._killed = True
        for worker in self._workers:
            worker.kill_all()

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
            expected = self._stop_deadline is not None or self._release is not None
            cause = None
            # Died by a signal after it said its training returned (a backend's teardown that
            # aborts at exit): finished. An exit status there is the script's own failure
            # after its training (an evaluation that raised): charged, as any.
            died = code < 0 or code > 128  # 128+N: a container runtime's report of signal N
            worker.finished = died and not expected and worker.has_finished()
            if worker.finished:
                log.warning(
                    "rank %d reached its end (its training returned), then died of %s: "
                    "counted as finished",
                    worker.spec.rank,
                    signal_name(code) or f"exit code {code}",
                )
            elif not expected and code != 0:
                cause = worker.cause(self._clock() - self._started_at <= EARLY_FAILURE_S)
                if self._out_of_memory():
                    cause = "; ".join(filter(None, (self._oom_words(), cause)))
                self._note_failure(worker, cause)
            if worker.warmup and not worker.has_left():
                log.warning(
                    "local rank %d: its warm-up exited (%s) before it was ready; the rank starts "
                    "with the next generation",
                    *(worker.spec.local_rank, signal_name(code) or f"exit code {code}"),
                )
            exits.append(
                WorkerExit(
                    generation=self._generation or 0,
                    rank=worker.spec.rank,
                    local_rank=worker.spec.local_rank,
                    exit_code=code if code >= 0 else None,
                    signal=signal_name(code),
                    expected=expected,
                    cause=cause,
                    finished=worker.finished,
                )
            )
        self._warm()
        if self._release is not None:
            self._release.enforce(self._workers, self._clock())
        stopping = self._stop_deadline is not None
        if stopping:
            for worker in self._workers:
                if worker.returncode is not None:
                    worker.term_group()
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

    def stopped(self, local_rank: int) -> bool:
        """Whether the worker of `local_rank` is stopped by a signal (Worker.stopped)."""
        return any(w.stopped() for w in self._workers if w.spec.local_rank == local_rank)

    def cpu_seconds(self, local_rank: int) -> float | None:
        """The live worker of `local_rank`'s CPU time (cheap: read at its beats)."""
        worker = self._live(local_rank)
        return worker.cpu_seconds() if worker is not None else None

    def activity(self, local_rank: int) -> Activity | None:
        """The live worker of `local_rank`'s process: working or not, its CPU time."""
        worker = self._live(local_rank)
        return worker.activity() if worker is not None else None

    def _live(self, local_rank: int) -> Worker | None:
        return next(
            (w for w in self._workers if w.spec.local_rank == local_rank and w.alive()), None
        )

    def dump_stacks(self, local_rank: int) -> str:
        """Capture a hung worker's stacks into its log (Worker.dump_stacks), py-spy run as the
        job's user."""
        worker = next(w for w in self._workers if w.spec.local_rank == local_rank)
        return worker.dump_stacks(self.tracer)

    def command(
        self,
        argv: Sequence[str],
        rank: int,
        size: int,
        devices: Sequence[tuple[int, str]] | None,
        env: Mapping[str, str],
        window: tuple[int, int] | None = None,
        stdin: bool = False,
    ) -> Command:
        """A command its user runs in the job (nodeagentctl run; Spawner.command), as task
        `rank` of `size` (spec.task_env): with the environment of a live worker of this node,
        less what is that worker's own, the job's `devices` here (None: not known) and `env`
        over it, in its working directory; with `window`, on a terminal of that size; with `stdin`,
        its stdin a pipe the agent feeds.

        Raises:
            OSError: no worker runs here now, or it cannot be started.
        """
        base = next((w.spec for w in live(self._workers) if not w.abandoned), None)
        if base is None:
            raise OSError("no worker of the job runs on this node now")
        given = {k: v for k, v in base.env.items() if k not in WORKERS_OWN}
        given.update(task_env(base.env, rank, size))
        if devices:
            given.update(visible_devices_of(devices))
        popen, terminal = self._spawner.command(argv, {**given, **env}, base.cwd, window, stdin)
        return Command(popen, terminal)

    @property
    def adoptable(self) -> bool:
        return self._spawner.cgroup is not None

    def adopt(self, pid: int) -> None:
        """Take process `pid` into the job's cgroup (Spawner.adopt).

        Raises:
            OSError: it cannot be.
        """
        self._spawner.adopt(pid)

    @property
    def tracer(self) -> WorkerUser | None:
        """Whom a py-spy dump of a worker runs as: its user (a containerised one's processes
        are the container runtime's: as the agent)."""
        return self._spawner.user if self._spawner.containers is None else None

    def _note_failure(self, worker: Worker, cause: str | None = None) -> None:
        """The generation's first failure; one while its job's cgroup recorded an OOM kill
        since the generation started is the job's running out of memory (the process killed
        may have been the worker or one of its own, a data loader's: the worker then raises)."""
        if self._failure is not None or worker.returncode is None:
            return
        failure = worker.failure(self._generation or 0, self._node, cause)
        if self._out_of_memory():
            failure = replace(failure, kind="oom", memory_limit=self._spawner.memory_limit)
        self._failure = failure

    def _out_of_memory(self) -> bool:
        return self._spawner.oom_kills() > self._oom_kills

    def _oom_words(self) -> str:
        limit = self._spawner.memory_limit
        return "out of memory" + (f" (its job's limit here: {size_text(limit)})" if limit else "")

    def _alive(self) -> bool:
        return any(worker.alive() for worker in self._workers)

    def status(self) -> GroupStatus:
        if not self._workers:
            return GroupStatus()
        if not self._alive():
            phase = GroupPhase.EXITED
        elif self._stop_deadline is not None:
            phase = GroupPhase.STOPPING
        elif self._release is not None:
            running = live(self._workers)
            left = all(w.warmup or w.has_left() for w in running) and bool(running)
            phase = GroupPhase.PARKED if left else GroupPhase.RELEASING
        else:
            phase = GroupPhase.RUNNING
        # Workers that exit 0 because we asked them to stop have not finished the job.
        asked = self._stop_deadline is not None or self._release is not None
        succeeded = not asked and all(w.returncode == 0 or w.finished for w in self._workers)
        warming = sum(
            1 for w in live(self._workers) if w.warmup and not w.abandoned and not w.has_left()
        )
        released = self._release is not None
        return GroupStatus(self._generation, phase, self._failure, succeeded, warming, released)

    def close(self) -> None:
        """Release what outlives a group (preloaded interpreters); the agent is leaving."""
        self._spawner.close()
        self._discard_unused_progress()

    def _discard_unused_progress(self) -> None:
        """The group has ended (the agent leaves): remove the progress files its workers never
        beat into, so only scripts that call beat() leave one behind."""
        for worker in self._workers:
            worker.drop()

    def next_deadline(self) -> float | None:
        """When poll() must run next: to escalate a stop, or to kill a survivor that has not
        left its generation in time."""
        if self._killed or not self._alive():
            return None
        if self._stop_deadline is not None:
            if any(w.group_termed for w in self._workers):  # their exits wake nobody
                return min(self._stop_deadline, self._clock() + LEFTOVER_POLL_S)
            return self._stop_deadline
        return self._release.next_deadline(self._workers) if self._release is not None else None

    def groups(self) -> tuple[Group, ...]:
        """The process groups of this generation that may still run (for the fence keeper)."""
        if not self._workers or not self._alive():
            return ()
        return tuple(w.group for w in self._workers if w.group is not None)

    def workers(self) -> tuple[WorkerInfo, ...]:
        stopping, released = self._stop_deadline is not None, self._release is not None
        return tuple(w.info(stopping, released) for w in self._workers)
