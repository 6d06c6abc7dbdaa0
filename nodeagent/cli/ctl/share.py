"""nodeagentctl share (sshare): each user's and each queue's shares, decayed usage and
fair-share factor; a job's priority gains weight x its user's factor x its queue's (docs/pool.md,
"Fair share"). `--json` documents carry
`"version": 1`."""

from __future__ import annotations

import argparse
import json

from nodeagent.cli.ctl.targets import Target
from nodeagent.config.values import format_duration
from nodeagent.views import fairshare as views

HELP = "fair share: each user's and queue's shares, decayed usage and factor (sshare)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")


def run(target: Target, args: argparse.Namespace) -> int:
    doc = views.share(target.pool_store)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    if doc["saved"] is None:
        print(f"pool {doc['pool']}: no fair share (pool.fair_share.weight is 0, or no round yet)")
        return 0
    state = "on" if doc["on"] else "off (weight 0)"
    half_life = format_duration(doc["half_life_s"])
    print(f"fair share {state}: weight {doc['weight']:g}, half-life {half_life}")
    for level in ("user", "queue"):
        print(
            f"{level.upper():<16} {'SHARES':>7} {'SHARE':>7} {'USAGE-NODE-H':>13} {'USAGE':>7} "
            f"{'FACTOR':>7}"
        )
        for r in doc[f"{level}s"]:
            print(
                f"{r[level]:<16} {r['shares']:>7g} {100 * r['share']:>6.1f}% "
                f"{r['usage_node_hours']:>13.2f} {100 * r['usage']:>6.1f}% {r['factor']:>7.3f}"
            )
    print(f"a job's priority gains {doc['weight']:g} x its user's factor x its queue's")
    return 0
