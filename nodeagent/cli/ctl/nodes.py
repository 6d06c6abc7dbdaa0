"""nodeagentctl nodes: the pool's nodes, the job each serves, health, cordon, labels (and with
--json, each agent's version)."""

from __future__ import annotations

import argparse
import json

from nodeagent.cli.ctl.targets import Target
from nodeagent.views import nodes as views
from nodeagent.views.documents import listing

HELP = "the pool's nodes: job, health, cordon, labels"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")


def run(target: Target, args: argparse.Namespace) -> int:
    store, as_json = target.pool_store, args.json
    rows = views.nodes(store)
    if as_json:
        print(json.dumps(listing("nodes", store.keys.pool, rows), indent=2))
        return 0
    print(f"{'NODE':<20} {'JOB':<24} {'HEALTH':<10} {'HB AGE':>7}  {'CORDON':<12} LABELS")
    for r in rows:
        labels = ",".join(f"{k}={v}" for k, v in sorted(r["labels"].items())) or "-"
        age = "-" if r["heartbeat_age_s"] is None else f"{r['heartbeat_age_s']:.1f}s"
        health = r["health"] if len(r["health"]) <= 10 else r["health"][:9] + "~"
        job = f"{r['job']} (pulling)" if r["job"] and r["pulling"] else r["job"] or "(free)"
        print(f"{r['name']:<20} {job:<24} {health:<10} {age:>7}  {r['cordon'] or '-':<12} {labels}")
    return 0
