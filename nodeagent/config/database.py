"""Where accounting records go (pool.accounting.database, `nodeagentctl history --accounting`):
a PostgreSQL URL, a SQLite file, or none (docs/accounting.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from nodeagent.errors import ConfigError

DEFAULT_FILE = "accounting.sqlite"  # in the agent's state directory, when no database is named
EXPECTED = (
    "expected postgresql://USER@HOST[:PORT]/DATABASE (a cluster), sqlite:///ABSOLUTE/PATH "
    "(one host), or none"
)


@dataclass(frozen=True)
class Database:
    """A database named: `kind` postgresql (`where`: its URL, for libpq) or sqlite (`where`:
    the file's absolute path)."""

    kind: str
    where: str

    def __str__(self) -> str:
        """As a log may say it: PostgreSQL's host and database, never a password."""
        if self.kind == "sqlite":
            return f"sqlite:///{self.where.lstrip('/')}"
        parts = urlsplit(self.where)
        port = f":{parts.port}" if parts.port else ""
        return f"postgresql://{parts.hostname or 'localhost'}{port}{parts.path}"


def database_of(url: str, key: str) -> Database | None:
    """The database `url` names; None for "none", and for "" (the default: the caller knows
    its state directory, `default_database`).

    Raises:
        ConfigError: `url` (read from `key`) is none of those.
    """
    if url in ("", "none"):
        return None
    parts = urlsplit(url)
    if "\0" in url or "\n" in url:
        raise ConfigError(key, f"{EXPECTED}; got a URL with a control character")
    if parts.scheme in ("postgresql", "postgres") and parts.path not in ("", "/"):
        return Database("postgresql", url)
    if parts.scheme == "sqlite" and not parts.netloc and parts.path.startswith("/"):
        # sqlite:///var/x and sqlite:////var/x (SQLAlchemy's absolute form) both name /var/x:
        # "//var/x" would be a path a file: URI takes for a host (its readers refused it).
        # A '?' or '#' in the file's name is written %3F or %23, as in any URL.
        return Database("sqlite", "/" + unquote(parts.path).lstrip("/"))
    raise ConfigError(key, f"{EXPECTED}; got {url!r}")


def default_database(url: str, state_dir: Path | None, key: str) -> Database | None:
    """pool.accounting.database as the agent keeps it: the one named, else the default file
    in `state_dir` (None: no state directory, so no records), else none.

    Raises:
        ConfigError: as database_of.
    """
    if url == "" and state_dir is not None:
        return Database("sqlite", str(state_dir / DEFAULT_FILE))
    return database_of(url, key)
