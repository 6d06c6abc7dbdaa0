"""Redis failures as nodeagent's errors, for every store of coord/."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

from nodeagent.errors import CoordinationError, CorruptStateError, FencedError


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    try:
        yield
    except redis.ResponseError as exc:
        if str(exc).startswith("FENCED"):
            raise FencedError(f"{what}: {exc}") from exc
        if str(exc).startswith("WRONGTYPE"):
            raise CorruptStateError(
                f"{what}: a key of the job holds the wrong type of value (garbage; the job's "
                f"leader deletes it): {exc}"
            ) from exc
        raise CoordinationError(f"{what}: Redis answered {exc}") from exc
    except redis.RedisError as exc:
        raise CoordinationError(f"{what}: {type(exc).__name__}: {exc}") from exc
    except UnicodeDecodeError as exc:  # a client that decodes strictly read a non-UTF-8 value
        raise CorruptStateError(f"{what}: Redis holds a value that is not UTF-8: {exc}") from exc
