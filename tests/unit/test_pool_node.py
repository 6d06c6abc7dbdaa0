"""The node's pool report: what it says round-trips, what another agent version left out reads
as absent, and garbage is refused."""

from __future__ import annotations

import json

import pytest

from nodeagent.errors import CorruptStateError
from nodeagent.model.pool import PoolNode


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
