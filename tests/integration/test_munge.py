"""The munge and unmunge programs against a real munged the tests start with a key of their own:
what a credential says, and each way it can fail."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from nodeagent.model.credential import Decoded, MungeStatus, MungeUnavailable, bound, check
from nodeagent.supervisor.munge import MungeProgram
from tests.helpers.munge import MungeDaemon

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def other_site() -> Iterator[MungeDaemon]:
    daemon = MungeDaemon().start()
    yield daemon
    daemon.stop()


def test_a_credential_says_who_made_it_once(munged: MungeDaemon) -> None:
    munge = munged.program()
    credential = munge.encode(bound("ab" * 32))
    first = munge.decode(credential)
    assert isinstance(first, Decoded)
    assert (first.status, first.uid, first.gid) == (MungeStatus.SUCCESS, os.getuid(), os.getgid())
    assert first.payload == bound("ab" * 32) and first.ttl_s == 300
    assert abs(first.encoded_s - time.time()) < 5
    assert check(first, "ab" * 32) == first
    assert check(first, "cd" * 32) == (
        "credential signed for another request (its payload does not match this one)"
    )
    again = munge.decode(credential)
    assert isinstance(again, Decoded) and again.status is MungeStatus.REPLAYED
    assert check(again, "ab" * 32) == "credential replayed: it was used before"
    assert check(again, "ab" * 32, stored=True) == again  # signed: a stored spec's is kept


def test_an_expired_credential_is_refused_unless_stored(munged: MungeDaemon) -> None:
    munge = munged.program()
    credential = munge.encode(bound("ef" * 32), ttl_s=1)
    time.sleep(2.2)
    found = munge.decode(credential)
    assert isinstance(found, Decoded) and found.status is MungeStatus.EXPIRED
    assert check(found, "ef" * 32) == (
        "credential expired (time to live 1 s): sign the request again"
    )
    assert check(found, "ef" * 32, stored=True) == found


def test_another_sites_key_and_garbage_say_nothing(
    munged: MungeDaemon, other_site: MungeDaemon
) -> None:
    foreign = other_site.program().encode(bound("ab" * 32))
    assert munged.program().decode(foreign) is MungeStatus.INVALID
    assert check(MungeStatus.INVALID, "ab" * 32) == (
        "credential invalid: not made with this pool's munge key, or altered"
    )
    tampered = foreign[:20] + ("A" if foreign[20] != "A" else "B") + foreign[21:]
    assert munged.program().decode(tampered) in (MungeStatus.INVALID, MungeStatus.MALFORMED)
    assert munged.program().decode("MUNGE:not-base64!:") is MungeStatus.MALFORMED
    assert munged.program().decode("alice") is MungeStatus.MALFORMED


def test_no_munged_is_said_with_its_socket(tmp_path: object) -> None:
    munge = MungeProgram("/tmp/no-such-munged/socket")
    with pytest.raises(MungeUnavailable, match="/tmp/no-such-munged/socket"):
        munge.encode("x")
    with pytest.raises(MungeUnavailable, match="/tmp/no-such-munged/socket"):
        munge.decode("MUNGE:AAAA:")
    missing = MungeProgram("/tmp/x", munge="/nonexistent/munge")
    with pytest.raises(MungeUnavailable, match="install MUNGE"):
        missing.encode("x")
