"""The restore report and the refusal kinds (nodeagent/channel/restore.py): what a worker writes
is what the agent reads, and each kind's meaning is said in one place. No torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.channel.restore import (
    REPORT_MAX,
    Refusal,
    RefusalKind,
    RestoreReport,
    moved_report,
    read_report,
    report_path,
    write_report,
)


def test_a_report_the_worker_writes_is_the_one_the_agent_reads(tmp_path: Path) -> None:
    path = report_path(tmp_path / "job", 3, 1)
    path.parent.mkdir(parents=True)
    refused = (
        Refusal("memory:20@2", RefusalKind.BAD_COPY, "checksum 1 != 2"),
        Refusal("persistent:20@2", RefusalKind.ABSENT, "no step 20"),
    )
    report = RestoreReport(1, "persistent", 10, 0.25, refused, saves=2)
    write_report(path, report)
    assert read_report(path) == report
    assert json.loads(path.read_text())["refused"][0]["kind"] == "bad_copy"  # plain strings
    assert list(path.parent.iterdir()) == [path]  # the temporary file renamed into place


def test_a_file_the_agent_made_for_the_worker_is_written_in_place(tmp_path: Path) -> None:
    """The agent makes the file for a worker of another user: the worker writes into it (it
    may not create files in that directory), and an empty one says nothing yet."""
    path = tmp_path / "rank-0.restore.json"
    path.touch()
    assert read_report(path) is None
    write_report(path, RestoreReport(0, "start", None, 0.1))
    assert read_report(path) == RestoreReport(0, "start", None, 0.1)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '{"rank": 0, "tier": "start", "step": null, "seconds": 0.1, "refused": '
            '[{"source": "memory:9", "kind": "fatal", "reason": "?"}]}',
            "refusal kind 'fatal'",
        ),
        (
            '{"rank": 0, "tier": "start", "step": null, "seconds": 0.1, "refused": [], '
            '"saves": -1}',
            "'saves' must be a count",
        ),
        (
            '{"rank": 0, "tier": "start", "step": null, "seconds": 0.1, "refused": '
            + json.dumps([{"source": "script", "kind": "absent", "reason": ""}] * 33)
            + "}",
            "33 refused sources",
        ),
    ],
)
def test_a_report_nodeagent_did_not_write_is_refused(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        RestoreReport.from_json(text)


def test_an_oversized_report_is_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(b"{" + b" " * REPORT_MAX)
    with pytest.raises(ValueError, match="more than"):
        read_report(path)


def test_a_long_reason_or_source_is_cut() -> None:
    text = json.dumps(
        {
            "rank": 0,
            "tier": "start",
            "step": None,
            "seconds": 0.1,
            "refused": [{"source": "m" * 100, "kind": "absent", "reason": "r" * 1000}],
        }
    )
    [refusal] = RestoreReport.from_json(text).refused
    assert (len(refusal.source), len(refusal.reason)) == (64, 300)


@pytest.mark.parametrize(
    ("kind", "condemned", "event", "again", "theirs"),
    [
        (RefusalKind.BAD_STATE, 7, True, False, RefusalKind.BAD_STATE),
        (RefusalKind.BAD_COPY, None, True, True, RefusalKind.ABSENT),
        (RefusalKind.ABSENT, None, False, False, RefusalKind.ABSENT),
    ],
)
def test_each_kind_carries_its_meaning(
    kind: RefusalKind,
    condemned: int | None,
    event: bool,
    again: bool,
    theirs: RefusalKind,
) -> None:
    """Only a non-finite state condemns its step (every copy holds it) and is every rank's; a
    bad copy has its node verify again and is only absent on another rank."""
    refusal = Refusal("memory:7@3", kind, "why")
    assert (refusal.condemned, refusal.worth_an_event) == (condemned, event)
    assert kind.meaning.verify_again is again
    assert kind.seen_by_another_rank() is theirs


def test_a_refusal_of_a_source_naming_no_step_condemns_nothing() -> None:
    assert Refusal("memory:x", RefusalKind.BAD_STATE, "non-finite").condemned is None
    assert Refusal("script", RefusalKind.BAD_STATE, "non-finite").condemned is None


def test_a_survivor_finds_its_new_report_from_its_first(tmp_path: Path) -> None:
    first = report_path(tmp_path / "job", 3, 1)
    assert moved_report(first, 4, 0) == report_path(tmp_path / "job", 4, 0)
