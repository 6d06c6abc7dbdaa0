"""nodeagentctl show JOB (scontrol show job): a pool job's spec, times, nodes per generation,
exit code, restarts by cause, and where its time went (model/goodput.py: the effective training
time ratio and the wall time cut into productive training, checkpoint stalls, re-training,
re-forms and waiting). `--json` documents carry `"version": 1`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from nodeagent.cli.ctl import argtypes
from nodeagent.cli.ctl.targets import Target
from nodeagent.config.values import format_duration
from nodeagent.views import show as views

HELP = "a pool job in full: command, user, times, nodes per generation, exit code"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="JOB", type=argtypes.name)
    parser.add_argument("--json", action="store_true")


def run(target: Target, args: argparse.Namespace) -> int:
    doc = views.show(target.pool_store, target.prefix, args.job_id)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_show(doc)
    return 0


SHOWN = (
    ("job", "job"),
    ("state", "state"),
    ("reason", "reason"),
    ("user", "user"),
    ("submitted_by", "submitted by"),
    ("queue", "queue"),
    ("priority", "priority"),
    ("command", "command"),
    ("working_dir", "working dir"),
    ("time_limit", "time limit"),
    ("held_by", "held by"),
    ("dependency", "dependency"),
    ("submitted", "submitted"),
    ("started", "started"),
    ("ended", "ended"),
    ("elapsed_s", "elapsed"),
    ("placed", "nodes now"),
    ("nodes", "nodes (most)"),
    ("node_hours", "node-hours"),
    ("exit_code", "exit code"),
    ("restarts", "restarts"),
    ("restarts_by_cause", "restarts by cause"),
    ("detail", "detail"),
)


def _print_show(doc: dict[str, Any]) -> None:
    for key, label in SHOWN:
        value = doc.get(key)
        if value in (None, "", {}, []):
            continue
        if key == "elapsed_s":
            value = format_duration(value)
        elif key == "command":
            value = " ".join(value)
        elif key == "placed":
            value = ", ".join(value)
        elif key == "restarts_by_cause":
            value = ", ".join(f"{cause} {n}" for cause, n in sorted(value.items()))
        print(f"{label + ':':<19} {value}")
    if doc.get("goodput"):
        print_goodput(doc["goodput"])
    if doc["generations"]:
        print(f"{'GENERATION':>10}  {'STARTED':<25} {'REASON':<14} NODES")
    for g in doc["generations"]:
        more = f" and {g['more_nodes']} more" if g["more_nodes"] else ""
        print(
            f"{g['generation']:>10}  {g['started']:<25} {g['reason'] or '-':<14} "
            f"{', '.join(g['nodes'])}{more}"
        )


LABELS = {
    "productive": "productive",
    "queued": "queued (pending, held)",
    "checkpoint_stalls": "checkpoint stalls",
    "retrained": "re-training lost steps",
    "slow_ranks": "slow ranks",
    "first_start": "first start",
    "detection": "detection",
    "reforming": "re-forming",
    "startup_restore": "start-up and restore",
    "waiting": "waiting for nodes",
    "ending": "ending",
}


def print_goodput(data: dict[str, Any]) -> None:
    """Where the time went: the ETTR, each part of the wall time, each re-form."""
    wall, ettr = data["wall_s"], data["ettr"]
    ratio = f"{100 * ettr:.1f} %" if ettr is not None else "-"
    print(f"{'goodput:':<19} ETTR {ratio} of {format_duration(wall)}", end="")
    print(f", {data['steps_lost']} steps lost" if data["steps_lost"] else "")
    for key, label in LABELS.items():
        seconds = data["parts"].get(key, 0.0)
        if seconds > 0:
            share = 100 * seconds / wall if wall > 0 else 0.0
            print(f"  {label + ':':<24} {seconds:>9.1f} s {share:5.1f} %")
    for r in data["reforms"]:
        lost = r["steps_lost"] if r["steps_lost"] is not None else "?"
        print(
            f"  generation {r['generation']} ({r['reason'] or '-'}): detection "
            f"{r['detection_s']:.1f} s, re-forming {r['reforming_s']:.1f} s, start-up and "
            f"restore {r['startup_restore_s']:.1f} s, {lost} steps lost "
            f"({r['retrained_s']:.1f} s)"
        )
    print(f"  {'rank-hours trained:':<24} {data['rank_hours']:>9.3f}", end="")
    short = data.get("short_rank_hours", 0.0)
    print(f"  (short of the target world: {short:.3f})" if short else "")
    if data["unaccounted"]:
        gens = ", ".join(str(g) for g in data["unaccounted"])
        print(f"  (rank 0 said nothing of its training in generation {gens}: counted productive)")
