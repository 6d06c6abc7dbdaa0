"""What the kernel says of a worker process's use of the CPU, from /proc (Linux; without it, a
process gone or another kernel, there is no reading):

- `cpu_usage`: the seconds it ran and the seconds it was ready to run but waited for a CPU (a run
  queue, or its cgroup's CPU quota spent), from each thread's schedstat (0.2 ms for a process
  of 30 threads): the slow-rank detection's reading, once a window (job/speed.py);
- `cpu_of`: the seconds it ran, from its one stat file: cheap enough for every read of a rank's
  beat (job/stalls.py);
- `activity_of`: whether it works (job/stalls.py): any thread of its process, or of a process it
  started (a data loader's workers, an asynchronous save's writer), running or in disk I/O. A
  rank whose every thread sleeps (on a lock, a queue, a sleep, a collective over gloo), or is
  held by a signal or a tracer, and that used next to no CPU, does no work of its own: stuck, or
  waiting. One thread writing a save while the main one waits for it is work (state D); so is a
  thread computing or one the CPU controller holds back (state R).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from nodeagent.supervisor.status import Activity

PROC = Path("/proc")
WORKING = frozenset("RD")  # /proc/<pid>/stat states: running (or runnable), disk I/O
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuUsage:
    cpu_s: float  # on a CPU
    delay_s: float  # runnable, waiting for a CPU


def cpu_usage(pid: int, proc: Path = PROC) -> CpuUsage | None:
    """The process's threads' times, summed; None: no such process or no schedstat.

    A thread that ended takes its times with it, so the sum can fall between two readings:
    the reader takes a fall as no reading for that window."""
    cpu_ns = delay_ns = 0
    read = False
    for text in _each_thread(pid, "schedstat", proc):
        try:
            fields = text.split()
            cpu_ns, delay_ns = cpu_ns + int(fields[0]), delay_ns + int(fields[1])
            read = True
        except (ValueError, IndexError):
            continue
    return CpuUsage(cpu_ns / 1e9, delay_ns / 1e9) if read else None


def cpu_of(pid: int, proc: Path = PROC) -> float | None:
    """The CPU seconds process `pid` has used, its threads' together; None: gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = _after_command(stat).split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime: fields 14 and 15


def state_of(stat: str) -> str:
    """The state letter of a /proc/<pid>/stat line."""
    return _after_command(stat)[:1]


def threads_work(pid: int, proc: Path = PROC) -> bool:
    """Some thread of process `pid` is running or in disk I/O."""
    return any(state_of(stat) in WORKING for stat in _each_thread(pid, "stat", proc))


def activity_of(pid: int) -> Activity | None:
    """Whether a thread of process `pid` or of those it started works, and `pid`'s own CPU
    seconds (as `cpu_of`); None: gone or not readable. It walks the process table: asked only of
    a rank already silent past its step times."""
    try:
        root = psutil.Process(pid)
        working = any(threads_work(p.pid) for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return None
    cpu = cpu_of(pid)
    return None if cpu is None else Activity(not working, cpu)


def _each_thread(pid: int, name: str, proc: Path) -> Iterator[str]:
    """Each thread's /proc/<pid>/task/<tid>/<name> file; none if the process is gone, and a
    thread that ended as it was read is left out."""
    tasks = proc / str(pid) / "task"
    try:
        tids = os.listdir(tasks)
    except OSError:
        return
    for tid in tids:
        try:
            yield (tasks / tid / name).read_text()
        except OSError:
            continue


def _after_command(stat: str) -> str:
    """A stat line past its command (in parentheses, which may itself hold spaces and
    parentheses): the state letter first."""
    return stat[stat.rindex(")") + 2 :]
