"""The listener of the checkpoint plane: copies of peers' saves taken, saves served to a peer
that must restore them (issue 27; the wire format is wire.py's, the side that connects is
sender.py's). Never through the training process group: replication must neither compete with
the training's collectives nor fail with them.

The listener trusts nothing it is sent (issue 40):
- Only agents: a request's credential must prove an agent of this cluster made it, for this
  request (checkpoint/peerauth.py), before anything else is looked at; a peer that fails is
  answered `ERR refused` and told nothing (no job, node or address), and `on_refused` hears of
  it (the agent publishes an event).
- Only as planned: `accept(offer)` must say yes (the agent checks the request against the
  leader's plan and what the peer reported in Redis: a member of the job, connecting from its
  address, offering a save whose digest it reported or asking for one the plan lets it).
- Bounded: at most MAX_RECEIVES transfers of agents at once and PER_ADDRESS from one address
  (more are answered `ERR busy`), counted once a request proved an agent made it: an agent
  shares its address with every user of its host, so a connection that has not proven anything
  takes no agent's place (issue 52: two idle connections of a local user, reopened as they were
  dropped, turned every send of the genuine agent away). Those are bounded on their own: at
  most MAX_UNPROVEN at once, the oldest of them dropped to let a new one in (never a new one
  refused: an agent's request, sent at once, is never the oldest for long), each given up on
  at HEADER_S. Then the header within HEADER_S, the whole transfer within a deadline that
  grows with its size (wire.transfer_deadline), a copy no larger than `most` bytes (a rank's
  share of the memory tier), one copy of a node's rank at a time (a second would write into
  the same slot).
It writes only the files the manifest names, into its own replica area
(`<root>/<node>/rank-<R>/slot-0|1`, two slots as in the memory tier, so a copy cut short spares
the last whole one, and never the slot of the committed save the node's pin names:
channel/pin.py), checks every file against the manifest's SHA-256 as it arrives and writes the
manifest last. It reads a save it serves only as regular files, never through a link: the slot
is the workers', and the agent (root) must not send a peer what a link planted there points to.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nodeagent.channel import manifests, pin, tier
from nodeagent.channel.manifests import BadCopy, Manifest
from nodeagent.checkpoint import peerauth, wire
from nodeagent.checkpoint.peerauth import PlaneAuth
from nodeagent.checkpoint.wire import Busy, Want
from nodeagent.model.credential import MungeUnavailable

log = logging.getLogger(__name__)
MAX_RECEIVES = 8  # agents' transfers served at once: more are turned away, not queued
PER_ADDRESS = 2  # of them from one address (a push and a fetch of one peer at once)
MAX_UNPROVEN = 64  # connections whose request has not proven an agent sent it (a thread each)
LOG_EVERY_S = 60.0  # a refused address is logged at most this often (then at debug level)
MAX_LOGGED = 4096  # addresses remembered for that


@dataclass(frozen=True)
class Offer:
    """A peer's request: to leave a copy (`manifest`) or to be sent one (`want`)."""

    node: str  # who the peer says it is (an agent of this cluster: it proved that)
    host: str  # the address it connected from
    manifest: Manifest | None = None
    want: Want | None = None


# Whether a peer's request may be served; None: yes, else why not.
Accept = Callable[[Offer], str | None]


@dataclass(frozen=True)
class Received:
    node: str
    generation: int
    manifest: Manifest
    seconds: float
    slot: Path  # where it was written


@dataclass(frozen=True)
class Refused:
    """A request turned away: from which address, claiming which node (unproven unless
    `authenticated`), and why."""

    host: str
    node: str
    why: str
    authenticated: bool


@dataclass(frozen=True)
class Listening:
    """What the listener is: the job, this node's name, where it listens, how it authenticates
    its peers, and the most bytes one copy may take (None: any)."""

    job: str
    node: str
    auth: PlaneAuth
    address: str = "127.0.0.1"
    port: int = 0
    most: int | None = None


class _Refusal(Exception):
    """A request refused; `authenticated`: whether its reason may be told to the peer."""

    def __init__(self, why: str, node: str = "", authenticated: bool = True) -> None:
        super().__init__(why)
        self.node, self.authenticated = node, authenticated


class ReplicaServer:
    """Takes copies of peers' saves for one job, and serves fetches, in threads of its own."""

    def __init__(
        self,
        listening: Listening,
        root: Path,
        accept: Accept,
        on_received: Callable[[Received], None] | None = None,
        memory: Path | None = None,
        on_refused: Callable[[Refused], None] | None = None,
    ) -> None:
        self.job, self.node = listening.job, listening.node
        self.root = root
        self.memory = memory  # this node's memory tier: what a fetch may be served from too
        self._auth = listening.auth
        self._most = listening.most
        self._accept = accept
        self._on_received = on_received or (lambda _: None)
        self._on_refused = on_refused or (lambda _: None)
        family = socket.AF_INET6 if ":" in listening.address else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((listening.address, listening.port))
        self._sock.listen(16)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._unproven: dict[socket.socket, None] = {}  # oldest first
        self._serving = 0
        self._by_address: dict[str, int] = {}
        self._admitted: set[socket.socket] = set()  # counted in _serving and _by_address
        self._logged: dict[str, float] = {}  # address -> when a refusal of it was last logged
        self._receiving: set[tuple[str, int]] = set()  # (node, rank) copies under way
        self._conns: set[socket.socket] = set()  # served now: close() ends them
        self._thread = threading.Thread(target=self._serve, name="nodeagent-replicas", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def close(self) -> None:
        """Stop listening and end the copies under way (they write nothing more)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)
        with self._lock:
            serving = list(self._conns)
        for conn in serving:
            _drop(conn)

    @contextlib.contextmanager
    def reserve(self, node: str, rank: int) -> Iterator[None]:
        """Hold the place of `node`'s rank `rank` in the replica area (a fetch writing there)
        so that no copy is received into it meanwhile. Raises: Busy if one is under way."""
        with self._lock:
            if (node, rank) in self._receiving:
                raise Busy(f"busy: a copy of {node}'s rank {rank} is under way")
            self._receiving.add((node, rank))
        try:
            yield
        finally:
            with self._lock:
                self._receiving.discard((node, rank))

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
                self._unproven[conn] = None
                if len(self._unproven) > MAX_UNPROVEN:
                    oldest = next(iter(self._unproven))
                    del self._unproven[oldest]
                    _drop(oldest)  # its thread ends it
            threading.Thread(target=self._handle, args=(conn, str(peer[0])), daemon=True).start()

    def _admit(self, conn: socket.socket, host: str) -> str | None:
        """Count the transfer on `conn`, whose request proved an agent made it, against the
        limits; None when it may go on, else why not."""
        with self._lock:
            if self._serving >= MAX_RECEIVES:
                return f"{MAX_RECEIVES} transfers under way"
            if self._by_address.get(host, 0) >= PER_ADDRESS:
                return f"{PER_ADDRESS} transfers from one address under way"
            self._admitted.add(conn)
            self._serving += 1
            self._by_address[host] = self._by_address.get(host, 0) + 1
            return None

    def _handle(self, conn: socket.socket, host: str) -> None:
        try:
            with conn:
                conn.settimeout(wire.TIMEOUT_S)
                if not self._closed.is_set():
                    self._take(conn, host)
        finally:
            self._release(conn, host)
            with self._lock:
                self._conns.discard(conn)
                self._unproven.pop(conn, None)

    def _release(self, conn: socket.socket, host: str) -> None:
        """The transfer on `conn` is no longer under way (once): before its last answer, so
        that a peer that reads the answer and asks again at once is not told it is busy."""
        with self._lock:
            if conn not in self._admitted:
                return
            self._admitted.discard(conn)
            self._serving -= 1
            left = self._by_address.pop(host, 1) - 1
            if left:
                self._by_address[host] = left

    def _take(self, conn: socket.socket, host: str) -> None:
        began = time.monotonic()
        try:
            data, digest = self._authenticated(conn, host)
            with self._lock:
                self._unproven.pop(conn, None)
            busy = self._admit(conn, host)
            if busy is not None:
                wire.answer(conn, f"ERR busy: {busy}, try again")
                return
            node, generation, manifest, want = self._request(data)
            if want is not None:
                self._give(conn, Offer(node, host, want=want), digest, began)
                return
            assert manifest is not None
            slot = self._keep(conn, Offer(node, host, manifest=manifest), digest, began)
        except _Refusal as exc:
            self._release(conn, host)
            self._refused(conn, Refused(host, exc.node, str(exc), exc.authenticated))
            return
        except (BadCopy, OSError, ValueError, MungeUnavailable) as exc:
            log.warning("replica from %s refused: %s", host, exc)
            self._release(conn, host)
            wire.answer(conn, f"ERR {exc}")
            return
        self._release(conn, host)
        wire.answer(conn, "OK")
        self._on_received(Received(node, generation, manifest, time.monotonic() - began, slot))

    def _refused(self, conn: socket.socket, refused: Refused) -> None:
        """Log a refusal (once a minute per address at most: a flood of connections must not
        flood the log too), say it, and answer it (telling a stranger nothing)."""
        who = f"{refused.host} (claiming {refused.node or 'no node'})"
        now = time.monotonic()
        with self._lock:
            said = self._logged.get(refused.host)
            loud = said is None or now - said >= LOG_EVERY_S
            if loud:
                if len(self._logged) >= MAX_LOGGED:  # many addresses: forget, never grow
                    self._logged.clear()
                self._logged[refused.host] = now
        level = logging.WARNING if loud else logging.DEBUG
        log.log(level, "checkpoint plane: refused a request from %s: %s", who, refused.why)
        self._on_refused(refused)  # before the answer: whoever reads it, the refusal is known
        told = f": {refused.why}" if refused.authenticated else ""  # nothing to a stranger
        wire.answer(conn, f"ERR {wire.REFUSED}{told}")

    def _authenticated(self, conn: socket.socket, host: str) -> tuple[dict[str, object], str]:
        """The request's fields once its credential proves an agent sent them, and their
        digest. Raises: _Refusal (unauthenticated: its reason is not told)."""
        try:
            raw = wire.read_line(conn, time.monotonic() + wire.HEADER_S)
            data = json.loads(raw)
        except (BadCopy, ValueError) as exc:
            raise _Refusal(f"no request: {exc}", authenticated=False) from None
        if not isinstance(data, dict) or data.get("v") != wire.VERSION:
            raise _Refusal(f"not a request of version {wire.VERSION}", authenticated=False)
        credential = data.pop("auth", None)
        claimed = data.get("node")
        node = claimed if isinstance(claimed, str) and manifests.plain_name(claimed) else ""
        if not isinstance(credential, str):
            raise _Refusal("no credential", node, authenticated=False)
        digest = peerauth.digest_of(data)
        try:
            why = self._auth.check(credential, digest)
        except MungeUnavailable as exc:
            why = f"cannot check its credential: {exc}"
        if why is not None:
            raise _Refusal(f"not an agent of this cluster: {why}", node, authenticated=False)
        return data, digest

    def _request(self, data: dict[str, object]) -> tuple[str, int, Manifest | None, Want | None]:
        """What an authenticated request asks. Raises: BadCopy naming what is wrong."""
        if data.get("job") != self.job or data.get("to") != self.node:
            raise BadCopy(f"not a request to {self.node} of job {self.job}")
        node, generation = data.get("node"), data.get("generation")
        if not isinstance(node, str) or not manifests.plain_name(node):
            raise BadCopy(f"node {node!r} is not a node name")
        if not isinstance(generation, int) or not _count_ok(generation):
            raise BadCopy(f"generation {generation!r} is not a generation")
        want = data.get("want")
        if want is not None:
            if not isinstance(want, dict) or not all(
                _count_ok(want.get(k)) for k in ("rank", "step", "generation")
            ):
                raise BadCopy("'want' must name a rank, a step and a generation")
            return node, generation, None, Want(want["rank"], want["step"], want["generation"])
        manifest = Manifest.from_json(json.dumps(data.get("manifest")), f"{node}'s manifest")
        if not manifest.cryptographic:
            raise BadCopy(wire.LEGACY)
        return node, generation, manifest, None

    def _keep(self, conn: socket.socket, offer: Offer, digest: str, began: float) -> Path:
        """Take the copy `offer` leaves, once accepted. Raises: _Refusal, BadCopy, OSError."""
        manifest = offer.manifest
        assert manifest is not None
        with self.reserve(offer.node, manifest.rank):
            why = self._accept(offer)
            if why is not None:
                raise _Refusal(why, offer.node)
            if self._most is not None and manifest.size > self._most:
                raise _Refusal(
                    f"a save of {manifest.size:,} bytes, more than the {self._most:,} one "
                    "rank's copy may take here (checkpoint.memory_size)",
                    offer.node,
                )
            wire.answer(conn, f"GO {self._auth.sign(wire.go_digest(digest)) or wire.NO_CREDENTIAL}")
            slot = pin.slot_for_copy(self.root / offer.node, manifest.rank, self.memory)
            deadline = wire.transfer_deadline(began, manifest.size)
            wire.receive(wire.by_deadline(conn, deadline), slot, manifest)
        return slot

    def _give(self, conn: socket.socket, offer: Offer, digest: str, began: float) -> None:
        """Serve a fetch: the save asked for, from the memory tier or the replica area.
        Raises: _Refusal, BadCopy (the answer says why)."""
        want = offer.want
        assert want is not None
        why = self._accept(offer)
        if why is not None:
            raise _Refusal(why, offer.node)
        slot = tier.find_save(self.memory, self.root, want.rank, want.step, want.generation)
        if slot is None:
            raise BadCopy(f"no save of rank {want.rank}, step {want.step}@{want.generation} here")
        beneath = self.root.parent  # memory_dir: the tier and the replica area lie below it
        manifest = manifests.read_manifest(slot, beneath, self._most)
        if not manifest.cryptographic:
            raise BadCopy(f"rank {want.rank}'s save of step {want.step} predates SHA-256 manifests")
        credential = self._auth.sign(wire.go_digest(digest, manifest)) or wire.NO_CREDENTIAL
        deadline = wire.transfer_deadline(began, manifest.size)
        with contextlib.suppress(OSError):  # the asker gave up: nothing more to say
            conn.sendall(f"GO {credential} {manifest.to_json()}\n".encode())  # never cut
            wire.body(conn, slot, manifest, 0.0, deadline=deadline, beneath=beneath)


def _drop(conn: socket.socket) -> None:
    """End a connection another thread serves (its reads fail at once)."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


def _count_ok(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53


def replicas_held(root: Path) -> list[tuple[str, Path]]:
    """Every replica slot under `root` with the node it came from (unverified)."""
    found = []
    if root.is_dir():
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False):
                found += [(entry.name, slot) for slot, _ in tier.memory_saves(Path(entry.path))]
    return found
