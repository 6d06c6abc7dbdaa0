"""channel/layout.py: which old ranks a rank of a new world reads, for row-wise shards."""

from __future__ import annotations

import pytest

from nodeagent.channel import layout


def chunk_rows(n: int, world: int) -> list[range]:
    """torch.chunk's split of n rows (what FSDP2 shards by), computed another way: the first
    ranks take ceil(n / world) rows each until the rows run out."""
    size = -(-n // world)
    out, start = [], 0
    for _ in range(world):
        stop = min(start + size, n)
        out.append(range(start, stop))
        start = stop
    return out


@pytest.mark.parametrize("n", [1, 3, 5, 8, 12, 13, 1000, 1001])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_rows_are_torch_chunks_split(n: int, world: int) -> None:
    assert [layout.rows(n, world, r) for r in range(world)] == chunk_rows(n, world)


def test_four_to_three_reads_two_old_ranks_each() -> None:
    assert [layout.needed([12], 4, [r], 3) for r in range(3)] == [[0, 1], [1, 2], [2, 3]]
    # the union over every tensor: 13 rows split 4/4/4/1 at world 4 and 5/5/3 at world 3
    assert layout.needed([12, 13], 4, [1], 3) == [1, 2]
    assert layout.needed([12], 4, [0, 1, 2], 3) == [0, 1, 2, 3]


def test_growing_reads_one_or_two_old_ranks() -> None:
    assert [layout.needed([12], 3, [r], 4) for r in range(4)] == [[0], [0, 1], [1, 2], [2]]


def test_a_state_with_no_rows_for_the_rank_reads_one_old_rank() -> None:
    """Every tensor whole on every rank (DDP), or no rows of any for this rank: one save
    holds what it reads (whole tensors and non-tensor values are in every rank's save)."""
    assert layout.needed([], 4, [2], 3) == [2]
    assert layout.needed([2], 4, [2], 3) == [2]  # 2 rows: ranks 0 and 1 hold them, 2 reads none
    assert layout.needed([2], 4, [1], 3) == [1]
    assert layout.needed([], 4, [5], 6) == [1]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 12, 13, 100, 1001])
@pytest.mark.parametrize(("saved_world", "world"), [(4, 3), (3, 4), (4, 2), (2, 5), (7, 3)])
def test_needed_is_every_old_rank_whose_rows_overlap(n: int, saved_world: int, world: int) -> None:
    """Against the definition, rank by rank, for one tensor."""
    for rank in range(world):
        new = set(layout.rows(n, world, rank))
        overlapping = [
            old for old in range(saved_world) if new & set(layout.rows(n, saved_world, old))
        ]
        assert layout.needed([n], saved_world, [rank], world) == (
            overlapping or [rank % saved_world]
        )
