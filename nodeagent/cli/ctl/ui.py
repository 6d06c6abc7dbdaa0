"""nodeagentctl ui: a one-time link that signs your browser in to the pool's web UI
(docs/ui.md), as Jupyter's token link does.

    nodeagentctl ui [--url https://login1:8443] [--lifetime 8h]

It asks the pool leader, with your own MUNGE credential, for an API token for you that it keeps
for whoever brings a code made here, once, within ten minutes, and prints `URL/ui/signin#CODE`.
The code rides in the fragment, which a browser never sends to a server nor puts in a Referer;
the sign-in page posts it (POST /v1/session), the API service redeems it for the token, and the
session is a cookie the page's scripts cannot read. The token itself is never in the link. The
session lasts as long as the token; signing out revokes it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import sys
from typing import Any
from urllib.parse import urlsplit

from nodeagent.cli.ctl import argtypes
from nodeagent.cli.ctl.targets import Target
from nodeagent.errors import UsageError
from nodeagent.model.request import Reply, Verb

HELP = "a one-time link that signs your browser in to the web UI (docs/ui.md)"
URL_ENV = "NODEAGENT_API_URL"
DEFAULT_LIFETIME_S = 8 * 3600


def api_url(value: str) -> str:
    """argparse type of --url: the API service's HTTPS address, as a browser reaches it."""
    parts = urlsplit(value.strip())
    if parts.scheme != "https" or not parts.hostname or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(
            f"expected the API service's HTTPS address, such as https://login1:8443, got "
            f"{value!r} (the UI is served only over TLS: docs/api.md)"
        )
    return f"https://{parts.netloc}{parts.path.rstrip('/')}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=api_url,
        default=os.environ.get(URL_ENV),  # a string default is checked by `type` too
        help=f"the API service's address (default: ${URL_ENV})",
    )
    parser.add_argument(
        "--lifetime",
        type=argtypes.duration,
        default=float(DEFAULT_LIFETIME_S),
        help="how long the session lasts (default 8h; at most pool.tokens.max_lifetime)",
    )


def request(
    args: argparse.Namespace, user: str, job: str | None
) -> tuple[Verb, dict[str, Any]] | None:
    if args.url is None:
        raise UsageError(f"ui: the API service's address is needed: --url URL or ${URL_ENV}")
    args.code = secrets.token_urlsafe(32)  # the link's; only its hash goes to the pool
    code_hash = hashlib.sha256(args.code.encode()).hexdigest()
    return Verb.TOKEN, {"action": "mint", "lifetime_s": round(args.lifetime), "signin": code_hash}


def run(target: Target, args: argparse.Namespace) -> int:
    """Only a signed request mints a token."""
    raise UsageError(
        f"pool {target.pool_store.keys.pool} takes no signed requests (pool.auth: none), "
        "so no tokens and no UI sign-in: whoever can write its Redis keys acts as anyone"
    )


def received(reply: Reply, args: argparse.Namespace) -> int:
    """Print the link (stdout: the link alone)."""
    print(f"{reply.message}: open it in your browser", file=sys.stderr)
    print(f"{args.url}/ui/signin#{args.code}", flush=True)
    return 0
