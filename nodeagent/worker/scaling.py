"""Hyperparameters for a world size other than the one a checkpoint was trained at.

Elastic jobs resume at another world size; Paddle's documentation asks users to rescale the
learning rate by hand. `rescale` does it: by default the linear scaling rule (per-rank batch
kept, learning rate proportional to the global batch); or keep the global batch constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rescaled:
    lr: float
    per_rank_batch: int


Policy = Callable[[float, int, int, int], Rescaled]


def linear(lr: float, per_rank_batch: int, old_world: int, new_world: int) -> Rescaled:
    """Same per-rank batch; learning rate scaled with the global batch (Goyal et al., 2017)."""
    return Rescaled(lr * new_world / old_world, per_rank_batch)


def keep_global_batch(lr: float, per_rank_batch: int, old_world: int, new_world: int) -> Rescaled:
    """Same global batch (rounded up to a multiple of the new world); learning rate kept."""
    return Rescaled(lr, math.ceil(per_rank_batch * old_world / new_world))


POLICIES: dict[str, Policy] = {"linear": linear, "keep_global_batch": keep_global_batch}


def rescale(
    lr: float,
    per_rank_batch: int,
    old_world: int,
    new_world: int,
    policy: str | Policy = "linear",
) -> Rescaled:
    """Learning rate and per-rank batch for `new_world`, from values tuned at `old_world`.

    Raises:
        ValueError: a world size below 1, or an unknown policy name.
    """
    if old_world < 1 or new_world < 1:
        raise ValueError(f"world sizes must be >= 1, got {old_world} -> {new_world}")
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(
                f"unknown policy {policy!r}; use one of {sorted(POLICIES)} or a callable"
            )
        policy = POLICIES[policy]
    return policy(lr, per_rank_batch, old_world, new_world)
