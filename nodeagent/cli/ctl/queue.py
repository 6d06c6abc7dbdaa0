"""nodeagentctl queue create|set|delete|list: the pool's queues (nodeagent.model.queues)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from nodeagent.cli.ctl import argtypes, caller
from nodeagent.cli.ctl.targets import Target
from nodeagent.coord import poolqueues
from nodeagent.coord.pool import PoolStore
from nodeagent.errors import UsageError
from nodeagent.model.queues import DEFAULT, QueueView
from nodeagent.model.request import Verb
from nodeagent.views import queues as views
from nodeagent.views.documents import listing

GUARANTEES = ("guaranteed", "gpu_guaranteed")
HELP = "the pool's queues: quota, guaranteed share, use"
QUEUE_KEYS = frozenset({"quota", "guaranteed", "max_priority", "gpu_quota", "gpu_guaranteed"})


def add_arguments(queue: argparse.ArgumentParser) -> None:
    queue.description = (
        "nodeagentctl queue create research --quota 8 --gpu-quota 32 --guaranteed 4 "
        "--gpu-guaranteed 16 | "
        "queue set research --quota none | queue delete research | queue list"
    )
    actions = queue.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (("create", "a new queue"), ("set", "change a queue")):
        parser = actions.add_parser(action, help=text)
        parser.add_argument("name", type=argtypes.name)
        parser.add_argument(
            "--quota",
            type=_quota,
            default=argparse.SUPPRESS,  # absent, unlike `--quota none`
            help="most nodes its jobs hold at once (none: no limit)",
        )
        parser.add_argument(
            "--gpu-quota",
            type=_quota,
            default=argparse.SUPPRESS,
            help="most GPUs its jobs hold at once, a whole node's all of them (none: no limit)",
        )
        parser.add_argument(
            "--guaranteed", type=int, help="nodes it may take back from queues above theirs"
        )
        parser.add_argument(
            "--gpu-guaranteed",
            type=int,
            help="GPUs its jobs may take back from queues above theirs",
        )
        parser.add_argument(
            "--max-priority",
            type=_ceiling,
            default=argparse.SUPPRESS,
            help="the highest priority a job may be submitted with (none: no ceiling)",
        )
    delete = actions.add_parser("delete", help="remove a queue that no job is in")
    delete.add_argument("name", type=argtypes.name)
    listing = actions.add_parser("list", help="every queue and what it holds")
    listing.add_argument("--json", action="store_true")


def _quota(text: str) -> int | None:
    if text.lower() in ("none", "off", "unlimited"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of nodes or none, got {text!r}"
        ) from None


def _ceiling(text: str) -> int | None:
    if text.lower() in ("none", "off"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a priority or none, got {text!r}") from None


def request(
    args: argparse.Namespace, user: str, job: str | None
) -> tuple[Verb, dict[str, Any]] | None:
    if args.action == "list":
        return None
    found: dict[str, Any] = {"action": args.action, "name": args.name}
    given = {key: value for key, value in vars(args).items() if key in QUEUE_KEYS}
    found.update(  # (absent: unchanged; the guarantees' absence is None, not SUPPRESS)
        {k: v for k, v in given.items() if k not in GUARANTEES or v is not None}
    )
    return Verb.QUEUE, found


def run(target: Target, args: argparse.Namespace) -> int:
    store, by = target.pool_store, caller.by()
    if args.action == "list":
        return _list(store, args.json)
    if args.action == "delete":
        return _delete(target, args.name, by)
    snap = store.read()
    existing = snap.queues.get(args.name)
    if args.action == "create" and (existing is not None or args.name == DEFAULT):
        raise UsageError(f"queue {args.name} exists already: `queue set {args.name}` changes it")
    if args.action == "set" and existing is None and args.name != DEFAULT:
        raise UsageError(f"no queue {args.name}: `queue create {args.name}` makes it")
    base = existing or QueueView(args.name)
    queue = QueueView(
        args.name,
        quota=args.quota if "quota" in vars(args) else base.quota,
        guaranteed=base.guaranteed if args.guaranteed is None else args.guaranteed,
        max_priority=args.max_priority if "max_priority" in vars(args) else base.max_priority,
        gpu_quota=args.gpu_quota if "gpu_quota" in vars(args) else base.gpu_quota,
        gpu_guaranteed=base.gpu_guaranteed if args.gpu_guaranteed is None else args.gpu_guaranteed,
    )
    problems = queue.problems()
    if problems:
        raise UsageError(f"queue {args.name}: {'; '.join(problems)}")
    poolqueues.set_queue(store.client, store.keys, queue, by, created=existing is None)
    target.confirm(f"queue {queue.name}")
    print(f"queue {queue.name}: {queue.describe()}")
    queues = {**snap.queues, queue.name: queue}.values()
    promised = sum(q.guaranteed for q in queues)
    if promised > len(snap.nodes):
        print(
            f"warning: the queues are guaranteed {promised} nodes, the pool has {len(snap.nodes)}"
        )
    promised_gpus = sum(q.gpu_guaranteed for q in queues)
    offered = sum(len(report.gpus) for report in snap.nodes.values())
    if promised_gpus > offered:
        print(f"warning: the queues are guaranteed {promised_gpus} GPUs, the pool offers {offered}")
    return 0


def _delete(target: Target, name: str, by: str) -> int:
    store = target.pool_store
    snap = store.read()
    if name not in snap.queues:
        raise UsageError(f"no queue {name}")
    specs = store.specs([j for j, s in snap.jobs.items() if not s.state.ended])
    inside = sorted(
        j for j, spec in specs.items() if not isinstance(spec, str) and spec.queue == name
    )
    if inside:
        raise UsageError(
            f"queue {name} has {len(inside)} jobs that have not ended ({', '.join(inside[:5])}): "
            "cancel them or wait for them first"
        )
    poolqueues.delete_queue(store.client, store.keys, name, by)
    target.confirm(f"queue {name}'s deletion")
    print(f"queue {name}: deleted")
    return 0


def _list(store: PoolStore, as_json: bool) -> int:
    found = views.queues(store)
    if as_json:
        print(json.dumps(listing("queues", store.keys.pool, found), indent=2))
        return 0
    print(
        f"{'QUEUE':<16} {'QUOTA':>6} {'GUARANTEED':>10} {'NODES':>6} {'GPUS':>9} "
        f"{'GPUS GUAR.':>10} {'RUNNING':>7} {'PENDING':>7}"
    )
    for r in found:
        quota = "-" if r["quota"] is None else str(r["quota"])
        gpus = str(r["gpus"]) + ("" if r["gpu_quota"] is None else f"/{r['gpu_quota']}")
        print(
            f"{r['queue']:<16} {quota:>6} {r['guaranteed']:>10} {r['nodes']:>6} {gpus:>9} "
            f"{r['gpu_guaranteed']:>10} {r['running']:>7} {r['pending']:>7}"
        )
    return 0
