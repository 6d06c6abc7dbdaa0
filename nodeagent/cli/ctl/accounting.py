"""The accounting database `history` and `report` read (docs/accounting.md): --accounting URL,
else --config's pool.accounting (its default: the file in its state_dir, if there), else
$NODEAGENT_ACCOUNTING_URL; none: the pool's own window only. A PostgreSQL password comes
from libpq's own places (~/.pgpass, PGPASSWORD), or the config's password_file when --config
names one its caller can read."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from nodeagent.accounting.databases import open_ledger
from nodeagent.accounting.ledger import Ledger
from nodeagent.cli.ctl.targets import Target
from nodeagent.config.database import database_of, default_database
from nodeagent.config.keyfile import read_password
from nodeagent.config.settings import DEFAULT_STATE_DIR
from nodeagent.errors import ConfigError, UsageError

URL_ENV = "NODEAGENT_ACCOUNTING_URL"


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--accounting",
        metavar="URL",
        help="the accounting database: postgresql://USER@HOST/DB or sqlite:///PATH "
        f"(default: --config's pool.accounting, else ${URL_ENV}; none: the pool's window only)",
    )


def ledger_of(target: Target, args: argparse.Namespace) -> Ledger | None:
    """The database named, opened for reading (None: none named).

    Raises:
        UsageError: a URL that names no database.
    """
    password = None
    try:
        if args.accounting is not None:
            database = database_of(args.accounting, "--accounting")
        elif target.config is not None:
            account = target.config.pool.accounting
            state = Path(target.config.state_dir or DEFAULT_STATE_DIR)
            database = default_database(account.database, state, "pool.accounting.database")
            if database is not None and database.kind == "sqlite" and not account.database:
                database = database if Path(database.where).is_file() else None
            if account.password_file and os.access(account.password_file, os.R_OK):
                password = read_password(account.password_file, "pool.accounting.password_file")
        else:
            database = database_of(os.environ.get(URL_ENV, ""), URL_ENV)
        return None if database is None else open_ledger(database, password, writer=False)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
