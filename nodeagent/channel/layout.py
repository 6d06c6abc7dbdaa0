"""Which ranks of a save a rank of another world reads, for a state sharded row-wise. No torch.

FSDP2 shards every parameter, and the optimizer's state with it, along dim 0 over the world:
rank r of a world of W holds rows [r*c, (r+1)*c) of a tensor of n rows, c = ceil(n / W)
(torch.chunk's split; the last ranks may hold fewer rows, or none). A rank of a new world then
reads only the old ranks whose rows overlap its own, for each tensor: at 4 -> 3, two old ranks
each, not four. The worker records in each save's manifest the distinct row counts of its
tensors (`dim0`) when the whole state is laid out so (every sharded tensor split along dim 0
over a one-dimensional mesh of the whole world, every other tensor whole on every rank);
otherwise nothing, and a rank of another world reads every old rank. Both the agent (what to
bring from peers) and the worker (what to verify and read) ask `reads` the same question.
"""

from __future__ import annotations

from collections.abc import Iterable


def rows(n: int, world: int, rank: int) -> range:
    """The rows of a tensor of `n` rows that rank `rank` of a world of `world` holds."""
    size = -(-n // world)
    start = min(rank * size, n)
    return range(start, min(start + size, n))


def needed(sizes: Iterable[int], saved_world: int, ranks: Iterable[int], world: int) -> list[int]:
    """The ranks of a save made at `saved_world`, its tensors of the row counts `sizes`, that
    ranks `ranks` of a world of `world` read. At least one: a tensor whole on every rank, and
    what is not a tensor, are in every rank's save."""
    wanted = list(ranks)
    found: set[int] = set()
    for n in set(sizes):
        size = -(-n // saved_world) if n else 1  # rows per old rank
        for rank in wanted:
            new = rows(n, world, rank)
            if new:  # old rank j holds rows [j*size, (j+1)*size)
                found.update(range(new.start // size, (new.stop - 1) // size + 1))
    return sorted(found) or [min(wanted, default=0) % max(saved_world, 1)]


def reads(
    saved_world: int, counts: Iterable[int] | None, ranks: Iterable[int], world: int
) -> list[int]:
    """The ranks of a save made at `saved_world` that ranks `ranks` of a world of `world` read:
    their own at the same world; at another, those whose rows overlap theirs where the save
    records its row counts (`counts`), else every one."""
    if saved_world == world:
        return list(ranks)
    if counts is None:
        return list(range(saved_world))
    return needed(counts, saved_world, ranks, world)
