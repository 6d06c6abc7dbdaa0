"""libmunge (in process) and the munge and unmunge programs (its fallback) against a real munged
the tests start with a key of their own: what a credential says, and each way it can fail, the
same from either; a credential made by one is read by the other."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from nodeagent.model.credential import (
    Decoded,
    Munge,
    MungeStatus,
    MungeUnavailable,
    bound,
    check,
    credential_id,
)
from nodeagent.supervisor import libmunge
from nodeagent.supervisor.libmunge import MungeLibrary, munge_at
from nodeagent.supervisor.munge import MungeProgram
from tests.helpers.munge import MungeDaemon

KINDS = ("library", "program")


def client(daemon: MungeDaemon, kind: str) -> Munge:
    if kind == "program":
        return daemon.program()
    found = munge_at(daemon.socket)
    assert isinstance(found, MungeLibrary), "libmunge.so.2 (Debian: libmunge2) did not load"
    return found


pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def other_site() -> Iterator[MungeDaemon]:
    daemon = MungeDaemon().start()
    yield daemon
    daemon.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_a_credential_says_who_made_it_once(munged: MungeDaemon, kind: str) -> None:
    munge = client(munged, kind)
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


@pytest.mark.parametrize("kind", KINDS)
def test_an_expired_credential_is_refused_unless_stored(munged: MungeDaemon, kind: str) -> None:
    munge = client(munged, kind)
    credential = munge.encode(bound("ef" * 32), ttl_s=1)
    time.sleep(2.2)
    found = munge.decode(credential)
    assert isinstance(found, Decoded) and found.status is MungeStatus.EXPIRED
    assert check(found, "ef" * 32) == (
        "credential expired (time to live 1 s): sign the request again"
    )
    assert check(found, "ef" * 32, stored=True) == found


@pytest.mark.parametrize("kind", KINDS)
def test_another_sites_key_and_garbage_say_nothing(
    munged: MungeDaemon, other_site: MungeDaemon, kind: str
) -> None:
    munge = client(munged, kind)
    foreign = client(other_site, kind).encode(bound("ab" * 32))
    assert munge.decode(foreign) is MungeStatus.INVALID
    assert check(MungeStatus.INVALID, "ab" * 32) == (
        "credential invalid: not made with this pool's munge key, or altered"
    )
    tampered = foreign[:20] + ("A" if foreign[20] != "A" else "B") + foreign[21:]
    assert munge.decode(tampered) in (MungeStatus.INVALID, MungeStatus.MALFORMED)
    assert munge.decode("MUNGE:not-base64!:") is MungeStatus.MALFORMED
    assert munge.decode("alice") is MungeStatus.MALFORMED


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tail", ["\x00junk", "\nMUNGE:AAAA:", "AAAA", " "])
def test_a_credential_with_anything_after_it_is_not_one(
    munged: MungeDaemon, kind: str, tail: str
) -> None:
    """munged reads a credential and ignores what follows (seen: unmunge decoded each of these
    tails' credentials as a success): a replay with a tail, named apart from the first by the
    replay memory, would be taken again on another host."""
    munge = client(munged, kind)
    credential = munge.encode(bound("ab" * 32))
    assert munge.decode(credential + tail) is MungeStatus.MALFORMED
    found = munge.decode(credential)  # not spent by the attempt
    assert isinstance(found, Decoded) and found.status is MungeStatus.SUCCESS


def test_texts_that_carry_the_same_bytes_are_one_credential(munged: MungeDaemon) -> None:
    """In a padded base64 text the last character has bits no byte is made of: a text with
    them set carries the same credential, and is named as it."""
    made = (munged.program().encode(payload) for payload in ("x", "xy", "xyz"))
    credential = next(c for c in made if c.endswith("=:"))  # one of three lengths is padded
    body = credential[len("MUNGE:") : -1]
    data, padding = body.rstrip("="), body[len(body.rstrip("=")) :]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    spare = alphabet[alphabet.index(data[-1]) ^ 1]  # the lowest bit: always a spare one
    twin = f"MUNGE:{data[:-1]}{spare}{padding}:"
    assert twin != credential
    assert credential_id(twin) == credential_id(credential)
    assert credential_id(munged.program().encode("x")) != credential_id(credential)


@pytest.mark.parametrize(("maker", "reader"), [("library", "program"), ("program", "library")])
def test_either_reads_what_the_other_made(munged: MungeDaemon, maker: str, reader: str) -> None:
    made = client(munged, maker).encode(bound("cd" * 32), ttl_s=60)
    found = client(munged, reader).decode(made)
    assert isinstance(found, Decoded)
    assert (found.status, found.uid, found.payload, found.ttl_s) == (
        MungeStatus.SUCCESS,
        os.getuid(),
        bound("cd" * 32),
        60,
    )


def test_a_credential_restricted_to_another_uid_says_nothing_here(munged: MungeDaemon) -> None:
    other = os.getuid() + 4242
    for kind in KINDS:
        sealed = client(munged, kind).encode("secret", restrict_uid=other)
        assert client(munged, kind).decode(sealed) is MungeStatus.MALFORMED


def test_without_libmunge_the_programs_do_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libmunge, "_LIBRARY", None)
    assert munge_at("/run/x") == MungeProgram("/run/x")


@pytest.mark.parametrize("kind", KINDS)
def test_no_munged_is_said_with_its_socket(kind: str) -> None:
    where = "/tmp/no-such-munged/socket"
    munge = MungeProgram(where) if kind == "program" else munge_at(where)
    with pytest.raises(MungeUnavailable, match="/tmp/no-such-munged/socket"):
        munge.encode("x")
    with pytest.raises(MungeUnavailable, match="/tmp/no-such-munged/socket"):
        munge.decode("MUNGE:AAAA:")
    missing = MungeProgram("/tmp/x", munge="/nonexistent/munge")
    with pytest.raises(MungeUnavailable, match="install MUNGE"):
        missing.encode("x")
