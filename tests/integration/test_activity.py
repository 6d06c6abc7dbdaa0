"""Whether a worker works (supervisor/usage.py), on real processes: one asleep, one
computing, one whose main thread waits while another thread works, one whose child works, one
stopped by a signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from nodeagent.supervisor.status import Activity
from nodeagent.supervisor.usage import activity_of, cpu_of, state_of
from tests.helpers.cluster import wait_for

ASLEEP = "import time; print('up', flush=True); time.sleep(600)"
COMPUTING = "print('up', flush=True)\nwhile True: pass"
# the main thread waits on a lock for ever while another thread computes (a save's writer)
THREAD_WORKS = """
import threading
def spin():
    while True: pass
threading.Thread(target=spin, daemon=True).start()
print('up', flush=True)
lock = threading.Lock(); lock.acquire(); lock.acquire()
"""
# asleep itself, its child computing (a data loader's worker)
CHILD_WORKS = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "while True: pass"])
print('up', flush=True)
time.sleep(600)
"""


@contextmanager
def running(code: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"up\n"
        yield process
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def settled(pid: int) -> Activity:
    """Its activity once its start-up's CPU is behind it: the same sleeping flag twice."""

    def twice() -> Activity | None:
        first = activity_of(pid)
        time.sleep(0.2)
        second = activity_of(pid)
        return second if first and second and first.sleeping == second.sleeping else None

    return wait_for(twice, 10, "a settled reading")


def test_a_process_asleep_does_no_work_and_uses_no_cpu() -> None:
    with running(ASLEEP) as process:
        before = settled(process.pid)
        time.sleep(0.5)
        after = activity_of(process.pid)
        assert before.sleeping and after is not None and after.sleeping
        assert after.cpu_s - before.cpu_s < 0.05


@pytest.mark.parametrize(
    ("code", "its_own_cpu"), [(COMPUTING, True), (THREAD_WORKS, True), (CHILD_WORKS, False)]
)
def test_a_thread_or_a_child_computing_is_work(code: str, its_own_cpu: bool) -> None:
    """The CPU time is the worker's own process's (its child's is not counted: its state is).
    Its own grows by 0.1 s within 30 s, however loaded the machine (CI saw 0.01 s in 0.5 s
    with both cores busy); a child's computing leaves it where it was over the same while."""
    with running(code) as process:
        before = settled(process.pid)

        def grown() -> Activity | None:
            now = activity_of(process.pid)
            return now if now is not None and now.cpu_s - before.cpu_s > 0.1 else None

        after: Activity | None
        if its_own_cpu:
            after = wait_for(grown, 30, "0.1 s more of its own CPU")
        else:
            time.sleep(0.5)
            after = activity_of(process.pid)
            assert after is not None and after.cpu_s - before.cpu_s <= 0.1
        assert after is not None and not before.sleeping and not after.sleeping
        own = cpu_of(process.pid)
        assert own is not None and own >= after.cpu_s


def test_a_process_stopped_by_a_signal_works_no_more() -> None:
    with running(COMPUTING) as process:
        os.kill(process.pid, signal.SIGSTOP)
        try:
            assert settled(process.pid).sleeping
        finally:
            os.kill(process.pid, signal.SIGCONT)


def test_gone_is_unknown_and_the_state_is_read_past_the_command() -> None:
    with running(ASLEEP) as process:
        pid = process.pid
    assert activity_of(pid) is None and cpu_of(pid) is None
    assert state_of("1234 (a) b (c)) R 1 2 3") == "R"
    assert state_of("99 (python3) S 1 99 99 0 -1") == "S"
