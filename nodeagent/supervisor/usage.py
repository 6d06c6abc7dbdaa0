"""What the kernel says a worker process got of the CPU: the seconds it ran and the seconds it
was ready to run but waited for a CPU (a run queue, or its cgroup's CPU quota spent).

Read from /proc/<pid>/task/<tid>/schedstat, summed over the process's threads (Linux; 0.2 ms
for a process of 30 threads). Without it (another kernel, a process gone) there is no reading:
slow-rank detection then has only what the workers mark (job/speed.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class CpuUsage:
    cpu_s: float  # on a CPU
    delay_s: float  # runnable, waiting for a CPU


def cpu_usage(pid: int, proc: Path = PROC) -> CpuUsage | None:
    """The process's threads' times, summed; None: no such process or no schedstat.

    A thread that ended takes its times with it, so the sum can fall between two readings:
    the reader takes a fall as no reading for that window."""
    tasks = proc / str(pid) / "task"
    try:
        tids = os.listdir(tasks)
    except OSError:
        return None
    cpu_ns = delay_ns = 0
    read = False
    for tid in tids:
        try:
            fields = (tasks / tid / "schedstat").read_text().split()
            cpu_ns, delay_ns = cpu_ns + int(fields[0]), delay_ns + int(fields[1])
            read = True
        except (OSError, ValueError, IndexError):
            continue  # the thread ended as it was read
    return CpuUsage(cpu_ns / 1e9, delay_ns / 1e9) if read else None
