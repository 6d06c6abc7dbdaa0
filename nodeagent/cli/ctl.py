"""`nodeagentctl`: inspect a job and change it (status, scale, events, restart, stop).

Exit codes: 0 done; 1 a --wait timed out; 2 a request that can never succeed as given (bad
arguments, a target outside [min_nodes, max_nodes]); 69 (EX_UNAVAILABLE) Redis unreachable;
78 (EX_CONFIG) the --config file is invalid.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from nodeagent.config import EMBEDDED, EX_CONFIG, Config, parse_duration, read_config
from nodeagent.coord.client import connect
from nodeagent.coord.embedded import embedded_url
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError, CoordinationError, UsageError
from nodeagent.model import Command, CommandType, Cordon, Event
from nodeagent.state import JobState
from nodeagent.status import status_document

EX_UNAVAILABLE = 69
EX_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nodeagentctl", description=__doc__.splitlines()[0])
    where = parser.add_argument_group("which job (either --config, or --redis and --job)")
    where.add_argument("--config", help="an agent's config file")
    where.add_argument("--redis", help="Redis URL, e.g. redis://10.0.0.2:6379/0")
    where.add_argument("--job", help="job id")
    where.add_argument("--key-prefix", default=None, help="Redis key prefix (default nodeagent)")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="show the job and its nodes")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    scale = commands.add_parser("scale", help="change the job's target number of nodes")
    scale.add_argument("nodes", type=int, help="new target, within [min_nodes, max_nodes]")
    scale.add_argument("--wait", action="store_true", help="wait until the job runs at that size")
    scale.add_argument("--timeout", default="10m", help="how long --wait waits (default 10m)")
    scale.add_argument("--rollback", action="store_true", help="on timeout restore the old target")
    events = commands.add_parser("events", help="show the job's event log")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.add_argument("--last", type=int, default=50, help="how many past events (default 50)")
    commands.add_parser("restart", help="force a new generation (also restarts a finished job)")
    commands.add_parser("stop", help="stop the job's workers everywhere")
    cordon = commands.add_parser("cordon", help="keep a node out of the next generations")
    cordon.add_argument("node")
    cordon.add_argument("--reason", default="cordoned by an operator")
    drain = commands.add_parser(
        "drain", help="cordon a node and take it out of the job now (its workers checkpoint)"
    )
    drain.add_argument("node")
    drain.add_argument("--reason", default="drained by an operator")
    drain.add_argument("--wait", action="store_true", help="wait until its workers are stopped")
    drain.add_argument("--timeout", default="10m", help="how long --wait waits (default 10m)")
    uncordon = commands.add_parser("uncordon", help="let a node take part again")
    uncordon.add_argument("node")
    health = commands.add_parser("health", help="a node's GPU verdicts (default: this node)")
    health.add_argument("--node", help="node name (default: node.name of --config)")
    health.add_argument("--json", action="store_true")
    return parser


def _store(args: argparse.Namespace) -> tuple[JobStore, Config | None]:
    config = read_config(args.config) if args.config else None
    url = args.redis or (config.redis.url if config else None)
    if url == EMBEDDED and config is not None:
        url = embedded_url(config.job.id)
    job = args.job or (config.job.id if config else None)
    if not url or not job:
        raise UsageError("give --config PATH, or both --redis URL and --job ID")
    prefix = args.key_prefix or (config.redis.key_prefix if config else "nodeagent")
    return JobStore(
        connect(url, timeout_s=5.0, client_name="nodeagentctl"), JobKeys(prefix, job)
    ), config


def _by() -> str:
    return f"{getpass.getuser()}@{socket.gethostname().split('.')[0]}"


def _print_status(doc: dict[str, Any]) -> None:
    print(
        f"job {doc['job']}: {doc['state']} ({doc['reason']})  generation {doc['generation']}  "
        f"world {doc['world_size']}  target {doc['target_nodes']} "
        f"[{doc['min_nodes']}-{doc['max_nodes']}]  restarts {doc['restart_count']}/"
        f"{doc['max_restarts']}  leader {doc['leader'] or '-'}"
    )
    if doc["detail"]:
        print(f"  {doc['detail']}")
    if doc["record_error"]:
        print(f"  WARNING: {doc['record_error']}")
    print(
        f"{'NODE':<20} {'STATE':<10} {'RANK':>4} {'GEN':>4} {'HB AGE':>7}  {'ADDRESS':<16} WORKERS"
    )
    for node in doc["nodes"]:
        rank = "-" if node["group_rank"] is None else node["group_rank"]
        age = "-" if node["heartbeat_age_s"] is None else f"{node['heartbeat_age_s']:.1f}s"
        workers = " ".join(f"{w['rank']}:{w['state']}" for w in node["workers"]) or "-"
        print(
            f"{node['name']:<20} {node['state']:<10} {rank!s:>4} {node['generation']!s:>4} "
            f"{age:>7}  {node['address'] or '-':<16} {workers}"
        )
        if node["cordon"]:
            print(f"{'':<20} cordoned: {node['cordon']['reason']} (by {node['cordon']['by']})")
        if node["unfit"]:
            print(f"{'':<20} cannot take part: {node['unfit']}")


def _format_event(event: Event) -> str:
    at = datetime.fromtimestamp((event.at_ms or 0) / 1000, tz=timezone.utc)
    gen = f"gen={event.generation}" if event.generation is not None else "gen=-"
    node = f"node={event.node}" if event.node else ""
    stamp = at.isoformat(timespec="milliseconds")
    return f"{stamp} {gen} {event.type} {node} {event.message}".rstrip()


def _event_json(event: Event) -> str:
    return json.dumps(
        {
            "id": event.id,
            "at_ms": event.at_ms,
            "type": event.type,
            "generation": event.generation,
            "node": event.node,
            "message": event.message,
            "data": dict(event.data),
        }
    )


def _events(store: JobStore, args: argparse.Namespace) -> int:
    show = _event_json if args.json else _format_event
    last = store.events_tail(args.last) if args.last > 0 else []
    for event in last:
        print(show(event), flush=True)
    cursor = last[-1].id if last else store.last_event_id()
    while args.follow:
        for _, entry_id, fields in store.wait_events({store.keys.events: cursor or "0-0"}, 2000):
            cursor = entry_id
            print(show(store.parse_event(entry_id, fields)), flush=True)
    return 0


def _scale(store: JobStore, config: Config | None, args: argparse.Namespace) -> int:
    record = store.snapshot().record
    if record is not None:
        low, high, before = record.min_nodes, record.max_nodes, record.target_nodes
    elif config is not None:
        low, high, before = config.job.min_nodes, config.job.max_nodes, config.job.target_nodes
    else:
        raise UsageError(
            f"job {store.keys.job} has not formed yet and no --config gives its "
            "bounds; start its agents or pass --config"
        )
    if not low <= args.nodes <= high:
        raise UsageError(
            f"cannot scale job {store.keys.job} to {args.nodes}: the target must be "
            f"within [min_nodes, max_nodes] = [{low}, {high}]"
        )
    timeout = parse_duration(args.timeout, "--timeout")
    store.send_command(Command(CommandType.SCALE, target=args.nodes, by=_by()))
    print(f"job {store.keys.job}: target {before} -> {args.nodes} requested")
    if not args.wait:
        return 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = store.snapshot().record
        if (
            record is not None
            and record.state is JobState.RUNNING
            and record.target_nodes == args.nodes
            and len(record.members) == args.nodes
        ):
            print(
                f"job {store.keys.job} runs on {args.nodes} nodes (generation {record.generation})"
            )
            return 0
        time.sleep(0.2)
    print(
        f"timed out after {args.timeout}: job {store.keys.job} does not run on {args.nodes} nodes",
        file=sys.stderr,
    )
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
    if not args.wait:
        return 0
    deadline = time.monotonic() + parse_duration(args.timeout, "--timeout")
    while time.monotonic() < deadline:
        nodes = {n["name"]: n for n in status_document(store.snapshot(), store.keys.job)["nodes"]}
        node = nodes.get(args.node)
        if node is None or (
            node["state"] in ("cordoned", "lost")
            and not any(w["state"] in ("running", "stopping") for w in node["workers"])
        ):
            print(f"node {args.node}: workers stopped, out of the job")
            return 0
        time.sleep(0.2)
    print(f"timed out after {args.timeout}: node {args.node} still has workers", file=sys.stderr)
    return 1


def _health(store: JobStore, config: Config | None, args: argparse.Namespace) -> int:
    name = args.node or (config.node.name if config else None)
    if name is None:
        raise UsageError("give --node NAME, or --config of the node")
    nodes = {n["name"]: n for n in status_document(store.snapshot(), store.keys.job)["nodes"]}
    if name not in nodes:
        raise UsageError(f"node {name} is not in job {store.keys.job} (no live lease)")
    node = nodes[name]
    if args.json:
        print(
            json.dumps(
                {
                    "node": name,
                    "cordon": node["cordon"],
                    "unfit": node["unfit"],
                    "gpu": node["gpu"],
                },
                indent=2,
            )
        )
        return 0
    gpu = node["gpu"] or {"available": False, "reason": "not reported", "gpus": []}
    if not gpu["available"]:
        print(f"node {name}: GPU monitoring unavailable ({gpu['reason']})")
    for g in gpu["gpus"]:
        temp = f"{g['temperature_c']:.0f}C" if g["temperature_c"] is not None else "-"
        print(f"GPU {g['index']}: {g['health']:<9} {temp:>5}  {g['action']:<15} {g['reason']}")
    if node["cordon"]:
        print(f"node {name} is cordoned: {node['cordon']['reason']} (by {node['cordon']['by']})")
    if node["unfit"]:
        print(f"node {name} cannot take part: {node['unfit']}")
    return 0


def dispatch(args: argparse.Namespace) -> int:
    store, config = _store(args)
    if args.command == "status":
        doc = status_document(store.snapshot(), store.keys.job)
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            _print_status(doc)
        return 0
    if args.command == "scale":
        return _scale(store, config, args)
    if args.command == "events":
        return _events(store, args)
    if args.command == "cordon":
        store.cordon(args.node, Cordon(reason=args.reason, by=_by()))
        print(f"node {args.node}: cordoned ({args.reason})")
        return 0
    if args.command == "drain":
        return _drain(store, args)
    if args.command == "uncordon":
        lifted = store.uncordon(args.node, by=_by())
        print(f"node {args.node}: " + ("uncordoned" if lifted else "was not cordoned"))
        return 0
    if args.command == "health":
        return _health(store, config, args)
    return _command(store, CommandType(args.command))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return dispatch(args)
    except ConfigError as exc:
        print(f"nodeagentctl: invalid configuration: {exc}", file=sys.stderr)
        return EX_CONFIG
    except UsageError as exc:
        print(f"nodeagentctl: {exc}", file=sys.stderr)
        return EX_USAGE
    except CoordinationError as exc:
        print(f"nodeagentctl: cannot reach Redis: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
