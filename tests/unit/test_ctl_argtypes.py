"""nodeagentctl's argument checks and password handling, and how Redis failures are told apart."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.connection import parse_url

from nodeagent.cli.ctl import argtypes
from nodeagent.config import redisurl
from nodeagent.coord.client import parse_sentinel_url
from nodeagent.coord.failure import RedisFailure, classify
from nodeagent.errors import CoordinationError, UsageError

PASSWORDS = ["plain", "with space", "a/b@c:d", "pct%41", "üñí"]


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize(
    "url",
    [
        "redis://10.0.0.2:6379/0",
        "redis://operator@10.0.0.2:6379/3",
        "rediss://h:6380/0?ssl_ca_certs=/etc/ca.pem",
        "unix:///run/redis.sock?db=2",
    ],
)
def test_a_password_survives_the_url_as_redis_py_reads_it(url: str, password: str) -> None:
    with_it = redisurl.with_password(url, password)
    parsed = parse_url(with_it)  # type: ignore[no-untyped-call]
    assert parsed["password"] == password
    assert parsed.get("username") == ("operator" if "operator@" in url else None)
    assert argtypes.url_password(url) is None
    assert argtypes.url_password(with_it) is not None


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_password_survives_a_sentinel_url(password: str) -> None:
    url = redisurl.with_password("redis+sentinel://a:26379,b:26379/mymaster/0", password)
    target = parse_sentinel_url(url)
    assert target.password == password and target.service == "mymaster"


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("redis://:pw@h:6379/0", "pw"),
        ("redis://user:pw@h:6379/0", "pw"),
        ("redis://h:6379/0?password=pw", "pw"),
        ("redis://user@h:6379/0", None),
        ("redis://h:6379/0", None),
    ],
)
def test_url_password(url: str, password: str | None) -> None:
    assert argtypes.url_password(url) == password


@pytest.mark.parametrize(
    ("check", "value", "expected"),
    [
        (argtypes.count, "0", 0),
        (argtypes.count, "12", 12),
        (argtypes.count, "-5", None),
        (argtypes.count, "2.5", None),
        (argtypes.count, "", None),
        (argtypes.duration, "30s", 30.0),
        (argtypes.duration, "500ms", 0.5),
        (argtypes.duration, "abc", None),
        (argtypes.duration, "-5s", None),
        (argtypes.name, "node-1.a_b", "node-1.a_b"),
        (argtypes.name, "", None),
        (argtypes.name, "a b", None),
        (argtypes.name, "a{b}", None),
        (argtypes.name, "x" * 64, None),
    ],
)
def test_argument_types(check: Callable[[str], object], value: str, expected: object) -> None:
    if expected is None:
        with pytest.raises(argparse.ArgumentTypeError):
            check(value)
    else:
        assert check(value) == expected


def test_password_file(tmp_path: Path) -> None:
    good = tmp_path / "pw"
    good.write_text("s3cret\nignored\n")
    assert argtypes.read_password_file(str(good)) == "s3cret"
    crlf = tmp_path / "crlf"
    crlf.write_bytes(b"s3cret\r\n")
    assert argtypes.read_password_file(str(crlf)) == "s3cret"
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(UsageError, match="is empty"):
        argtypes.read_password_file(str(empty))
    with pytest.raises(UsageError, match="cannot read"):
        argtypes.read_password_file(str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="cannot read"):
        argtypes.read_password_file(str(tmp_path))  # a directory


def _wrapped(cause: BaseException) -> CoordinationError:
    try:
        raise CoordinationError(f"status: {cause}") from cause
    except CoordinationError as exc:
        return exc


@pytest.mark.parametrize(
    ("cause", "kind"),
    [
        (redis.AuthenticationError("invalid username-password pair"), RedisFailure.CREDENTIALS),
        (redis.AuthenticationWrongNumberOfArgsError("wrong args"), RedisFailure.CREDENTIALS),
        (
            redis.exceptions.NoPermissionError("no permissions to run 'hset'"),
            RedisFailure.PERMISSION,
        ),
        (redis.ConnectionError("Connection refused"), RedisFailure.UNREACHABLE),
        (redis.TimeoutError("Timeout reading"), RedisFailure.UNREACHABLE),
        (redis.ResponseError("WRONGTYPE Operation against a key"), RedisFailure.ANSWER),
        (ValueError("not redis"), RedisFailure.OTHER),
    ],
)
def test_classify(cause: BaseException, kind: RedisFailure) -> None:
    assert classify(_wrapped(cause)) is kind
    assert classify(CoordinationError("no cause")) is RedisFailure.OTHER
