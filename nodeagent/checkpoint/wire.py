"""The replica protocol's wire format: what goes over an agent-to-agent connection of the
checkpoint plane, shared by the listener (transport.py) and the side that connects (sender.py).

A request is one line of JSON, at most MAX_HEADER bytes:

    {"v": 2, "job", "node" (who asks), "to" (the node asked), "generation", "nonce",
     "manifest" (a copy left here) | "want": {"rank", "step", "generation"} (a save asked for),
     "auth": a credential binding the SHA-256 of every other field (checkpoint/peerauth.py)}

answered, on one line, `ERR <why>` or `GO <credential>` (a push) or `GO <credential> <manifest>`
(a fetch), the listener's credential binding the request's digest (and the manifest's): the
asker learns it speaks to an agent before it sends or takes a byte. Then the body: the
manifest's files in its (sorted) order, each exactly its size, each checked against its SHA-256
as it arrives, the manifest written last; and a push's last line, `OK` or `ERR <why>`.
A listener answers a request it has not authenticated `ERR refused`, naming nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nodeagent.channel import manifests
from nodeagent.channel.manifests import BadCopy, Manifest
from nodeagent.checkpoint import peerauth
from nodeagent.checkpoint.peerauth import PlaneAuth

VERSION = 2
MAX_HEADER = 1 << 20  # a manifest of 10,000 files fits
HEADER_S = 10.0  # the whole header, however slowly it trickles in
CHUNK = 1 << 20
PACED_SLICE = 64 << 10  # the least a paced send writes at once
TIMEOUT_S = 30.0  # a peer silent this long mid-transfer is given up on
ANSWER_MAX = 2000  # characters of a refusal's reason
REFUSED = "refused"  # all an unauthenticated peer is told
NO_CREDENTIAL = "-"  # in place of a credential where the plane signs nothing (auth: none)
MIN_RATE = 1 << 20  # bytes a second a transfer must average, after TRANSFER_S
TRANSFER_S = 60.0
LEGACY = "a manifest without a SHA-256 of every file (format 1) is never taken"


@dataclass(frozen=True)
class Want:
    """A save asked for: one rank's, of one step, saved by one generation."""

    rank: int
    step: int
    generation: int


@dataclass(frozen=True)
class Hello:
    """Who speaks to whom: the job, the node asking (`node`), the node asked (`to`), and the
    asker's generation."""

    job: str
    node: str
    to: str
    generation: int


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


def request(hello: Hello, auth: PlaneAuth, **what: object) -> tuple[bytes, str]:
    """A request's line, signed, and its digest (what the listener's answer binds)."""
    fields: dict[str, object] = {
        "v": VERSION,
        "job": hello.job,
        "node": hello.node,
        "to": hello.to,
        "generation": hello.generation,
        "nonce": secrets.token_hex(16),
        **what,
    }
    digest = peerauth.digest_of(fields)
    line = _json_line({**fields, "auth": auth.sign(digest) or NO_CREDENTIAL})
    return line, digest


def go_digest(request_digest: str, manifest: Manifest | None = None) -> str:
    """What a listener's `GO` binds: the request, and the manifest it will send."""
    fields = {"answer": "GO", "request": request_digest}
    if manifest is not None:
        fields["manifest"] = manifests.digest(manifest)
    return peerauth.digest_of(dict(fields))


def _json_line(fields: dict[str, object]) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def read_line(conn: socket.socket, deadline: float | None = None) -> bytes:
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


def line(conn: socket.socket, deadline: float | None = None) -> str:
    return read_line(conn, deadline).decode(errors="replace").strip()


def answer(conn: socket.socket, text: str) -> None:
    """One line of answer: `text` (cut at ANSWER_MAX characters, as a refusal's reason may be
    long; a manifest is never sent through here)."""
    with contextlib.suppress(OSError):
        conn.sendall(text.replace("\n", " ")[:ANSWER_MAX].encode() + b"\n")


def by_deadline(conn: socket.socket, deadline: float) -> Callable[[int], bytes]:
    """`conn.recv`, given up on at `deadline` (monotonic) however slowly the bytes trickle in.
    Raises (when called): BadCopy past the deadline."""

    def recv(size: int) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadCopy("the transfer took longer than its size allows (a trickle)")
        conn.settimeout(min(TIMEOUT_S, left))
        try:
            return conn.recv(size)
        except TimeoutError:
            raise BadCopy("the transfer took longer than its size allows (a trickle)") from None

    return recv


def transfer_deadline(began: float, size: int) -> float:
    """When a transfer of `size` bytes begun at `began` (monotonic) is given up on: a trickle
    of a byte every TIMEOUT_S would otherwise hold a connection without end."""
    return began + TRANSFER_S + size / MIN_RATE


def receive(recv: Callable[[int], bytes], slot: Path, manifest: Manifest) -> None:
    """The manifest's files into `slot`, read with `recv`, each checked against its SHA-256 as
    it arrives; the manifest last. Raises: BadCopy."""
    if not manifest.cryptographic:
        raise BadCopy(LEGACY)
    manifests.begin(slot)
    for name, expected in sorted(manifest.files.items()):
        summer, left = manifests.Summer(expected), expected.size
        with open(slot / name, "wb") as f:
            while left:
                chunk = recv(min(CHUNK, left))
                if not chunk:
                    raise BadCopy(f"{name}: the connection closed {left} bytes short")
                summer.update(chunk)
                f.write(chunk)
                left -= len(chunk)
        why = manifests.mismatch(name, summer.result(), expected)
        if why is not None:
            raise BadCopy(why)
    manifests.write_manifest(slot, manifest)


def body(
    conn: socket.socket,
    slot: Path,
    manifest: Manifest,
    max_rate: float,
    cancel: threading.Event | None = None,
    deadline: float | None = None,
    beneath: Path | None = None,
) -> int:
    """Send the manifest's files; paced, in slices of a tenth of a second's worth at
    `max_rate` (a burst of a whole chunk at line rate is what the cap keeps off the link),
    each opened below `beneath` without following a link (manifests.open_plain).
    Raises: Cancelled once `cancel` is set, between slices or in a pause; BadCopy past
    `deadline` (monotonic: a peer that reads a trickle), or a file not plainly there."""
    sent, began = 0, time.monotonic()
    cancel = cancel or threading.Event()  # none given: never set
    size = CHUNK if max_rate <= 0 else int(min(CHUNK, max(PACED_SLICE, max_rate / 10)))
    for name, expected in sorted(manifest.files.items()):
        with os.fdopen(manifests.open_plain(slot / name, beneath), "rb") as f:
            left = expected.size  # what the manifest says, never more (the file may grow)
            while left and (chunk := f.read(min(size, left))):
                conn.sendall(chunk)
                sent += len(chunk)
                left -= len(chunk)
                if _pace(sent, began, max_rate, cancel):
                    raise Cancelled(f"cancelled after {sent:,} bytes: a new generation")
                if deadline is not None and time.monotonic() > deadline:
                    raise BadCopy("the transfer took longer than its size allows (a trickle)")
            if left or f.read(1):
                raise BadCopy(f"{slot / name}: not the {expected.size} bytes its manifest says")
    return sent


def _pace(sent: int, began: float, max_rate: float, cancel: threading.Event) -> bool:
    """Wait until `sent` bytes are within `max_rate` bytes a second of `began`; whether the
    send was cancelled (meanwhile or before)."""
    ahead = sent / max_rate - (time.monotonic() - began) if max_rate > 0 else 0.0
    return cancel.wait(ahead) if ahead > 0 else cancel.is_set()
