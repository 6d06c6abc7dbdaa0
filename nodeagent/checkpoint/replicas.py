"""This node's replica area of one job: the copies of peers' saves it holds, the listener that
takes them, and the copies this node makes (issue 27, docs/checkpoints.md).

The area is `<memory_dir>/<node>.<job>.replicas`, the agent's own: the workers may read it
(its group is theirs), never write it, so what a peer sent cannot be changed behind the agent's
back. What to copy where is decided elsewhere (job/checkpoints/replication.py) and handed to `run`
as plain data; the copies are made one at a time in a thread of their own, sends paced to
`max_rate`, so the agent's loop never waits on a peer. Fetches (a save the node must restore and
does not hold) try each holder in turn: a copy that does not match its manifest, or a manifest that
is not the one its holder reported, is refused and the next holder asked.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nodeagent.channel import beneath, fetching, manifests, tier
from nodeagent.checkpoint import scan, sender, space, wire
from nodeagent.checkpoint import transport as replica
from nodeagent.checkpoint.transport import Accept, Listening, Refused, ReplicaServer
from nodeagent.checkpoint.wire import Hello, ReplicaError, Want
from nodeagent.config.settings import CheckpointConfig
from nodeagent.errors import ConfigError
from nodeagent.model.handout import Transfer
from nodeagent.model.tiers import Held, SaveKey

log = logging.getLogger(__name__)
# A fetch asks a holder that turned it down or could not be reached again, this many times
# this far apart: a peer learns of a generation that added the asker at its next tick.
FETCH_ROUNDS = 20
FETCH_PAUSE_S = 0.5
MAX_REFUSED = 64  # refusals kept between two passes of the agent's loop
# The replica area: the agent's, read by the workers' group (by ACL: every copy in it too,
# whatever the agent's umask), nobody else's.
AREA_MODE = 0o750


@dataclass(frozen=True)
class Done:
    """A transfer made (`error` None) or given up on, and what it cost."""

    transfer: Transfer
    seconds: float
    bytes: int
    error: str | None = None
    refused: tuple[str, ...] = ()  # copies a fetch refused on the way (which holder, why)


class Replicas:
    """This node's replica area of one job and the copies it makes (the module docstring).
    Its methods are called from the agent's loop; the listener and the copies run in threads
    of their own and hand results back under `_lock`."""

    def __init__(
        self,
        config: CheckpointConfig,
        node: str,
        job: str,
        listening: Listening,
        clock: Callable[[], float] = time.monotonic,
        *,
        per_node: int = 1,
        landed: Callable[[], None] = lambda: None,
    ) -> None:
        """`listening`: where the listener listens, how it and the copies authenticate peers,
        and the most bytes one copy may take (a rank's share of the memory tier). `landed` is
        called (from the listener's thread) when a copy completes what one node of `per_node`
        ranks saved of a step: the agent then reports it at once rather than at its next
        heartbeat, so that the leader may commit the step within one heartbeat."""
        self.area = Path(config.replica_area(node, job))
        self.memory = Path(config.memory_tier(node, job))
        self._node, self._job = node, job
        self._listening = listening
        self.max_rate = float(config.max_rate)
        self._clock = clock
        self._per_node = per_node
        self._landed = landed
        self._lock = threading.Lock()
        self._verified = scan.Verified(self.area, tier.area_saves, listening.most)
        self._server: ReplicaServer | None = None
        self._thread: threading.Thread | None = None
        self._done: list[Done] = []
        self._refused: list[Refused] = []
        self._cancel = threading.Event()

    def prepare(self, group: int | None) -> None:
        """Make the area (the agent's, readable by the workers' group `group`, nobody else)
        and verify what an earlier agent left in it.

        Raises: ConfigError naming job.checkpoint.memory_dir (the area cannot be made)."""
        gid = group if group is not None else -1
        space.make_marked(self.area, "the replica area", AREA_MODE, self._node, self._job, gid=gid)
        fetching.end(self.area)  # an earlier agent's: its fetches ended with it
        with self._lock:
            self._verified.refresh()

    def listen(self, accept: Accept) -> None:
        """Take peers' requests, each served only if `accept` says so.

        Raises: ConfigError naming job.checkpoint.replication.port (cannot listen there)."""
        if self._server is None:
            listening = self._listening
            try:
                self._server = ReplicaServer(
                    listening,
                    self.area,
                    accept,
                    on_received=self._received,
                    memory=self.memory,
                    on_refused=self._turned_away,
                )
            except OSError as exc:
                raise ConfigError(
                    "job.checkpoint.replication.port",
                    f"cannot listen on {listening.address}:{listening.port} for peers' copies: "
                    f"{exc.strerror}",
                ) from None

    @property
    def address(self) -> str | None:
        """host:port of the listener, what this node reports (None: not listening)."""
        return self._server.address if self._server is not None else None

    def _received(self, got: replica.Received) -> None:
        m = got.manifest
        with self._lock:
            self._verified.trust(got.slot, m)
            whole = scan.completes_node(scan.held(self._verified.saves()), m, self._per_node)
        log.debug(
            "copy of rank %d step %d (generation %d) from %s taken in %.3f s%s",
            *(m.rank, m.step, m.generation, got.node, got.seconds),
            ": the node's save is whole here" if whole else "",
        )
        if whole:
            self._landed()

    def _turned_away(self, refused: Refused) -> None:
        with self._lock:
            if len(self._refused) < MAX_REFUSED:  # a flood is not kept whole: its first ones
                self._refused.append(refused)

    def take_refused(self) -> list[Refused]:
        """The requests the listener refused since the last call (the agent says so)."""
        with self._lock:
            refused, self._refused = self._refused, []
        return refused

    def held(self) -> tuple[Held, ...]:
        """Peers' saves held here, verified: what this node reports as its replicas."""
        with self._lock:
            return scan.held(self._verified.saves())

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(
        self,
        transfers: Sequence[Transfer],
        addresses: Mapping[str, str],
        generation: int,
        deadline: float | None = None,
    ) -> bool:
        """Make `transfers` in the background, one at a time (False: copies are under way
        still, nothing started). `addresses`: each peer's listener; `deadline` (the clock's):
        what is not done by then is given up on. Fetches are announced to the workers of
        `generation` until they ended (channel/fetching.py): their restore waits for them."""
        if self.busy or self._server is None:
            return False
        announced = any(t.fetch for t in transfers)
        if announced:
            left = deadline - self._clock() if deadline is not None else fetching.MOST_S
            fetching.begin(self.area, generation, left)
        self._cancel.clear()
        self._thread = threading.Thread(
            target=self._work,
            args=(list(transfers), dict(addresses), generation, deadline, announced),
            name="nodeagent-replicas",
            daemon=True,
        )
        self._thread.start()
        return True

    def cancel(self) -> None:
        """Give up on the transfers under way: the sends not begun yet, the one being sent
        (at its next slice), and the fetches' waits between rounds."""
        self._cancel.set()

    def take_done(self) -> list[Done]:
        with self._lock:
            done, self._done = self._done, []
        return done

    def _work(
        self,
        transfers: list[Transfer],
        addresses: dict[str, str],
        generation: int,
        deadline: float | None,
        announced: bool,
    ) -> None:
        try:
            self._each(transfers, addresses, generation, deadline)
        finally:
            if announced:  # the workers waiting on the fetches read what arrived
                fetching.end(self.area)

    def _each(
        self,
        transfers: list[Transfer],
        addresses: dict[str, str],
        generation: int,
        deadline: float | None,
    ) -> None:
        for transfer in transfers:
            if self._cancel.is_set():
                self._finish(Done(transfer, 0.0, 0, "cancelled: a new generation"))
                continue
            if deadline is not None and self._clock() > deadline:
                self._finish(Done(transfer, 0.0, 0, "given up on: the restore could not wait"))
                continue
            began = self._clock()
            try:
                if transfer.fetch:
                    sent, refused = self._fetch(transfer, addresses, generation, deadline)
                else:
                    sent, refused = self._send(transfer, addresses, generation), ()
                self._finish(Done(transfer, self._clock() - began, sent, refused=refused))
            except ReplicaError as exc:
                error = str(exc)
                self._finish(Done(transfer, self._clock() - began, 0, error, refused=()))
            except Exception as exc:  # a bug must not end replication for good: say it
                log.exception("replica %s", transfer)
                self._finish(Done(transfer, self._clock() - began, 0, f"{type(exc).__name__}"))

    def _finish(self, done: Done) -> None:
        with self._lock:
            self._done.append(done)

    def _send(self, transfer: Transfer, addresses: dict[str, str], generation: int) -> int:
        """Raises: ReplicaError."""
        step, saved_by, _world = transfer.key
        slot = tier.find_save(self.memory, self.area, transfer.rank, step, saved_by)
        peer = addresses.get(transfer.target)
        if slot is None or peer is None:
            why = "no longer held here" if slot is None else "its listener is not known"
            raise ReplicaError(f"replica {transfer}: {why}")
        hello = Hello(self._job, self._node, transfer.target, generation)
        try:
            return sender.send(
                peer,
                hello,
                slot,
                self._listening.auth,
                self.max_rate,
                cancel=self._cancel,
                beneath=self.memory.parent,
                most=self._listening.most,
            )
        except manifests.BadCopy as exc:  # the worker saved over the slot meanwhile
            raise ReplicaError(f"replica {transfer}: {exc}") from None

    def _fetch(
        self,
        transfer: Transfer,
        addresses: dict[str, str],
        generation: int,
        deadline: float | None = None,
    ) -> tuple[int, tuple[str, ...]]:
        """From each holder in turn; the holders that turned it down or could not be reached
        are asked again, a while (FETCH_ROUNDS, not past `deadline`), and so is one whose copy
        of the rank this node's listener is taking meanwhile. The copies refused on the way
        (not matching what their holder reported) and how many bytes. Raises: ReplicaError
        (none had it whole)."""
        asking = [source for source in transfer.sources if source in addresses]
        refused: list[str] = []
        unavailable: dict[str, str] = {}
        for _round in range(FETCH_ROUNDS):
            for source in asking:
                try:
                    size = self._fetch_from(source, transfer, addresses[source], generation)
                    return size, tuple(refused)
                except (wire.Unavailable, wire.Busy) as exc:
                    unavailable[source] = str(exc)
                except (ReplicaError, manifests.BadCopy) as exc:
                    refused.append(f"{source}: {exc}")
                    unavailable.pop(source, None)
            asking = [source for source in asking if source in unavailable]
            left = FETCH_PAUSE_S if deadline is None else deadline - self._clock()
            if not asking or left <= 0 or self._cancel.wait(min(FETCH_PAUSE_S, left)):
                break
        why = "; ".join([*refused, *unavailable.values()])
        raise ReplicaError(f"replica {transfer}: no holder had it whole ({why})")

    def _fetch_from(self, source: str, transfer: Transfer, peer: str, generation: int) -> int:
        """Raises: ReplicaError, manifests.BadCopy."""
        step, saved_by, _world = transfer.key
        assert self._server is not None
        with self._server.reserve(source, transfer.rank):
            area = self.area / source
            want = Want(transfer.rank, step, saved_by)
            hello = Hello(self._job, self._node, source, generation)
            manifest = sender.fetch(
                peer,
                hello,
                want,
                area,
                self._listening.auth,
                transfer.digest,
                memory=self.memory,
            )
            slot = tier.newest_in_memory(area, transfer.rank, step, saved_by)
            if slot is not None:
                with self._lock:
                    self._verified.trust(slot, manifest)
        return manifest.size

    def prune(self, keep: Callable[[SaveKey], bool]) -> list[Path]:
        """Remove the copies whose save `keep` refuses (older than the committed one, or of a
        timeline the job abandoned); the slots removed."""
        if self.busy:
            return []  # a fetch may be writing: the next call
        removed = []
        for slot, _rank in tier.area_saves(self.area):
            manifest = manifests.manifest_in(slot)
            if manifest is not None and not keep(
                (manifest.step, manifest.generation, manifest.world_size)
            ):
                shutil.rmtree(slot, ignore_errors=True)
                removed.append(slot)
        if removed:
            with self._lock:
                self._verified.refresh()
        return removed

    def close(self) -> None:
        """Stop listening (the area stays: it outlives the agent, as the memory tier does)."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def remove(self) -> None:
        """The job ended: stop listening and remove the area."""
        self._cancel.set()
        self.close()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
        beneath.remove_tree(self.area)
