"""What every rank agrees on, in one collective: a verdict on a restore source (the ranks of a
job never load from different sources, nodeagent.worker.checkpointer), and whether any rank was told
something (to stop: GracefulExit; to leave the generation: Checkpointer.check)."""

from __future__ import annotations

from nodeagent.channel.restore import RefusalKind

Problem = tuple[RefusalKind, str]  # (why a source is refused, what is wrong)


def agree(problem: Problem | None) -> Problem | None:
    """Agreed by every rank: None if no rank has a problem, else this rank's own, or the first
    rank's, named, as this rank sees it (RefusalKind.seen_by_another_rank)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return problem
    # Plain strings go through the collective (pickled): no class of ours on the wire.
    said = None if problem is None else (problem[0].value, problem[1])
    gathered: list[tuple[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, said)
    if problem is not None:
        return problem
    for rank, found in enumerate(gathered):
        if found is not None:
            return RefusalKind(found[0]).seen_by_another_rank(), f"rank {rank}: {found[1]}"
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
