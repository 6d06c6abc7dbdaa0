"""transformers' `Trainer`: the memory tier, beats and the stop save through a TrainerCallback.

    from nodeagent.integrations.transformers import NodeagentCallback

    callback = NodeagentCallback(save_every=50)
    trainer = Trainer(model, args, train_dataset=data, callbacks=[callback])
    trainer.train(resume_from_checkpoint=callback.resume(trainer))

On every rank:

- `resume(trainer)`, before `train`: restores the step the leader chose for this generation
  (this node's memory tier, a peer's copy, the persistent tier, then `directory`) and hands it
  to `Trainer` the one way it resumes, a checkpoint directory: a private one is written for
  this process (in its TMPDIR, removed after the first step) with what `Trainer` reads there
  (the weights and the optimizer's state as restored, and the scheduler's and RNG's files
  and trainer_state.json as they were saved). The optimizer is made here
  (`Trainer.create_optimizer`, which `train` keeps) so its state is restored in place.
  `Trainer` then goes on as from its own checkpoint: the global step and epoch, the data
  loader fast-forwarded past the batches trained, the learning-rate schedule, the RNG after
  them. None (start afresh) when no step was saved.
- every `save_every` optimizer steps, saves into the memory tier: the model's and the
  optimizer's tensors through DCP (`nodeagent.worker.Checkpointer`; staged in host memory,
  written from a thread, verified and copied to peers by the agent), and the small files'
  bytes as they would be in a `Trainer` checkpoint (the optimizer's too would be pickled
  whole at every save: 0.3 s of the step for 25 MB);
- beats every step (hang detection, goodput);
- on SIGTERM (the agent's stop, a drain), every rank stops after the same step (one tiny
  all_reduce a step: ranks told a step apart would wait in each other's collectives), saves it
  and waits for the write; `train` returns, with `callback.stopped` set.

No compute marks: `Trainer` runs the forward and the backward in one call, with no hook
between them. Survivors do not keep their processes (job.recovery: restart only): `Trainer`
and Accelerate own the process group and the DDP wrapper for the whole of `train`
(docs/frameworks.md).
"""

from __future__ import annotations

import atexit
import dataclasses
import io
import json
import logging
import random
import shutil
import signal
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from nodeagent.worker import Checkpointer, TrainState, beat
from nodeagent.worker.agree import any_rank
from nodeagent.worker.ending import training_returned
from nodeagent.worker.graceful import exit_at_once_when_failing, no_longer_exit_at_once

log = logging.getLogger(__name__)
WEIGHTS = "pytorch_model.bin"  # transformers' WEIGHTS_NAME: read with weights_only
OPTIMIZER = "optimizer.pt"  # transformers' OPTIMIZER_NAME
RNG = "rng"  # the RNG states' file, written as rng_state[_<process index>].pth


class _Files:
    """The small files of a `Trainer` checkpoint (not the weights nor the optimizer's state),
    by name, saved whole as one value:
    a DCP load fills only the keys its target already has, and a fresh one has no files.
    Serialized with torch.save and read back with `weights_only` (names and bytes only)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"bytes": _saved(self.files)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.files = torch.load(io.BytesIO(state["bytes"]), weights_only=True)


def _saved(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _optimizer(trainer: Trainer) -> torch.optim.Optimizer:
    """The optimizer `Trainer` will train with, made now (`create_optimizer`, which `train`
    then keeps) so that the restore fills its state in place, its tensors through DCP like
    the model's: `Trainer` makes it after sharding the model under FSDP, tensor parallelism or
    DeepSpeed, where this cannot be done."""
    for feature in ("is_fsdp_enabled", "is_tp_enabled", "is_deepspeed_enabled"):
        if getattr(trainer, feature, False):
            raise ValueError(
                f"nodeagent.integrations.transformers: Trainer.{feature}: not supported (Trainer "
                "makes its optimizer after sharding the model); DDP or a single process is "
                "(docs/frameworks.md)"
            )
    optimizer = trainer.create_optimizer()
    return getattr(optimizer, "optimizer", optimizer)


def _rng_name(args: TrainingArguments) -> str:
    return f"rng_state_{args.process_index}.pth" if args.world_size > 1 else "rng_state.pth"


class NodeagentCallback(TrainerCallback):
    """See the module docstring.

    Args:
        save_every: optimizer steps between two saves into the memory tier.
        directory: the script's own checkpoints (DCP): where saves go without nodeagent, and
            the last source tried under it. None: only the tiers.
        keep: how many steps `directory` keeps.
    """

    def __init__(
        self, save_every: int = 50, directory: str | Path | None = None, keep: int = 2
    ) -> None:
        if save_every < 1:
            raise ValueError(f"save_every must be at least 1 step, not {save_every}")
        self.save_every = save_every
        self.directory = directory
        self.keep = keep
        self.checkpointer: Checkpointer | None = None
        self.restored_step = 0  # the global step the training went on from (0: the start)
        self.stopped = False  # train() returned because of SIGTERM (its step saved)
        self._files = _Files()
        self._state: TrainState | None = None
        self._saved = -1
        self._stop_asked = False
        self._previous_handler: Any = None
        self._resume_dir: Path | None = None  # removed once Trainer has read it all

    # -- before train ---------------------------------------------------------------------------

    def resume(self, trainer: Trainer) -> str | None:
        """Restore the leader's choice into the model; the checkpoint directory to give
        `train(resume_from_checkpoint=...)`, or None when nothing was saved yet."""
        self.checkpointer = Checkpointer(self.directory, keep=self.keep)
        optimizer = _optimizer(trainer)
        self._state = TrainState(trainer.model, optimizer, trainer=self._files)
        self.restored_step = self.checkpointer.restore(self._state)
        self._saved = self.restored_step or -1
        if not self.restored_step:
            return None
        # The process's own temporary directory (TMPDIR): the memory tier's is the agent's, and
        # what is written here is not counted in its size. Removed after the first step, or
        # at exit if training never got there.
        directory = Path(tempfile.mkdtemp(prefix="nodeagent-resume-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        model = trainer.model
        assert model is not None
        torch.save(model.state_dict(), directory / WEIGHTS)
        torch.save(optimizer.state_dict(), directory / OPTIMIZER)  # as restored
        for name, data in self._files.files.items():
            # this process's RNG file, under the name its rank reads now (the world may differ)
            target = _rng_name(trainer.args) if name == RNG else name
            (directory / target).write_bytes(data)
        log.info("resuming at step %d from %s", self.restored_step, directory)
        self._resume_dir = directory
        return str(directory)

    # -- during train ---------------------------------------------------------------------------

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if self.checkpointer is None:  # resume() was not called: saves only
            self.checkpointer = Checkpointer(self.directory, keep=self.keep)
        self._previous_handler = signal.signal(signal.SIGTERM, self._asked_to_stop)
        exit_at_once_when_failing(self._stopping)

    def _asked_to_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop_asked = True

    def _stopping(self) -> bool:
        return self._stop_asked

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        step = state.global_step
        beat(step)
        if self._resume_dir is not None:  # read by now (the RNG file: before the first step)
            shutil.rmtree(self._resume_dir, ignore_errors=True)
            self._resume_dir = None
        stop = any_rank(self._stop_asked)
        if (stop or step % self.save_every == 0) and step != self._saved:
            self._save(args, state, kwargs)
        if stop:
            log.info("stopping at step %d (SIGTERM): saved", step)
            control.should_training_stop = True
            self.stopped = True

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
        if self._resume_dir is not None:
            shutil.rmtree(self._resume_dir, ignore_errors=True)
            self._resume_dir = None
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            no_longer_exit_at_once(self._stopping)
            self._previous_handler = None
        training_returned(self.stopped)  # what follows is the exit (worker.ending)

    # -- helpers --------------------------------------------------------------------------------

    def _save(self, args: TrainingArguments, state: TrainerState, objects: dict[str, Any]) -> None:
        """The files `Trainer._save_checkpoint` writes at this point, and the weights through
        DCP."""
        assert self.checkpointer is not None
        scheduler = objects.get("lr_scheduler")
        files = {"trainer_state.json": self._trainer_state(state).encode()}
        if scheduler is not None:
            files["scheduler.pt"] = _saved(scheduler.state_dict())
        rng = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "cpu": torch.random.get_rng_state(),
        }
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.random.get_rng_state_all()
        files[RNG] = _saved(rng)
        self._files.files = files
        if self._state is None:  # resume() was not called
            optimizer = objects.get("optimizer")
            optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper
            self._state = TrainState(objects["model"], optimizer, trainer=self._files)
        self.checkpointer.save(self._state, state.global_step)
        self._saved = state.global_step

    @staticmethod
    def _trainer_state(state: TrainerState) -> str:
        """trainer_state.json as TrainerState.save_to_json writes it."""
        return json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n"
