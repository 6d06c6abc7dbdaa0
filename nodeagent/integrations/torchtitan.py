"""torchtitan: its checkpoint manager pointed at the memory tier, for FSDP2/TP jobs.

torchtitan (0.3) builds its checkpoint manager from the trainer config's `checkpoint` section,
any `BaseCheckpointManager` subclass's `Config`. Put this one there:

    from nodeagent.integrations.torchtitan import NodeagentCheckpointManager

    config.checkpoint = NodeagentCheckpointManager.Config(enable=True, interval=10)

and torchtitan's Trainer, on every rank:

- restores, at `train()`'s start, what the leader chose for this generation (the memory tier
  of this node or its peers, the persistent tier, then the `folder` under the dump folder):
  the model parts, the optimizers and learning-rate schedulers through torchtitan's own
  stateful wrappers (DCP, sharded: FSDP2's shards read back at any world), the trainer's step
  and tokens seen, and the data loader's position when the data-parallel world is the one it
  was saved at (torchtitan does not reshard a loader's state: at another world the data starts
  over, said in the log);
- saves the same into the memory tier every `interval` steps and at the last step, staged in
  host memory and written from a thread (`nodeagent.worker.Checkpointer`), copied to peers by
  the agent, and beats every step;
- on SIGTERM (the agent's stop, a drain) every rank stops after the same step (one tiny
  all_reduce a step), saves it, waits for the write and exits 0: torchtitan's loop has no stop
  hook of its own.

Under plain torchrun (no nodeagent) it saves to and restores from `folder`. Survivors do not
keep their processes (job.recovery: restart only). torchtitan picks its device as "cuda"
when it finds no accelerator: its Trainer runs on a GPU only; this manager and torchtitan's
components run on CPU too (tests/integration/test_torchtitan.py).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from torchtitan.components.checkpointer.base import (
    DATALOADER,
    LR_SCHEDULER,
    MODEL,
    OPTIMIZER,
    BaseCheckpointManager,
    ModelWrapper,
)
from torchtitan.tools import filesystem

from nodeagent.worker import Checkpointer, beat
from nodeagent.worker.agree import any_rank
from nodeagent.worker.ending import destroy_group_at_exit, training_ended
from nodeagent.worker.graceful import exit_at_once_when_failing, no_longer_exit_at_once

log = logging.getLogger(__name__)
KEEP_ALL = 1 << 30  # keep_latest_k: 0 keeps every step of `folder`


class _Loader:
    """torchtitan's data loader, its state under the same keys on every rank (its own are
    keyed by data-parallel rank, which a rank of another world would not find), restored only
    at the data-parallel world and rank it was saved at."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        own = self.loader.state_dict()  # {"dp_rank_<r>": pickled position, "world_size": n}
        rank_id = f"dp_rank_{self.loader.dp_rank}"
        return {"rank": self.loader.dp_rank, "world": own["world_size"], "bytes": own[rank_id]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rank, world = self.loader.dp_rank, self.loader.dp_world_size
        if (state["rank"], state["world"]) != (rank, world):
            log.warning(
                "data loader position not restored: saved by data-parallel rank %d of %d, "
                "this is rank %d of %d (torchtitan does not reshard a loader's state): the "
                "data starts over",
                state["rank"],
                state["world"],
                rank,
                world,
            )
            return
        self.loader.load_state_dict({f"dp_rank_{rank}": state["bytes"], "world_size": world})


class _States:
    """torchtitan's stateful objects as one state for `Checkpointer`, by name."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects

    def state_dict(self) -> dict[str, Any]:
        return {name: obj.state_dict() for name, obj in self.objects.items()}

    def load_state_dict(self, loaded: dict[str, Any]) -> None:
        for name, obj in self.objects.items():
            obj.load_state_dict(loaded[name])


class NodeagentCheckpointManager(BaseCheckpointManager):  # type: ignore[misc]
    """See the module docstring."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseCheckpointManager.Config):  # type: ignore[misc]
        """torchtitan's checkpoint options; `folder` is where saves go without nodeagent (and
        the last source tried under it), `keep_latest_k` how many steps it keeps, the
        `initial_load_*` options what the job starts from when it has no save yet (read by
        torchtitan's own manager). Not applied: the asynchronous modes (saves are always
        staged and written from a thread), `load_step` (the job's leader chooses), the last
        step's model-only or HF export (a job that wants one saves it with torchtitan's own
        manager)."""

    def __init__(
        self,
        config: Config,
        *,
        dataloader: Any,
        model_parts: list[Any],
        optimizers: Any,
        lr_schedulers: Any,
        states: dict[str, Any],
        sd_adapter: Any = None,
        base_folder: str = "",
    ) -> None:
        self.enable = config.enable
        self.save_future = None
        if not self.enable:
            return
        self.interval = config.interval
        self.load_only = config.load_only
        self.stopped = False  # a SIGTERM's save was written; the process exits
        objects: dict[str, Any] = {
            **states,
            MODEL: ModelWrapper(model_parts),
            OPTIMIZER: optimizers,
            LR_SCHEDULER: lr_schedulers,
        }
        if dataloader is not None:
            objects[DATALOADER] = _Loader(dataloader)
        excluded = set(config.exclude_from_loading) - set(objects)
        if excluded:
            raise ValueError(
                f"checkpoint.exclude_from_loading: {sorted(excluded)} not among the states "
                f"{sorted(objects)}"
            )
        self.states = _States(objects)
        self.loaded = _States(
            {k: v for k, v in objects.items() if k not in config.exclude_from_loading}
        )
        folder = filesystem.join(base_folder, config.folder)
        self.checkpointer = Checkpointer(folder, keep=config.keep_latest_k or KEEP_ALL)
        self.config = config
        self._parts = {
            "dataloader": dataloader,
            "model_parts": model_parts,
            "optimizers": optimizers,
            "lr_schedulers": lr_schedulers,
            "states": states,
            "sd_adapter": sd_adapter,
        }
        self._stop_asked = False
        self._previous_handler = signal.signal(signal.SIGTERM, self._asked_to_stop)
        exit_at_once_when_failing(self._stopping)

    def _asked_to_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop_asked = True

    def _stopping(self) -> bool:
        return self._stop_asked

    def _load(self, step: int = -1) -> bool:
        if step != -1:
            raise ValueError(
                f"checkpoint.load_step={step}: under nodeagent the job's leader chooses the "
                "step every rank restores; leave it at -1"
            )
        return self.checkpointer.restore(self.loaded) > 0 or self._initial_load()

    def _initial_load(self) -> bool:
        """torchtitan's own first load when the job has no save yet: `initial_load_path` (a
        fine-tuning's pretrained weights, DCP or Hugging Face safetensors) or the model's HF
        assets, read by torchtitan's own manager (built with the same options and a folder
        that does not exist, so it goes to that branch, and closed)."""
        config = self.config
        if not (config.initial_load_path or config.initial_load_in_hf):
            return False
        from torchtitan.components.checkpointer.dcp import CheckpointManager

        options = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        nowhere = Path(tempfile.gettempdir()) / f"nodeagent-no-saves-{uuid.uuid4().hex}"
        options.update(folder=str(nowhere), keep_latest_k=0, load_step=-1)
        parts = {**self._parts, "states": dict(self._parts["states"])}  # it adds its own
        manager = CheckpointManager.Config(**options).build(**parts)
        try:
            return bool(manager.load())
        finally:
            manager.close()

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        beat(curr_step)
        stop = any_rank(self._stop_asked)
        due = stop or last_step or curr_step % self.interval == 0
        saved = due and not self.load_only and self.checkpointer.save(self.states, curr_step)
        if stop:  # torchtitan's loop has no stop of its own: every rank leaves after this step
            self.checkpointer.close()
            self.stopped = True
            destroy_group_at_exit()  # before the interpreter's finalization (worker.ending)
            log.info(
                "stopping at step %d (SIGTERM)%s", curr_step, "" if self.load_only else ": saved"
            )
            sys.exit(0)
        if last_step:
            training_ended()  # what follows is the exit: its failure is not the job's
        return saved

    def _maybe_wait_for_staging(self) -> None:
        """Nothing: `save` returns once the state is staged."""

    def _wait_for_saving(self) -> None:
        """Never called: `save_future` stays None (the write is the Checkpointer's)."""

    def _close(self) -> None:
        self.checkpointer.close()
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            no_longer_exit_at_once(self._stopping)
            self._previous_handler = None
