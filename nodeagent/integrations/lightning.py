"""Lightning: the memory tier, beats, compute marks and the stop save for a `lightning.Trainer`.

    from nodeagent.integrations.lightning import NodeagentCallback, trainer_options

    trainer = Trainer(max_steps=1000, **trainer_options(NodeagentCallback(save_every=10)))
    trainer.fit(model, datamodule)

`trainer_options` reads the world from the environment at every start, as torchrun and
nodeagent set it per generation (`num_nodes` = GROUP_WORLD_SIZE, `devices` = LOCAL_WORLD_SIZE),
so the job re-forms at any size between min_nodes and max_nodes. The callback, on every rank:

- restores, as the fit starts, what the leader chose for this generation (the memory tier of
  this node or its peers, the persistent tier, then `directory`): the model, the optimizers,
  the learning-rate schedulers, the precision plugin's state and the fit loop's progress
  (epoch, global step, batch index, and the data loaders' positions where they are stateful,
  e.g. torchdata's StatefulDataLoader, as in Lightning's own checkpoints), and the random
  generators (Python's, NumPy's, torch's, the CUDA device's: not in Lightning's checkpoints),
  put back where the uninterrupted fit drew from them next (`_put_back`);
- beats every step (hang detection, goodput) and marks the forward pass as this rank's own
  compute (slow-node detection: from the batch's start to `backward`);
- saves the same into the memory tier every `save_every` optimizer steps, staged in host
  memory and written in the background (`nodeagent.worker.Checkpointer`, DCP: sharded for
  FSDP2/ModelParallelStrategy, whole for DDP);
- stops every rank after the same step once any got SIGTERM (the agent's stop, a drain: one
  tiny all_reduce a step, as Lightning broadcasts only rank 0's), saves that step and waits for
  the write. `fit` then returns, as when `trainer.should_stop` ends it (no validation on the
  way out, min_epochs and min_steps not waited for), with `callback.stopped` True: the code after
  `fit` runs, as after a transformers `Trainer.train` stopped so. Not Lightning's own way,
  SIGTERMException (a SystemExit with status 0 out of `fit`, the code after it never run).

Under plain torchrun (no nodeagent) it saves to and restores from `directory`, which it then
needs. Survivors do not keep their processes (job.recovery: restart only): Lightning's Trainer
owns the process group and the DDP wrapper for the whole of `fit` and cannot re-form them in
place (docs/frameworks.md).
"""

from __future__ import annotations

import io
import logging
import os
import random
import signal
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from nodeagent.worker import Checkpointer, TrainState, beat, compute
from nodeagent.worker.agree import any_rank
from nodeagent.worker.ending import training_returned
from nodeagent.worker.graceful import exit_at_once_when_failing, no_longer_exit_at_once

log = logging.getLogger(__name__)


def trainer_options(callback: NodeagentCallback | None = None) -> dict[str, Any]:
    """`Trainer(**trainer_options(...))`: this generation's world from the environment
    (GROUP_WORLD_SIZE nodes of LOCAL_WORLD_SIZE processes; one process without a launcher)
    and the callback, if given."""
    options: dict[str, Any] = {
        "num_nodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        "devices": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    }
    if callback is not None:
        options["callbacks"] = [callback]
    return options


def _saved(value: Any) -> dict[str, Any]:
    """`value` as one value of a save: torch.save's bytes (read back with `weights_only`: no
    code runs at load)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return {"bytes": buffer.getvalue()}


def _loaded(state: dict[str, Any]) -> Any:
    return torch.load(io.BytesIO(state["bytes"]), weights_only=True)


class _Opaque:
    """A Lightning object's state saved whole, as one value: a DCP load fills only the keys its
    target already has, and the fit loop's, say, holds the data loaders' states, which only
    exist once the fit has begun (the restore comes before)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def state_dict(self) -> dict[str, Any]:
        return _saved(self.target.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.target.load_state_dict(_loaded(state))


class _Progress:
    """Where the fit is, saved whole as one value (as `_Opaque`): the fit loop's progress
    (`_fit_loop_state`) and this process's random generators as the step left them
    (`_generators`). The generators are loaded into `generators`, for the callback to put
    back when the fit gets to the point they were read at (`NodeagentCallback._put_back`).
    A save from before they were kept holds the loop's progress alone."""

    def __init__(self, fit_loop: Any) -> None:
        self.fit_loop = fit_loop
        self.generators: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return _saved({"loop": _fit_loop_state(self.fit_loop), "generators": _generators()})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        loaded = _loaded(state)
        if "loop" not in loaded:  # the loop's progress alone
            loaded = {"loop": loaded}
        self.fit_loop.load_state_dict(loaded["loop"])
        self.generators = loaded.get("generators")


def _generators() -> dict[str, Any]:
    """Python's, NumPy's (if imported), torch's and the current CUDA device's (if CUDA is in
    use) random generators' states, as plain data."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, position, has_gauss, gauss = numpy.random.get_state()
        keys = torch.from_numpy(keys.astype(numpy.int64))
        state["numpy"] = (kind, keys, int(position), int(has_gauss), float(gauss))
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # (never started here)
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _put_back_generators(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        kind, keys, position, has_gauss, gauss = state["numpy"]
        numpy.random.set_state(
            (kind, keys.numpy().astype(numpy.uint32), position, has_gauss, gauss)
        )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _fit_loop_state(fit_loop: Any) -> dict[str, Any]:
    """The fit loop's state; at an epoch's last batch, without the data loaders' positions.

    Restored from a step that ended its epoch, Lightning goes on with the next epoch (its
    loop counts the epoch done), but a stateful loader's position then is "every batch of
    this pass handed out": loaded, it hands out nothing of the next pass, and Lightning counts
    that empty pass as one more epoch (Lightning 2.6.6, torchdata's StatefulDataLoader and
    Lightning's own checkpoints alike). The next epoch was skipped: its number, and under DDP
    its batches (the DistributedSampler shuffles by epoch). Left out, the loader starts the
    next pass from its first batch, as the uninterrupted fit does."""
    state: dict[str, Any] = fit_loop.state_dict()
    if fit_loop.epoch_loop.batch_progress.is_last_batch:
        state.get("state_dict", {}).pop("combined_loader", None)
    return state


class _Schedulers:
    """The trainer's learning-rate schedulers, in their configured order."""

    def __init__(self, trainer: Trainer) -> None:
        self.schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]

    def state_dict(self) -> dict[str, Any]:
        return {str(i): s.state_dict() for i, s in enumerate(self.schedulers)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, scheduler in enumerate(self.schedulers):
            scheduler.load_state_dict(state[str(i)])


def _connector(trainer: Trainer) -> Any:
    """Lightning's signal connector (private: None where a Lightning release has none)."""
    return getattr(trainer, "_signal_connector", None)


class NodeagentCallback(Callback):
    """See the module docstring.

    Args:
        save_every: optimizer steps between two saves into the memory tier.
        directory: the script's own checkpoints (DCP, `step-<S>/rank-<R>/`): where saves go
            without nodeagent, and the last source tried under it. None: only the tiers.
        keep: how many steps `directory` keeps.
    """

    def __init__(
        self, save_every: int = 10, directory: str | Path | None = None, keep: int = 2
    ) -> None:
        if save_every < 1:
            raise ValueError(f"save_every must be at least 1 step, not {save_every}")
        self.save_every = save_every
        self.directory = directory
        self.keep = keep
        self.checkpointer: Checkpointer | None = None
        self.restored_step = 0  # the global step the fit went on from (0: the start)
        self.stopped = False  # the fit ended because of SIGTERM (its step saved)
        self._state: TrainState | None = None
        self._progress = _Progress(None)
        self._computing: AbstractContextManager[None] | None = None
        self._saved = -1  # the last global step saved
        self._trainer: Trainer | None = None
        self._stop_asked = False  # SIGTERM, to on_train_start's handler
        self._set_for_the_stop: tuple[Any, Any, Any] | None = None  # what _stop changed, to undo

    # -- the fit's start and end --------------------------------------------------------------

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Restore here: the optimizers, schedulers and the (DDP- or FSDP-wrapped) model exist,
        and the fit loop has not run yet; Lightning restores a `ckpt_path` at the same point."""
        self.checkpointer = Checkpointer(self.directory, keep=self.keep)
        self._trainer = trainer
        exit_at_once_when_failing(self._stopping)
        self._progress = _Progress(trainer.fit_loop)
        self._state = TrainState(
            pl_module,
            list(trainer.optimizers),
            schedulers=_Schedulers(trainer),
            precision=_Opaque(trainer.precision_plugin),
            loops=self._progress,
        )
        self.restored_step = self.checkpointer.restore(self._state)
        self._saved = trainer.global_step if self.restored_step else -1
        if self.restored_step:
            log.info(
                "rank %d: resumed at global step %d, epoch %d",
                trainer.global_rank,
                trainer.global_step,
                trainer.current_epoch,
            )
            if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
                self._put_back()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Lightning's SIGTERM handler, registered just before, sets the signalled rank's flag
        and broadcasts rank 0's from inside the handler (Lightning 2.6): a collective only
        that rank makes, which pairs with whatever the others call next, or raises when a peer
        is gone (and the flag is never set). And the flag alone makes that rank leave at the
        step's end while the others go on: a SIGTERM landing after this step's agreement
        (`on_train_batch_end`) stopped one rank a step before the rest. A drain's SIGTERMs
        reach the ranks one by one. Replaced, where Lightning did not start the processes
        itself (nodeagent, torchrun), by one that only notes the signal: the ranks agree at
        the step's end and all stop together (`_stop`). Lightning restores the handlers it
        found when the fit ends."""
        environment = getattr(trainer.strategy, "cluster_environment", None)
        spawned = environment is not None and not environment.creates_processes_externally
        if not spawned and hasattr(_connector(trainer), "received_sigterm"):
            signal.signal(signal.SIGTERM, self._asked_to_stop)

    def _asked_to_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop_asked = True

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close()
        no_longer_exit_at_once(self._stopping)
        training_returned(self.stopped)  # what follows is the exit (worker.ending)
        if self._set_for_the_stop is not None:  # the trainer as it was, for a validate() after
            min_epochs, min_steps, limit_val_batches = self._set_for_the_stop
            trainer.fit_loop.min_epochs = min_epochs
            trainer.fit_loop.epoch_loop.min_steps = min_steps
            trainer.limit_val_batches = limit_val_batches
            self._set_for_the_stop = None

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """Where Lightning's own SIGTERM handler stays (processes it started itself), its
        SIGTERMException can still end the fit (rank 0's flag, broadcast before a step): the
        step reached is saved, and written before the process exits."""
        self._end_compute()
        stopped = isinstance(exception, SIGTERMException)
        if stopped and self._state is not None and trainer.global_step != self._saved:
            self._save(trainer)  # between the agreed stop and here: cannot happen, kept safe
        self.stopped = self.stopped or stopped
        self._close()

    # -- every step ---------------------------------------------------------------------------

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._put_back()  # the first step after a restore inside an epoch (else: done)
        self._computing = compute()
        self._computing.__enter__()

    def on_before_backward(
        self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor
    ) -> None:
        self._end_compute()

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._end_compute()  # manual optimization: no backward hook was called
        step = trainer.global_step
        beat(step)
        # Lightning stops on SIGTERM only on the ranks that got it (only rank 0's is
        # broadcast): every rank agrees here, saves this step and stops after it, so that no
        # rank is left in a collective (the save's own, the next step's) with one that left.
        stop = any_rank(self._stop_asked or trainer.received_sigterm)
        if (stop or (step > 0 and step % self.save_every == 0)) and step != self._saved:
            self._save(trainer)
        if stop:
            self._stop(trainer)

    # -- helpers --------------------------------------------------------------------------------

    def _stop(self, trainer: Trainer) -> None:
        """End the fit after this step, on every rank alike, the step's save written first:
        as `trainer.should_stop` ends it (EarlyStopping's way), so that `fit` returns. The
        epoch's end hooks and `on_train_end` run; the validation `should_stop` asks for does
        not (a drain's grace is for the save), nor do min_epochs and min_steps hold the stop
        back. Lightning's own flag, where its handler set it, is cleared: it would end the fit
        with SIGTERMException instead, on that rank alone."""
        assert self.checkpointer is not None
        self.checkpointer.close()
        self.stopped = True
        loop = trainer.fit_loop
        self._set_for_the_stop = (
            loop.min_epochs,
            loop.epoch_loop.min_steps,
            trainer.limit_val_batches,
        )
        loop.min_epochs = None
        loop.epoch_loop.min_steps = None
        trainer.limit_val_batches = 0
        trainer.should_stop = True
        connector = _connector(trainer)
        if getattr(connector, "received_sigterm", False):
            connector.received_sigterm = False
        log.info(
            "rank %d: stopping after step %d (SIGTERM): saved",
            trainer.global_rank,
            trainer.global_step,
        )

    def _stopping(self) -> bool:
        """The fit is stopping: the agent asked this process (this handler or Lightning's), or
        the ranks agreed to stop (a peer was asked)."""
        trainer = self._trainer
        asked = trainer is not None and bool(trainer.received_sigterm)
        return self._stop_asked or self.stopped or asked

    def _put_back(self) -> None:
        """The random generators as the restored step left them, once. Where the uninterrupted
        fit drew from them next: after a step that ended its epoch, the next epoch's data
        loader iterators (a DataLoader's base seed, a RandomSampler's seed), made after this
        hook (`on_fit_start`) in a resumed fit; after a step inside its epoch, the next step
        itself (dropout), the batch fetched (`on_train_batch_start`)."""
        generators, self._progress.generators = self._progress.generators, None
        if generators is not None:
            _put_back_generators(generators)

    def _end_compute(self) -> None:
        computing, self._computing = self._computing, None
        if computing is not None:
            computing.__exit__(None, None, None)

    def _save(self, trainer: Trainer) -> None:
        assert self.checkpointer is not None and self._state is not None
        step = trainer.global_step
        self.checkpointer.save(self._state, step)
        self._saved = step

    def _close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
