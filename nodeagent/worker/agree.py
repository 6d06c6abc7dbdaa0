"""What every rank agrees on, in one collective: a verdict on a restore source (the ranks of a
job never load from different sources, nodeagent.worker.tiered), and whether any rank was told
something (to stop: GracefulExit; to leave the generation: Checkpointer.check)."""

from __future__ import annotations

from nodeagent.channel import tier

Problem = tuple[str, str]  # (tier.REFUSALS kind, what is wrong)


def agree(problem: Problem | None) -> Problem | None:
    """Agreed by every rank: None if no rank has a problem, else this rank's own, or the first
    rank's, named. Another rank's bad copy is not this rank's: it is said as absent here (the
    node that holds the copy reports it)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return problem
    gathered: list[Problem | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, problem)
    if problem is not None:
        return problem
    for rank, found in enumerate(gathered):
        if found is not None:
            kind = tier.BAD_STATE if found[0] == tier.BAD_STATE else tier.ABSENT
            return kind, f"rank {rank}: {found[1]}"
    return None


def any_rank(flag: bool) -> bool:
    """True on every rank as soon as `flag` is true on any (one all_reduce); `flag` itself
    without a process group."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    value = torch.tensor([1.0 if flag else 0.0])
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)
