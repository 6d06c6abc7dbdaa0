"""Who speaks on the checkpoint plane: every replica connection proves, in both directions and
before a byte of a save moves, that the other end is an agent of this cluster (issue 40).

The proof is a MUNGE credential, the mechanism Slurm authenticates every node-to-node message
with, and the one `pool.auth: munge` deploys already (one key on every node, munged on each):
munged encodes the caller's uid as the kernel gave it, so a credential of the agents' service
account (the uid this agent runs as) can be made only by an agent, never by a job's user or
another user on the node; its payload binds the SHA-256 of the request it travels with, so it
proves nothing of another; munged refuses a credential decoded on this host before (replayed)
or past its time to live (60 s). Why not mutual TLS: it needs a certificate authority, a
certificate per node and its rotation, all new; MUNGE is there, costs about 2 ms an encode or
decode here (two of each per connection), and binds the kernel's uid, which a certificate does
not. What MUNGE does not give: secrecy. A host on the network path still sees the bytes of a
copy; docs/operations.md says so and what to do about it.

`replication.auth: none` (`Unauthenticated`) keeps the plane open to anyone who can reach the
listener; the agent uses it only where the config says so (runtime/jobrun.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Protocol

from nodeagent.model.credential import Munge, check

PAYLOAD_PREFIX = "nodeagent-plane-v1 "
TTL_S = 60


class PlaneAuth(Protocol):
    """Signs what this agent says on the plane, and checks what a peer says."""

    @property
    def mode(self) -> str:
        """munge or none (what docs and logs call it)."""
        ...

    def sign(self, digest: str) -> str:
        """A credential binding `digest` (empty where nothing is signed).

        Raises: MungeUnavailable."""
        ...

    def check(self, credential: str, digest: str) -> str | None:
        """None if `credential` proves an agent of this cluster said `digest`; else why not.

        Raises: MungeUnavailable."""
        ...


@dataclass(frozen=True)
class MungePlane:
    """Credentials of this agent's uid (`uid`: the agents' service account) through munged."""

    munge: Munge
    uid: int
    mode: str = "munge"

    def sign(self, digest: str) -> str:
        return self.munge.encode(PAYLOAD_PREFIX + digest, TTL_S)

    def check(self, credential: str, digest: str) -> str | None:
        found = self.munge.decode(credential)
        verdict = check(found, digest, payload=PAYLOAD_PREFIX + digest)
        if isinstance(verdict, str):
            return verdict
        if verdict.uid != self.uid:
            return f"a credential of uid {verdict.uid}, not of the agents' ({self.uid})"
        return None


@dataclass(frozen=True)
class Unauthenticated:
    """replication.auth: none: nothing signed, anything taken (the config said so)."""

    mode: str = "none"

    def sign(self, digest: str) -> str:
        return ""

    def check(self, credential: str, digest: str) -> str | None:
        return None


def digest_of(fields: dict[str, object]) -> str:
    """The SHA-256 of a request's or an answer's fields in their canonical form (sorted keys,
    no spaces): what a credential binds."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
