"""Which command lines become which signed requests (cli/ctlsigned.request_of). Pure."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.cli import ctl, ctlsigned
from nodeagent.model.request import Verb


def request(argv: list[str], job: str | None = None) -> tuple[Verb, dict[str, Any]] | None:
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = ctl._parser().parse_args(argv[: len(argv) - len(command) - bool(command)])
    if command:  # as ctl.main does: what follows `--` is the job's command
        args.argv = command
    return ctlsigned.request_of(args, "alice", job)


@pytest.mark.parametrize(
    ("argv", "job", "expected"),
    [
        (["cancel", "x"], None, (Verb.CANCEL, {"job": "x"})),
        (["scale", "x", "+2"], None, (Verb.SCALE, {"job": "x", "target": "+2"})),
        (["scale", "3"], "x", (Verb.SCALE, {"job": "x", "target": "3"})),
        (["stop"], "x", (Verb.COMMAND, {"job": "x", "kind": "stop"})),
        (["restart"], "x", (Verb.COMMAND, {"job": "x", "kind": "restart"})),
        (
            ["drain", "n1", "--reason", "disk"],
            None,
            (Verb.CORDON, {"action": "drain", "node": "n1", "reason": "disk"}),
        ),
        (
            ["uncordon", "n1"],
            "x",
            (Verb.CORDON, {"action": "uncordon", "node": "n1", "reason": "", "job": "x"}),
        ),
        (
            ["queue", "set", "q", "--max-priority", "10"],
            None,
            (Verb.QUEUE, {"action": "set", "name": "q", "max_priority": 10}),
        ),
        (
            ["queue", "create", "q", "--quota", "none", "--guaranteed", "2"],
            None,
            (Verb.QUEUE, {"action": "create", "name": "q", "quota": None, "guaranteed": 2}),
        ),
        (["queue", "delete", "q"], None, (Verb.QUEUE, {"action": "delete", "name": "q"})),
        (["queue", "list"], None, None),  # reads change nothing
        (["jobs"], None, None),
        (["status"], "x", None),
        (["stop"], None, None),  # no job: the job's own command path says what is missing
    ],
)
def test_request_of(argv: list[str], job: str | None, expected: object) -> None:
    assert request(argv, job) == expected


def test_a_submission_carries_the_spec_as_alice_wrote_it() -> None:
    found = request(["submit", "--name", "j", "--nodes", "1:2", "--", "python", "t.py"])
    assert found is not None and found[0] is Verb.SUBMIT
    spec = found[1]["spec"]
    assert (spec["id"], spec["user"], spec["entrypoint"]) == ("j", "alice", ["python", "t.py"])
    assert "submitted_by" not in spec and "signature" not in spec  # the pool leader's to set
