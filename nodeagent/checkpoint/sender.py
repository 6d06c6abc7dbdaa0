"""The side of the checkpoint plane that connects: a copy of this node's save sent to a peer's
listener (`send`), a save this node must restore brought from a peer that holds it (`fetch`).
The wire format is wire.py's; neither sends or takes a byte of a save before the listener
proved it is an agent of this cluster (its `GO` carries a credential binding the request).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from pathlib import Path

from nodeagent.channel import manifests, pin
from nodeagent.channel.manifests import BadCopy, Manifest
from nodeagent.checkpoint import wire
from nodeagent.checkpoint.peerauth import PlaneAuth
from nodeagent.checkpoint.wire import Cancelled, Hello, ReplicaError, Unavailable, Want
from nodeagent.model.credential import MungeUnavailable


def send(
    peer: str,
    hello: Hello,
    slot: Path,
    auth: PlaneAuth,
    max_rate: float = 0.0,
    timeout: float = wire.TIMEOUT_S,
    cancel: threading.Event | None = None,
    beneath: Path | None = None,
    most: int | None = None,
) -> int:
    """Copy the save in `slot` to the listener at `peer` ("host:port") of node `hello.to`; the
    bytes sent. `cancel`: once set, the send stops at its next slice (a paced one, in its
    pause). `beneath`: the agent's directory above the slot, nothing below it followed
    (manifests.open_plain); `most`: the bytes a save may take (manifests.read_manifest).

    Raises: ReplicaError naming the peer and why (its answer, the connection's failure, a
        listener that is not an agent), Cancelled; BadCopy if `slot` holds no save, or one of a
        format never sent."""
    manifest = manifests.read_manifest(slot, beneath, most)
    if not manifest.cryptographic:
        raise BadCopy(f"{slot}: a save of format 1 (no SHA-256 per file) is never sent")
    sent = 0
    try:
        with _connect(peer, timeout) as conn:
            line, digest = wire.request(hello, auth, manifest=json.loads(manifest.to_json()))
            conn.sendall(line)
            said = wire.line(conn)
            word, _, credential = said.partition(" ")
            if word != "GO":
                raise ReplicaError(f"replica to {peer}: {said}")
            _vouched(auth, credential, wire.go_digest(digest), peer)
            # A receiver that gives up mid-body closes the connection: its answer says why.
            with contextlib.suppress(OSError):
                sent = wire.body(conn, slot, manifest, max_rate, cancel, beneath=beneath)
            said = wire.line(conn)
    except Cancelled as exc:
        raise Cancelled(f"replica to {peer}: {exc}") from None
    except ReplicaError:
        raise
    except (OSError, BadCopy, MungeUnavailable) as exc:
        raise ReplicaError(f"replica to {peer}: {exc}") from None
    if said != "OK":
        raise ReplicaError(f"replica to {peer}: {said}")
    return sent


def fetch(
    peer: str,
    hello: Hello,
    want: Want,
    area: Path,
    auth: PlaneAuth,
    digest: str | None = None,
    timeout: float = wire.TIMEOUT_S,
    memory: Path | None = None,
) -> Manifest:
    """Bring the save `want` from the listener at `peer` (of node `hello.to`) into `area` (a
    node's directory of a replica area: `<area>/rank-<R>/slot-N`), every byte checked against
    the manifest the peer sends, and that manifest against `digest` (what its holder reported)
    when given; never into a slot holding the save pinned in this node's memory tier `memory`.

    Raises: ReplicaError naming the peer and why: a copy that does not match, a listener that
        is not an agent, or Unavailable (its answer, the connection's failure); nothing of a
        copy that failed stays."""
    asked = {"rank": want.rank, "step": want.step, "generation": want.generation}
    slot: Path | None = None
    try:
        with _connect(peer, timeout) as conn:
            line, request = wire.request(hello, auth, want=asked)
            conn.sendall(line)
            said = wire.line(conn)
            word, _, rest = said.partition(" ")
            if word != "GO":
                raise Unavailable(f"replica from {peer}: {said}")
            credential, _, raw = rest.partition(" ")
            manifest = Manifest.from_json(raw, f"{peer}'s manifest")
            _vouched(auth, credential, wire.go_digest(request, manifest), peer)
            _expected(manifest, want, digest)
            slot = pin.slot_for_copy(area, want.rank, memory)
            deadline = wire.transfer_deadline(time.monotonic(), manifest.size)
            wire.receive(wire.by_deadline(conn, deadline), slot, manifest)
    except (OSError, BadCopy, MungeUnavailable) as exc:
        if slot is not None:
            with contextlib.suppress(OSError, BadCopy):
                manifests.begin(slot)
        failed = Unavailable if isinstance(exc, OSError | MungeUnavailable) else ReplicaError
        raise failed(f"replica from {peer}: {exc}") from None
    return manifest


def _connect(peer: str, timeout: float) -> socket.socket:
    host, _, port = peer.rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)


def _vouched(auth: PlaneAuth, credential: str, digest: str, peer: str) -> None:
    """Raises: BadCopy: the listener's answer is not an agent's (nothing more is sent or
    taken)."""
    why = auth.check(credential, digest)
    if why is not None:
        raise BadCopy(f"the listener at {peer} is not an agent of this cluster: {why}")


def _expected(manifest: Manifest, want: Want, digest: str | None) -> None:
    """Raises: BadCopy: not the save asked for, or not the one its holder reported."""
    if digest and manifests.digest(manifest) != digest:
        raise BadCopy(f"its manifest is not the save its holder reported ({digest})")
    if (manifest.rank, manifest.step, manifest.generation) != (
        want.rank,
        want.step,
        want.generation,
    ):
        raise BadCopy(f"it sent step {manifest.step}@{manifest.generation} rank {manifest.rank}")
