"""MUNGE credentials: who made a request, bound to that request. Pure (no process here).

A request that changes the pool carries a credential that `munged` (MUNGE, the daemon every
Slurm site runs) encoded for its caller: the caller's uid and gid, the time, a time to live, and
a payload. The payload is `bound(digest)`: the digest of the request's canonical form, so a
credential taken from one request proves nothing about another. Whoever holds the site's key
(every node's munged) decodes it and learns the uid and gid that the kernel gave the caller.

`Munge` is what encodes and decodes (supervisor/libmunge.py calls libmunge, supervisor/munge.py
runs the `munge` and `unmunge` programs where it cannot; tests hand a fake). A text is decoded
only when it is a credential and nothing else (`is_munge_credential`): munged reads a
credential and ignores what follows it, so a replay with a tail would pass for another
credential; `credential_id` names the bytes the credential carries, not its text.

`check(decoded, digest, ...)` is the verdict: the payload must bind this request, and the
status must be a success, or, for a credential that was checked once already when its request
was taken (a stored spec), an expired or replayed one, whose signature munged has still
verified.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import re
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

PAYLOAD_PREFIX = "nodeagent-request-v1 "
CREDENTIAL_MAX_BYTES = 4096  # a munge credential of a 90-byte payload is about 200 bytes
MUNGE_CREDENTIAL_RE = re.compile(r"MUNGE:([A-Za-z0-9+/]+=*):")  # as `munge` writes one


class MungeStatus(str, Enum):
    """What munged said of a credential (its error codes, libmunge's `munge_err_t`).

    SUCCESS     valid: made with this site's key, within its time to live, first decode here.
    EXPIRED     valid signature, but older than its time to live (15).
    REWOUND     valid signature, made in the future as this host's clock sees it (16).
    REPLAYED    valid signature, decoded on this host before (17).
    INVALID     not made with this site's key, or altered (14; also a bad MAC, 11).
    MALFORMED   not a credential at all (8, and anything else munged refuses to decode).
    """

    SUCCESS = "success"
    EXPIRED = "expired"
    REWOUND = "rewound"
    REPLAYED = "replayed"
    INVALID = "invalid"
    MALFORMED = "malformed"

    @property
    def signed(self) -> bool:
        """munged verified the signature (the uid, gid and payload are the encoder's)."""
        return self in (
            MungeStatus.SUCCESS,
            MungeStatus.EXPIRED,
            MungeStatus.REWOUND,
            MungeStatus.REPLAYED,
        )


# unmunge's exit status (libmunge's munge_err_t) -> status.
STATUS_OF_CODE = {
    0: MungeStatus.SUCCESS,
    11: MungeStatus.INVALID,
    14: MungeStatus.INVALID,
    15: MungeStatus.EXPIRED,
    16: MungeStatus.REWOUND,
    17: MungeStatus.REPLAYED,
}


@dataclass(frozen=True)
class Decoded:
    """A decoded credential: who encoded it, when, for how long, what it says."""

    status: MungeStatus
    uid: int
    gid: int
    payload: str
    encoded_s: int  # the encoding host's clock, seconds since the epoch
    ttl_s: int


class MungeUnavailable(Exception):
    """munged cannot be reached (no socket, not running, not answering), or its programs are
    missing: nothing can be encoded or checked. Says which socket and why."""


class Munge(Protocol):
    """Encodes and decodes credentials through this host's munged."""

    def encode(
        self, payload: str, ttl_s: int | None = None, restrict_uid: int | None = None
    ) -> str:
        """A credential for the caller of this process, carrying `payload`; with
        `restrict_uid`, one that only that uid (and root) can decode (MUNGE encrypts the
        payload: what hands a minted token to its user through Redis, model/token.py).

        Raises:
            MungeUnavailable: munged cannot be reached.
        """
        ...

    def decode(self, credential: str) -> Decoded | MungeStatus:
        """What the credential says, or why it says nothing (INVALID, MALFORMED).

        Raises:
            MungeUnavailable: munged cannot be reached.
        """
        ...


def digest_of(canonical: bytes) -> str:
    return hashlib.sha256(canonical).hexdigest()


def bound(digest: str) -> str:
    """The payload that binds a credential to the request whose canonical digest is `digest`."""
    return PAYLOAD_PREFIX + digest


def is_munge_credential(text: str) -> bool:
    """`text` is one MUNGE credential and nothing more (what is decoded: munged would read a
    credential followed by anything as that credential)."""
    return len(text) <= CREDENTIAL_MAX_BYTES and MUNGE_CREDENTIAL_RE.fullmatch(text) is not None


def credential_id(credential: str) -> str:
    """A short name of one credential (the replay record keeps these, not credentials). A
    MUNGE credential is named by the bytes it carries: texts that decode alike (base64's
    padding bits) are one credential."""
    found = MUNGE_CREDENTIAL_RE.fullmatch(credential)
    data = credential.encode()
    if found is not None:
        with contextlib.suppress(binascii.Error, ValueError):  # else named by its text
            data = b"MUNGE:" + base64.b64decode(found.group(1))
    return hashlib.sha256(data).hexdigest()[:32]


def check(
    found: Decoded | MungeStatus, digest: str, stored: bool = False, payload: str | None = None
) -> Decoded | str:
    """The decoded credential when it vouches for the request of `digest`, else why not.

    Args:
        stored: the credential was checked in full when its request was taken (a spec in
            Redis, re-checked by a node): expired and replayed ones are then accepted (munged
            verified their signature), a fresh request needs a first decode within its TTL.
        payload: the payload it must carry, where it binds something else than a request
            (a checkpoint plane's header, checkpoint/peerauth.py); `bound(digest)` otherwise.
    """
    if isinstance(found, MungeStatus):
        if found is MungeStatus.INVALID:
            return "credential invalid: not made with this pool's munge key, or altered"
        return "not a munge credential"
    if not found.status.signed:
        return f"credential {found.status.value}"
    if found.payload != (bound(digest) if payload is None else payload):
        return "credential signed for another request (its payload does not match this one)"
    if found.status is MungeStatus.SUCCESS or stored:
        return found
    if found.status is MungeStatus.EXPIRED:
        return f"credential expired (time to live {found.ttl_s} s): sign the request again"
    if found.status is MungeStatus.REPLAYED:
        return "credential replayed: it was used before"
    return "credential made in the future (the clocks of the two hosts disagree)"
