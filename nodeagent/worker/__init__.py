"""What training scripts import. torch is imported lazily: the agent never needs it.

    from nodeagent.worker import CheckpointManager, GracefulExit, beat, rescale

Every helper also works under plain torchrun (or no launcher): without nodeagent's environment
`beat` does nothing and `GracefulExit` still catches SIGTERM.
"""

from nodeagent.worker import elastic
from nodeagent.worker.checkpoint import Checkpoint, CheckpointManager
from nodeagent.worker.checkpointer import Checkpointer, Restored
from nodeagent.worker.elastic import Reform, ReformTimedOut, State, Stopped
from nodeagent.worker.graceful import GracefulExit
from nodeagent.worker.progress import beat
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
    "elastic",
    "rescale",
]
