"""nodeagentctl's verbs as one table (cli/ctl/verbs.py): every verb the parser takes is a row,
every row's module has the verb's shape, and which command lines become which signed requests.
Pure."""

from __future__ import annotations

import argparse
import hashlib
import pkgutil
from typing import Any

import pytest

import nodeagent.cli.ctl
from nodeagent.cli.ctl import verbs
from nodeagent.cli.ctl.parser import parser
from nodeagent.errors import UsageError
from nodeagent.model.request import Verb

# What changes the pool: each has a signed form (pool.auth: munge).
POOL_CHANGES = frozenset(
    {
        "submit", "alloc", "cancel", "hold", "release", "requeue", "scale", "queue",
        "cordon", "drain", "uncordon", "stop", "restart", "token", "ui",
    }
)  # fmt: skip


def request(argv: list[str], job: str | None = None) -> tuple[Verb, dict[str, Any]] | None:
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser().parse_args(argv[: len(argv) - len(command) - bool(command)])
    if command:  # as nodeagentctl's main does: what follows `--` is the job's command
        args.argv = command
    return verbs.signed_form(args.command, args, "alice", job)


def _subcommands(built: argparse.ArgumentParser) -> list[str]:
    [found] = [a for a in built._actions if isinstance(a, argparse._SubParsersAction)]
    return list(found.choices)


def test_the_parser_takes_exactly_the_verbs_of_the_table_in_its_order() -> None:
    assert _subcommands(parser()) == list(verbs.VERBS)


def test_every_verb_module_has_the_shape_and_only_pool_changes_sign() -> None:
    for name, module in verbs.VERBS.items():
        assert isinstance(module.HELP, str) and module.HELP, name
        assert callable(module.add_arguments) and callable(module.run), name
    signing = {n for n, m in verbs.VERBS.items() if isinstance(m, verbs.PoolVerbModule)}
    assert signing == POOL_CHANGES


def test_every_verb_only_reads_or_signs_and_one_that_does_neither_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fail closed (issue 40): under pool.auth: munge a verb runs its direct path only if it
    never changes anything; a verb added with neither a signed form nor a place in READS is
    refused."""
    assert verbs.READS.isdisjoint(POOL_CHANGES)
    assert set(verbs.VERBS) == verbs.READS | POOL_CHANGES
    assert all(verbs.unsigned(name) is None for name in verbs.VERBS)
    writes_directly = argparse.Namespace(HELP="x", add_arguments=print, run=print)
    monkeypatch.setattr(verbs, "VERBS", {**verbs.VERBS, "purge": writes_directly})
    refusal = verbs.unsigned("purge")
    assert refusal is not None and "purge has no signed form" in refusal


def test_every_module_of_the_package_is_a_verb_or_named_as_shared() -> None:
    """A new module is either a row of the table or one of the shared ones the package's
    docstring lists; a verb's module forgotten in the table is caught."""
    package = nodeagent.cli.ctl
    modules = {m.name for m in pkgutil.iter_modules(package.__path__)}
    shared = {
        "__main__", "nodeagentctl", "verbs", "parser", "targets", "argtypes", "rc", "caller",
        "checks", "cordons", "runs", "output", "wait", "signing", "accounting",
    }  # fmt: skip
    one_shape = {"holding": {"hold", "release", "requeue"}}  # a module, a verb object each
    assert modules - shared == set(verbs.VERBS) - one_shape["holding"] | set(one_shape)


SIGNED_LINES: list[tuple[list[str], str | None, tuple[Verb, dict[str, Any]] | None]] = [
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
    (
        ["queue", "set", "q", "--gpu-quota", "32"],
        None,
        (Verb.QUEUE, {"action": "set", "name": "q", "gpu_quota": 32}),
    ),
    (
        ["queue", "set", "q", "--gpu-guaranteed", "16"],
        None,
        (Verb.QUEUE, {"action": "set", "name": "q", "gpu_guaranteed": 16}),
    ),
    (["queue", "delete", "q"], None, (Verb.QUEUE, {"action": "delete", "name": "q"})),
    (["queue", "list"], None, None),  # reads change nothing
    (["hold", "x"], None, (Verb.HOLD, {"job": "x"})),
    (["release", "x"], None, (Verb.RELEASE, {"job": "x"})),
    (["requeue", "x"], None, (Verb.REQUEUE, {"job": "x"})),
    (
        ["cordon", "n1"],
        None,
        (Verb.CORDON, {"action": "cordon", "node": "n1", "reason": "cordoned by an operator"}),
    ),
    (["token"], None, (Verb.TOKEN, {"action": "mint", "lifetime_s": 3600})),
    (["token", "--lifetime", "2h"], None, (Verb.TOKEN, {"action": "mint", "lifetime_s": 7200})),
    (["token", "--revoke", "all"], None, (Verb.TOKEN, {"action": "revoke", "id": "all"})),
    (["token", "--list"], None, None),
    (["jobs"], None, None),
    (["status"], "x", None),
]


@pytest.mark.parametrize(("argv", "job", "expected"), SIGNED_LINES)
def test_the_signed_form_of_a_command_line(
    argv: list[str], job: str | None, expected: object
) -> None:
    assert request(argv, job) == expected


def test_ui_asks_for_a_token_kept_for_a_code_whose_hash_alone_it_sends() -> None:
    args = parser().parse_args(["ui", "--url", "https://login1:8443"])
    verb, body = verbs.signed_form(args.command, args, "alice", None) or (None, {})
    code = args.code  # what the link carries: the pool never sees it, only its SHA-256
    assert verb is Verb.TOKEN and body["action"] == "mint" and body["lifetime_s"] == 28800
    assert body["signin"] == hashlib.sha256(code.encode()).hexdigest() and code not in str(body)


def test_every_verb_that_changes_the_pool_has_a_signed_form_in_the_table() -> None:
    """The table above lists a signed line for every pool-changing verb (submit, alloc and ui
    below): a verb added to POOL_CHANGES without one fails here."""
    signed = {argv[0] for argv, _, expected in SIGNED_LINES if expected is not None}
    assert signed | {"submit", "alloc", "ui"} == POOL_CHANGES


def test_alloc_is_signed_as_the_submission_of_an_allocation() -> None:
    verb, body = request(["alloc", "--name", "dev", "--nodes", "2", "--time", "1h"]) or (None, {})
    spec = body["spec"]
    assert verb is Verb.SUBMIT and spec["kind"] == "allocation" and spec["user"] == "alice"
    assert (spec["id"], spec["min_nodes"], spec["time_limit"]) == ("dev", 2, 3600.0)
    assert spec["entrypoint"] == ["sleep", "infinity"] and "submitted_by" not in spec


@pytest.mark.parametrize("argv", [["stop"], ["restart"], ["scale", "3"], ["scale", "x", "3", "4"]])
def test_a_change_that_names_no_job_is_a_usage_error_not_an_unsigned_write(
    argv: list[str],
) -> None:
    """A command line that would change something has a signed form or is an error: never
    None (which means "this only reads" and runs the verb's direct path)."""
    with pytest.raises(UsageError, match=r"--job ID|give \[JOB\] N"):
        request(argv, None)


def test_a_submission_carries_the_spec_as_alice_wrote_it() -> None:
    found = request(["submit", "--name", "j", "--nodes", "1:2", "--", "python", "t.py"])
    assert found is not None and found[0] is Verb.SUBMIT
    spec = found[1]["spec"]
    assert (spec["id"], spec["user"], spec["entrypoint"]) == ("j", "alice", ["python", "t.py"])
    assert "submitted_by" not in spec and "signature" not in spec  # the pool leader's to set
