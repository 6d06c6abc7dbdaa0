"""The JSON codec of what agents store in Redis; garbage is reported, never trusted."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest

from nodeagent.errors import CorruptStateError
from nodeagent.model.job import (
    Command,
    CommandType,
    Cordon,
    Event,
    Failure,
    GpuInfo,
    GpuSummary,
    JobRecord,
    NodeReport,
    WorkerInfo,
)
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


def with_fields(obj: NodeReport | JobRecord | Cordon, **fields: object) -> str:
    """`obj` as JSON with some fields replaced, JSON-encoded as given (or raw with Raw)."""
    text = obj.to_json()
    doc = json.loads(text)
    doc.update({k: v for k, v in fields.items() if not isinstance(v, Raw)})
    text = json.dumps(doc)
    for name, value in fields.items():
        if isinstance(value, Raw):  # a literal JSON python's json.dumps will not write
            text = text[:-1] + f', "{name}": {value.text}}}'
    return text


@dataclass(frozen=True)
class Raw:
    text: str


CORDON = Cordon(reason="r", by="ops", drain=True)
GARBAGE_REPORTS = [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"name": "a"}', "'address'"),
    (b"\xff\xfe", "not JSON"),
    ("[" * 100_000, "not JSON"),  # nested too deeply: RecursionError
    ("1" * 5000, "not JSON"),  # an integer too long to convert
    ('"' + "x" * (2 << 20) + '"', "bytes long"),
    (with_fields(REPORT, state="dancing"), "'state'"),
    (with_fields(REPORT, acked_generation="4"), "'acked_generation'"),
    (with_fields(REPORT, acked_generation=4.0), "'acked_generation'"),
    (with_fields(REPORT, acked_generation=-1), "'acked_generation'"),
    (with_fields(REPORT, acked_generation=True), "'acked_generation'"),
    (with_fields(REPORT, acked_generation=Raw("1e999")), "not JSON"),
    (with_fields(REPORT, acked_generation=Raw("NaN")), "not JSON"),
    (with_fields(REPORT, acked_generation=Raw("Infinity")), "not JSON"),
    (with_fields(REPORT, free_port=70000), "'free_port'"),
    (with_fields(REPORT, lease_ttl_ms=0), "'lease_ttl_ms'"),
    (with_fields(REPORT, name="a b"), "'name'"),
    (with_fields(REPORT, address="evil host; rm"), "'address'"),
    (with_fields(REPORT, gpu="x"), "not a JSON object"),
    (with_fields(REPORT, gpu={"gpus": []}), "'available'"),
    (with_fields(REPORT, gpu={"available": True, "gpus": ["x"]}), "not a JSON object"),
    (with_fields(REPORT, gpu={"available": "yes"}), "'available'"),
    (
        with_fields(
            REPORT,
            gpu={
                "available": True,
                "gpus": [
                    {
                        "index": 0,
                        "health": "ok",
                        "action": "none",
                        "reason": "",
                        "temperature_c": 1e300,
                    }
                ],
            },
        ),
        "'temperature_c'",
    ),
    (with_fields(REPORT, workers="x"), "'workers'"),
    (with_fields(REPORT, workers=[{"rank": 0, "local_rank": 0, "state": "dancing"}]), "'state'"),
    (
        with_fields(REPORT, failure={"generation": 4, "node": "b", "rank": 0, "kind": "signal"}),
        "failure of b",
    ),
    (
        with_fields(REPORT, failure={"generation": 4, "node": "a", "rank": 0, "kind": "boom"}),
        "'kind'",
    ),
    (with_fields(REPORT, cordon={"reason": "r", "by": "x", "drain": "false"}), "'drain'"),
]


@pytest.mark.parametrize(("raw", "words"), GARBAGE_REPORTS)
def test_corrupt_node_reports_are_rejected(raw: str | bytes, words: str) -> None:
    with pytest.raises(CorruptStateError, match=words):
        NodeReport.from_json(raw)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("{}", "'generation'"),
        ('{"generation": "x"}', "'generation'"),
        (with_fields(RECORD, generation=2.9), "'generation'"),
        (with_fields(RECORD, generation=Raw("1e999")), "not JSON"),
        (with_fields(RECORD, state="x"), "'state'"),
        (with_fields(RECORD, members="ab"), "'members'"),
        (with_fields(RECORD, members=["a", "a"]), "distinct"),
        (with_fields(RECORD, members=["a", "b c"]), "node names"),
        (with_fields(RECORD, nproc_per_node=0), "'nproc_per_node'"),
        (with_fields(RECORD, target_nodes=2.9), "'target_nodes'"),
        (with_fields(RECORD, restart_count=-1), "'restart_count'"),
        (with_fields(RECORD, command_cursor="not-an-id"), "'command_cursor'"),
        (with_fields(RECORD, master_addr="a b"), "'master_addr'"),
        (with_fields(RECORD, master_port=70000), "'master_port'"),
        (with_fields(RECORD, pending_failure="x"), "not a JSON object"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_corrupt_job_records_are_rejected(raw: str | bytes, words: str) -> None:
    with pytest.raises(CorruptStateError, match=words):
        JobRecord.from_json(raw)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ('{"type": "explode"}', "'type'"),
        ('{"type": "scale", "target": "many"}', "'target'"),
        ('{"type": "scale", "target": 2.9}', "'target'"),
        ('{"type": "scale", "target": 1e999}', "not JSON"),
        ('{"type": "scale", "target": -1}', "'target'"),
        ('{"type": "scale", "target": true}', "'target'"),
        ('{"type": "scale", "target": NaN}', "not JSON"),
        ('{"type": "stop", "by": ["x"]}', "'by'"),
    ],
)
def test_corrupt_commands_are_rejected(raw: str, words: str) -> None:
    with pytest.raises(CorruptStateError, match=words):
        Command.from_stream("1-0", raw)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (with_fields(CORDON, drain="false"), "'drain'"),
        (with_fields(CORDON, drain=1), "'drain'"),
        (with_fields(CORDON, reason=5), "'reason'"),
        ('{"reason": "r", "drain": true}', "'by'"),
    ],
)
def test_corrupt_cordons_are_rejected(raw: str, words: str) -> None:
    with pytest.raises(CorruptStateError, match=words):
        Cordon.from_json(raw)


@pytest.mark.parametrize(
    ("entry_id", "raw", "words"),
    [
        ("1-0", '{"type": "x", "data": [1, 2]}', "'data'"),
        ("1-0", '{"type": "x", "generation": "7"}', "'generation'"),
        ("not-an-id", '{"type": "x"}', "not a stream entry ID"),
    ],
)
def test_corrupt_events_are_rejected(entry_id: str, raw: str, words: str) -> None:
    with pytest.raises(CorruptStateError, match=words):
        Event.from_stream(entry_id, raw)


def test_a_drain_is_a_real_boolean() -> None:
    assert Cordon.from_json(with_fields(CORDON, drain=False)).drain is False
    assert Cordon.from_json(with_fields(CORDON, drain=True)).drain is True


def test_a_report_digest_ignores_gpu_readings_but_not_verdicts() -> None:
    """The leader reads a node again only when its digest changes (scripts.SYNC): readings
    move every second, verdicts and everything else the leader plans from do not."""
    gpu = GpuSummary(True, gpus=(GpuInfo(0, "ok", "none", "", temperature_c=60.0, power_w=300),))
    base = NodeReport(name="a", address="10.0.0.1", state=NodeState.READY, gpu=gpu)
    warmer = replace(gpu, gpus=(replace(gpu.gpus[0], temperature_c=85.0, power_w=650),))
    bad = replace(gpu, gpus=(replace(gpu.gpus[0], health="bad"),))
    assert replace(base, gpu=warmer).digest == base.digest
    assert replace(base, gpu=bad).digest != base.digest
    assert replace(base, acked_generation=1).digest != base.digest


def test_a_record_read_as_its_head_names_the_rank_0_member_and_the_reader() -> None:
    record = make_record(JobState.RUNNING, 3, ("m0", "m1", "m2", "m3"), master_addr="10.0.0.1")
    head = record.head_json()
    assert json.loads(head)["members"] == ["m0"] and json.loads(head)["size"] == 4
    read = JobRecord.from_head(head, "m2", 2)
    assert read.members == ("m0", "", "m2", "")
    assert read.group_rank("m2") == 2 and read.world_size == record.world_size
    assert replace(read, members=record.members) == record
    assert JobRecord.from_head(head, "m0", 0).members == ("m0", "", "", "")
    outsider = JobRecord.from_head(head, "x", None)
    assert outsider.group_rank("x") is None and len(outsider.members) == 4
    empty = replace(record, members=(), state=JobState.WAITING)
    assert JobRecord.from_head(empty.head_json(), "x", None).members == ()
    with pytest.raises(ValueError, match="not written back"):
        read.to_json()  # a leader never writes what a follower read


@pytest.mark.parametrize(
    ("node", "rank", "words"),
    [
        ("m2", 4, "rank 4 of m2 is not below 4"),
        ("m2", 0, "the rank-0 member is m0, but m2's rank is 0"),
        ("m0", 1, "the rank-0 member is m0, but m0's rank is 1"),
        ("m0", None, "the rank-0 member is m0, but m0's rank is None"),
    ],
)
def test_a_rank_that_contradicts_the_head_is_corrupt(
    node: str, rank: int | None, words: str
) -> None:
    head = make_record(JobState.RUNNING, 3, ("m0", "m1", "m2", "m3")).head_json()
    with pytest.raises(CorruptStateError, match=words):
        JobRecord.from_head(head, node, rank)


def test_a_head_whose_size_contradicts_its_members_is_corrupt() -> None:
    doc = json.loads(make_record(JobState.RUNNING, 3, ("m0", "m1")).head_json())
    for members, size in ((["m0"], 0), ([], 2), (["m0", "m1"], 2), (["m0"], 2.5)):
        raw = json.dumps({**doc, "members": members, "size": size})
        with pytest.raises(CorruptStateError, match="head"):
            JobRecord.from_head(raw, "m1", 1)
