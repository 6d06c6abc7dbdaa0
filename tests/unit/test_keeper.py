"""The agent's TierKeeper (nodeagent/checkpoint/keeper.py) on real files: what it reports, what
it copies, and a settle that hangs not holding the job up. Saves made by hand, no torch."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from nodeagent.channel import tier
from nodeagent.checkpoint.keeper import TierKeeper
from nodeagent.config.settings import CheckpointConfig
from tests.helpers.tiers import fake_save


def keeper(tmp_path: Path, clock: list[float] | None = None) -> TierKeeper:
    config = CheckpointConfig(
        memory_size=1 << 30,
        memory_dir=str(tmp_path / "shm"),
        persist_dir=str(tmp_path / "persist"),
        persist_every=2,
    )
    now = clock if clock is not None else [0.0]
    return TierKeeper(config, "n0", "j", clock=lambda: now[0])


def settle(k: TierKeeper, persist: bool) -> None:
    k.settle(persist)
    deadline = time.monotonic() + 10
    while k.settling and time.monotonic() < deadline:
        time.sleep(0.01)
        k.poll()


def test_it_reports_what_verifies_and_persists_the_newest_whole_step(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.prepare(None)
    for rank in (0, 1):
        fake_save(tier.slot_for_save(k.memory, rank), 10, rank=rank)
        fake_save(tier.slot_for_save(k.memory, rank), 12, rank=rank)
    bad = tier.newest_in_memory(k.memory, 1, step=10)
    assert bad is not None
    (bad / "__0_0.distcp").write_bytes(b"flipped")
    settle(k, persist=True)
    report = k.report()
    assert [(h.step, h.ranks) for h in report.memory] == [(12, (0, 1)), (10, (0,))]
    assert [(h.step, h.ranks) for h in report.persisted] == [(12, (0, 1))]
    assert tier.verify(tier.rank_dir(tier.step_dir(tmp_path / "persist", 12), 1)).step == 12
    assert any("checksum" in p or "bytes" in p for p in k.problems)
    k.remove()
    assert not k.memory.exists()


def test_a_settle_that_hangs_stops_holding_the_generation_up(tmp_path: Path) -> None:
    now = [0.0]
    k = keeper(tmp_path, now)
    k.prepare(None)
    settle(k, persist=False)
    release = threading.Event()

    def hang(persist: bool, _settle: bool) -> None:
        release.wait(30)

    k._work = hang  # type: ignore[method-assign]
    k.settle(persist=True)  # a persist_dir on a stuck mount
    assert k.settling
    now[0] = k.settle_timeout - 1
    assert k.settling
    now[0] = k.settle_timeout + 1
    assert not k.settling  # the job goes on; the copy may still finish
    assert any("more than 300s" in p for p in k.slow)
    release.set()
