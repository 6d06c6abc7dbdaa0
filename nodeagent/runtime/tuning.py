"""The interpreter's settings for nodeagent's daemons: the node's agent (runtime/run.py), its
requests' serving (runtime/servechild.py), and the API service (cli/api.py), whose reads are
made in worker threads beside its event loop: at 5 ms a read made again of the queues at
10,000 jobs (70-100 ms of work) held the loop long enough that the listing's p99 was 127-147 ms
in three of four runs of bench/api.py's reads; at 1 ms ≤ 58 ms in five of five."""

from __future__ import annotations

import gc
import sys

# How long a thread holding the GIL keeps it while another waits (CPython's default: 5 ms). The
# pool leader's round computes for up to half a second at 10,000 jobs while other threads of the
# agent wait on Redis: at 5 ms they waited up to 5 ms after each reply (bench/api.py at 10,000
# jobs, one run each, when the requests were served on a thread of the agent: 473 submissions/s
# and p99 692 ms at 5 ms, 577/s and 519 ms at 1 ms).
SWITCH_INTERVAL_S = 0.001
# The cyclic garbage collector's thresholds (CPython's default: 700, 10, 10). A collection holds
# the GIL: at 10,000 pending jobs a pool leader's full collection took up to 66 ms (4 in 12
# rounds of 300 new submissions, 248 ms in all; young ones 557 times, 28 ms), and its other
# threads waited through each. The agent's data is freed by reference counting (its cycles are
# few: exceptions, threads); young cycles are still collected, 50,000 allocations apart.
# bench/api.py, six runs with, seven without, alternating at the end: submissions at 10,000
# jobs p99 191-320 ms (median 249) against 249-370 (320), 621-988/s against 557-825.
GC_THRESHOLDS = (50_000, 50, 100)


def tune() -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)
