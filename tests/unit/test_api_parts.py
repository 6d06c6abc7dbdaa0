"""The API service's small parts, pure: a read kept for every caller, stale ones made again in
the background (api/cache.py), the rate per user (api/limits.RateLimiter), the config file
(config/api.py)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from nodeagent.api.cache import STALE_READS, Fresh
from nodeagent.api.limits import RateLimiter
from nodeagent.api.server import unix_socket
from nodeagent.config.api import load_api
from nodeagent.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_read_is_made_once_for_everyone_within_its_time_then_again() -> None:
    clock, made = Clock(), []
    fresh = Fresh(0.5, clock)

    def read() -> bytes:
        made.append(round(clock.now, 1))
        return f"at {clock.now:.1f}".encode()

    assert fresh.get("/v1/nodes?", read) == b"at 100.0"
    clock.now += 0.4
    assert fresh.get("/v1/nodes?", read) == b"at 100.0" and made == [100.0]
    assert fresh.peek("/v1/nodes?") == b"at 100.0"
    clock.now += 0.2
    assert fresh.peek("/v1/nodes?") is None  # stale, nobody reading: read again
    assert fresh.get("/v1/nodes?", read) == b"at 100.6" and len(made) == 2
    assert fresh.get("/v1/queues?", read) == b"at 100.6" and len(made) == 3  # its own key


def test_callers_wait_for_the_one_read_and_share_its_error() -> None:
    started, release = threading.Event(), threading.Event()
    fresh, calls = Fresh(0.5), []

    def slow() -> bytes:
        calls.append(1)
        started.set()
        release.wait(10)
        raise ConnectionError("Redis away")

    errors: list[BaseException] = []

    def ask() -> None:
        try:
            fresh.get("k", slow)
        except ConnectionError as exc:
            errors.append(exc)

    first = threading.Thread(target=ask)
    first.start()
    started.wait(10)
    others = [threading.Thread(target=ask) for _ in range(5)]
    for thread in others:
        thread.start()
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert len(calls) == 1 and len(errors) == 6  # one read, its error for all six
    assert fresh.peek("k") is None  # an error is not kept


def test_while_a_kept_read_is_read_again_the_others_get_the_last_answer() -> None:
    clock = Clock()
    fresh = Fresh(0.5, clock)
    fresh.get("k", lambda: b"old")
    clock.now += 1
    inside = threading.Event()
    done = threading.Event()

    def again() -> bytes:
        inside.set()
        done.wait(10)
        return b"new"

    reader = threading.Thread(target=lambda: fresh.get("k", again))
    reader.start()
    inside.wait(10)
    assert fresh.peek("k") == b"old" and fresh.get("k", lambda: b"never") == b"old"
    done.set()
    reader.join(10)
    assert fresh.get("k", lambda: b"never") == b"new"


def test_a_change_through_the_service_is_read_back_at_once() -> None:
    """changed(): nothing kept from before is given, no caller joins a read begun before it,
    and that read's answer is not kept (issue 81: a cancel, then history from before it)."""
    clock = Clock()
    fresh = Fresh(0.5, clock)
    assert fresh.get("/v1/jobs?", lambda: b"running") == b"running"
    fresh.changed()
    assert fresh.peek("/v1/jobs?") is None and fresh.claim("/v1/jobs?") == (None, False)
    assert fresh.get("/v1/jobs?", lambda: b"cancelling") == b"cancelling"
    # a read under way when the change is made: its own caller gets it; nobody else does
    inside, done = threading.Event(), threading.Event()

    def before() -> bytes:
        inside.set()
        done.wait(10)
        return b"from before"

    clock.now += 1
    answers: list[bytes] = []
    reader = threading.Thread(target=lambda: answers.append(fresh.get("k", before)))
    reader.start()
    inside.wait(10)
    fresh.changed()
    assert fresh.get("k", lambda: b"after") == b"after"  # not a wait for the one before
    done.set()
    reader.join(10)
    assert answers == [b"from before"] and fresh.get("k", lambda: b"never") == b"after"
    # a background read claimed before the change: its answer is not kept either
    clock.now += 0.3
    fresh.peek("k")  # asked for: under load
    clock.now += 0.3
    assert fresh.claim("k") == (b"after", True)
    fresh.changed()
    fresh.refresh("k", lambda: b"never kept")
    assert fresh.get("k", lambda: b"fresh") == b"fresh"


def test_a_stale_read_is_given_at_once_while_one_caller_makes_the_next() -> None:
    clock, made = Clock(), []
    fresh = Fresh(0.5, clock)
    fresh.get("k", lambda: b"first")
    clock.now += 0.3
    assert fresh.peek("k") == b"first"  # asked for: under load
    clock.now += 0.3  # stale
    assert fresh.peek("k") is None  # nobody reads it again yet: the route claims it
    assert fresh.claim("k") == (b"first", True)  # given at once; this caller makes the next
    assert fresh.peek("k") == b"first" and fresh.claim("k") == (b"first", False)

    def again() -> bytes:
        made.append(clock.now)
        return b"second"

    fresh.refresh("k", again)
    assert made == [100.6] and fresh.claim("k") == (b"second", False)


def test_a_failed_background_read_drops_the_key_so_the_next_caller_hears_why() -> None:
    clock = Clock()
    fresh = Fresh(0.5, clock)
    fresh.get("k", lambda: b"first")
    clock.now += 0.3
    assert fresh.claim("k") == (b"first", False)  # fresh, and asked for
    clock.now += 0.3
    assert fresh.claim("k") == (b"first", True)

    def away() -> bytes:
        raise ConnectionError("Redis away")

    fresh.refresh("k", away)  # in a worker thread: nobody to raise to
    assert fresh.peek("k") is None and fresh.claim("k") == (None, False)
    with pytest.raises(ConnectionError):
        fresh.get("k", away)  # the next caller's own read: its 503


def test_a_background_read_that_never_ran_is_abandoned_and_read_again() -> None:
    clock = Clock()
    fresh = Fresh(0.5, clock)
    fresh.get("k", lambda: b"first")
    clock.now += 0.3
    assert fresh.peek("k") == b"first"
    clock.now += 0.3
    assert fresh.claim("k") == (b"first", True)
    fresh.abandon("k", RuntimeError("its task was cancelled"))
    assert fresh.claim("k") == (None, False) and fresh.get("k", lambda: b"again") == b"again"


def test_a_stale_answer_is_not_given_to_a_key_not_under_load_nor_long_after() -> None:
    clock = Clock()
    fresh = Fresh(0.5, clock)
    fresh.get("k", lambda: b"before the change")
    clock.now += 0.6  # nobody asked since it was made: a client reading back its change
    assert fresh.claim("k") == (None, False)  # read now, waited for
    assert fresh.get("k", lambda: b"after") == b"after"
    clock.now += 0.4
    assert fresh.peek("k") == b"after"  # asked for: under load
    clock.now += 0.4
    assert fresh.claim("k") == (b"after", True)  # stale: this caller reads it again ...
    clock.now += 0.4
    assert fresh.peek("k") == b"after"  # ... given meanwhile, asked for ...
    clock.now += 0.4  # ... but that read never ends: at STALE_READS ttls it is not given
    assert STALE_READS * 0.5 <= 0.4 * 4
    assert fresh.peek("k") is None and fresh.claim("k") == (None, False)


def test_a_user_past_their_rate_waits_for_it() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=2.0, burst=3, clock=clock)
    assert [limiter.take("alice") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("alice") == pytest.approx(0.5)  # 1 token at 2 a second
    assert limiter.take("bob") == 0.0  # each user has their own
    clock.now += 0.5
    assert limiter.take("alice") == 0.0


@pytest.mark.parametrize(
    ("doc", "key", "words"),
    [
        ({}, "redis.url", "required"),
        ({"redis": {"url": "http://x"}}, "redis.url", "redis"),
        ({"redis": {"url": "redis://h:6379/0"}, "listen": "0.0.0.0:8443"}, "tls", "tls.cert"),
        ({"redis": {"url": "redis://h:6379/0"}, "listen": "nowhere"}, "listen", "host:port"),
        ({"redis": {"url": "redis://h:6379/0"}, "socket": ""}, "listen", "listens nowhere"),
        ({"redis": {"url": "redis://h:6379/0"}, "socket": "rel/sock"}, "socket", "absolute"),
        ({"redis": {"url": "redis://h:6379/0"}, "socket_mode": "999"}, "socket_mode", "octal"),
        ({"redis": {"url": "redis://h:6379/0"}, "limits": {"burst": 0}}, "limits.burst", ""),
        ({"redis": {"url": "redis://h:6379/0"}, "colour": "red"}, "colour", "unknown key"),
    ],
)
def test_a_bad_api_config_names_its_key(doc: object, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_api(doc)
    assert caught.value.key == key and words in str(caught.value)


def test_the_api_config_s_defaults() -> None:
    settings = load_api({"redis": {"url": "redis://h:6379/0"}, "socket_mode": 0o660})
    assert settings.socket == "/run/nodeagent-api/api.sock" and settings.listen == ""
    assert settings.socket_mode == 0o660 and settings.limits.read_cache == 0.5


def test_the_socket_replaces_a_stale_one_and_refuses_a_live_one(tmp_path: Path) -> None:
    """A crash leaves the socket file behind: the next start replaces it. A second service on
    the path of a running one is refused (nodeagent api exits 78 then), not given its socket."""
    path = str(tmp_path / "api.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # the file stays, nothing listens
    first = unix_socket(path, 0o666)
    try:
        with pytest.raises(FileExistsError, match="another process listens on it"):
            unix_socket(path, 0o666)
        with socket.socket(socket.AF_UNIX) as caller:
            caller.connect(path)  # still the first service's
    finally:
        first.close()
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError, match="is not a socket"):
        unix_socket(str(tmp_path / "file"), 0o666)
