"""nodeagentctl's pool changes in a pool with pool.auth: munge: signed requests.

submit, cancel, hold, release, requeue, scale, queue create|set|delete, cordon, drain and
uncordon (of a pool node, or with --job of a node in that job), and a job's stop and restart
become a request (model/request.py) carrying a MUNGE credential from this host's munged (your
uid and gid, bound to the request), written to the pool's requests stream. The pool leader
checks it, does it if you may, and answers; this prints the answer: 0 done, 2 refused (why),
3 no such job or node, 69 unknown: no pool leader answered in time, or the change is not
acknowledged on the replicas pool.durability asks for (it may or may not be kept: the same
command with the --request-id it printed is that change again, never done twice). Each request
carries the command's request id; a request that cannot be sent is signed and sent again, with
the same id. Each verb that changes the pool says its own signed form (its `request`, beside
its `run`: verbs.py); this module signs, sends and waits for the answer.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from dataclasses import replace
from typing import Any

from nodeagent.cli.ctl import alloc, submit, token, ui, wait
from nodeagent.coord.durable import NotAcknowledged
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError, CoordinationError, NotFoundError, UsageError
from nodeagent.model.credential import Munge, MungeUnavailable
from nodeagent.model.request import Reply, Request, Verb
from nodeagent.pool import jobverbs
from nodeagent.views.waits import answered_request

ANSWER_TIMEOUT_S = 30.0
SEND_TRIES = 3  # a request Redis could not take is sent again, as the same change
SEND_BACKOFF_S = 1.0
POLL_S = 1.0  # the answer read at least this often while its event is awaited
UNFOLLOWED_S = 0.1  # and this often where the pool's stream cannot be followed


def run(
    store: PoolStore, args: argparse.Namespace, munge: Munge, verb: Verb, body: dict[str, Any]
) -> int:
    """Send one signed request and print the pool leader's answer.

    Raises:
        UsageError: refused (exit 2).
        ConfigError: munged cannot be reached here (exit 78).
    """
    before = _target_now(store, body) if verb is Verb.SCALE else None
    rid = getattr(args, "request_id", None) or ""
    reply = ask(store, munge, verb, body, rid)
    if reply is None:
        raise NotAcknowledged(
            f"no pool leader answered within {ANSWER_TIMEOUT_S:g}s: the change may or may not "
            f"be made (are the agents of pool {store.keys.pool} running? nodeagentctl nodes); "
            f"run it again with --request-id {rid}"
        )
    if reply.unacknowledged:
        raise NotAcknowledged(reply.message)
    if not reply.ok:
        raise (NotFoundError if reply.missing else UsageError)(reply.message)
    if verb is Verb.SCALE and args.wait:
        print(reply.message, flush=True)
        return _scaled(store, munge, args, body, before)
    if verb is Verb.TOKEN and args.command == "ui":
        return ui.received(reply, args)
    if verb is Verb.TOKEN and reply.sealed:
        return token.received(munge, reply)
    if verb is Verb.SUBMIT and body["spec"].get("array"):
        print(body["spec"]["id"] if args.parsable else reply.message, flush=True)
        return 0
    if verb is Verb.SUBMIT and args.command == "alloc":
        job_id = str(body["spec"]["id"])
        keep = lambda: ask(store, munge, Verb.KEEP, {"job": job_id})  # noqa: E731
        return alloc.hold(store, job_id, args, lambda: _cancel(store, munge, job_id), keep)
    if verb is Verb.SUBMIT:
        job_id = str(body["spec"]["id"])
        submit.submitted(job_id, args)
        return submit.follow(store, job_id, args)
    print(reply.message, flush=True)
    if verb is Verb.CORDON and args.command == "drain" and args.wait:
        job = body.get("job")
        if job is not None:
            jobs = JobStore(store.client, store.keys.job(str(job)))
            return wait.wait_job_drained(jobs, args.node, args.timeout)
        return wait.wait_drained(store, args.node, args.timeout)
    return 0


def _cancel(store: PoolStore, munge: Munge, job_id: str) -> None:
    """An allocation's end, as a signed cancel (said where it is not done)."""
    reply = ask(store, munge, Verb.CANCEL, {"job": job_id})
    if reply is None or not reply.ok:
        said = reply.message if reply is not None else "no pool leader answered"
        print(f"nodeagentctl: cannot end job allocation {job_id}: {said}", file=sys.stderr)


def ask(
    store: PoolStore, munge: Munge, verb: Verb, body: dict[str, Any], request_id: str = ""
) -> Reply | None:
    """Sign and send one request (`request_id`: its change's, the same for every try); the
    answer (None: none came).

    Raises:
        ConfigError: munged cannot be reached here (exit 78).
        CoordinationError: it could not be sent, SEND_TRIES times.
    """
    requests = RequestStore(store.client, store.keys)
    try:
        after: str | None = store.last_event_id()  # its answer's event comes after this
    except CoordinationError:  # not a stream (garbage), or not readable: the reply polled
        after = None
    entry = _send(requests, munge, Request(store.keys.pool, verb, body, request_id=request_id))
    return wait_reply(store, requests, entry, after, ANSWER_TIMEOUT_S)


def _send(requests: RequestStore, munge: Munge, request: Request) -> str:
    """Sign and send `request`, signed and sent again (the same request id) while Redis cannot
    take it, SEND_TRIES times at most; its entry's id."""
    for attempt in range(1, SEND_TRIES + 1):
        signed = replace(request, nonce=secrets.token_hex(8))  # a new credential each time
        try:
            signed = replace(signed, credential=munge.encode(signed.payload))
        except MungeUnavailable as exc:
            raise ConfigError(
                "--munge-socket",
                f"pool {requests.keys.pool} takes signed requests (pool.auth: munge), but {exc}",
            ) from None
        try:
            return requests.send(signed)
        except CoordinationError:
            if attempt == SEND_TRIES or not request.request_id:  # no id: never twice
                raise
            time.sleep(SEND_BACKOFF_S * attempt)
    raise AssertionError("unreachable")


def _target_now(store: PoolStore, body: dict[str, Any]) -> int | None:
    record = store.records([str(body["job"])]).get(str(body["job"]))
    return record.target_nodes if record is not None else None


def _scaled(
    store: PoolStore,
    munge: Munge,
    args: argparse.Namespace,
    body: dict[str, Any],
    before: int | None,
) -> int:
    """--wait (and --rollback) of a signed scale, as of a job's own (scale.py)."""
    jobs = JobStore(store.client, store.keys.job(str(body["job"])))
    nodes = jobverbs.relative_target(str(body["target"]), before or 0)
    if nodes is not None and wait.wait_scaled(jobs, nodes, args.timeout):
        return 0
    if args.rollback and before is not None:
        back = ask(store, munge, Verb.SCALE, {**body, "target": str(before)})
        if back is not None:
            print(f"rolled back: {back.message}", file=sys.stderr)
    return 1


def wait_reply(
    store: PoolStore, requests: RequestStore, request_id: str, after: str | None, timeout: float
) -> Reply | None:
    """The answer to `request_id`, read as soon as its event follows `after` in the pool's
    stream (the leader writes both at once), else at least every POLL_S (an event trimmed
    away); every UNFOLLOWED_S where the stream cannot be followed (`after` None, or it turns
    out unreadable): None when none came within `timeout`."""
    deadline = time.monotonic() + timeout
    cursor, read_at = after, 0.0
    while (now := time.monotonic()) < deadline:
        if now >= read_at:  # at first, once its event came, and every POLL_S
            reply = requests.reply(request_id)
            if reply is not None:
                return reply
            read_at = now + (POLL_S if cursor is not None else UNFOLLOWED_S)
        block_ms = max(1, round((min(deadline, read_at) - now) * 1000))
        if cursor is None:
            time.sleep(block_ms / 1000)
            continue
        try:
            got = store.wait_events({store.keys.events: cursor}, block_ms)
        except CoordinationError:  # not a stream, or not readable: the reply polled alone
            cursor, read_at = None, 0.0
            continue
        if got:
            cursor = got[-1][1]
            if request_id in (answered_request(i, fields) for _, i, fields in got):
                read_at = 0.0
    return None
