"""The persistent tier is never written over, nor pruned, by a node of an abandoned timeline
(a zombie: held out while alive, its old generation's saves copied before its lease fences
it): checkpoint/scan.py's persist and prune compare the generation each persisted rank
directory's manifest names (docs/design.md, "What changed in the fencing promise")."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.channel import manifests, tier
from nodeagent.checkpoint import scan
from nodeagent.model.tiers import Held
from tests.helpers.tiers import fake_save


def memory_save(tmp_path: Path, step: int, rank: int, generation: int) -> scan.Save:
    slot = tmp_path / "memory" / f"g{generation}" / f"rank-{rank}" / "slot-0"
    fake_save(slot, step, rank=rank, generation=generation)
    return scan.Save(slot, manifests.read_manifest(slot))


def persisted_generation(root: Path, step: int, rank: int) -> int | None:
    return scan.generation_there(tier.rank_dir(tier.step_dir(root, step), rank))


def test_a_zombie_never_writes_over_the_new_timelines_persisted_step(tmp_path: Path) -> None:
    root = tmp_path / "persist"
    scan.persist([memory_save(tmp_path, 30, r, generation=5) for r in (0, 1)], root)
    zombie = [memory_save(tmp_path, 30, 1, generation=4)]  # its rank 1 of generation 4

    with pytest.raises(scan.Superseded, match=r"step 30 of generation 4: .* generation 5's"):
        scan.persist(zombie, root)
    assert [persisted_generation(root, 30, r) for r in (0, 1)] == [5, 5]  # untouched


def test_a_newer_generation_writes_over_an_older_ones_step(tmp_path: Path) -> None:
    """The other way round is the job's own: the zombie's copy, or a rolled-back timeline's,
    replaced by the current timeline's save of the same step."""
    root = tmp_path / "persist"
    scan.persist([memory_save(tmp_path, 30, 0, generation=4)], root)
    scan.persist([memory_save(tmp_path, 30, 0, generation=5)], root)
    assert persisted_generation(root, 30, 0) == 5


def test_a_zombies_prune_leaves_the_new_timelines_steps(tmp_path: Path) -> None:
    """The zombie persisted step 40 of generation 4 and prunes, keeping 2: steps 20 and 10 of
    its ranks go, unless a node of generation 5 made them (the job went back to step 10 and
    saved 20 again)."""
    root = tmp_path / "persist"
    scan.persist([memory_save(tmp_path, 10, 0, generation=3)], root)
    scan.persist([memory_save(tmp_path, 20, 0, generation=5)], root)
    scan.persist([memory_save(tmp_path, 30, 0, generation=4)], root)
    scan.persist([memory_save(tmp_path, 40, 0, generation=4)], root)
    mine = [Held(40, 2, (0,), 4), Held(30, 2, (0,), 4)]

    kept = scan.prune(root, mine, keep=2, ranks=(0,), generation=4)
    assert [h.step for h in kept] == [40, 30]
    assert tier.steps(root) == [40, 30, 20]  # 10 (generation 3) pruned, 20 (generation 5) not
    scan.prune(root, mine, keep=2, ranks=(0,))  # without a generation: as before, 20 goes too
    assert tier.steps(root) == [40, 30]


def test_the_copy_as_the_jobs_user_refuses_it_too(tmp_path: Path) -> None:
    """The program a submitted job's copies run in (as its user: here this process's), its
    refusal told apart from a save saved over (its own exit status)."""
    import subprocess
    import sys
    from collections.abc import Sequence

    from nodeagent.checkpoint.persistcopy import AsJobUser

    def run(argv: Sequence[str], stdin: bytes) -> tuple[int, bytes]:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, timeout=60)
        return done.returncode, done.stdout

    root = tmp_path / "persist"
    scan.persist([memory_save(tmp_path, 30, 0, generation=5)], root)
    with pytest.raises(scan.Superseded, match="generation 5's"):
        AsJobUser(run, sys.executable).persist(
            [memory_save(tmp_path, 30, 0, generation=4)], root, -1, None
        )
    assert persisted_generation(root, 30, 0) == 5
