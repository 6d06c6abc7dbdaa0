"""The job listing (views/jobs.py: `nodeagentctl jobs`, GET /v1/jobs) against a real
redis-server: the running jobs alone are listed from their own specs and records, without the
queue's specs nor any node's report, and say what the whole listing says of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore, PoolWrite
from nodeagent.model.pool import PoolJobState, PoolNode
from nodeagent.model.spec import JobSpec, load_spec
from nodeagent.views import jobs as listing
from tests.helpers.cluster import RedisServer


def test_the_running_jobs_are_listed_as_the_whole_listing_lists_them(
    redis_server: RedisServer, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis_server.client()
    store = PoolStore(client, PoolKeys("nodeagent", job_id))
    try:
        for name, more in [
            ("train", {"priority": 5, "queue": "default", "user": "alice", "max_nodes": 2}),
            ("eval", {"user": "bob", "target_nodes": 1}),
            ("waits", {"user": "alice", "min_nodes": 9, "max_nodes": 9}),
        ]:
            spec = {"id": name, "entrypoint": ["true"], **more}
            store.submit(load_spec(spec))
        node = PoolNode(name="n1", address="10.0.0.1", lease_ttl_ms=600_000, labels={})
        store.sync_many([node, replace(node, name="n2"), replace(node, name="n3")])
        client.set(store.keys.leader, "n1 7", px=60_000)
        now = store.now_ms()
        statuses = store.read().jobs
        running = {
            j: statuses[j].moved(PoolJobState.RUNNING, now, "admitted") for j in ("train", "eval")
        }
        store.commit("n1 7", PoolWrite(place={"n1": "train", "n2": "train", "n3": "eval"},
                                       jobs=running))  # fmt: skip

        whole = [r for r in listing.jobs(store) if r["state"] == "running"]
        pages: list[object] = []
        real_page = store._read_page

        def page(*args: Any) -> Any:
            pages.append(args)
            return real_page(*args)

        monkeypatch.setattr(store, "_read_page", page)
        monkeypatch.setattr(store, "specs", _only(store.specs, {"train", "eval"}))
        alone = listing.jobs(store, state="running")
        assert _timeless(alone) == _timeless(whole)  # (each read at its own time)
        assert [r["job"] for r in alone] == ["eval", "train"]  # newest first
        assert alone[1]["nodes"] == 2 and alone[1]["priority"] == 5 and alone[1]["user"] == "alice"
        assert pages == []  # no node's report read
        bobs = listing.jobs(store, state="running", user="bob")
        assert _timeless(bobs) == _timeless(alone[:1])
    finally:
        client.close()


def _timeless(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "age_s"} for row in rows]


def _only(specs: Specs, wanted: set[str]) -> Specs:
    """The store's specs(), refusing to read any but `wanted`'s."""

    def read(ids: Sequence[str]) -> dict[str, JobSpec | str]:
        assert set(ids) <= wanted, f"read the specs of {sorted(set(ids) - wanted)}"
        return specs(ids)

    return read


Specs = Callable[[Sequence[str]], dict[str, "JobSpec | str"]]
