"""nodeagentctl token: an API token for yourself (docs/api.md), as Slurm's `scontrol token`.

    nodeagentctl token [--lifetime 1h]   mint one; only the token goes to stdout
    nodeagentctl token --list [--all]    your tokens not revoked (--all: everyone's)
    nodeagentctl token --revoke ID|all   revoke one of yours (an operator: anyone's), or all yours

Minting is a signed request (pool.auth: munge) of your own MUNGE credential: the pool leader
makes the token with the key only the agents hold, registers it, and hands it back inside a
MUNGE credential only your uid can decode (model/token.py); this decodes it and prints it.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from typing import Any

from nodeagent.cli.ctl import argtypes, caller
from nodeagent.cli.ctl.targets import Target
from nodeagent.coord.tokens import TokenStore
from nodeagent.errors import UsageError
from nodeagent.model.credential import Decoded, Munge
from nodeagent.model.request import Reply, Verb
from nodeagent.model.token import DEFAULT_LIFETIME_S, TokenError, unsealed

STAMP = "%Y-%m-%dT%H:%M:%SZ"
HELP = "mint, list or revoke your API tokens (docs/api.md)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lifetime",
        type=argtypes.duration,
        default=float(DEFAULT_LIFETIME_S),
        help="how long the token is good for (default 1h; at most pool.tokens.max_lifetime)",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="list your tokens not revoked")
    what.add_argument("--revoke", metavar="ID", help="revoke a token by its id, or all of yours")
    parser.add_argument("--all", action="store_true", help="with --list: every user's")


def request(
    args: argparse.Namespace, user: str, job: str | None
) -> tuple[Verb, dict[str, Any]] | None:
    if args.list:
        return None
    if args.revoke is not None:
        return Verb.TOKEN, {"action": "revoke", "id": args.revoke}
    return Verb.TOKEN, {"action": "mint", "lifetime_s": round(args.lifetime)}


def run(target: Target, args: argparse.Namespace) -> int:
    """--list; anything else is a signed request, refused where the pool takes none."""
    if not args.list:
        raise UsageError(
            f"pool {target.pool_store.keys.pool} takes no signed requests (pool.auth: none), "
            "so no tokens: whoever can write its Redis keys acts as anyone"
        )
    me = caller.user()
    now = time.time()
    rows = sorted(TokenStore(target.client, target.pool_store.keys).listing().items())
    print(f"{'ID':<18} {'USER':<16} {'EXPIRES':<21}")
    for token_id, entry in rows:
        if (args.all or entry["user"] == me) and entry["exp"] > now:
            expires = datetime.fromtimestamp(entry["exp"], timezone.utc).strftime(STAMP)
            print(f"{token_id:<18} {entry['user']:<16} {expires:<21}")
    return 0


def received(munge: Munge, reply: Reply) -> int:
    """Print the token a mint's reply hands out (stdout: the token alone)."""
    token = unseal(munge, reply)
    print(reply.message, file=sys.stderr)
    print(token, flush=True)
    return 0


def unseal(munge: Munge, reply: Reply) -> str:
    """The token a mint's reply hands out, from the MUNGE credential only this uid decodes.

    Raises:
        UsageError: not decodable here, not made by an agent, or carrying no token.
    """
    found = munge.decode(reply.sealed)
    if not isinstance(found, Decoded) or not found.status.signed:
        raise UsageError(f"the pool's answer cannot be decoded here ({found}): is this your uid?")
    if found.uid != 0:
        raise UsageError(f"the pool's answer was made by uid {found.uid}, not by an agent (root)")
    try:
        return unsealed(found.payload)
    except TokenError as exc:
        raise UsageError(str(exc)) from None
