"""What nodeagentctl waits for after a change: a submitted job's end (submit --wait: its exit
code), a job running every rank (--wait-running), a job at its new size, a node off its job.
The conditions are views/waits.py's; here they are polled and said. Each returns (or is) the
exit code: 0 reached, 1 timed out."""

from __future__ import annotations

import sys
import time

from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.model.pool import PoolJobState
from nodeagent.views import waits

POLL_S = 0.5  # how often --wait looks at a job that may run for days


def wait_ended(store: PoolStore, job_id: str, timeout: float | None) -> int:
    """Until the job ends, as `sbatch --wait`: 0 if it succeeded, else its exit code (its
    failing rank's) or 1; 1 if `timeout` (None: none) passes first, said."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while deadline is None or time.monotonic() < deadline:
        status = store.status(job_id)
        if status is None:
            print(f"job {job_id} is gone from the pool (pruned?)", file=sys.stderr)
            return 1
        if status.state.ended:
            code = waits.exit_code(status)
            print(f"job {job_id} {status.state.value}: {status.reason} (exit code {code})")
            return code
        time.sleep(POLL_S)
    print(f"timed out after {timeout:g}s: job {job_id} has not ended", file=sys.stderr)
    return 1


def wait_running(store: PoolStore, job_id: str, timeout: float) -> int:
    """Until every rank of the job runs (0), it ends first (0 if it succeeded, else 1), or
    `timeout` passes (1)."""
    job_store = JobStore(store.client, store.keys.job(job_id))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = store.status(job_id)
        if status is not None and status.state.ended:
            print(f"job {job_id} {status.state.value}: {status.reason}")
            return 0 if status.state is PoolJobState.SUCCEEDED else 1
        record = waits.every_rank_running(job_store.snapshot())
        if record is not None:
            print(
                f"job {job_id} runs: {record.world_size} ranks on {len(record.members)} "
                f"nodes (generation {record.generation})"
            )
            return 0
        time.sleep(0.2)
    print(f"timed out after {timeout:g}s: job {job_id} does not run every rank yet")
    return 1


def wait_scaled(store: JobStore, nodes: int, timeout: float) -> bool:
    """Until the job runs on `nodes` nodes (True), or it ends or `timeout` passes first (False,
    said)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = store.snapshot().record
        if record is not None and record.state.terminal:
            print(
                f"job {store.keys.job} {record.state.value} before it ran on {nodes} nodes",
                file=sys.stderr,
            )
            return False
        if record is not None and waits.runs_on(record, nodes):
            print(f"job {store.keys.job} runs on {nodes} nodes (generation {record.generation})")
            return True
        time.sleep(0.2)
    print(
        f"timed out after {timeout:g}s: job {store.keys.job} does not run on {nodes} nodes",
        file=sys.stderr,
    )
    return False


def wait_job_drained(store: JobStore, name: str, timeout: float) -> int:
    """Until the node's workers in the job have stopped and the job went on without it (0), or
    `timeout` passes (1) (views/waits.out_of_its_job)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if waits.out_of_its_job(store.snapshot(), store.keys.job, name):
            print(f"node {name}: workers stopped, out of the job")
            return 0
        time.sleep(0.2)
    print(f"timed out after {timeout:g}s: node {name} still has workers", file=sys.stderr)
    return 1


def wait_drained(store: PoolStore, name: str, timeout: float) -> int:
    """Until the node serves nothing (0), or `timeout` passes (1)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if waits.serves_nothing(store.read(), name):
            print(f"node {name}: off its job, serving nothing")
            return 0
        time.sleep(0.2)
    print(f"timed out after {timeout:g}s: node {name} still serves a job")
    return 1
