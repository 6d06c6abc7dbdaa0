"""nodeagentctl nodes: the pool's nodes, the job each serves, health, its GPUs held and
offered, its memory for jobs, cordon, labels (with --gpus, each GPU unit and the job holding
it; with --json, everything, each agent's version too)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from nodeagent.cli.ctl.targets import Target
from nodeagent.config.values import size_text
from nodeagent.views import nodes as views
from nodeagent.views.documents import listing

HELP = "the pool's nodes: job, health, GPUs, cordon, labels"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--gpus", action="store_true", help="a row per GPU unit: its model, memory and holder"
    )


def run(target: Target, args: argparse.Namespace) -> int:
    store, as_json = target.pool_store, args.json
    rows = views.nodes(store)
    if as_json:
        print(json.dumps(listing("nodes", store.keys.pool, rows), indent=2))
        return 0
    if args.gpus:
        return _units(rows)
    print(
        f"{'NODE':<20} {'JOB':<24} {'HEALTH':<10} {'GPUS':>5} {'MEMORY':>9} {'HB AGE':>7}  "
        f"{'CORDON':<12} LABELS"
    )
    for r in rows:
        labels = ",".join(f"{k}={v}" for k, v in sorted(r["labels"].items())) or "-"
        age = "-" if r["heartbeat_age_s"] is None else f"{r['heartbeat_age_s']:.1f}s"
        health = r["health"] if len(r["health"]) <= 10 else r["health"][:9] + "~"
        job = f"{r['job']} (pulling)" if r["job"] and r["pulling"] else r["job"] or "(free)"
        if r["shares"]:
            shared = ",".join(sorted(r["shares"]))
            job = shared if len(shared) <= 24 else f"{len(r['shares'])} jobs (shared)"
        gpus = r["gpus"]
        used = f"{sum(1 for u in gpus if u['job'])}/{len(gpus)}" if gpus else "-"
        cordon = r["cordon"] or "-"
        memory = "-" if r["memory"] is None else size_text(r["memory"])
        print(
            f"{r['name']:<20} {job:<24} {health:<10} {used:>5} {memory:>9} {age:>7}  "
            f"{cordon:<12} {labels}"
        )
    return 0


def _units(rows: list[dict[str, Any]]) -> int:
    print(f"{'NODE':<20} {'GPU':<44} {'MODEL':<28} {'MEMORY':>9}  JOB")
    for r in rows:
        for unit in r["gpus"]:
            mib = unit["memory_mib"]
            memory = "-" if mib is None else f"{mib / 1024:.0f} GiB"
            model, holder = unit["model"] or "-", unit["job"] or "(free)"
            print(f"{r['name']:<20} {unit['uuid']:<44} {model:<28} {memory:>9}  {holder}")
    return 0
