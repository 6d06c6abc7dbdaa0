"""What nodeagentctl waits for after a change: a submitted job's end (submit --wait: its exit
code), a job running every rank (--wait-running), a job at its new size, a node off its job.
Each returns (or is) the exit code: 0 reached, 1 timed out."""

from __future__ import annotations

import sys
import time

from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.model.pool import PoolJobState
from nodeagent.state import JobState, NodeState
from nodeagent.views.status import status_document

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
            code = 0 if status.state is PoolJobState.SUCCEEDED else (status.exit_code or 1)
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
        snapshot = job_store.snapshot()
        record = snapshot.record
        if record is not None and record.state is JobState.RUNNING:
            states = {
                lease.name: lease.report.state
                for lease in snapshot.leases
                if lease.report is not None
            }
            if all(states.get(m) is NodeState.RUNNING for m in record.members):
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
        if (
            record is not None
            and record.state is JobState.RUNNING
            and record.target_nodes == nodes
            and len(record.members) == nodes
        ):
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
    `timeout` passes (1). Its agent acknowledges the generation that leaves it out only once it
    persisted and handed over its workers' last save (docs/checkpoints.md): a rolling upgrade
    that restarts the agent as soon as this returns cuts neither short."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshot = store.snapshot()
        nodes = {n["name"]: n for n in status_document(snapshot, store.keys.job)["nodes"]}
        node = nodes.get(name)
        record = snapshot.record
        went_on = (
            record is None
            or record.state.terminal
            or (record.state is not JobState.RESTARTING and name not in record.members)
        )
        if node is None or (
            went_on
            and node["state"] in ("cordoned", "lost")
            and not any(w["state"] in ("running", "stopping") for w in node["workers"])
        ):
            print(f"node {name}: workers stopped, out of the job")
            return 0
        time.sleep(0.2)
    print(f"timed out after {timeout:g}s: node {name} still has workers", file=sys.stderr)
    return 1


def wait_drained(store: PoolStore, name: str, timeout: float) -> int:
    """Until the node serves nothing (0), or `timeout` passes (1)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = store.read()
        report = snap.nodes.get(name)
        serving = report is not None and (report.serving is not None or report.sharing)
        if name not in snap.placements and name not in snap.shares and not serving:
            print(f"node {name}: off its job, serving nothing")
            return 0
        time.sleep(0.2)
    print(f"timed out after {timeout:g}s: node {name} still serves a job")
    return 1
