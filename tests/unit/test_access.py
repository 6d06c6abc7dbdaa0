"""runtime/access.py: the kernel's mode-bit rule for another user, from stat results (no I/O)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from nodeagent.runtime.access import READ, SEARCH, WRITE, Entry, Step, Who, allows, denial, explain

DIR, FILE = stat.S_IFDIR, stat.S_IFREG
ALICE = Who(1000, frozenset({1000, 44}))  # her own group and video
ROOT = Who(0, frozenset({0}))


def entry(kind: int, mode: int, uid: int = 0, gid: int = 0, acl: bool = False) -> Entry:
    return Entry(Path("/x"), kind | mode, uid, gid, acl)


@pytest.mark.parametrize(
    ("the_entry", "who", "want", "allowed"),
    [
        # the owner's bits for the owner, even when others' would allow more
        (entry(DIR, 0o700, uid=1000), ALICE, SEARCH, True),
        (entry(DIR, 0o077, uid=1000), ALICE, SEARCH, False),
        # the group's bits for a member of the file's group (primary or supplementary)
        (entry(DIR, 0o750, gid=44), ALICE, SEARCH, True),
        (entry(DIR, 0o740, gid=44), ALICE, SEARCH, False),
        (entry(DIR, 0o705, gid=44), ALICE, SEARCH, False),  # not the others' bits then
        (entry(FILE, 0o640, gid=1000), ALICE, READ, True),
        # the others' bits for everybody else
        (entry(DIR, 0o751), ALICE, SEARCH, True),
        (entry(DIR, 0o750), ALICE, SEARCH, False),
        (entry(FILE, 0o644), ALICE, READ, True),
        (entry(FILE, 0o640), ALICE, READ, False),
        (entry(FILE, 0o644), ALICE, READ | WRITE, False),  # every bit asked for
        (entry(FILE, 0o646), ALICE, READ | WRITE, True),
        (entry(FILE, 0o755), ALICE, SEARCH, True),  # execute, on a file
        # root reads, writes and enters anything, executes what has any execute bit
        (entry(DIR, 0o000, uid=1000), ROOT, SEARCH, True),
        (entry(FILE, 0o000, uid=1000), ROOT, READ | WRITE, True),
        (entry(FILE, 0o600, uid=1000), ROOT, SEARCH, False),
        (entry(FILE, 0o601, uid=1000), ROOT, SEARCH, True),
        # a POSIX ACL may grant what the bits do not: not judged
        (entry(DIR, 0o700, acl=True), ALICE, SEARCH, True),
    ],
)
def test_the_mode_bits_rule(the_entry: Entry, who: Who, want: int, allowed: bool) -> None:
    assert allows(the_entry, who, want) is allowed


def test_the_first_refusal_on_the_way_is_named() -> None:
    way = [
        Step(Entry(Path("/"), DIR | 0o755, 0, 0), SEARCH),
        Step(Entry(Path("/srv"), DIR | 0o700, 0, 0), SEARCH),
        Step(Entry(Path("/srv/logs"), DIR | 0o700, 0, 0), SEARCH),
    ]
    refused = denial(way, ALICE)
    assert refused is not None and refused.entry.path == Path("/srv")
    assert denial(way[:1], ALICE) is None
    assert denial(way, ROOT) is None


@pytest.mark.parametrize(
    ("step", "words"),
    [
        (
            Step(Entry(Path("/srv"), DIR | 0o700, 0, 0), SEARCH),
            "'alice' cannot enter /srv (mode 0700, uid 0, gid 0); let it, e.g. chmod o+x /srv",
        ),
        (
            Step(Entry(Path("/t.py"), FILE | 0o600, 0, 0), READ),
            "'alice' cannot read /t.py (mode 0600, uid 0, gid 0); let it, e.g. chmod o+r /t.py",
        ),
        (Step(Entry(Path("/run"), FILE | 0o644, 0, 0), SEARCH), "cannot execute /run"),
        (Step(Entry(Path("/d"), DIR | 0o500, 0, 0), WRITE | SEARCH), "cannot write and execute"),
    ],
)
def test_the_explanation_says_what_and_how_to_fix_it(step: Step, words: str) -> None:
    text = explain(step, "'alice'")
    assert words in text and "chgrp it to a group of 'alice'" in text
