"""The job (or pool) nodeagentctl acts on, and how it reaches it: the Redis URL (--redis, else
--config's, else NODEAGENT_REDIS_URL, else nodeagentctl's own file: rc.py), its password
(--redis-password-file, else the URL's, else NODEAGENT_REDIS_PASSWORD), the key prefix, the pool
and the job, every one checked before anything is sent.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from nodeagent.cli.ctl import argtypes
from nodeagent.config import redisurl
from nodeagent.config.load import read_settings
from nodeagent.config.settings import EMBEDDED, NodeSettings
from nodeagent.coord.client import Redis, connect
from nodeagent.coord.durable import NotAcknowledged, published
from nodeagent.coord.embedded import embedded_url
from nodeagent.coord.keys import JobKeys, PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError, UsageError
from nodeagent.model.request import new_request_id
from nodeagent.supervisor.munge import DEFAULT_SOCKET

URL_ENV = "NODEAGENT_REDIS_URL"


def _password(args: argparse.Namespace, url: str, environ: Mapping[str, str]) -> str | None:
    """The password to use: --redis-password-file, else the URL's, else the environment's."""
    in_url = argtypes.url_password(url)
    if args.redis_password_file is not None:
        if in_url is not None:
            raise UsageError(
                "the Redis password is given twice (in the URL and --redis-password-file); "
                "drop it from the URL"
            )
        return argtypes.read_password_file(args.redis_password_file)
    if in_url is not None:
        return None  # the URL carries it already
    return environ.get(argtypes.PASSWORD_ENV) or None


@dataclass(frozen=True)
class Target:
    """The job (or pool) nodeagentctl acts on, and how it reaches it."""

    client: Redis
    config: NodeSettings | None
    prefix: str
    pool: str
    job: str | None
    password_given: bool  # from a file, the URL or the environment
    request_id: str = ""  # this change's: the same for every try of it (model/request.py)

    @property
    def store(self) -> JobStore:
        return JobStore(self.client, JobKeys(self.prefix, required(self.job)))

    @property
    def pool_store(self) -> PoolStore:
        return PoolStore(self.client, PoolKeys(self.prefix, self.pool))

    def confirm(self, what: str) -> None:
        """Every write of this command is on the replicas the pool's durability asks for, as
        its leader published it (coord/durable.py): before the command says "done".

        Raises:
            NotAcknowledged: it is not (exit 69, naming this change's request id).
        """
        keys = PoolKeys(self.prefix, self.pool)
        try:
            published(self.client, keys.durability).confirm(self.client, keys.acks, what)
        except NotAcknowledged as exc:
            again = f"; run it again with --request-id {self.request_id}" if self.request_id else ""
            raise NotAcknowledged(f"{exc}{again}") from None


def target(args: argparse.Namespace, environ: Mapping[str, str]) -> Target:
    """Connect to the job's Redis (lazily: nothing is sent yet), with every argument checked.

    Raises:
        UsageError: a bad --redis URL, a missing job, an unreadable password file.
        ConfigError: the --config file, or its redis.url, is invalid.
    """
    config = read_settings(args.config) if args.config else None
    url = args.redis or (config.redis.url if config else None) or environ.get(URL_ENV) or None
    if url == EMBEDDED and config is not None and config.job is not None:
        url = embedded_url(config.job.id)
    job = args.job or (config.job.id if config and config.job else None)
    if args.redis is not None and not args.redis:
        raise UsageError("--redis: empty; give a URL such as redis://10.0.0.2:6379/0")
    if not url:
        raise UsageError(
            f"give --config PATH, or --redis URL (or set {URL_ENV}), and the job for a job's "
            "commands"
        )
    problem = redisurl.problem(url)
    origin = getattr(args, "redis_origin", "--redis")
    if problem and (args.redis or not config):
        raise UsageError(f"{origin if args.redis else URL_ENV}: {problem}")
    if problem:
        raise ConfigError("redis.url", f"{problem} (in {args.config})")
    password = _password(args, url, environ)
    password_given = password is not None or argtypes.url_password(url) is not None
    if password is not None:
        url = redisurl.with_password(url, password)
    prefix = args.key_prefix or (config.redis.key_prefix if config else "nodeagent")
    pool = args.pool or (config.pool.name if config else "default")
    try:
        client = connect(url, timeout_s=5.0, client_name="nodeagentctl")
    except (ValueError, ConfigError) as exc:
        origin = origin if args.redis else f"redis.url in {args.config}" if config else URL_ENV
        raise UsageError(f"{origin}: {redisurl.redact(url)}: {exc}") from None
    rid = getattr(args, "request_id", None) or new_request_id()
    return Target(client, config, prefix, pool, job, password_given, rid)


NO_JOB = "give --config PATH of a node with a job: section, or --job ID"


def required(job: str | None) -> str:
    """The job a job's own verb acts on (--job, --config). Raises: UsageError where none."""
    if job is None:
        raise UsageError(NO_JOB)
    return job


def munge_socket(target: Target, args: argparse.Namespace) -> str:
    """munged's socket: --munge-socket, else --config's pool.munge_socket, else the default."""
    if args.munge_socket:
        return str(args.munge_socket)
    return target.config.pool.munge_socket if target.config is not None else DEFAULT_SOCKET
