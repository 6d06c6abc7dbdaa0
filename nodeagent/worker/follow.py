"""What a worker that recovers in place has been told over its control channel, and how it acts
on it: `Follower` (nodeagent.channel.control has the channel itself).

Both kinds of in-place state follow the channel through one: nodeagent.worker.elastic's `State`
(data-parallel replicas) and nodeagent.worker.checkpointer's `Checkpointer` (sharded models). No
torch here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from nodeagent.channel.control import Assignment, ControlFile, Leave

POLL_S = 0.005


class Reform(Exception):
    """The job is re-forming: leave the process group (raised by check() between steps)."""

    def __init__(self, reason: str, assignment: Assignment | None = None) -> None:
        super().__init__(reason)
        self.assignment = assignment


class ReformTimedOut(Exception):
    """No new assignment came within reform_timeout: exit so the agent restarts this worker."""


class Stopped(Exception):
    """A stop was asked for (run's `stop`) while this worker waited for its next assignment:
    it is in no process group, so there is nothing to save together; exit (0 is fine)."""


class Follower:
    """One worker's channel, the generation it is in and how far it has read the channel."""

    def __init__(self, generation: int | None = None) -> None:
        if generation is None:
            generation = int(os.environ.get("NODEAGENT_GENERATION", "0"))
        self.generation = generation
        self.channel: ControlFile | None = None
        self.seen = 0  # the sequence number of the last message read

    def attach(self, channel: ControlFile | None) -> None:
        """Follow `channel`. An assignment already in it is news only if it is for a generation
        after this process's own (NODEAGENT_GENERATION): one written while a newcomer was
        still importing torch."""
        self.channel = channel
        self.seen = 0

    def news(self) -> Reform | None:
        """Why to leave the generation, if the agent said so since the last look (one memory
        read when nothing is new)."""
        channel = self.channel
        if channel is None or channel.sequence() == self.seen:
            return None
        self.seen, message = channel.message()
        if isinstance(message, Leave) and message.generation >= self.generation:
            return Reform(f"told to leave generation {message.generation}")
        if isinstance(message, Assignment) and message.generation > self.generation:
            return Reform(f"new assignment for generation {message.generation}", message)
        return None

    def told(self) -> bool:
        """Whether the agent has said to leave this generation (news() would say why), without
        taking the news: for a thread beside the training (worker/abort.py)."""
        channel = self.channel
        if channel is None or channel.sequence() == self.seen:
            return False
        _, message = channel.message()
        if isinstance(message, Leave):
            return message.generation >= self.generation
        return isinstance(message, Assignment) and message.generation > self.generation

    def check(self) -> None:
        """Raise Reform if the agent has told this worker to leave its generation or published
        a newer assignment."""
        reform = self.news()
        if reform is not None:
            raise reform

    def _newer(self, channel: ControlFile, generation: int) -> Assignment | None:
        seq, message = channel.message()
        self.seen = max(self.seen, seq)
        if isinstance(message, Assignment) and message.generation > generation:
            return message
        return None

    def wait(self, deadline: float, stop: Callable[[], bool] | None) -> Assignment:
        """The next assignment, once the agent writes it.

        Raises:
            Stopped: `stop()` said so first.
            ReformTimedOut: none came by `deadline` (time.monotonic()).
        """
        assert self.channel is not None
        while True:
            assignment = self._newer(self.channel, self.generation)
            if assignment is not None:
                return assignment
            if stop is not None and stop():
                raise Stopped(f"asked to stop after leaving generation {self.generation}")
            if time.monotonic() >= deadline:
                raise ReformTimedOut(
                    f"no assignment newer than generation {self.generation} came in time"
                )
            time.sleep(POLL_S)

    def take(self, assignment: Assignment) -> Assignment:
        """Become what `assignment` says (or a still newer one that came meanwhile): its
        generation, and its variables in os.environ. Returns the one taken."""
        assert self.channel is not None
        newest = self._newer(self.channel, assignment.generation)
        if newest is not None:
            assignment = newest
        os.environ.update(assignment.environment())
        self.generation = assignment.generation
        return assignment
