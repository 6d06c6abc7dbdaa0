"""`nodeagentctl`: submit and follow a pool's jobs (Slurm's verbs), and act inside one job.

Pool: submit, jobs, show, history, cancel, hold, release, requeue, scale, nodes, queue; a job:
status, events, restart, stop, scale, cordon, drain, uncordon, health; `logs JOB` a rank's log
from its node's agent, `logs` without JOB this node's rank logs (no Redis).

Every argument is checked before anything is written to Redis: a node that holds no lease and
is not a member of the job record, a job with neither a record nor a lease, a bad duration,
count, name or Redis URL all exit 2 and change nothing.

Exit codes:
  0   done (also `uncordon` of a node that was not cordoned: nothing to do)
  1   a --wait timed out (submit --wait: the job's own exit code once it has ended)
  2   a request that can never succeed as given: bad arguments, a job in a state that does
      not take the verb, a target outside [min_nodes, max_nodes], an unreadable
      --redis-password-file
  3   the job or node named does not exist (in this pool, job or key prefix)
  69  (EX_UNAVAILABLE) Redis unreachable, or it answered with an error (e.g. WRONGTYPE: a key of
      the job holds something nodeagent did not write)
  78  (EX_CONFIG) the --config file is invalid, or Redis refused the credentials or (ACL) the
      command: a fix in configuration, not a retry, helps
  130 interrupted (Ctrl-C), as shells report SIGINT

Redis: --redis URL, else --config's redis.url, else the environment variable NODEAGENT_REDIS_URL,
else `redis` in nodeagentctl's own file (cli/ctlrc.py: ~/.config/nodeagent/nodeagentctl.yaml,
which may also give redis_password_file, pool, key_prefix, munge_socket).

The password: `--redis-password-file PATH` (its first line), else the one in the URL, else the
environment variable NODEAGENT_REDIS_PASSWORD (a file and a URL password together are an
error). The file and the variable keep it out of `ps`; an ACL user name goes in the URL.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace

from nodeagent.cli import (
    ctlargs,
    ctlhistory,
    ctljobverbs,
    ctllogs,
    ctlparser,
    ctlpool,
    ctlqueue,
    ctlrc,
    ctlshow,
    ctlsigned,
    ctltarget,
    ctlwait,
)
from nodeagent.cli.ctltarget import Target
from nodeagent.cli.status import status_document
from nodeagent.config.load import read_config
from nodeagent.config.settings import EX_CONFIG, NodeSettings
from nodeagent.coord import eventlog
from nodeagent.coord.failure import RedisFailure, classify
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.coord.store import JobStore, Snapshot
from nodeagent.errors import ConfigError, CoordinationError, NotFoundError, UsageError
from nodeagent.model.job import Command, CommandType, Cordon
from nodeagent.pool import jobverbs
from nodeagent.supervisor.munge import DEFAULT_SOCKET, MungeProgram

EX_UNAVAILABLE = 69
EX_USAGE = 2
EX_NOT_FOUND = 3  # the job or node named does not exist
EX_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it
WRITES = frozenset({"scale", "restart", "stop", "cordon", "drain", "uncordon"})


_parser = ctlparser.parser  # (the tests build arguments with it)


def _one_job(args: argparse.Namespace) -> None:
    """The job given as JOB (positional) or --job: the same one if both.

    Raises:
        UsageError: two different jobs.
    """
    given = getattr(args, "job_pos", None)
    if given is None:
        return
    if args.job is not None and args.job != given:
        raise UsageError(f"two jobs given: --job {args.job} and {given}; give one")
    args.job = given


def _by() -> str:
    return f"{getpass.getuser()}@{socket.gethostname().split('.')[0]}"


def _require_job(store: JobStore, snapshot: Snapshot) -> None:
    """A job exists when it has a record (readable or not) or a node holds a lease."""
    if snapshot.record is None and snapshot.record_error is None and not snapshot.leases:
        raise NotFoundError(
            f"job {store.keys.job!r} does not exist under key prefix {store.keys.prefix!r}: it "
            "has not formed yet (no job record) and no node holds a lease; check --job, "
            "--key-prefix and --redis, or start its agents first"
        )


def _require_node(store: JobStore, snapshot: Snapshot, name: str, more: set[str]) -> None:
    """A node is known when it holds a lease, is named by the job record, or is in `more`."""
    known = {lease.name for lease in snapshot.leases} | more
    record = snapshot.record
    if record is not None:
        known |= set(record.members)
        if record.pending_failure is not None:
            known.add(record.pending_failure.node)
    if name not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise NotFoundError(
            f"node {name!r} is not in job {store.keys.job}: it holds no lease and the job "
            f"record does not name it (known nodes: {listed})"
        )


def _events(store: JobStore | PoolStore, args: argparse.Namespace) -> int:
    """The job's events, or with --pool the pool's (submissions, requests and who made them,
    placements, preemptions, queue and cordon changes)."""
    show = ctlshow.event_json if args.json else ctlshow.event_line
    last = eventlog.tail(store, args.last) if args.last > 0 else []
    for entry_id, fields in last:
        print(show(entry_id, fields), flush=True)
    cursor = last[-1][0] if last else store.last_event_id()
    while args.follow:
        for _, entry_id, fields in store.wait_events({store.keys.events: cursor}, 2000):
            cursor = entry_id
            print(show(entry_id, fields), flush=True)
    return 0


def _scale(
    store: JobStore, snapshot: Snapshot, config: NodeSettings | None, args: argparse.Namespace
) -> int:
    record = snapshot.record
    if record is not None:
        low, high, before = record.min_nodes, record.max_nodes, record.target_nodes
    elif config is not None and config.job is not None and config.job.id == store.keys.job:
        job = config.job
        low, high, before = job.min_nodes, job.max_nodes, job.target_nodes
    else:
        raise UsageError(
            f"job {store.keys.job} has not formed yet and no --config gives its "
            "bounds; start its agents or pass --config"
        )
    args.nodes = ctlpool.resolve_target(args.value, before)
    if not low <= args.nodes <= high:
        raise UsageError(
            f"cannot scale job {store.keys.job} to {args.nodes}: the target must be "
            f"within [min_nodes, max_nodes] = [{low}, {high}]"
        )
    store.send_command(Command(CommandType.SCALE, target=args.nodes, by=_by()))
    print(f"job {store.keys.job}: target {before} -> {args.nodes} requested")
    if not args.wait or ctlwait.wait_scaled(store, args.nodes, args.timeout):
        return 0
    if args.rollback:
        store.send_command(Command(CommandType.SCALE, target=before, by=f"{_by()} (rollback)"))
        print(f"rolled back: target {args.nodes} -> {before}", file=sys.stderr)
    return 1


def _command(store: JobStore, kind: CommandType) -> int:
    store.send_command(Command(kind, by=_by()))
    print(f"job {store.keys.job}: {kind.value} requested")
    return 0


def _drain(store: JobStore, args: argparse.Namespace) -> int:
    store.cordon(args.node, Cordon(reason=args.reason, by=_by(), drain=True))
    print(f"node {args.node}: drained ({args.reason})")
    return ctlwait.wait_job_drained(store, args.node, args.timeout) if args.wait else 0


def _uncordon(store: JobStore, snapshot: Snapshot, args: argparse.Namespace) -> int:
    cordoned = set(store.cordons())
    _require_node(store, snapshot, args.node, cordoned)
    if args.node not in cordoned:
        print(f"node {args.node}: was not cordoned")
        return 0
    lifted = store.uncordon(args.node, by=_by())
    print(f"node {args.node}: " + ("uncordoned" if lifted else "was not cordoned"))
    return 0


def _read(store: JobStore, config: NodeSettings | None, args: argparse.Namespace) -> int:
    """The commands that only read: events, health."""
    if args.command == "events":
        return _events(store, args)
    name = args.node or (config.node.name if config else None)
    if name is None:
        raise UsageError("give --node NAME, or --config of the node")
    nodes = {n["name"]: n for n in status_document(store.snapshot(), store.keys.job)["nodes"]}
    if name not in nodes:
        raise NotFoundError(f"node {name} is not in job {store.keys.job} (no live lease)")
    ctlshow.print_health(name, nodes[name], args.json)
    return 0


def _write(store: JobStore, config: NodeSettings | None, args: argparse.Namespace) -> int:
    """The commands that write, each after checking that its job and node exist."""
    snapshot = store.snapshot()
    _require_job(store, snapshot)
    if args.command == "scale":
        return _scale(store, snapshot, config, args)
    if args.command == "uncordon":
        return _uncordon(store, snapshot, args)
    if args.command in ("cordon", "drain"):
        _require_node(store, snapshot, args.node, set())
    if args.command == "cordon":
        store.cordon(args.node, Cordon(reason=args.reason, by=_by()))
        print(f"node {args.node}: cordoned ({args.reason})")
        return 0
    if args.command == "drain":
        return _drain(store, args)
    return _command(store, CommandType(args.command))


def _signed(target: Target, args: argparse.Namespace) -> int | None:
    """A pool change as a signed request, when the pool takes only those (pool.auth: munge)."""
    found = ctlsigned.request_of(args, getpass.getuser(), target.job)
    if found is None or RequestStore(target.client, target.pool_store.keys).auth() != "munge":
        return None
    munge = MungeProgram(_munge_socket(target, args))
    return ctlsigned.run(target.pool_store, args, munge, *found)


def _munge_socket(target: Target, args: argparse.Namespace) -> str:
    if args.munge_socket:
        return str(args.munge_socket)
    return target.config.pool.munge_socket if target.config is not None else DEFAULT_SOCKET


def dispatch(target: Target, args: argparse.Namespace) -> int:
    signed = _signed(target, args)
    if signed is not None:
        return signed
    if args.command in ctlpool.COMMANDS:
        return ctlpool.run(target.pool_store, args, getpass.getuser(), _by())
    if args.command in ctljobverbs.COMMANDS:
        return ctljobverbs.run(target.pool_store, args, _by())
    if args.command in ctlhistory.COMMANDS:
        return ctlhistory.run(target.pool_store, args)
    if args.command == ctlqueue.COMMAND:
        return ctlqueue.run(target.pool_store, args, _by())
    if args.command in ("cordon", "drain", "uncordon") and target.job is None:
        return ctlpool.pool_cordon(target.pool_store, args, _by())  # a pool node, no job
    if args.command == "events" and args.pool_stream:
        return _events(target.pool_store, args)
    if args.command == "logs":  # logs JOB: from the agent of the rank's node
        return ctllogs.run_pool(
            target.client,
            target.prefix,
            target.pool,
            args,
            MungeProgram(_munge_socket(target, args)),
        )
    if args.command == "scale":
        if len(args.what) > 2:
            raise UsageError("scale: give [JOB] N, such as `scale llama 4` or `scale llama +2`")
        args.value = args.what[-1]
        if len(args.what) == 2:
            target = replace(target, job=ctlargs.checked_name(args.what[0], "scale: JOB"))
            handled = ctlpool.pool_scale_check(target.pool_store, args.what[0], args.value)
            if handled is not None:
                return handled
    if args.command == "stop":
        _not_a_pool_job(target)
    if args.command in WRITES:
        return _write(target.store, target.config, args)
    if args.command == "status":
        return _status(target, args.json)
    return _read(target.store, target.config, args)


def _not_a_pool_job(target: Target) -> None:
    """`stop` stops a pinned job until `restart`; a submitted job ends or requeues instead.

    Raises:
        UsageError: the job was submitted to the pool.
    """
    status = target.pool_store.status(target.job) if target.job else None
    if status is not None and not status.pinned:
        raise UsageError(jobverbs.stop_refusal(target.job or ""))


def _status(target: Target, as_json: bool) -> int:
    """The job's own status, and its place in the pool (why it waits, was shrunk, evicted)."""
    store = target.store
    doc = {"version": ctlshow.JSON_VERSION, **status_document(store.snapshot(), store.keys.job)}
    pooled = target.pool_store.status(store.keys.job)
    doc["pool"] = (
        {"pool": target.pool, "state": pooled.state.value, "reason": pooled.reason}
        if pooled is not None
        else None
    )
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        ctlshow.print_status(doc)
    return 0


def _redis_failure(exc: CoordinationError, target: Target | None) -> int:
    """Say what kind of Redis failure `exc` is; its exit code."""
    kind = classify(exc)
    if kind is RedisFailure.CREDENTIALS:
        given = "" if target is None or target.password_given else "; no password was given"
        print(
            f"nodeagentctl: Redis refused the credentials ({exc}{given}); give the password "
            f"with --redis-password-file PATH or {ctlargs.PASSWORD_ENV}, and an ACL user in "
            "the URL (redis://USER@host:6379/0)",
            file=sys.stderr,
        )
        return EX_CONFIG
    if kind is RedisFailure.PERMISSION:
        print(
            f"nodeagentctl: Redis refused the command for this user (ACL): {exc}; use an "
            "operator user allowed the job's keys and these commands",
            file=sys.stderr,
        )
        return EX_CONFIG
    if kind is RedisFailure.UNREACHABLE:
        print(f"nodeagentctl: cannot reach Redis: {exc}", file=sys.stderr)
    else:
        print(f"nodeagentctl: Redis answered with an error: {exc}", file=sys.stderr)
    return EX_UNAVAILABLE


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    entrypoint: list[str] = []
    if "--" in argv:  # submit's command: argparse would take its first word for the spec file
        cut = argv.index("--")
        argv, entrypoint = argv[:cut], argv[cut + 1 :]
    args = ctlparser.parser(__doc__.splitlines()[0]).parse_args(argv)
    if entrypoint:
        args.argv = entrypoint
    target: Target | None = None
    try:
        if args.command == "logs" and args.logs_job is None:  # this node's files: no Redis
            return ctllogs.run(read_config(args.config) if args.config else None, args)
        _one_job(args)
        environ = os.environ if environ is None else environ
        defaults = ctlrc.load(environ)
        ctlrc.apply(args, defaults, str(ctlrc.path(environ)), environ.get(ctltarget.URL_ENV))
        target = ctltarget.target(args, environ)
        return dispatch(target, args)
    except ConfigError as exc:
        print(f"nodeagentctl: invalid configuration: {exc}", file=sys.stderr)
        return EX_CONFIG
    except NotFoundError as exc:
        print(f"nodeagentctl: {exc}", file=sys.stderr)
        return EX_NOT_FOUND
    except UsageError as exc:
        print(f"nodeagentctl: {exc}", file=sys.stderr)
        return EX_USAGE
    except CoordinationError as exc:
        return _redis_failure(exc, target)
    except KeyboardInterrupt:
        return EX_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
