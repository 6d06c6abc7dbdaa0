"""Whether a worker works, as /proc shows it (job/stalls.py): any thread of its process, or of a
process it started (a data loader's workers, an asynchronous save's writer), running or in disk
I/O, and the CPU time they have used, together.

A rank whose every thread sleeps (on a lock, a queue, a sleep, a collective over gloo), or is
held by a signal or a tracer, and that used next to no CPU, does no work of its own: stuck, or
waiting. One thread writing a save while the main one waits for it is work (state D); so is a
thread computing or one the CPU controller holds back (state R).
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from nodeagent.supervisor.status import Activity

WORKING = frozenset("RD")  # /proc/<pid>/stat states: running (or runnable), disk I/O


def state_of(stat: str) -> str:
    """The state letter of a /proc/<pid>/stat line (after the command's closing parenthesis:
    the command itself may hold spaces and parentheses)."""
    return stat[stat.rindex(")") + 2 :][:1]


def threads_work(pid: int, proc: Path = Path("/proc")) -> bool:
    """Some thread of process `pid` is running or in disk I/O."""
    tasks = proc / str(pid) / "task"
    for tid in os.listdir(tasks):
        try:
            stat = (tasks / tid / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        if state_of(stat) in WORKING:
            return True
    return False


def activity_of(pid: int) -> Activity | None:
    """The process `pid` and those it started, together; None: gone or not readable."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
        cpu, working = 0.0, False
        for process in tree:
            times = process.cpu_times()
            cpu += times.user + times.system
            working = working or threads_work(process.pid)
    except (psutil.Error, OSError):
        return None
    return Activity(not working, cpu)
