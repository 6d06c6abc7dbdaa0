"""A node bringing a save from its peers before its workers restore it (nodeagent/checkpoint/
replicas.py, nodeagent/job/checkpoints/replicaduties.py): two real replica listeners on
loopback, real files.

A peer that turns a fetch down may only not have read yet that the asker is a member of the
job's new generation (it reads at its next tick, the asker asks at once): it is asked again, a
while; a copy that does not match what its holder reported is not. The peer asked reads the
members and the asker's report again itself before it says no.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from nodeagent.channel import fetching, manifests, tier
from nodeagent.checkpoint import replicas as peers
from nodeagent.checkpoint.replicas import Done, Replicas
from nodeagent.checkpoint.transport import Offer
from nodeagent.checkpoint.wire import Want
from nodeagent.coord.bounded import unbounded
from nodeagent.errors import CoordinationError
from nodeagent.job.checkpoints import replicaduties as copies_module
from nodeagent.job.checkpoints import replication
from nodeagent.job.checkpoints.replicaduties import ReplicaDuties
from nodeagent.model.handout import Handout, Transfer
from nodeagent.model.job import NodeReport
from nodeagent.model.tiers import CheckpointRecord, Held, TierReport
from nodeagent.state import JobState, NodeState
from nodeagent.telemetry.checkpoints import CheckpointMetrics
from tests.helpers.factories import make_record
from tests.helpers.tiers import CopyState, fake_save, node_replicas, terms

JOB = "j"
KEY = (30, 3, 2)  # step 30, saved by generation 3, world 2


@pytest.fixture(autouse=True)
def quick_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "FETCH_PAUSE_S", 0.05)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Replicas]:
    """Node a, whose memory tier holds rank 0 of step 30@3."""
    with node_replicas(tmp_path, "a") as made:
        yield made


@pytest.fixture
def asker(tmp_path: Path) -> Iterator[Replicas]:
    """Node c, which fetches it."""
    with node_replicas(tmp_path, "c", lambda _offer: "c takes no copies in these tests") as made:
        yield made


def saved(holder: Replicas, rank: int = 0) -> str:
    """Rank `rank` of step 30@3 saved in the holder's memory tier; its digest."""
    slot = tier.slots(holder.memory, rank)[0]
    fake_save(slot, KEY[0], rank=rank, world=KEY[2], generation=KEY[1], size=100_000)
    return manifests.digest(manifests.read_manifest(slot))


def fetched(asker: Replicas, digest: str, holder: Replicas, deadline: float | None = None) -> Done:
    assert holder.address is not None
    transfer = Transfer(KEY, 0, digest, ("a",), "c", fetch=True)
    assert asker.run([transfer], {"a": holder.address}, 4, deadline)
    [done] = finished(asker)
    return done


def finished(replicas: Replicas) -> list[Done]:
    """What `replicas` made, once its transfers ended (30 s at most)."""
    wait = time.monotonic() + 30
    while replicas.busy and time.monotonic() < wait:
        time.sleep(0.01)
    return replicas.take_done()


def answers(*said: str | None) -> tuple[Callable[[Offer], str | None], list[Offer]]:
    """An accept that answers `said` in turn (the last one from then on); the offers it saw."""
    seen: list[Offer] = []

    def accept(offer: Offer) -> str | None:
        seen.append(offer)
        return said[min(len(seen), len(said)) - 1]

    return accept, seen


def test_a_holder_that_turned_a_fetch_down_is_asked_again_until_it_serves_it(
    holder: Replicas, asker: Replicas
) -> None:
    accept, seen = answers("c is not a peer the leader named to a", None)
    holder.listen(accept)
    digest = saved(holder)
    done = fetched(asker, digest, holder)
    assert done.error is None and done.refused == ()  # a refusal is not a bad copy
    assert len(seen) == 2 and all(o.want == Want(0, *KEY[:2]) for o in seen)
    slot = tier.find_save(None, asker.area, 0, KEY[0], KEY[1])
    assert slot is not None and manifests.digest(manifests.verify(slot)) == digest
    assert [(h.step, h.generation, h.ranks) for h in asker.held()] == [(30, 3, (0,))]


def test_a_holder_that_keeps_turning_it_down_is_given_up_on_with_its_reason(
    holder: Replicas, asker: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers, "FETCH_ROUNDS", 3)
    accept, seen = answers("c is not a member of the job as a knows it")
    holder.listen(accept)
    done = fetched(asker, saved(holder), holder)
    assert done.error is not None and "c is not a member of the job" in done.error
    assert len(seen) == 3
    assert tier.find_save(None, asker.area, 0, KEY[0], KEY[1]) is None


def test_a_holder_that_keeps_turning_it_down_is_not_asked_past_the_restores_deadline(
    holder: Replicas, asker: Replicas
) -> None:
    """The restore waits for its fetches until fetch_timeout: the rounds of asking again end
    there too, not FETCH_ROUNDS pauses later."""
    accept, seen = answers("c is not a member of the job as a knows it")
    holder.listen(accept)
    digest = saved(holder)
    done = fetched(asker, digest, holder, deadline=time.monotonic() + 4 * peers.FETCH_PAUSE_S)
    assert done.error is not None and "c is not a member of the job" in done.error
    assert 1 <= len(seen) <= 5 < peers.FETCH_ROUNDS  # a round a pause: 4 pauses, 5 asks


def test_a_fetch_waits_for_a_copy_of_the_same_rank_this_node_is_receiving(
    holder: Replicas, asker: Replicas
) -> None:
    """The holder is sending its copy of that rank here as the restore needs it: the fetch is
    tried again once the copy under way ended, not given up on."""
    accept, seen = answers(None)
    holder.listen(accept)
    digest = saved(holder)
    server = asker._server
    assert server is not None
    receiving = server.reserve("a", 0)
    receiving.__enter__()
    threading.Timer(0.3, receiving.__exit__, (None, None, None)).start()
    done = fetched(asker, digest, holder)
    assert done.error is None and len(seen) == 1  # asked once the place was free


def test_cancelling_the_copies_stops_a_paced_send_mid_file(
    holder: Replicas, tmp_path: Path
) -> None:
    """A new generation needs the node's restore (job/checkpoints/replicaduties.py cancels the
    copies under way): a save being sent at a low rate stops at its next slice, not at its end, 10 s
    later."""
    with node_replicas(tmp_path, "d", lambda _offer: None) as taker:
        assert taker.address is not None
        slot = tier.slots(holder.memory, 0)[0]
        fake_save(slot, KEY[0], rank=0, world=KEY[2], generation=KEY[1], size=2_000_000)
        digest = manifests.digest(manifests.read_manifest(slot))
        holder.max_rate = 200_000
        holder.listen(lambda _offer: None)
        copy = Transfer(KEY, 0, digest, ("a",), "d")
        assert holder.run([copy, copy], {"d": taker.address}, 4)
        threading.Timer(0.3, holder.cancel).start()
        first, second = finished(holder)
        assert first.error is not None and "cancelled after" in first.error, first
        assert second.error == "cancelled: a new generation"  # not begun
        assert tier.find_save(None, taker.area, 0, KEY[0], KEY[1]) is None  # nothing of it kept


def test_the_workers_are_told_while_their_generations_saves_are_being_brought(
    holder: Replicas, asker: Replicas
) -> None:
    """The workers start as the fetch runs; their restore waits on the note (channel/
    fetching.py), which names the generation while the fetch is under way, and is gone once
    it ended."""
    accept, _seen = answers(None)
    holder.listen(accept)
    digest = saved(holder)
    server = asker._server
    assert server is not None and holder.address is not None
    receiving = server.reserve("a", 0)  # holds the fetch back a moment
    receiving.__enter__()
    transfer = Transfer(KEY, 0, digest, ("a",), "c", fetch=True)
    assert asker.run([transfer], {"a": holder.address}, 4, time.monotonic() + 30)
    assert json.loads((asker.area / fetching.NOTE).read_text())["generation"] == 4
    assert fetching.wait(asker.area, 3) < 0.05  # another generation's workers do not wait
    threading.Timer(0.3, receiving.__exit__, (None, None, None)).start()
    assert fetching.wait(asker.area, 4) > 0  # until the fetch ended: then the save is here
    assert tier.find_save(None, asker.area, 0, KEY[0], KEY[1]) is not None
    assert not (asker.area / fetching.NOTE).exists()
    [done] = asker.take_done()
    assert done.error is None


def test_a_copy_that_is_not_the_save_its_holder_reported_is_not_asked_for_again(
    holder: Replicas, asker: Replicas
) -> None:
    accept, seen = answers(None)
    holder.listen(accept)
    saved(holder)
    done = fetched(asker, "0" * 16, holder)
    assert done.error is not None and "not the save its holder reported" in done.error
    assert len(seen) == 1  # the same copy again would not match either


def report(name: str, address: str = "127.0.0.1") -> NodeReport:
    held = Held(KEY[0], KEY[2], (1,), KEY[1], ("d1",))
    tiers = TierReport(memory=(held,), address=f"{address}:1")
    return NodeReport(name, address, NodeState.RUNNING, tier=tiers)


def duties(
    holder: Replicas,
    share: Callable[[], Handout | None],
    reports: dict[str, NodeReport] | None = None,
    wait: float = 30,
    node: str = "a",
    clock: Callable[[], float] = time.monotonic,
) -> ReplicaDuties:
    """`node`'s duties around `holder`, reading `share` and, for a request, `reports`."""

    return ReplicaDuties(
        holder,
        CopyState(share, reports),
        unbounded,
        terms(node, share_wait=wait),
        metrics=CheckpointMetrics(JOB, CollectorRegistry()),
        clock=clock,
    )


def test_a_peer_named_in_a_share_this_node_has_not_read_yet_is_served(
    holder: Replicas,
) -> None:
    """Nothing read yet (the loop reads at its next tick): the share and the asker's report
    are read at the request."""
    share: Handout | None = Handout(4, peers=("b",))
    copies = duties(holder, lambda: share, {"a": report("a"), "c": report("c")})
    want = Offer("c", "127.0.0.1", want=Want(1, *KEY[:2]))
    assert copies.accept(want) == "c is not a peer the leader named to a"
    share = Handout(5, peers=("b", "c"))  # the new generation's share names c
    assert copies.accept(want) is None
    elsewhere = Offer("c", "10.9.9.9", want=Want(1, *KEY[:2]))
    assert copies.accept(elsewhere) == "c reports address 127.0.0.1, the request came from 10.9.9.9"


def a_and_c(
    holder: Replicas, asker: Replicas
) -> tuple[dict[str, TierReport], dict[str, NodeReport]]:
    """a (listening, all accepted) holds rank 0 of step 30 alone, c rank 1: their tiers and
    reports."""
    holder.listen(lambda _offer: None)
    mine = Held(KEY[0], KEY[2], (0,), KEY[1], (saved(holder),))
    tiers = {
        "a": TierReport(memory=(mine,), address=holder.address),
        "c": TierReport(
            memory=(Held(KEY[0], KEY[2], (1,), KEY[1], ("d1",)),), address=asker.address
        ),
    }
    reports = {n: NodeReport(n, "127.0.0.1", NodeState.RUNNING, tier=t) for n, t in tiers.items()}
    return tiers, reports


def test_copies_wait_until_this_nodes_workers_restored_the_new_generation(
    holder: Replicas, asker: Replicas
) -> None:
    """Re-protecting (a's rank 0 of step 30 is on a alone) does not start beside the workers'
    restore, the recovery's critical path: only once they said they restored."""
    tiers, reports = a_and_c(holder, asker)
    sends = replication.copies(("a", "c"), reports, 1)
    shares = replication.handouts(4, reports, sends)  # as the leader hands them out
    copies = duties(holder, lambda: shares["a"], reports)
    checkpoint = CheckpointRecord(restore=("persistent:20@3", "start"), replicas=1)
    record = make_record(JobState.RUNNING, 4, ("a", "c"), checkpoint=checkpoint)
    assert not copies.holds_start(record)  # nothing to bring: the workers start at once
    copies.tick(record, tiers["a"])
    assert not holder.busy and holder.take_done() == []  # the workers are restoring
    copies.restored(20, 4)
    copies.tick(record, tiers["a"])
    [done] = finished(holder)
    assert (done.transfer.rank, done.transfer.target) == (0, "c")


def test_a_share_naming_a_strangers_address_for_a_member_is_ignored_not_dialled(
    holder: Replicas, asker: Replicas, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 40: the share is written by whoever holds the agents' Redis password; one that
    gives member c the address of a stranger's listener (here a socket that counts the
    connections it gets) has the node dial nobody there; with c's own address it dials c."""
    tiers, reports = a_and_c(holder, asker)
    with socket.create_server(("127.0.0.1", 0)) as stranger:
        stranger.settimeout(0.5)
        forged = dict(replication.handouts(4, reports, replication.copies(("a", "c"), reports, 1)))
        forged["a"] = replace(
            forged["a"], addresses=(("c", f"127.0.0.1:{stranger.getsockname()[1]}"),)
        )
        written, now = [forged["a"]], [100.0]
        copies = duties(holder, lambda: written[0], reports, clock=lambda: now[0])
        record = make_record(JobState.RUNNING, 4, ("a", "c"), checkpoint=CheckpointRecord())
        copies.tick(record, tiers["a"])  # sees a's save: its report goes out, no read yet
        now[0] += 0.25
        copies.tick(record, tiers["a"])
        [done] = finished(holder)
        assert done.error is not None and "its listener is not known" in done.error
        with pytest.raises(TimeoutError):
            stranger.accept()
    assert "ignoring c at 127.0.0.1:" in caplog.text
    written[0] = replace(forged["a"], addresses=(("c", str(asker.address)),))
    now[0] += copies_module.IDLE_S  # the share's next read
    copies.tick(record, tiers["a"])
    [done] = finished(holder)  # c's own listener, which takes no copies in these tests
    assert done.error is not None and "c takes no copies" in done.error, done.error


def test_the_workers_of_a_memory_restore_wait_for_this_nodes_share_then_start(
    holder: Replicas, asker: Replicas
) -> None:
    """c lacks rank 1 of the step its workers restore: they wait until c reads its share of
    the generation (the leader writes it as it writes the record), and the fetch it names
    brings the save as they start."""
    holder.listen(lambda _offer: None)
    held = Held(KEY[0], KEY[2], (0, 1), KEY[1], (saved(holder, 0), saved(holder, 1)))
    reports = {
        "a": NodeReport(
            "a", "127.0.0.1", NodeState.RUNNING, tier=TierReport((held,), address=holder.address)
        ),
        "c": NodeReport(
            "c", "127.0.0.1", NodeState.RUNNING, tier=TierReport(address=asker.address)
        ),
    }
    checkpoint = CheckpointRecord(restore=(f"memory:{KEY[0]}@{KEY[1]}", "start"), replicas=1)
    record = make_record(JobState.RUNNING, 5, ("a", "c"), checkpoint=checkpoint)
    fetches = replication.restore_fetches(("a", "c"), 1, checkpoint.restore, ("a", "c"), reports)
    assert [(f.rank, f.sources) for f in fetches["c"]] == [(1, ("a",))] and fetches["a"] == []
    written: list[Handout] = []
    copies = duties(asker, lambda: written[0] if written else None, reports, wait=30, node="c")
    assert copies.holds_start(record) and copies.waiting  # no share yet: the workers wait
    # the share of the scale-down's announcement (same generation, nothing to bring) is not it
    written.append(replication.handouts(5, reports, [], {}, {"c": ("a",)}, announced=True)["c"])
    time.sleep(copies_module.WAIT_READ_S * 1.5)
    assert copies.holds_start(record) and copies.waiting
    written[0] = replication.handouts(5, reports, [], fetches)["c"]
    deadline = time.monotonic() + 5
    while copies.holds_start(record) and time.monotonic() < deadline:
        time.sleep(0.02)  # read again WAIT_READ_S later
    assert not copies.waiting
    assert fetching.wait(asker.area, 5) > 0
    assert tier.find_save(None, asker.area, 1, KEY[0], KEY[1]) is not None
    [done] = asker.take_done()
    assert done.error is None and done.transfer.fetch


def test_workers_whose_share_never_comes_start_without_it(holder: Replicas) -> None:
    checkpoint = CheckpointRecord(restore=(f"memory:{KEY[0]}@{KEY[1]}", "start"), replicas=1)
    record = make_record(JobState.RUNNING, 5, ("a", "c"), checkpoint=checkpoint)
    now = [100.0]
    last = Handout(4)  # the last generation's share: not this one's
    copies = duties(holder, lambda: last, wait=10, clock=lambda: now[0])
    assert copies.holds_start(record)
    now[0] += 9.9
    assert copies.holds_start(record)
    now[0] += 0.2
    assert not copies.holds_start(record) and not copies.waiting
    assert not copies.holds_start(record)  # the generation's start is decided once
    unplanned = replace(record, generation=6, checkpoint=replace(checkpoint, replicas=0))
    assert not copies.holds_start(unplanned)  # its leader plans no copies: nothing to wait for


def test_a_request_is_turned_down_naming_why_when_the_share_cannot_be_read(
    holder: Replicas,
) -> None:
    def unreadable() -> Handout | None:
        raise CoordinationError("redis at 127.0.0.1:1 is unreachable")

    copies = duties(holder, unreadable, {})
    why = copies.accept(Offer("c", "127.0.0.1", want=Want(1, *KEY[:2])))
    assert why == (
        "c is not a peer the leader named to a "
        "(and it cannot be read now: redis at 127.0.0.1:1 is unreachable)"
    )


def test_a_node_reads_its_share_each_second_while_its_newest_save_is_not_committed(
    holder: Replicas,
) -> None:
    """Every read is a round trip to Redis: once its newest save is committed (and the copies
    of its last share made), a node reads its share every IDLE_S only; after a new save, not at
    the tick that saw it (its report goes out then), at each of the EAGER_TICKS next ticks
    while no share names its copies (the leader plans them at its next round), then every
    PLAN_S."""
    now, reads = [100.0], []

    def share() -> Handout | None:
        reads.append(now[0])
        return Handout(4)

    copies = duties(holder, share, wait=10, clock=lambda: now[0])
    committed = CheckpointRecord(
        replicas=1, committed_step=KEY[0], committed_generation=KEY[1], committed_world=KEY[2]
    )
    record = make_record(JobState.RUNNING, 4, ("a", "c"), checkpoint=committed)
    own = TierReport(memory=(Held(KEY[0], KEY[2], (0,), KEY[1], ("0" * 16,)),))
    newer = TierReport(memory=(Held(KEY[0] + 5, KEY[2], (0,), KEY[1], ("1" * 16,)),))
    for tiers in (own, own, newer, newer):
        for _ in range(20):  # 10 s of ticks, a tick every half second
            copies.tick(record, tiers)
            now[0] += 0.5
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(reads)]
    assert reads[0] == 100.5 and reads[3] == 121.0  # the ticks that saw a new save: no read
    eager = [0.5] * (copies_module.EAGER_TICKS - 1)
    then = gaps[2 + len(eager) :]
    assert gaps[: 2 + len(eager)] == [copies_module.IDLE_S] * 2 + eager
    assert then == [copies_module.PLAN_S] * len(then) and len(then) >= 10


def test_the_peers_a_share_names_are_served_without_reading_it_again(holder: Replicas) -> None:
    reads: list[int] = []

    def share() -> Handout | None:
        reads.append(1)
        return Handout(4, peers=("c",))

    copies = duties(holder, share, {"c": report("c")})
    record = make_record(JobState.RUNNING, 4, ("a", "c"), checkpoint=CheckpointRecord(replicas=1))
    copies.tick(record, TierReport())
    assert len(reads) == 1
    want = Offer("c", "127.0.0.1", want=Want(1, *KEY[:2]))
    assert copies.accept(want) is None  # its report read once, the share not again
    assert copies.accept(want) is None and len(reads) == 1


def test_a_named_peer_fetches_only_what_the_plan_has_it_fetch_from_this_node(
    holder: Replicas,
) -> None:
    """Issue 40: being a member named to this node let a peer fetch any save it holds (any
    rank, any step); now only the (rank, step) the leader's plan has it bring from here."""
    planned = ("c", KEY[0], KEY[1], 1)
    share = Handout(4, peers=("b", "c"), serves=(planned,))
    copies = duties(holder, lambda: share, {"a": report("a"), "c": report("c")})
    assert copies.accept(Offer("c", "127.0.0.1", want=Want(1, *KEY[:2]))) is None
    other_rank = Offer("c", "127.0.0.1", want=Want(0, *KEY[:2]))
    assert copies.accept(other_rank) == (
        f"the leader's plan does not have c fetch rank 0 of step {KEY[0]}@{KEY[1]} from a"
    )
    older = Offer("c", "127.0.0.1", want=Want(1, KEY[0] - 10, KEY[1]))
    assert copies.accept(older) is not None
    assert copies.accept(Offer("b", "127.0.0.1", want=Want(1, *KEY[:2]))) is not None


def test_replication_behind_fires_when_saves_outpace_the_copies_and_clears_after(
    holder: Replicas,
) -> None:
    """Issue 41: with the committed save pinned, the two slots say nothing of skipped saves;
    the first member says `replication_behind` once the newest save waited for its commit
    longer than a save interval, while copies are still under way, and `replication_caught_up`
    once it is committed."""
    clock = [0.0]
    copies = duties(holder, lambda: None, {}, clock=lambda: clock[0])

    def tick(newest: int, committed: int | None) -> list[str]:
        checkpoint = CheckpointRecord(
            replicas=1,
            committed_step=committed,
            committed_generation=3,
            committed_world=2,
        )
        record = make_record(JobState.RUNNING, 4, ("a", "c"), checkpoint=checkpoint)
        own = TierReport(memory=(Held(newest, 2, (0,), 3),))
        return [e.type for e in copies.tick(record, own)]

    assert tick(10, None) == []  # one save seen: no interval yet
    clock[0] = 5.0
    assert tick(15, 10) == []
    clock[0] = 10.0
    assert tick(20, 15) == []  # step 20's copies under way
    clock[0] = 17.0
    assert tick(20, 15) == []  # within an interval and a half
    clock[0] = 18.0
    assert tick(20, 15) == ["replication_behind"]  # step 25 found no slot: skipped
    clock[0] = 19.0
    assert tick(20, 15) == []  # said once
    assert tick(20, 20) == ["replication_caught_up"]
