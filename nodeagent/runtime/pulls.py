"""A job's image is pulled before its workers start, as a phase of its own.

The node loop asks `Pulls.state(config)` before it starts serving a job with `container:`: an
image already present is ready at once (never pulled again); else one pull runs in a thread of
its own while the loop goes on heartbeating, and wakes the loop when it ends. A pull that fails
(no such image, no registry, past `containers.pull_timeout`) is the node's refusal of the job,
with the runtime's reason: the scheduler places the job elsewhere, nothing restarts in a loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from nodeagent.config.settings import Config
from nodeagent.supervisor.container import ContainerRuntime, Podman, PullFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pulled:
    """An image ready on this node, and how long its pull took (0: it was present)."""

    image: str
    seconds: float


@dataclass(frozen=True)
class Pulling:
    image: str
    since: float


@dataclass(frozen=True)
class PullRefused:
    image: str
    reason: str


PullState = Pulled | Pulling | PullRefused


def podman_of(config: Config) -> ContainerRuntime:
    assert config.job.container is not None
    return Podman(config.containers, config.job.container)


class Pulls:
    """The node's pulls, one thread each, keyed by image."""

    def __init__(
        self,
        wake: Callable[[], None],
        runtime_of: Callable[[Config], ContainerRuntime] = podman_of,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wake = wake
        self._runtime_of = runtime_of
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, PullState] = {}

    def state(self, config: Config) -> PullState:
        """Where `config`'s image stands; starts its pull if it has not started. A refused
        pull is tried again only when asked after `forget`."""
        assert config.job.container is not None
        image = config.job.container.image
        with self._lock:
            known = self._states.get(image)
            if known is not None:
                return known
            started = Pulling(image, self._clock())
            self._states[image] = started
        threading.Thread(
            target=self._pull, args=(config, started), name=f"pull-{image}", daemon=True
        ).start()
        return started

    def forget(self, image: str) -> None:
        """Ask again next time (a refusal the pool has moved past, an image removed)."""
        with self._lock:
            self._states.pop(image, None)

    def _pull(self, config: Config, started: Pulling) -> None:
        runtime = self._runtime_of(config)
        image, timeout = started.image, config.containers.pull_timeout
        state: PullState
        try:
            if runtime.present(image):
                state = Pulled(image, 0.0)
            else:
                log.info("pulling image %s for job %s", image, config.job.id)
                runtime.pull(image, timeout)
                state = Pulled(image, self._clock() - started.since)
                log.info("pulled image %s in %.1fs", image, state.seconds)
        except (PullFailed, OSError, ValueError) as exc:  # OSError, ValueError: no runtime at all
            state = PullRefused(image, f"pulling image {image} failed: {exc}")
        with self._lock:
            self._states[image] = state
        self._wake()
