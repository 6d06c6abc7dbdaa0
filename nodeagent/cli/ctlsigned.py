"""nodeagentctl's pool changes in a pool with pool.auth: munge: signed requests.

submit, cancel, scale JOB, queue create|set|delete, and cordon, drain, uncordon of a pool node
become a request (model/request.py) carrying a MUNGE credential from this host's munged (your
uid and gid, bound to the request), written to the pool's requests stream. The pool leader
checks it, does it if you may, and answers; this prints the answer: 0 done, 2 refused (why),
1 no pool leader answered in time (the request may still be taken: see `events --pool`).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from nodeagent.cli import ctlpool
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.errors import ConfigError, UsageError
from nodeagent.model.credential import Munge, MungeUnavailable
from nodeagent.model.request import Reply, Request, Verb

ANSWER_TIMEOUT_S = 30.0
QUEUE_KEYS = frozenset({"quota", "guaranteed", "max_priority"})  # absent: unchanged


def request_of(args: argparse.Namespace, user: str) -> tuple[Verb, dict[str, Any]] | None:
    """The request a command line makes (None: a command that changes no pool state)."""
    command = args.command
    if command == "submit":
        spec = ctlpool.spec_from_args(args, user, "")
        return Verb.SUBMIT, {"spec": spec.to_dict()}
    if command == "cancel":
        return Verb.CANCEL, {"job": args.job_id}
    if command == "scale" and len(args.what) == 2:
        return Verb.SCALE, {"job": args.what[0], "target": args.what[1]}
    if command == "queue" and args.action != "list":
        found: dict[str, Any] = {"action": args.action, "name": args.name}
        given = {key: value for key, value in vars(args).items() if key in QUEUE_KEYS}
        found.update({k: v for k, v in given.items() if k != "guaranteed" or v is not None})
        return Verb.QUEUE, found
    if command in ("cordon", "drain", "uncordon") and args.job is None:
        return Verb.CORDON, {
            "action": command,
            "node": args.node,
            "reason": getattr(args, "reason", ""),
        }
    return None


def run(
    store: PoolStore, args: argparse.Namespace, munge: Munge, verb: Verb, body: dict[str, Any]
) -> int:
    """Send one signed request and print the pool leader's answer.

    Raises:
        UsageError: refused (exit 2).
        ConfigError: munged cannot be reached here (exit 78).
    """
    request = Request(store.keys.pool, verb, body)
    try:
        request = replace(request, credential=munge.encode(request.payload))
    except MungeUnavailable as exc:
        raise ConfigError(
            "--munge-socket",
            f"pool {store.keys.pool} takes signed requests (pool.auth: munge), but {exc}",
        ) from None
    requests = RequestStore(store.client, store.keys)
    request_id = requests.send(request)
    reply = wait_reply(requests, request_id, ANSWER_TIMEOUT_S)
    if reply is None:
        print(
            f"no pool leader answered request {request_id} within {ANSWER_TIMEOUT_S:g}s: are "
            f"the agents of pool {store.keys.pool} running (nodeagentctl nodes)?"
        )
        return 1
    if not reply.ok:
        raise UsageError(reply.message)
    if verb is Verb.SUBMIT:
        spec = ctlpool.spec_from_args(args, reply.user, reply.user)
        print(spec.id, flush=True)
        return ctlpool.wait_running(store, spec, args.timeout) if args.wait else 0
    print(reply.message, flush=True)
    if verb is Verb.CORDON and args.command == "drain" and args.wait:
        return ctlpool.wait_drained(store, args.node, args.timeout)
    return 0


def wait_reply(store: RequestStore, request_id: str, timeout: float) -> Reply | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = store.reply(request_id)
        if reply is not None:
            return reply
        time.sleep(0.1)
    return None
