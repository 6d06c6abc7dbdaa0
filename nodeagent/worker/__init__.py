"""What training scripts import. torch is imported lazily: the agent never needs it.

    from nodeagent.worker import Checkpointer, GracefulExit, TrainState, beat

    checkpointer = Checkpointer("/shared/ckpt/llama")  # under nodeagent: its tiers first
    state = TrainState(model, optimizer)
    start = checkpointer.restore(state)  # on every rank: the step to resume from (0: none)
    with GracefulExit() as stop:
        for step in range(start + 1, steps + 1):
            train_one_step(step)
            beat(step)  # progress: the agent's hang detection
            last = stop.should_stop_all()  # SIGTERM on any rank: every rank stops here
            if step % 50 == 0 or last:
                checkpointer.save(state, step)  # on every rank, at the same steps
            if last:
                break
    checkpointer.close()  # writes the last save the tiers held back (docs/checkpoints.md)

checkpointer.py (Checkpointer: sharded saves in the agent's tiers that survive a worker
crash and a node loss), trainstate.py (TrainState: what a save holds), dcpio.py
(torch.distributed.checkpoint as the tiers use it), agree.py (the ranks' one verdict per
restore source), checkpoint.py (CheckpointManager: whole-file checkpoints that cannot be
half-read), graceful.py (GracefulExit: an emergency save on SIGTERM), progress.py (`beat`;
`compute`: the part of a step that waits for no peer, for slow-rank detection; `finished`),
ending.py (`training_ended`: a rank's end said and its process group destroyed at exit, for
the integrations),
scaling.py (`rescale`: hyperparameters for another world), elastic.py (in-place recovery:
`elastic.run`, State, Reform), follow.py (what a worker was told over its control channel),
abort.py (a collective blocked on a frozen peer ended once the job re-forms),
release.py (a destroyed process group really closes), preloaded.py (a pre-started
interpreter, `job.preload`). Every helper also works under plain torchrun (or no launcher):
without nodeagent's environment `beat` does nothing and `GracefulExit` still catches SIGTERM.
"""

from nodeagent.worker import elastic
from nodeagent.worker.checkpoint import Checkpoint, CheckpointManager
from nodeagent.worker.checkpointer import Checkpointer, Restored
from nodeagent.worker.elastic import Reform, ReformTimedOut, State, Stopped
from nodeagent.worker.graceful import GracefulExit
from nodeagent.worker.progress import beat, compute
from nodeagent.worker.scaling import Rescaled, rescale
from nodeagent.worker.trainstate import TrainState

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "Checkpointer",
    "GracefulExit",
    "Reform",
    "ReformTimedOut",
    "Rescaled",
    "Restored",
    "State",
    "Stopped",
    "TrainState",
    "beat",
    "compute",
    "elastic",
    "rescale",
]
