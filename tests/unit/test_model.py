"""The JSON codec of what agents store in Redis; garbage is reported, never trusted."""

from __future__ import annotations

import pytest

from nodeagent.errors import CorruptStateError
from nodeagent.model import Command, CommandType, Event, Failure, JobRecord, NodeReport, WorkerInfo
from nodeagent.state import JobState, NodeState
from tests.helpers.factories import make_record

REPORT = NodeReport(
    name="a",
    address="10.0.0.1",
    state=NodeState.RUNNING,
    acked_generation=4,
    worker_generation=4,
    group_rank=0,
    free_port=29500,
    restart_count=1,
    lease_ttl_ms=5000,
    workers=(WorkerInfo(0, 0, 123, "running"),),
    failure=Failure(generation=4, node="a", rank=0, kind="signal", signal="SIGKILL"),
)
RECORD = make_record(
    JobState.RUNNING,
    4,
    ("a", "b"),
    reason="scale",
    target_nodes=2,
    max_nodes=3,
    nproc_per_node=8,
    master_addr="10.0.0.1",
    master_port=29500,
)


def test_round_trips() -> None:
    assert NodeReport.from_json(REPORT.to_json()) == REPORT
    assert JobRecord.from_json(RECORD.to_json()) == RECORD
    assert (
        RECORD.world_size == 16 and RECORD.group_rank("b") == 1 and RECORD.group_rank("z") is None
    )
    cmd = Command(CommandType.SCALE, target=3, by="ops")
    assert Command.from_stream("1-0", cmd.to_json()) == Command(CommandType.SCALE, 3, "ops", "1-0")
    event = Event.from_stream("1700000000123-0", Event("node_lost", 3, "b", "gone").to_json())
    assert (event.type, event.generation, event.node, event.at_ms) == (
        "node_lost",
        3,
        "b",
        1700000000123,
    )


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"name": "a"}', "malformed"),
        (REPORT.to_json().replace('"running"', '"dancing"', 1), "malformed"),
        (
            REPORT.to_json().replace('"acked_generation":4', '"acked_generation":"4"'),
            "acked_generation",
        ),
    ],
)
def test_corrupt_node_reports_are_rejected(raw: str, words: str) -> None:
    with pytest.raises(CorruptStateError, match=words):
        NodeReport.from_json(raw)


@pytest.mark.parametrize(
    "raw",
    [
        "{}",
        '{"generation": "x"}',
        RECORD.to_json().replace('"members":["a","b"]', '"members":"ab"'),
        b"\xff\xfe",
    ],
)
def test_corrupt_job_records_are_rejected(raw: str | bytes) -> None:
    with pytest.raises(CorruptStateError):
        JobRecord.from_json(raw)


def test_corrupt_commands_are_rejected() -> None:
    with pytest.raises(CorruptStateError):
        Command.from_stream("1-0", '{"type": "explode"}')
    with pytest.raises(CorruptStateError):
        Command.from_stream("1-0", '{"type": "scale", "target": "many"}')
