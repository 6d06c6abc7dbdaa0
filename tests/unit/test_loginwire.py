"""The login wire (telemetry/loginwire.py), the job a login goes into (runtime/logins.py
`choose`) and the PAM check's own decisions (cli/pamadopt.py), as tables."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nodeagent.cli.pamadopt import check
from nodeagent.runtime.logins import choose
from nodeagent.telemetry.loginwire import (
    LoginAnswer,
    answer_line,
    ask_line,
    parse_answer,
    parse_ask,
)


@pytest.mark.parametrize("user", ["alice", "a.b-c_d", "svc$", "x@example.org", "_9"])
@pytest.mark.parametrize("adopt", [True, False])
def test_a_request_names_a_user(user: str, adopt: bool) -> None:
    assert parse_ask(ask_line(user, adopt)) == (user, adopt)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (b'{"user": "alice"}', "one line"),  # no newline
        (b'{"user": "alice"}' + b" " * 5000 + b"\n", "one line"),
        (b"alice\n", "a JSON object"),
        (b'["alice"]\n', "a JSON object"),
        (b"{}\n", "names a user"),
        (b'{"user": "../etc"}\n', "names a user"),
        (b'{"user": "al ice"}\n', "names a user"),
        (b'{"user": "-alice"}\n', "names a user"),
        (b'{"user": 1000}\n', "names a user"),
        (b'{"user": "alice", "adopt": 1}\n', "'adopt' is true or false"),
    ],
)
def test_a_bad_request_says_what_is_wrong(line: bytes, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_ask(line)


@pytest.mark.parametrize(
    "answer", [LoginAnswer("j1", "taken into j1"), LoginAnswer("", "alice holds no job")]
)
def test_an_answer_goes_both_ways(answer: LoginAnswer) -> None:
    assert parse_answer(answer_line(answer)) == answer
    assert answer.admitted == bool(answer.job)


@pytest.mark.parametrize("line", [b"", b"{}\n", b'{"said": 3}\n', b'{"job": [], "said": ""}\n'])
def test_what_is_not_an_answer_is_refused(line: bytes) -> None:
    with pytest.raises(ValueError):
        parse_answer(line)


@dataclass
class Job:
    job_id: str
    uid: int
    left: bool = False
    adoptable: bool = True

    def adopt(self, pid: int) -> None:
        raise AssertionError("choose decides, it does not adopt")


@pytest.mark.parametrize(
    ("jobs", "uid", "chosen"),
    [
        ([], 1000, None),
        ([Job("a", 1001)], 1000, None),
        ([Job("a", 1000)], 1000, "a"),
        ([Job("a", 1000), Job("b", 1001), Job("c", 1000)], 1000, "c"),  # the newest
        ([Job("a", 1000), Job("c", 1000, left=True)], 1000, "a"),  # one leaving is not
        ([Job("a", 1000, left=True)], 1000, None),
        ([Job("a", 1000), Job("c", 1000, adoptable=False)], 1000, "a"),  # c: in containers
        ([Job("a", 1000, adoptable=False)], 1000, "a"),  # its refusal says why
    ],
)
def test_a_login_goes_into_its_users_newest_job_here_that_can_take_it(
    jobs: list[Job], uid: int, chosen: str | None
) -> None:
    found = choose(uid, jobs)
    assert (found.job_id if found else None) == chosen


@pytest.mark.parametrize(
    ("user", "stage", "said"),
    [
        ("root", "account", None),  # never asked about: the socket is not there
        ("alice", "close_session", None),  # nothing to check at a session's end
        ("alice", "account", "does not answer at /nonexistent/login.sock"),
        ("alice", "open_session", "does not answer"),
        ("", "account", "no PAM_USER"),
    ],
)
def test_the_pam_check_without_an_agent(user: str, stage: str, said: str | None) -> None:
    why = check(user, stage, "/nonexistent/login.sock")
    assert why == said if said is None else said in (why or "")
