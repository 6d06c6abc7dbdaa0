"""Whether a worker works, as /proc shows it (job/stalls.py): any thread of its process, or of a
process it started (a data loader's workers, an asynchronous save's writer), running or in disk
I/O; and the CPU time its process has used.

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
TICKS = os.sysconf("SC_CLK_TCK")


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


def cpu_of(pid: int, proc: Path = Path("/proc")) -> float | None:
    """The CPU seconds process `pid` has used, its threads' together (one read of its stat: cheap
    enough for every beat read); None: gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime: fields 14 and 15


def activity_of(pid: int) -> Activity | None:
    """Whether a thread of process `pid` or of those it started works, and `pid`'s own CPU
    seconds (as `cpu_of`); None: gone or not readable. It walks the process table: asked only of
    a rank already silent past its step times."""
    try:
        root = psutil.Process(pid)
        working = any(threads_work(p.pid) for p in [root, *root.children(recursive=True)])
    except (psutil.Error, OSError):
        return None
    cpu = cpu_of(pid)
    return None if cpu is None else Activity(not working, cpu)
