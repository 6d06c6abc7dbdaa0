"""What kind of Redis failure lies behind a CoordinationError, for messages and exit codes.

A client that cannot connect, one whose credentials are refused and one whose command Redis
answered with an error (a key of the wrong type, a fenced write) need different words: only the
first is "cannot reach Redis". The callers (cli/) must not import redis, so the classification
of redis-py's exceptions lives here, next to the code that raises them.
"""

from __future__ import annotations

from enum import Enum

import redis

REFUSED_PREFIXES = ("WRONGPASS", "NOAUTH")  # Redis' replies when it refuses the credentials
# No connection, or a Redis Cluster's passing states as redis-py raises them once its own
# retries are spent. (A MOVED or ASK that gets out is an answer: from a plain client, it says
# where the key lives.)
UNREACHABLE_ERRORS = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterDownError,  # also MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,  # no RedisError: found in a cause chain
)


class RedisFailure(str, Enum):
    """Why a Redis call failed.

    UNREACHABLE: no connection, or it broke or timed out: retrying later may succeed. So is a
        Redis Cluster that is down (CLUSTERDOWN, as during a failover), asks to try again
        (TRYAGAIN, during a slot migration), or has no node serving the key's slot.
    CREDENTIALS: Redis refused the password (or the user name), or wants one and got none.
    PERMISSION: the user is authenticated but its ACL forbids a command or key (NOPERM).
    ANSWER: Redis answered the command with an error (WRONGTYPE, a script error, FENCED).
    OTHER: not a redis-py error at all.
    """

    UNREACHABLE = "unreachable"
    CREDENTIALS = "credentials"
    PERMISSION = "permission"
    ANSWER = "answer"
    OTHER = "other"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def classify(exc: BaseException) -> RedisFailure:
    """The kind of the first redis-py error in `exc`'s cause chain (`raise ... from`)."""
    for cause in _chain(exc):
        # Order matters: AuthenticationError is a ConnectionError, NoPermissionError and
        # AuthenticationWrongNumberOfArgsError are ResponseErrors.
        if isinstance(
            cause, redis.AuthenticationError | redis.AuthenticationWrongNumberOfArgsError
        ):
            return RedisFailure.CREDENTIALS
        if isinstance(cause, redis.ResponseError) and str(cause).startswith(REFUSED_PREFIXES):
            return RedisFailure.CREDENTIALS  # as a reply to a command rather than to AUTH
        if isinstance(cause, redis.exceptions.NoPermissionError):
            return RedisFailure.PERMISSION
        if isinstance(cause, UNREACHABLE_ERRORS):
            return RedisFailure.UNREACHABLE
        if isinstance(cause, redis.RedisError):
            return RedisFailure.ANSWER
    return RedisFailure.OTHER
