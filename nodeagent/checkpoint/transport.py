"""Copies of a rank's save between agents, over the agents' own TCP connections (issue 27).

Never through the training process group: replication must neither compete with the training's
collectives nor fail with them. A sender streams one save to a peer's `ReplicaServer` (`send`):

    header   one line of JSON: {"v": 1, "job", "node" (the sender), "generation", "manifest"}
             answered `GO` (or `ERR <why>`: nothing of the body is sent to a peer that refuses)
    body     the manifest's files, in the manifest's (sorted) order, each exactly its size

and a node that must restore a save it lacks asks a peer for it (`fetch`):

    header   {"v": 1, "job", "node" (who asks), "generation", "want": {"rank", "step",
             "generation"}}, answered `GO <manifest>` (or `ERR <why>`), then the body as above,
             which the asker checks byte by byte against that manifest (and the manifest
             against the digest its holder reported) as it arrives

The receiver trusts nothing it is sent. It serves at most MAX_RECEIVES connections at once (more
are answered `ERR busy`), reads a header of at most MAX_HEADER bytes within HEADER_S, takes one
copy of a node's rank at a time (a second, meanwhile, would write into the same slot), and
serves a request only if `accept(offer)` says so (the agent checks it against what that node
reported in Redis: a member of the job, connecting from its address, offering a save whose
digest it reported: a peer cannot plant a file). It writes only the files the manifest names,
into its own replica area (`<root>/<node>/rank-<R>/slot-0|1`, two slots as in the memory tier,
so a copy cut short spares the last whole one, and never the slot of the committed save the
node's pin names: channel/pin.py), checks every file against the manifest's SHA-256
as it arrives and writes the manifest last. It answers the body `OK` or `ERR <why>` on one line.
A sender paces itself to `max_rate` bytes a second (0: as fast as it can), and reads the save
only as regular files, never through a link: the slot is the workers', and the agent (root) must
not send a peer what a link planted there points to.
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

log = logging.getLogger(__name__)
VERSION = 1
MAX_HEADER = 1 << 20  # a manifest of 10,000 files fits
HEADER_S = 10.0  # the whole header, however slowly it trickles in
MAX_RECEIVES = 8  # connections served at once: more are turned away, not queued as threads
CHUNK = 1 << 20
PACED_SLICE = 64 << 10  # the least a paced send writes at once
TIMEOUT_S = 30.0  # a peer silent this long mid-transfer is given up on
ANSWER_MAX = 2000  # characters of a refusal's reason
_LEGACY = "a manifest without a SHA-256 of every file (format 1) is never taken"


@dataclass(frozen=True)
class Want:
    """A save asked for: one rank's, of one step, saved by one generation."""

    rank: int
    step: int
    generation: int


@dataclass(frozen=True)
class Offer:
    """A peer's request: to leave a copy (`manifest`) or to be sent one (`want`)."""

    node: str  # who the peer says it is
    host: str  # the address it connected from
    manifest: Manifest | None = None
    want: Want | None = None


# Whether a peer's request may be served; None: yes, else why not.
Accept = Callable[[Offer], str | None]


class ReplicaError(Exception):
    """A copy that did not happen: the peer refused it or the connection failed."""


class Unavailable(ReplicaError):
    """A fetch the peer turned down or that could not reach it: unlike a copy that does not
    match what its holder reported, asking again a moment later may succeed (the peer had not
    read yet that the asker is a member of the job's new generation)."""


class Cancelled(ReplicaError):
    """A send given up on mid-file: a new generation's restore needs this node (the receiver
    sees the connection close short and keeps nothing of it)."""


class Busy(BadCopy):
    """A copy of that rank is being received already (it ends soon): not this one meanwhile."""


@dataclass(frozen=True)
class Received:
    node: str
    generation: int
    manifest: Manifest
    seconds: float
    slot: Path  # where it was written


class ReplicaServer:
    """Takes copies of peers' saves for one job, on `address` (the node's own), in a thread."""

    def __init__(
        self,
        job: str,
        root: Path,
        accept: Accept,
        address: str = "127.0.0.1",
        port: int = 0,
        on_received: Callable[[Received], None] | None = None,
        memory: Path | None = None,
    ) -> None:
        self.job = job
        self.root = root
        self.memory = memory  # this node's memory tier: what a fetch may be served from too
        self._accept = accept
        self._on_received = on_received or (lambda _: None)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, port))
        self._sock.listen(16)
        self._closed = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_RECEIVES)
        self._lock = threading.Lock()
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
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

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
                conn, _ = self._sock.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                with conn:
                    conn.settimeout(1.0)
                    _answer(conn, f"ERR busy: {MAX_RECEIVES} copies under way, try again")
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.add(conn)
        try:
            with conn:
                conn.settimeout(TIMEOUT_S)
                if not self._closed.is_set():
                    self._take(conn)
        finally:
            with self._lock:
                self._conns.discard(conn)
            self._slots.release()

    def _take(self, conn: socket.socket) -> None:
        began = time.monotonic()
        try:
            node, generation, manifest, want = self._header(conn)
            host = conn.getpeername()[0]
            if want is not None:
                self._give(conn, Offer(node, host, want=want))
                return
            assert manifest is not None
            if not manifest.cryptographic:
                raise BadCopy(_LEGACY)
            with self.reserve(node, manifest.rank):
                why = self._accept(Offer(node, host, manifest=manifest))
                if why is not None:
                    raise BadCopy(f"refused: {why}")
                _answer(conn, "GO")
                slot = pin.slot_for_copy(self.root / node, manifest.rank, self.memory)
                _receive(conn, slot, manifest)
        except (BadCopy, OSError, ValueError) as exc:
            log.warning("replica refused: %s", exc)
            _answer(conn, f"ERR {exc}")
            return
        _answer(conn, "OK")
        self._on_received(Received(node, generation, manifest, time.monotonic() - began, slot))

    def _give(self, conn: socket.socket, offer: Offer) -> None:
        """Serve a fetch: the save asked for, from the memory tier or the replica area.
        Raises: BadCopy (the answer says why)."""
        want = offer.want
        assert want is not None
        why = self._accept(offer)
        if why is not None:
            raise BadCopy(f"refused: {why}")
        slot = tier.find_save(self.memory, self.root, want.rank, want.step, want.generation)
        if slot is None:
            raise BadCopy(f"no save of rank {want.rank}, step {want.step}@{want.generation} here")
        manifest = manifests.read_manifest(slot)
        if not manifest.cryptographic:
            raise BadCopy(f"rank {want.rank}'s save of step {want.step} predates SHA-256 manifests")
        conn.sendall(f"GO {manifest.to_json()}\n".encode())  # whole: never cut (MAX_HEADER)
        with contextlib.suppress(OSError):  # the asker gave up: nothing more to say
            _body(conn, slot, manifest, 0.0)

    def _header(self, conn: socket.socket) -> tuple[str, int, Manifest | None, Want | None]:
        line = _read_line(conn, time.monotonic() + HEADER_S)
        conn.settimeout(TIMEOUT_S)
        try:
            data = json.loads(line)
        except ValueError:
            raise BadCopy("the header is not JSON") from None
        if not isinstance(data, dict) or data.get("v") != VERSION:
            raise BadCopy(f"not a replica header of version {VERSION}")
        if data.get("job") != self.job:
            raise BadCopy(f"job {data.get('job')!r} is not {self.job!r}")
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
        return node, generation, manifest, None


def _count_ok(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53


def _read_line(conn: socket.socket, deadline: float | None = None) -> bytes:
    """One line, read without taking a byte past it (the body follows); at most MAX_HEADER
    bytes, and by `deadline` (time.monotonic()) if given. Raises: BadCopy."""
    buf = bytearray()
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BadCopy(f"the header took more than {HEADER_S:g}s")
            conn.settimeout(left)  # a silent peer too: not TIMEOUT_S per recv
        try:
            peeked = conn.recv(min(CHUNK, MAX_HEADER + 1 - len(buf)), socket.MSG_PEEK)
        except TimeoutError:
            if deadline is None:
                raise
            raise BadCopy(f"the header took more than {HEADER_S:g}s") from None
        if not peeked:
            raise BadCopy("the connection closed before the header ended")
        end = peeked.find(b"\n")
        taken = conn.recv(len(peeked) if end < 0 else end + 1)
        buf += taken
        if end >= 0:
            return bytes(buf)
        if len(buf) > MAX_HEADER:
            raise BadCopy(f"a header of more than {MAX_HEADER} bytes")


def _receive(conn: socket.socket, slot: Path, manifest: Manifest) -> None:
    """The manifest's files, each checked against its SHA-256 as it arrives; the manifest last.
    Raises: BadCopy."""
    if not manifest.cryptographic:
        raise BadCopy(_LEGACY)
    manifests.begin(slot)
    for name, expected in sorted(manifest.files.items()):
        summer, left = manifests.Summer(expected), expected.size
        with open(slot / name, "wb") as f:
            while left:
                chunk = conn.recv(min(CHUNK, left))
                if not chunk:
                    raise BadCopy(f"{name}: the connection closed {left} bytes short")
                summer.update(chunk)
                f.write(chunk)
                left -= len(chunk)
        why = manifests.mismatch(name, summer.result(), expected)
        if why is not None:
            raise BadCopy(why)
    manifests.write_manifest(slot, manifest)


def _answer(conn: socket.socket, text: str) -> None:
    """One line of answer: `text` (cut at ANSWER_MAX characters, as a refusal's reason may be
    long; a manifest is never sent through here)."""
    with contextlib.suppress(OSError):
        conn.sendall(text.replace("\n", " ")[:ANSWER_MAX].encode() + b"\n")


def send(
    peer: str,
    job: str,
    node: str,
    generation: int,
    slot: Path,
    max_rate: float = 0.0,
    timeout: float = TIMEOUT_S,
    cancel: threading.Event | None = None,
) -> int:
    """Copy the save in `slot` to the ReplicaServer at `peer` ("host:port"); the bytes sent.
    `cancel`: once set, the send stops at its next slice (a paced one, in its pause).

    Raises: ReplicaError naming the peer and why (its answer, or the connection's failure),
        Cancelled; BadCopy if `slot` holds no save, or one of a format never sent."""
    manifest = manifests.read_manifest(slot)
    if not manifest.cryptographic:
        raise BadCopy(f"{slot}: a save of format 1 (no SHA-256 per file) is never sent")
    header = {
        "v": VERSION,
        "job": job,
        "node": node,
        "generation": generation,
        "manifest": json.loads(manifest.to_json()),
    }
    host, _, port = peer.rpartition(":")
    sent = 0
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as conn:
            conn.sendall(json.dumps(header, separators=(",", ":")).encode() + b"\n")
            answer = _line(conn)
            if answer == "GO":
                # A receiver that gives up mid-body closes the connection: its answer says why.
                with contextlib.suppress(OSError):
                    sent = _body(conn, slot, manifest, max_rate, cancel)
                answer = _line(conn)
    except Cancelled as exc:
        raise Cancelled(f"replica to {peer}: {exc}") from None
    except (OSError, BadCopy) as exc:
        raise ReplicaError(f"replica to {peer}: {exc}") from None
    if answer != "OK":
        raise ReplicaError(f"replica to {peer}: {answer}")
    return sent


def fetch(
    peer: str,
    job: str,
    node: str,
    generation: int,
    want: Want,
    area: Path,
    digest: str | None = None,
    timeout: float = TIMEOUT_S,
    memory: Path | None = None,
) -> Manifest:
    """Bring the save `want` from the ReplicaServer at `peer` into `area` (a node's directory
    of a replica area: `<area>/rank-<R>/slot-N`), every byte checked against the manifest the
    peer sends, and that manifest against `digest` (what its holder reported) when given;
    never into a slot holding the save pinned in this node's memory tier `memory`.

    Raises: ReplicaError naming the peer and why: a copy that does not match, or Unavailable
        (its answer, the connection's failure); nothing of a copy that failed stays."""
    header = {
        "v": VERSION,
        "job": job,
        "node": node,
        "generation": generation,
        "want": {"rank": want.rank, "step": want.step, "generation": want.generation},
    }
    host, _, port = peer.rpartition(":")
    slot: Path | None = None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as conn:
            conn.sendall(json.dumps(header, separators=(",", ":")).encode() + b"\n")
            answer = _line(conn)
            word, _, rest = answer.partition(" ")
            if word != "GO":
                raise Unavailable(f"replica from {peer}: {answer}")
            manifest = Manifest.from_json(rest, f"{peer}'s manifest")
            if digest and manifests.digest(manifest) != digest:
                raise BadCopy(f"its manifest is not the save its holder reported ({digest})")
            if (manifest.rank, manifest.step, manifest.generation) != (
                want.rank,
                want.step,
                want.generation,
            ):
                raise BadCopy(
                    f"it sent step {manifest.step}@{manifest.generation} rank {manifest.rank}"
                )
            slot = pin.slot_for_copy(area, want.rank, memory)
            _receive(conn, slot, manifest)
    except (OSError, BadCopy) as exc:
        if slot is not None:
            with contextlib.suppress(OSError, BadCopy):
                manifests.begin(slot)
        failed = Unavailable if isinstance(exc, OSError) else ReplicaError
        raise failed(f"replica from {peer}: {exc}") from None
    return manifest


def _line(conn: socket.socket) -> str:
    return _read_line(conn).decode(errors="replace").strip()


def _body(
    conn: socket.socket,
    slot: Path,
    manifest: Manifest,
    max_rate: float,
    cancel: threading.Event | None = None,
) -> int:
    """Send the manifest's files; paced, in slices of a tenth of a second's worth at
    `max_rate` (a burst of a whole chunk at line rate is what the cap keeps off the link).
    Raises: Cancelled once `cancel` is set, between slices or in a pause."""
    sent, began = 0, time.monotonic()
    cancel = cancel or threading.Event()  # none given: never set
    size = CHUNK if max_rate <= 0 else int(min(CHUNK, max(PACED_SLICE, max_rate / 10)))
    for name, expected in sorted(manifest.files.items()):
        with os.fdopen(manifests.open_plain(slot / name), "rb") as f:
            left = expected.size  # what the manifest says, never more (the file may grow)
            while left and (chunk := f.read(min(size, left))):
                conn.sendall(chunk)
                sent += len(chunk)
                left -= len(chunk)
                if _pace(sent, began, max_rate, cancel):
                    raise Cancelled(f"cancelled after {sent:,} bytes: a new generation")
            if left or f.read(1):
                raise BadCopy(f"{slot / name}: not the {expected.size} bytes its manifest says")
    return sent


def _pace(sent: int, began: float, max_rate: float, cancel: threading.Event) -> bool:
    """Wait until `sent` bytes are within `max_rate` bytes a second of `began`; whether the
    send was cancelled (meanwhile or before)."""
    ahead = sent / max_rate - (time.monotonic() - began) if max_rate > 0 else 0.0
    return cancel.wait(ahead) if ahead > 0 else cancel.is_set()


def replicas_held(root: Path) -> list[tuple[str, Path]]:
    """Every replica slot under `root` with the node it came from (unverified)."""
    found = []
    if root.is_dir():
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False):
                found += [(entry.name, slot) for slot, _ in tier.memory_saves(Path(entry.path))]
    return found
