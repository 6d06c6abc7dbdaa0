"""Whom an agent's peer watch follows, and what it reports (job/peers.py): on the in-memory
store, with a fake watch. No sockets, no Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from nodeagent.job import suspicion
from nodeagent.job.peers import PeerDuties
from nodeagent.job.peerwatch import Peer
from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.state import JobState, NodeState
from tests.helpers.factories import make_record
from tests.helpers.memstore import MemoryJobStore

T = TypeVar("T")


@dataclass
class FakeWatch:
    port: int = 4000
    token: str = "ab" * 8
    watched: list[tuple[Peer, ...]] = field(default_factory=list)
    silent: frozenset[str] = frozenset()

    def watch(self, peers: Iterable[Peer]) -> None:
        self.watched.append(tuple(peers))

    def suspects(self) -> frozenset[str]:
        return self.silent

    def tell(self, said: int, bits: int) -> None: ...

    def said(self) -> dict[str, tuple[int, int]]:
        return {}

    def fresh(self, within: float) -> frozenset[str]:
        return frozenset()


def call(fn: Callable[[], T], what: str) -> T:
    return fn()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def report(name: str, port: int = 5000) -> NodeReport:
    return NodeReport(
        name,
        f"10.0.0.{ord(name[0])}",
        NodeState.RUNNING,
        lease_ttl_ms=5000,
        watch_port=port,
        watch_token="cd" * 8,
    )


def setup(*names: str) -> tuple[MemoryJobStore, FakeWatch, PeerDuties, Clock]:
    clock = Clock()
    store = MemoryJobStore(now_ms=lambda: int(clock.now * 1000))
    for name in names:
        store.reports[name] = report(name)
        store.leases[name] = int(clock.now * 1000) + 60_000
    watch = FakeWatch()
    return store, watch, PeerDuties(watch, "a", store, call, 5.0, clock), clock


def running(generation: int, members: tuple[str, ...]) -> JobRecord:
    return make_record(JobState.RUNNING, generation, members)


def test_a_member_watches_the_others_from_their_reports_once_a_generation() -> None:
    store, watch, duties, _ = setup("a", "b", "c")
    store.record = running(3, ("a", "b", "c"))
    assert duties.tick(store.record) == []
    assert [p.name for p in watch.watched[-1]] == ["b", "c"]
    assert watch.watched[-1][0] == Peer("b", "10.0.0.98", 5000, "cd" * 8)
    duties.tick(store.record)
    assert len(watch.watched) == 1  # not again in the same generation


def test_a_new_suspect_is_said_once_and_stays_watched_while_its_lease_holds() -> None:
    store, watch, duties, clock = setup("a", "b", "c")
    store.record = running(3, ("a", "b", "c"))
    duties.tick(store.record)
    watch.silent = frozenset({"c"})
    events = duties.tick(store.record)
    assert [(e.type, e.node, e.message) for e in events] == [("peer_suspected", "a", "suspects c")]
    assert events[0].data == {"new": ["c"]}
    assert duties.suspects == ("c",)
    assert duties.tick(store.record) == []  # said once
    store.record = running(4, ("a", "b"))  # the job went on without c
    duties.tick(store.record)
    assert [p.name for p in watch.watched[-1]] == ["b", "c"]  # c still watched: still silent
    assert duties.suspects == ("c",)
    del store.leases["c"]  # its lease lapsed: the leases' business now
    clock.now += 5.0
    duties.tick(store.record)
    assert [p.name for p in watch.watched[-1]] == ["b"]
    assert not duties.suspects


def test_no_member_no_report_of_a_watch_or_a_large_job_watches_nobody() -> None:
    store, watch, duties, _ = setup("a", "b", "c")
    store.reports["c"] = report("c", port=0)  # an agent without the watch
    store.record = running(3, ("a", "b", "c"))
    duties.tick(store.record)
    assert [p.name for p in watch.watched[-1]] == ["b"]
    store.record = running(4, ("b", "c"))  # a is no member
    duties.tick(store.record)
    assert watch.watched[-1] == ()
    many = ("a", *(f"n{i}" for i in range(suspicion.MAX_WATCHED)))
    store.record = running(5, many)
    duties.tick(store.record)
    assert watch.watched[-1] == ()
