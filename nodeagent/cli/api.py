"""`nodeagent api`: the HTTP API service (nodeagent/api/, docs/api.md), run by systemd as
nodeagent-api.service on a login or head host.

    nodeagent api [--config /etc/nodeagent/api.yaml]
    nodeagent api --openapi          the OpenAPI document (docs/openapi.json), then exit

Exit codes: 0 after SIGTERM, 78 for a configuration error (an invalid file, Redis refusing
the credentials, a socket that cannot be made), as the agent's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

from nodeagent.config.api import read_api
from nodeagent.config.settings import EX_CONFIG
from nodeagent.errors import ConfigError

DEFAULT_CONFIG = "/etc/nodeagent/api.yaml"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    api = commands.add_parser(
        "api", help="the HTTP API service (docs/api.md; systemd: nodeagent-api.service)"
    )
    api.add_argument("--config", default=DEFAULT_CONFIG, help=f"default {DEFAULT_CONFIG}")
    api.add_argument("--openapi", action="store_true", help="print the OpenAPI document")


def run(args: argparse.Namespace) -> int:
    # FastAPI and uvicorn are the API host's (the `api` extra), not every node's: imported here
    from nodeagent.api.app import openapi_document

    if args.openapi:
        print(json.dumps(openapi_document(), indent=2, sort_keys=True))
        return 0
    from nodeagent.api.server import listening, serve
    from nodeagent.api.service import Service
    from nodeagent.coord.client import check_credentials, connect
    from nodeagent.errors import CoordinationError
    from nodeagent.runtime import tuning
    from nodeagent.supervisor.libmunge import munge_at
    from nodeagent.telemetry.sdnotify import Notifier

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    tuning.tune()  # its reads made in worker threads hold the event loop's GIL 1 ms at most
    try:
        settings = read_api(args.config)
        client = connect(settings.redis_url, 5.0, client_name="nodeagent-api")
        check_credentials(client)
        sockets = listening(settings)
        service = Service(settings, client, munge_at(settings.munge_socket))
    except ConfigError as exc:
        print(f"nodeagent api: invalid configuration: {exc}", file=sys.stderr)
        return EX_CONFIG
    except CoordinationError as exc:
        print(f"nodeagent api: Redis: {exc}", file=sys.stderr)
        return EX_CONFIG
    except OSError as exc:
        print(f"nodeagent api: cannot listen: {exc}", file=sys.stderr)
        return EX_CONFIG
    where = [settings.socket or "", f"https://{settings.listen}" if settings.listen else ""]
    logging.getLogger("nodeagent.api").info(
        "serving pool %s on %s", settings.pool, " and ".join(w for w in where if w)
    )
    asyncio.run(serve(service, sockets, Notifier.from_environ(os.environ)))
    return 0
