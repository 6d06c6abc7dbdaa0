"""The node's pool report: what it says round-trips, what another agent version left out reads
as absent, and garbage is refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nodeagent.config.container import ContainerRule
from nodeagent.errors import CorruptStateError
from nodeagent.model.gpus import (
    GpuUnit,
    placement_texts,
    read_placement,
    share_text,
    split_placements,
)
from nodeagent.model.pool import PoolJob, PoolJobState, PoolNode


def test_a_report_round_trips_with_the_image_it_pulls() -> None:
    node = PoolNode("a", "10.0.0.1", 5000, serving=None, pulling="localhost/torch:2.5")
    assert PoolNode.from_json(node.to_json()) == node


def test_a_report_without_pulling_reads_as_not_pulling() -> None:
    doc = json.loads(PoolNode("a", "10.0.0.1", 5000).to_json())
    del doc["pulling"]  # an agent of an earlier version
    assert PoolNode.from_json(json.dumps(doc)).pulling is None


@pytest.mark.parametrize("pulling", [7, "x" * 1025])
def test_a_bad_pulling_is_refused(pulling: object) -> None:
    doc = {**json.loads(PoolNode("a", "10.0.0.1", 5000).to_json()), "pulling": pulling}
    with pytest.raises(CorruptStateError, match="pulling"):
        PoolNode.from_json(json.dumps(doc))


def test_a_report_carries_what_its_containers_section_allows_and_no_more() -> None:
    rule = ContainerRule(True, ("localhost/",), ("/data",), socket="/s", ulimits=("a=1",))
    doc = json.loads(PoolNode("a", "10.0.0.1", 5000, containers=rule).to_json())
    assert doc["containers"] == {
        "allowed": True,
        "images": ["localhost/"],
        "mount_sources": ["/data"],
    }
    back = PoolNode.from_json(json.dumps(doc)).containers
    assert back == ContainerRule(True, ("localhost/",), ("/data",))  # the runtime's own stays home


@pytest.mark.parametrize(
    ("containers", "says"),
    [
        ({"allowed": "yes", "images": [], "mount_sources": []}, "allowed is true or false"),
        ({"allowed": True, "images": ["../x"], "mount_sources": []}, "image prefixes"),
        ({"allowed": True, "images": [], "mount_sources": ["data"]}, "absolute plain paths"),
        ({"allowed": True, "images": [], "mount_sources": [], "runtime": "x"}, "expected allowed"),
        ({"allowed": True, "images": ["a/"] * 65, "mount_sources": []}, "at most 64"),
        ([], "expected allowed"),
    ],
)
def test_a_bad_containers_offer_is_refused(containers: object, says: str) -> None:
    doc = {**json.loads(PoolNode("a", "10.0.0.1", 5000).to_json()), "containers": containers}
    with pytest.raises(CorruptStateError, match=says):
        PoolNode.from_json(json.dumps(doc))


def test_a_report_round_trips_with_its_gpu_units_and_their_holders() -> None:
    units = (GpuUnit("GPU-1", "NVIDIA H100", 81559, "j"), GpuUnit("MIG-2", "NVIDIA A100 MIG", 9856))
    node = PoolNode("a", "10.0.0.1", 5000, gpus=units)
    assert PoolNode.from_json(node.to_json()) == node
    doc = json.loads(node.to_json())
    del doc["gpus"]  # an agent of an earlier version: offers none
    assert PoolNode.from_json(json.dumps(doc)).gpus == ()


@pytest.mark.parametrize(
    ("gpus", "says"),
    [
        ("GPU-1", "gpus"),
        ([{"uuid": "GPU-1"}] * 2, "names a GPU twice"),
        ([{"uuid": "../../etc"}], "not a GPU or MIG UUID"),
        ([{"uuid": "GPU-1", "memory_mib": -1}], "memory_mib"),
        ([{"uuid": "GPU-1", "job": "x" * 64}], "job"),
        ([{"uuid": f"GPU-{i}"} for i in range(129)], "at most 128"),
    ],
)
def test_bad_gpu_units_are_refused(gpus: object, says: str) -> None:
    doc = {**json.loads(PoolNode("a", "10.0.0.1", 5000).to_json()), "gpus": gpus}
    with pytest.raises(CorruptStateError, match=says):
        PoolNode.from_json(json.dumps(doc))


def test_a_placement_is_a_whole_node_job_or_the_shares_of_the_jobs_sharing_it() -> None:
    assert read_placement("llama") == "llama"
    assert read_placement(share_text({"b": 2, "a": 1})) == {"a": 1, "b": 2}
    assert share_text({"b": 2, "a": 1}) == "a:1 b:2"
    for garbage in ("", "a:0", "a:1 a:2", "a:x", "../x:1", "a:1  b:2", "a:999"):
        assert read_placement(garbage) is None, garbage
    texts = placement_texts({"n1": "whole"}, {"n2": {"x": 1, "y": 7}, "n3": {}})
    assert texts == {"n1": "whole", "n2": "x:1 y:7"}  # a node no job shares holds nothing
    assert split_placements({**texts, "n4": "a:1 a:1"}) == (
        {"n1": "whole"},
        {"n2": {"x": 1, "y": 7}},
    )


def test_a_job_status_with_a_new_reason_is_the_status_replace_makes() -> None:
    status = PoolJob(PoolJobState.PENDING, seq=7, submitted_ms=1, reason="old", node_ms=5)
    changed = status.with_reason("needs 4 nodes, 2 free")
    assert changed == dataclasses.replace(status, reason="needs 4 nodes, 2 free")
    assert hash(changed) == hash(dataclasses.replace(status, reason="needs 4 nodes, 2 free"))
    assert status.reason == "old"  # the original unchanged
    assert PoolJob.from_json(changed.to_json()) == changed
    with pytest.raises(dataclasses.FrozenInstanceError):
        changed.reason = "x"  # type: ignore[misc]
