"""How nodeagentctl prints a job's status, its events and a node's GPU health."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from nodeagent.model.job import Event
from nodeagent.views.documents import JSON_VERSION, decode, event_doc


def print_status(doc: dict[str, Any]) -> None:
    print(
        f"job {doc['job']}: {doc['state']} ({doc['reason']})  generation {doc['generation']}  "
        f"world {doc['world_size']}  target {doc['target_nodes']} "
        f"[{doc['min_nodes']}-{doc['max_nodes']}]  restarts {doc['restart_count']}/"
        f"{doc['max_restarts']}  leader {doc['leader'] or '-'}"
    )
    if doc["detail"]:
        print(f"  {doc['detail']}")
    pooled = doc.get("pool")
    if pooled is not None:
        print(f"  pool {pooled['pool']}: {pooled['state']} ({pooled['reason']})")
    if doc["record_error"]:
        print(f"  WARNING: {doc['record_error']}")
    tiers = doc.get("checkpoints")
    if tiers:
        print(
            f"  checkpoints: memory step {_step(tiers['memory'])} (every rank), persistent step "
            f"{_step(tiers['persisted'])}; this generation restores from "
            f"{' > '.join(tiers['restore']) or '-'}"
            + (f"; never again: {', '.join(map(str, tiers['bad']))}" if tiers["bad"] else "")
        )
        if tiers.get("replicas"):
            short = tiers["under_replicated"]
            print(
                f"  replicas: {tiers['replicas']}, committed step {_step(tiers['committed'])}"
                + (
                    f"; UNDER-REPLICATED: ranks {', '.join(map(str, short))} on fewer than "
                    f"{tiers['replicas'] + 1} nodes"
                    if short
                    else ""
                )
            )
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
        if node.get("slow"):
            slow = node["slow"]
            print(
                f"{'':<20} SLOW ({slow['ratio']:.2f}x its peers): {slow['why']}; {slow['action']}"
            )


def _step(step: int | None) -> str:
    return "-" if step is None else str(step)


def _stamp(event: Event) -> str:
    try:
        at = datetime.fromtimestamp((event.at_ms or 0) / 1000, tz=timezone.utc)
        return at.isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):  # a stream ID far out of range
        return str(event.id)


def event_line(entry_id: str, fields: Mapping[str, str]) -> str:
    """One line for people: time, generation, type, node, message."""
    event, raw = decode(entry_id, fields)
    gen = f"gen={event.generation}" if event.generation is not None else "gen=-"
    node = f"node={event.node}" if event.node else ""
    message = f"{event.message}: {raw[:200]}" if raw is not None else event.message
    return f"{_stamp(event)} {gen} {event.type} {node} {message}".rstrip()


def event_json(entry_id: str, fields: Mapping[str, str]) -> str:
    """One JSON object per event (views/documents.event_doc)."""
    return json.dumps(event_doc(entry_id, fields), default=str)


def print_health(name: str, node: dict[str, Any], as_json: bool) -> None:
    """One node of the status document: its cordon, why it is unfit, its GPU verdicts."""
    if as_json:
        print(
            json.dumps(
                {
                    "version": JSON_VERSION,
                    "node": name,
                    "cordon": node["cordon"],
                    "unfit": node["unfit"],
                    "gpu": node["gpu"],
                },
                indent=2,
            )
        )
        return
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
