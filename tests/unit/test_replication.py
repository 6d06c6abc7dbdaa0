"""Which copies of a job's saves go where, and which step is committed
(job/checkpoints/replication.py): pure tables over node reports."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nodeagent.config.checkpoint import load_checkpoint
from nodeagent.config.values import Section
from nodeagent.errors import ConfigError, CorruptStateError
from nodeagent.job.checkpoints import replication, restore
from nodeagent.model.handout import Handout
from nodeagent.model.job import NodeReport
from nodeagent.model.tiers import CheckpointRecord
from tests.helpers.tiers import reporting as node

W = 4  # world: one rank per node


def test_the_ring_spreads_copies_across_racks_and_keeps_the_order_without_them() -> None:
    members = ["a", "b", "c", "d", "e"]
    assert replication.ring(members, {}) == tuple(members)
    racks = {"a": "r1", "b": "r1", "c": "r1", "d": "r2", "e": "r2"}
    order = replication.ring(members, racks)
    assert sorted(order) == members
    neighbours = [(order[i], order[(i + 1) % 5]) for i in range(4)]  # the wrap may share one
    assert all(racks[x] != racks[y] for x, y in neighbours)


def test_each_node_sends_its_newest_whole_save_to_the_next_node_for_any_node_count() -> None:
    for count in (3, 4, 5):
        names = [chr(ord("a") + i) for i in range(count)]
        nodes = {n: node(n, {20: [i]}, world=count) for i, n in enumerate(names)}
        copies = replication.copies(names, nodes, 1)
        assert {(c.sources[0], c.target, c.rank) for c in copies} == {
            (n, names[(i + 1) % count], i) for i, n in enumerate(names)
        }


def test_a_step_is_committed_once_every_rank_is_on_k_plus_1_nodes() -> None:
    nodes = {n: node(n, {20: [i], 22: [i]}, {20: [(i - 1) % W]}) for i, n in enumerate("abcd")}
    held = replication.holdings(nodes)
    assert replication.committed(held, 1) == (20, 1, W)  # 22: one copy of each rank only
    assert replication.committed(held, 2) is None
    assert replication.committed(held, 1, bad=[20]) is None
    # a node cut off (not among the live reports) takes its copies with it
    del nodes["b"]
    assert replication.committed(replication.holdings(nodes), 1) is None


def test_after_a_node_loss_the_first_survivor_holding_its_ranks_copies_them_on() -> None:
    # c is lost: its rank 2 is on d only (c's successor), and rank 1, whose copy c held, on b
    nodes = {n: node(n, {20: [i]}, {20: [(i - 1) % W]}) for i, n in enumerate("abcd") if n != "c"}
    copies = replication.copies(["a", "b", "d"], nodes, 1, keep=(20, 1, W))
    assert [(c.rank, c.sources, c.target) for c in copies] == [(1, ("b",), "d"), (2, ("d",), "a")]


def test_a_node_brings_its_own_rank_at_the_same_world_and_every_rank_at_another() -> None:
    nodes = {n: node(n, {20: [i]}, {20: [(i - 1) % W]}) for i, n in enumerate("abd")}
    nodes["d"] = node("d", {20: [3]}, {20: [2]})  # d held c's rank 2 too
    four = ("a", "b", "x", "d")  # x replaces c: a is rank 0 of world 4 again
    same = replication.restore_fetches(four, 1, ["memory:20@1"], four, nodes)["a"]
    assert same == []  # a holds rank 0 already
    three = ("a", "b", "d")
    other = replication.restore_fetches(three, 1, ["memory:20@1", "start"], three, nodes)["a"]
    assert {(c.rank, c.sources[0]) for c in other} == {(1, "b"), (2, "d")}
    assert all(c.target == "a" and c.key == (20, 1, W) for c in other)
    alone = replication.restore_fetches(("a",), 1, ["persistent:20@1"], ("a",), nodes)
    assert alone == {"a": []}


def test_a_row_wise_save_brings_only_the_old_ranks_whose_rows_overlap() -> None:
    """c is lost, 4 -> 3, a 12-row tensor: a (new rank 0) reads old ranks 0 and 1 and holds 0
    and 3; b (new rank 1) reads 1 and 2 and holds 1 and 0; d (new rank 2) reads 2 and 3 and
    holds both."""
    nodes = {n: node(n, {20: [i]}, {20: [(i - 1) % W]}) for i, n in enumerate("abd")}
    nodes["d"] = node("d", {20: [3]}, {20: [2]})
    order, restore = ("a", "b", "d"), ["memory:20@1"]

    def brought(reports: dict[str, NodeReport]) -> dict[str, list[tuple[int, str]]]:
        fetched = replication.restore_fetches(order, 1, restore, order, reports)
        return {me: [(c.rank, c.sources[0]) for c in f] for me, f in fetched.items()}

    rows = {n: _with_rows(r, (12,)) for n, r in nodes.items()}  # the holders say the layout
    assert brought(rows) == {"a": [(1, "b")], "b": [(2, "d")], "d": []}
    every = brought(nodes)["d"]
    assert {rank for rank, _ in every} == {0, 1}  # no layout recorded: every rank it lacks
    # rank 0's node lost instead: b, c, d (new ranks 0, 1, 2) each hold the two they read
    alive = {n: node(n, {20: [i]}, {20: [(i - 1) % W]}) for i, n in enumerate("abcd") if i}
    members = ("b", "c", "d")
    rowed = {n: _with_rows(r, (12,)) for n, r in alive.items()}
    fetched = replication.restore_fetches(members, 1, restore, members, rowed)
    assert fetched == {"b": [], "c": [], "d": []}


def test_a_new_world_restores_the_newest_save_its_members_hold_whole_then_the_committed() -> None:
    """Saves outpace copies: 26 is on one node per rank only (d's rank 3 reached a before d was
    lost), 20 is committed. The new world of a, b, c tries 26 first, then 20, at any world."""
    nodes = {n: node(n, {26: [i], 20: [i]}, {20: [(i - 1) % W]}) for i, n in enumerate("abc")}
    nodes["a"] = node("a", {26: [0], 20: [0]}, {26: [3], 20: [3]})
    checkpoint = CheckpointRecord(
        replicas=1, committed_step=20, committed_generation=1, committed_world=W
    )
    chosen = restore.choose(checkpoint, ("a", "b", "c"), 1, nodes)
    assert chosen.restore == ("memory:26@1", "memory:20@1", "script", "start")
    # without replicas nothing brings a missing rank: only same-world memory steps are offered
    alone = restore.choose(CheckpointRecord(), ("a", "b", "c"), 1, nodes)
    assert alone.restore == ("script", "start")
    lost_a = {n: r for n, r in nodes.items() if n != "a"}  # a's ranks 0 and 3 go with it
    assert restore.choose(checkpoint, ("b", "c"), 1, lost_a).restore == ("script", "start")


def test_under_replicated_names_the_ranks_short_of_copies() -> None:
    nodes = {n: node(n, {20: [i]}, {20: [(i - 1) % W]}) for i, n in enumerate("abcd")}
    held = replication.holdings(nodes)
    assert replication.under_replicated(held, (20, 1, W), 1) == []
    del nodes["c"]
    assert replication.under_replicated(replication.holdings(nodes), (20, 1, W), 1) == [1, 2]


@pytest.mark.parametrize(
    ("section", "wrong"),
    [
        ({"replicas": 9}, "replicas: at most 8 peers"),
        ({"replicas": -1}, "replicas: must be >= 0"),
        ({"replication": {"max_rate": "fast"}}, "max_rate: expected bytes a second"),
        ({"replication": {"port": 70000}}, "port: must be a TCP port"),
        ({"replication": {"rate": 1}}, "replication.rate: unknown key"),
    ],
)
def test_a_bad_replication_setting_is_named(section: dict[str, object], wrong: str) -> None:
    with pytest.raises(ConfigError, match=wrong):
        load_checkpoint(Section({"memory_size": "1GiB", **section}, "job.checkpoint"))


def test_the_replication_settings_read_back() -> None:
    config = load_checkpoint(
        Section(
            {"memory_size": "1GiB", "replicas": 2, "replication": {"max_rate": "500MiB/s"}},
            "job.checkpoint",
        )
    )
    assert config is not None
    assert (config.replicas, config.max_rate, config.replica_port) == (2, 500 << 20, 0)
    default = load_checkpoint(Section({"memory_size": "1GiB"}, "job.checkpoint"))
    assert default is not None and (default.replicas, default.max_rate) == (1, 0)


@pytest.mark.parametrize(
    "tier",
    [
        {"replicas": [{"step": 1, "world_size": 2, "ranks": [0, 1], "digests": ["00"]}]},
        {"memory": [{"step": 1, "world_size": 2, "ranks": [0], "digests": ["zz" * 8]}]},
        {"address": "127.0.0.1"},
        {"address": "a b:80"},
    ],
)
def test_garbage_in_a_reported_tier_is_refused(tier: dict[str, object]) -> None:
    report = json.loads(node("a").to_json())
    report["tier"] = {**report["tier"], **tier}
    with pytest.raises(CorruptStateError):
        NodeReport.from_json(json.dumps(report))


def test_each_node_is_handed_its_share_and_the_peers_that_may_ask_it() -> None:
    """The leader's plan split by node: a sends rank 0 to b, b rank 1 to c, ...; c, lost
    before its restore at world 3, leaves its ranks for a and d to bring."""
    nodes = {n: node(n, {20: [i]}) for i, n in enumerate("abcd")}
    sends = replication.copies(list("abcd"), nodes, 1)
    shares = replication.handouts(7, nodes, sends)
    assert set(shares) == set("abcd")
    a = shares["a"]
    assert a.generation == 7
    assert [(t.rank, t.target, t.fetch) for t in a.transfers] == [(0, "b", False)]
    assert a.addresses == (("b", "127.0.0.1:7098"),)  # the peers its transfers name
    assert a.peers == ("d",)  # d sends it rank 3
    nodes = {n: node(n, {20: [i]}, {20: [(i - 1) % W]}) for i, n in enumerate("abcd") if n != "c"}
    members, restore = ("a", "b", "d"), ("memory:20@1",)
    fetched = replication.restore_fetches(members, 1, restore, members, nodes)
    assert {n: [(c.rank, c.sources) for c in f] for n, f in fetched.items()} == {
        "a": [(1, ("b",)), (2, ("d",))],  # no row counts reported: every rank it lacks
        "b": [(2, ("d",)), (3, ("a", "d"))],
        "d": [(0, ("a", "b")), (1, ("b",))],
    }
    rows = {n: _with_rows(r, (12,)) for n, r in nodes.items()}  # as the keeper reports them
    row_wise = replication.restore_fetches(members, 1, restore, members, rows)
    assert {n: [c.rank for c in f] for n, f in row_wise.items()} == {"a": [1], "b": [2], "d": []}
    shares = replication.handouts(8, nodes, [], fetched)
    assert set(shares) == {"a", "b", "d"}  # every member, an empty share too
    assert all(t.fetch and t.target == n for n, s in shares.items() for t in s.transfers)
    assert "a" in shares["b"].peers and "d" in shares["b"].peers  # both read b's rank 1
    # what each may fetch from b, and nothing else (issue 40)
    assert shares["b"].serves == (("a", 20, 1, 1), ("d", 20, 1, 0), ("d", 20, 1, 1))
    assert shares["a"].serves == (("b", 20, 1, 3), ("d", 20, 1, 0))
    assert Handout.from_json(shares["b"].to_json(), "copies b") == shares["b"]


def test_each_share_names_the_successors_a_scale_down_hands_the_stop_save_to() -> None:
    """The next k nodes of the ring with a listener (the ring wraps: d's is a), their addresses,
    and in their shares the predecessors that may send to them."""
    nodes = {n: node(n, {20: [i]}) for i, n in enumerate("abcd")}
    order = replication.ring(list("abcd"), {})
    after = replication.successors(order, 1, nodes)
    assert after == {"a": ("b",), "b": ("c",), "c": ("d",), "d": ("a",)}
    assert replication.successors(order, 2, nodes)["d"] == ("a", "b")
    assert replication.successors(order, 5, nodes)["a"] == ("b", "c", "d")  # not itself
    silent = node("b", {20: [1]})
    assert silent.tier is not None
    unreachable = {**nodes, "b": replace(silent, tier=replace(silent.tier, address=None))}
    assert replication.successors(order, 1, unreachable)["a"] == ("c",)  # b has no listener
    shares = replication.handouts(7, nodes, [], {}, after)
    assert set(shares) == set("abcd")  # every member: nothing to send yet, a successor still
    d = shares["d"]
    assert (d.transfers, d.successors, d.addresses) == ((), ("a",), (("a", "127.0.0.1:7097"),))
    assert shares["a"].peers == ("d",)  # d may send it its stop save
    assert Handout.from_json(d.to_json(), "copies d") == d
    assert replication.successors(("a",), 1, nodes) == {"a": ()}  # alone: nobody to hand to


def test_a_share_reads_back_and_garbage_is_refused_naming_it() -> None:
    nodes = {n: node(n, {20: [i]}) for i, n in enumerate("abcd")}
    share = replication.handouts(7, nodes, replication.copies(list("abcd"), nodes, 1))["a"]
    assert Handout.from_json(share.to_json(), "copies a") == share
    good = json.loads(share.to_json())
    wrongs: list[tuple[dict[str, object], str]] = [
        ({"generation": -1}, "generation"),
        ({"transfers": [[20, 1, 4, 4, "0" * 16, ["a"], "b", False]]}, "rank 4 is not a rank"),
        ({"transfers": [[20, 1, 4, 0, "x", ["a"], "b", False]]}, "digest"),
        ({"transfers": [[20, 1, 4, 0, "0" * 16, [], "b bad", False]]}, "node names"),
        ({"addresses": {"b": "nowhere"}}, "host:port"),
        ({"peers": ["a", "a"]}, "distinct"),
        ({"successors": "b"}, "successors"),
        ({"serves": [["a", 20, 1]]}, "serves"),
        ({"serves": [["a b", 20, 1, 0]]}, "serves"),
        ({"serves": [["a", 20, 1, -1]]}, "serves"),
    ]
    for wrong, what in wrongs:
        with pytest.raises(CorruptStateError, match=what):
            Handout.from_json(json.dumps({**good, **wrong}), "copies a")


def _with_rows(report: NodeReport, rows: tuple[int, ...]) -> NodeReport:
    assert report.tier is not None
    tier = replace(
        report.tier,
        memory=tuple(replace(h, rows=rows) for h in report.tier.memory),
        replicas=tuple(replace(h, rows=rows) for h in report.tier.replicas),
    )
    return replace(report, tier=tier)


def test_at_a_scale_down_the_successors_are_the_nodes_that_stay() -> None:
    """6 -> 3 with one copy: d's and e's ring successors leave too. A node that stays hands to
    the next that stays; the nodes that leave are dealt out over those that stay, one each."""
    names = list("abcdef")
    nodes = {n: node(n, {20: [i]}, world=6) for i, n in enumerate(names)}
    order = replication.ring(names, {})
    after = replication.successors(order, 1, nodes, staying=("a", "b", "c"))
    assert after == {"a": ("b",), "b": ("c",), "c": ("a",), "d": ("a",), "e": ("b",), "f": ("c",)}
    two = replication.successors(order, 2, nodes, staying=("a", "c"))
    assert (two["a"], two["c"]) == (("c",), ("a",))  # never itself
    assert (two["b"], two["d"], two["e"]) == (("a", "c"), ("c", "a"), ("a", "c"))
    assert replication.successors(order, 1, nodes, staying=()) == {n: () for n in names}
    big = [f"n{i:05}" for i in range(10_000)]  # halving a large job: one node's saves each
    many = {n: node(n, {20: [0]}) for n in big}
    dealt = replication.successors(big, 1, many, staying=big[:5000])
    assert sorted(dealt[n][0] for n in big[5000:]) == big[:5000]
