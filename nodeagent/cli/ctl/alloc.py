"""nodeagentctl alloc: nodes held for your own commands, as salloc (docs/interactive.md).

The pool admits an allocation as any job (gang, queue, quota, priority, fair share,
accounting): it is a job of kind `allocation`, whose one worker on each node is a holder
(`sleep infinity`, as the job's user, in the job's cgroup) in place of a program. Once every
node holds it, this runs a shell (your $SHELL, or the command after `--`) here, on the host you
typed it on, with the allocation's variables (views/allocation.py). When that exits, the
allocation is cancelled and its nodes go back to the pool; when the allocation ends first (its
time limit, a cancel, its nodes lost), the shell is told (SIGHUP, then SIGTERM), and killed
after GRACE_S.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nodeagent.cli.ctl import argtypes, caller, submit
from nodeagent.cli.ctl.targets import Target
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError, NodeagentError, UsageError
from nodeagent.model.request import Verb
from nodeagent.model.spec import JobSpec, load_spec, new_job_id
from nodeagent.pool import holders
from nodeagent.supervisor.foreground import Foreground
from nodeagent.views import waits
from nodeagent.views.allocation import allocation_doc, allocation_env, node_gpus

HELP = "hold nodes for your own commands and shells, as salloc: a shell here once they are held"
POLL_S = 0.5  # how often the allocation is looked at while the shell runs
GRACE_S = 10.0  # a shell told its allocation ended is killed after this
EX_ENDED = 1  # the allocation ended (or never started) before the shell did
GPUS_SAID_S = 10.0  # how long a held allocation waits for its nodes to say their GPUs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "nodeagentctl alloc --nodes 2 --gpus-per-node 1 --time 2h | nodeagentctl alloc "
        "--nodes 1 -- jupyter lab --no-browser"
    )
    parser.add_argument(
        "--name",
        type=argtypes.name,
        help="the allocation's id (default: a new one such as job-3f9c2a1d)",
    )
    submit.shape_arguments(parser)
    parser.add_argument(
        "--timeout",
        type=argtypes.duration,
        help="how long to wait for the nodes (default: no limit, as salloc); then it is "
        "cancelled and this exits 1",
    )
    parser.set_defaults(argv=[])  # the command after `--` (nodeagentctl's main splits it off)


def spec_of(args: argparse.Namespace, user: str, by: str) -> JobSpec:
    """The allocation's spec (views/allocation.py's FIXED, in the shape the flags say).

    Raises:
        UsageError: naming the flag that is wrong.
    """
    doc = submit.shape_doc(args, {**allocation_doc({}), "attended": True})
    try:
        spec = load_spec(doc, default_user=user, job_id=args.name or new_job_id())
    except ConfigError as exc:
        raise UsageError(f"alloc: {exc}") from None
    return replace(spec, submitted_by=by)


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    return Verb.SUBMIT, {"spec": spec_of(args, user, "").to_dict()}


def run(target: Target, args: argparse.Namespace) -> int:
    """Under pool.auth none: the allocation stored here (as `submit` stores a job), then held."""
    store, by = target.pool_store, caller.by()
    spec = replace(spec_of(args, caller.user(), by), request=target.request_id)
    spec = submit.checked(store, spec, "allocation")
    submit.store_one(target, spec, "", "allocation")
    return hold(
        store,
        spec.id,
        args,
        lambda: store.cancel(spec.id, by),
        lambda: store.keep_holder(spec.id, holders.TTL_MS),
    )


def hold(
    store: PoolStore,
    job_id: str,
    args: argparse.Namespace,
    cancel: Callable[[], Any],
    keep: Callable[[], Any],
) -> int:
    """Wait for the allocation, run the shell in it, and end the allocation with it, renewing
    its holder's lease (`keep`) all the while; the shell's exit code (EX_ENDED: the
    allocation ended, or was never held, first)."""
    renewing = threading.Event()
    renewer = threading.Thread(target=_renew, args=(keep, renewing), daemon=True)
    renewer.start()
    try:
        return _held(store, job_id, args, cancel)
    finally:
        renewing.set()


def _renew(keep: Callable[[], Any], stop: threading.Event) -> None:
    """The holder's lease renewed every RENEW_S until `stop` (a failed renewal is tried again
    at the next: the lease outlives several)."""
    while not stop.is_set():
        with contextlib.suppress(NodeagentError):
            keep()
        stop.wait(holders.RENEW_S)


def _held(
    store: PoolStore, job_id: str, args: argparse.Namespace, cancel: Callable[[], Any]
) -> int:
    say(f"pending job allocation {job_id}")
    ending = {sig: signal.signal(sig, _interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        env = granted(store, job_id, args.timeout)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM or SIGHUP, while it waits
        cancel()
        say(f"job allocation {job_id} cancelled while it waited")
        raise
    finally:
        for sig, handler in ending.items():
            signal.signal(sig, handler)
    if env is None:
        _end(store, job_id, cancel)
        return EX_ENDED
    say(f"granted job allocation {job_id} on {env['NODEAGENT_NODELIST']}")
    command = list(args.argv) or [os.environ.get("SHELL") or "/bin/sh"]
    try:
        code = run_in(store, job_id, command, env)
    finally:
        _end(store, job_id, cancel, f"relinquishing job allocation {job_id}")
    return code


def _end(store: PoolStore, job_id: str, cancel: Callable[[], Any], said: str = "") -> None:
    """The allocation cancelled, `said` first, unless it has ended already."""
    status = store.status(job_id)
    if status is not None and not status.state.ended:
        if said:
            say(said)
        cancel()


def granted(store: PoolStore, job_id: str, timeout: float | None) -> dict[str, str] | None:
    """The allocation's variables once every node holds it and says which GPUs it gave
    (its next pool heartbeat; GPUS_SAID_S at most); None: it ended first, or `timeout`
    passed (said)."""
    jobs = JobStore(store.client, store.keys.job(job_id))
    deadline = None if timeout is None else time.monotonic() + timeout
    held_at: float | None = None
    while deadline is None or time.monotonic() < deadline:
        status = store.status(job_id)
        if status is not None and status.state.ended:
            say(f"job allocation {job_id} {status.state.value}: {status.reason}")
            return None
        record = waits.every_rank_running(jobs.snapshot())
        if record is not None:
            held_at = held_at if held_at is not None else time.monotonic()
            nodes = store.nodes()
            gpus = node_gpus(job_id, nodes, record.members)
            unsaid = [m for m in record.members if m in nodes and nodes[m].gpus and not gpus[m]]
            if not unsaid or time.monotonic() - held_at > GPUS_SAID_S:
                spec = store.spec(job_id)
                queue = spec.queue if isinstance(spec, JobSpec) else "default"
                master = (
                    f"{record.master_addr}:{record.master_port}" if record.master_port else None
                )
                return allocation_env(job_id, store.keys.pool, queue, record.members, master, gpus)
        time.sleep(0.2)
    say(f"timed out after {timeout:g}s waiting for job allocation {job_id}: cancelled")
    return None


def run_in(store: PoolStore, job_id: str, command: list[str], env: dict[str, str]) -> int:
    """`command` here with the allocation's variables, until it exits (its code) or the
    allocation ends (it is told, then killed after GRACE_S: EX_ENDED). Ctrl-C is the
    shell's (it shares this terminal's foreground group); SIGTERM and SIGHUP sent to this
    command are passed on to it."""
    try:
        child = Foreground(command, {**os.environ, **env})
    except OSError as exc:
        raise UsageError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    forwarded = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig in forwarded:
        signal.signal(sig, lambda number, _: child.send(number))
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        while (code := child.wait(POLL_S)) is None:
            status = store.status(job_id)
            if status is None or status.state.ended:
                why = f"{status.state.value}: {status.reason}" if status else "gone from the pool"
                say(f"job allocation {job_id} has ended ({why}); ending {command[0]}")
                child.end(GRACE_S)
                return EX_ENDED
        return code
    finally:
        signal.signal(signal.SIGINT, interrupt)
        for sig, handler in forwarded.items():
            signal.signal(sig, handler)


def _interrupted(number: int, _: object) -> None:
    raise KeyboardInterrupt(signal.Signals(number).name)


def say(what: str) -> None:
    print(f"nodeagentctl: {what}", file=sys.stderr, flush=True)
