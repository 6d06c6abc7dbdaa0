"""nodeagentctl ui: a one-time link that signs your browser in to the pool's web UI
(docs/ui.md), as Jupyter's token link does.

    nodeagentctl ui [--url https://login1:8443] [--lifetime 8h]

It mints an API token for you as `nodeagentctl token` does (your own MUNGE credential) and
prints `URL/ui/signin#TOKEN`. The token rides in the fragment, which a browser never sends to a
server nor puts in a Referer; the sign-in page posts it once (POST /v1/session), the pool takes
it for one sign-in only, and the session is a cookie the page's scripts cannot read. The
session lasts as long as the token; signing out revokes it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from urllib.parse import urlsplit

from nodeagent.cli.ctl import argtypes, token
from nodeagent.cli.ctl.targets import Target
from nodeagent.errors import UsageError
from nodeagent.model.credential import Munge
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
    return Verb.TOKEN, {"action": "mint", "lifetime_s": round(args.lifetime)}


def run(target: Target, args: argparse.Namespace) -> int:
    """Only a signed request mints a token."""
    raise UsageError(
        f"pool {target.pool_store.keys.pool} takes no signed requests (pool.auth: none), "
        "so no tokens and no UI sign-in: whoever can write its Redis keys acts as anyone"
    )


def received(munge: Munge, reply: Reply, url: str) -> int:
    """Print the link (stdout: the link alone)."""
    minted = token.unseal(munge, reply)
    print(f"{reply.message}: open the link once, in your browser", file=sys.stderr)
    print(f"{url}/ui/signin#{minted}", flush=True)
    return 0
