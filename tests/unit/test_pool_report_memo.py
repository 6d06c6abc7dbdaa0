"""coord/poolreplies.ReportMemo: a node's report is decoded once while its text stays the
same, again when it changes; garbage is still said for each read, and the memo is bounded.
Pure, no Redis."""

from __future__ import annotations

import pytest

from nodeagent.coord import poolreplies
from nodeagent.coord.poolreplies import ReportMemo, leases
from nodeagent.model.pool import PoolNode

NOW = 1_700_000_000_000


def report(name: str, serving: str | None = None) -> str:
    node = PoolNode(name=name, address="10.0.0.1", lease_ttl_ms=1000, labels={}, metrics="")
    return PoolNode(**{**node.__dict__, "serving": serving}).to_json()


def read(memo: ReportMemo, *raws: str) -> tuple[list[PoolNode | None], list[str]]:
    names = [f"n{i}" for i in range(len(raws))]
    flat = [x for name in names for x in (name, str(NOW + 5000))]
    garbage: list[str] = []
    found, _ = leases(NOW, flat, list(raws), garbage, memo.decode)
    return [lease.report for lease in found], garbage


def test_a_report_is_decoded_once_while_its_text_stays_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memo = ReportMemo()
    decoded: list[str] = []
    real = PoolNode.from_json

    def counting(raw: str) -> PoolNode:
        decoded.append(raw)
        return real(raw)

    monkeypatch.setattr(PoolNode, "from_json", staticmethod(counting))
    first, _ = read(memo, report("n0"), report("n1"))
    again, _ = read(memo, report("n0"), report("n1"))
    assert first == again and first[0] is again[0] and len(decoded) == 2
    moved, _ = read(memo, report("n0", serving="llama"), report("n1"))
    assert moved[0] is not None and moved[0].serving == "llama" and len(decoded) == 3


def test_garbage_is_said_at_every_read_and_the_memo_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memo = ReportMemo()
    for _ in range(2):
        found, garbage = read(memo, "{not json", report("other"))
        assert found == [None, None]
        assert len(garbage) == 2 and "its report names 'other'" in garbage[1], garbage
    monkeypatch.setattr(poolreplies, "MAX_REPORTS", 3)
    for i in range(10):
        read(memo, report("n0", serving=f"job{i}"))
    assert len(memo._by_text) <= 3
