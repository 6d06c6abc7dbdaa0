"""The supervisor against real child processes."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from nodeagent.supervisor.group import SPAWN_FAILED, Supervisor
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import GroupPhase
from tests.helpers.cluster import wait_for

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.lines: list[str] = []
        self.woken = threading.Event()
        self.sup = Supervisor(
            echo=lambda rank, line: self.lines.append(f"[rank {rank}]: {line}"), wake=self.woken.set
        )

    def specs(self, code: str, n: int = 2, argv: tuple[str, ...] | None = None) -> list[WorkerSpec]:
        return [
            WorkerSpec(
                rank=10 + i,
                local_rank=i,
                argv=argv or (sys.executable, "-c", code),
                env={
                    **os.environ,
                    "LOCAL_RANK": str(i),
                    "NODEAGENT_PROGRESS_FILE": str(
                        self.tmp_path / "logs" / f"rank-{10 + i}.progress"
                    ),
                },
                cwd=str(self.tmp_path),
                log_path=self.tmp_path / "logs" / f"rank-{10 + i}.log",
                progress_path=self.tmp_path / "logs" / f"rank-{10 + i}.progress",
            )
            for i in range(n)
        ]

    def settle(self, phase: GroupPhase, timeout: float = 15) -> None:
        def done() -> bool:
            self.sup.poll()
            return self.sup.status().phase is phase

        wait_for(done, timeout, f"group {phase.value}")


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.sup.kill()


def test_success_logs_and_echo(h: Harness) -> None:
    code = "import os; print('hello from', os.environ['LOCAL_RANK'], flush=True)"
    h.sup.start(1, "n", h.specs(code))
    h.settle(GroupPhase.EXITED)
    status = h.sup.status()
    assert status.succeeded and status.failure is None and status.generation == 1
    assert h.woken.is_set()
    assert (h.tmp_path / "logs" / "rank-11.log").read_text() == "hello from 1\n"
    wait_for(lambda: "[rank 10]: hello from 0" in h.lines, 5, "echoed line")
    assert [w.state for w in h.sup.workers()] == ["exited", "exited"]


@pytest.mark.parametrize(
    ("end", "finished"),
    [("os.abort()", True), ("os.kill(os.getpid(), signal.SIGSEGV)", True), ("sys.exit(1)", False)],
    ids=["abort", "segv", "exit-status"],
)
def test_a_rank_that_said_its_end_and_then_died_of_a_signal_finished(
    h: Harness, end: str, finished: bool
) -> None:
    """Issue 62: after `progress.finished()` a death by a signal (a destructor aborting at
    interpreter exit) is the rank's end, not a failure; an exit status there is the script's
    own failure after its training (an evaluation that raised), charged as any."""
    code = (
        "import os, signal, sys; from nodeagent.worker import progress; "
        f"progress.beat(1); progress.finished(); {end}"
    )
    h.sup.start(1, "n", h.specs(code, n=1))
    h.settle(GroupPhase.EXITED)
    status = h.sup.status()
    assert status.succeeded is finished, status
    assert (status.failure is None) is finished, status.failure


def test_failure_by_exit_code_and_by_signal(h: Harness) -> None:
    code = (
        "import os, sys, time; r = int(os.environ['LOCAL_RANK']); time.sleep(0.3 * r); sys.exit(3)"
    )
    h.sup.start(2, "n", h.specs(code))
    h.settle(GroupPhase.EXITED)
    failure = h.sup.status().failure
    assert failure is not None
    assert (failure.rank, failure.kind, failure.exit_code, failure.node) == (
        10,
        "exit_code",
        3,
        "n",
    )
    code = "import time; print('step 1', flush=True); time.sleep(60)"
    h.sup.start(3, "n", h.specs(code, n=1))
    pid = h.sup.workers()[0].pid
    assert pid is not None
    log = h.tmp_path / "logs" / "rank-10.log"
    wait_for(lambda: log.exists() and "step 1" in log.read_text(), 10, "the worker's output")
    os.kill(pid, signal.SIGKILL)
    h.settle(GroupPhase.EXITED)
    failure = h.sup.status().failure
    assert failure is not None and failure.signal == "SIGKILL" and failure.generation == 3
    assert failure.cause is None  # killed: what it printed last is not why it died


def test_stop_escalates_to_sigkill_after_grace(h: Harness) -> None:
    stubborn = IGNORE_TERM + "print('up', flush=True); time.sleep(60)"
    h.sup.start(4, "n", h.specs(stubborn, n=1))
    wait_for(lambda: h.lines, 10, "worker up")
    h.sup.stop(grace_s=0.5)
    assert h.sup.status().phase is GroupPhase.STOPPING
    deadline = h.sup.next_deadline()
    assert deadline is not None
    exits = []

    def stopped() -> bool:
        exits.extend(h.sup.poll())
        return h.sup.status().phase is GroupPhase.EXITED

    wait_for(stopped, 10, "group killed")
    assert exits[0].signal == "SIGKILL" and exits[0].expected
    assert h.sup.status().failure is None  # a stop we asked for is not a failure


def test_graceful_stop_lets_workers_exit(h: Harness) -> None:
    polite = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('saving', flush=True), sys.exit(0)))\n"
        "print('up', flush=True)\ntime.sleep(60)"
    )
    h.sup.start(5, "n", h.specs(polite, n=1))
    wait_for(lambda: h.lines, 10, "worker up")
    h.sup.stop(grace_s=30)
    h.settle(GroupPhase.EXITED)
    assert h.sup.workers()[0].exit_code == 0
    wait_for(lambda: "[rank 10]: saving" in h.lines, 5, "the worker's last words")


def test_grandchildren_do_not_outlive_the_group(h: Harness, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {IGNORE_TERM + 'time.sleep(60)'!r}])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)"
    )
    h.sup.start(6, "n", h.specs(code, n=1))
    wait_for(lambda: pidfile.exists() and pidfile.read_text(), 10, "grandchild")
    grandchild = psutil.Process(int(pidfile.read_text()))
    h.sup.stop(grace_s=0.5)
    h.settle(GroupPhase.EXITED)
    assert not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE


def test_missing_entrypoint_is_a_clear_failure(h: Harness) -> None:
    h.sup.start(7, "n", h.specs("", n=1, argv=("/nonexistent/train",)))
    h.sup.poll()
    status = h.sup.status()
    assert status.phase is GroupPhase.EXITED
    assert status.failure is not None and status.failure.exit_code == SPAWN_FAILED
    assert "cannot start '/nonexistent/train'" in (h.tmp_path / "logs" / "rank-10.log").read_text()


def test_start_refuses_while_a_group_is_active(h: Harness) -> None:
    h.sup.start(8, "n", h.specs("import time; time.sleep(60)", n=1))
    with pytest.raises(RuntimeError):
        h.sup.start(9, "n", h.specs("pass", n=1))
    h.sup.kill()
    h.settle(GroupPhase.EXITED)
    h.sup.start(9, "n", h.specs("pass", n=1))
    h.settle(GroupPhase.EXITED)
    assert h.sup.status().generation == 9 and h.sup.status().succeeded


STALLS = (  # a worker using the real helpers, stuck where a collective would block
    "import time\nfrom nodeagent.worker import GracefulExit, beat\n"
    "guard = GracefulExit().install()\nbeat(1)\n"
    "def stalled_in_collective():\n    time.sleep(60)\n"
    "print('up', flush=True)\nstalled_in_collective()\n"
)


@pytest.mark.skipif(
    not Path(sys.executable).with_name("py-spy").exists(), reason="py-spy not installed"
)
def test_stack_dump_of_a_blocked_worker_with_py_spy(h: Harness) -> None:
    h.sup.start(10, "n", h.specs(STALLS, n=1))
    wait_for(lambda: h.lines, 10, "worker up")
    dump = h.sup.dump_stacks(0)
    assert "stalled_in_collective" in dump
    assert "py-spy dump" in (h.tmp_path / "logs" / "rank-10.log").read_text()


def test_stack_dump_of_a_stopped_worker_via_faulthandler(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """py-spy cannot read a SIGSTOPped process: the fallback is SIGUSR1, dumped once the stop
    (SIGTERM + SIGCONT) lets the process run."""

    def absent(pid: int, native: bool = False, user: object = None) -> str:
        raise OSError("py-spy is not installed beside the agent")

    monkeypatch.setattr("nodeagent.supervisor.worker.py_spy_dump", absent)
    h.sup.start(11, "n", h.specs(STALLS, n=1))
    wait_for(lambda: h.lines, 10, "worker up")
    pid = h.sup.workers()[0].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    assert "SIGUSR1" in h.sup.dump_stacks(0)
    h.sup.mark_failed(0, "hang")
    h.sup.stop(grace_s=1)
    h.settle(GroupPhase.EXITED)
    log = h.tmp_path / "logs" / "rank-10.log"
    wait_for(lambda: "stalled_in_collective" in log.read_text(), 10, "the faulthandler dump")
    assert "most recent call first" in log.read_text()
    failure = h.sup.status().failure
    assert failure is not None and failure.kind == "hang" and failure.rank == 10


def test_each_rank_has_one_log_across_generations(h: Harness) -> None:
    """<job>/rank-R.log gets every generation's output after a banner naming it."""
    for generation in (1, 2):
        code = f"print('gen {generation} line')"
        h.sup.start(generation, "n7", h.specs(code, n=1))
        h.settle(GroupPhase.EXITED)
        line = f"[rank 10]: gen {generation} line"
        wait_for(lambda: line in h.lines, 5, "echoed line")  # noqa: B023 - waited for here
    stable = (h.tmp_path / "rank-10.log").read_text().splitlines()
    assert [line.split(",")[0] for line in stable[::2]] == [
        "=== nodeagent: generation 1",
        "=== nodeagent: generation 2",
    ]
    assert "rank 10 (local 0) on n7" in stable[0]
    assert stable[1::2] == ["gen 1 line", "gen 2 line"]
    assert (h.tmp_path / "logs" / "rank-10.log").read_text() == "gen 1 line\ngen 2 line\n"


BEAT = (
    "import os; from nodeagent.channel.beats import BeatWriter; "
    "w = BeatWriter(os.environ['NODEAGENT_PROGRESS_FILE']); w.beat(1) if {beats} else None"
)


@pytest.mark.parametrize(("beats", "kept"), [(True, True), (False, False)])
def test_progress_files_only_for_workers_that_beat(h: Harness, beats: bool, kept: bool) -> None:
    specs = h.specs(BEAT.format(beats=beats), n=1)
    h.sup.start(1, "n", specs)
    h.settle(GroupPhase.EXITED)
    assert specs[0].progress_path.exists()  # until the group ends: the hang watch reads it
    h.sup.close()  # the agent leaves (a next generation's start() does the same)
    assert specs[0].progress_path.exists() is kept


def test_an_early_failure_names_its_last_lines_and_its_log(h: Harness) -> None:
    """A rank dying in its first seconds (an import error) is reported with what it printed
    last and where its whole output is; a rank's @record error file wins over its output."""
    code = "print('loading'); import no_such_module_x7"
    h.sup.start(1, "n", h.specs(code, n=1))
    h.settle(GroupPhase.EXITED)
    failure = h.sup.status().failure
    assert failure is not None and failure.cause is not None
    assert failure.cause.endswith("ModuleNotFoundError: No module named 'no_such_module_x7'")
    assert failure.log == str(h.tmp_path / "logs" / "rank-10.log")
    assert "no_such_module_x7" in failure.describe() and "rank-10.log" in failure.describe()

    error_file = h.tmp_path / "error.json"
    error_file.write_text(
        '{"message": {"message": "ValueError: bad batch size 0", '
        '"extraInfo": {"py_callstack": "", "timestamp": "0"}}}'
    )
    (spec,) = h.specs("import sys; print('noise'); sys.exit(1)", n=1)
    spec = replace(spec, env={**spec.env, "TORCHELASTIC_ERROR_FILE": str(error_file)})
    h.sup.start(2, "n", [spec])
    h.settle(GroupPhase.EXITED)
    failure = h.sup.status().failure
    assert failure is not None and failure.cause is not None
    assert "ValueError: bad batch size 0" in failure.cause and "noise" not in failure.cause


# The graceful-exit pattern of docs/worker.md with a DataLoader whose worker processes feed it:
# on SIGTERM it goes on reading batches (the emergency checkpoint's last step needs them), then
# says "saved" and exits 0. Its loader workers die at SIGTERM like any process.
LOADER = (
    "import os, sys, time\n"
    "import torch\n"
    "from torch.utils.data import DataLoader, Dataset\n"
    "from nodeagent.worker import GracefulExit\n"
    "class Steps(Dataset):\n"
    "    def __len__(self): return 100000\n"
    "    def __getitem__(self, i):\n"
    "        time.sleep(0.01)\n"
    "        return torch.full((2,), float(i))\n"
    "guard = GracefulExit().install()\n"
    "loader = iter(DataLoader(Steps(), batch_size=None, num_workers=2))\n"
    "step = 0\n"
    "while True:\n"
    "    step = int(next(loader)[0])\n"
    "    if step == 3: print('up', flush=True)\n"
    "    if guard.should_stop():\n"
    "        for _ in range(5): step = int(next(loader)[0])  # the last step's batches\n"
    "        print('saved', step, flush=True)\n"
    "        os._exit(0)\n"
)


def test_graceful_stop_keeps_a_dataloaders_workers_until_the_main_process_saved(
    h: Harness,
) -> None:
    """Only the main process gets SIGTERM at the stop; its DataLoader's workers (its group)
    get theirs when it has exited, and are gone before the group counts as exited."""
    pytest.importorskip("torch")
    h.sup.start(12, "n", h.specs(LOADER, n=1))
    wait_for(lambda: "[rank 10]: up" in h.lines, 60, "the worker to read batches")
    pid = h.sup.workers()[0].pid
    assert pid is not None
    loaders = psutil.Process(pid).children(recursive=True)
    assert len(loaders) == 2, loaders
    h.sup.stop(grace_s=30)
    h.settle(GroupPhase.EXITED, timeout=60)
    log = (h.tmp_path / "logs" / "rank-10.log").read_text()
    assert h.sup.workers()[0].exit_code == 0, log
    assert "saved" in log and "killed by signal" not in log
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in loaders)


def test_a_stops_leftovers_get_sigterm_when_their_main_process_exits(
    h: Harness, tmp_path: Path
) -> None:
    """A shell wrapper's child (or anything a main process leaves when it exits on SIGTERM) is
    told in its turn, with what is left of the grace, not killed at once."""
    termed = tmp_path / "child.termed"
    child = (
        "import pathlib, signal, sys, time\n"
        f"def bye(*a): pathlib.Path({str(termed)!r}).write_text('x'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\ntime.sleep(60)"
    )
    wrapper = ("sh", "-c", f'{sys.executable} -c "$0"; echo bye', child)  # sh does not exec
    h.sup.start(13, "n", h.specs("", n=1, argv=wrapper))
    wait_for(lambda: "[rank 10]: up" in h.lines, 10, "the wrapped worker")
    h.sup.stop(grace_s=30)
    h.settle(GroupPhase.EXITED)
    assert termed.exists()
