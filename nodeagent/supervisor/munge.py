"""MUNGE's programs: `munge` encodes a credential, `unmunge` decodes one (model/credential.py).

Where libmunge loads, it does this work in process (supervisor/libmunge.py, 10x cheaper); the
programs are the fallback of a host without libmunge2. They ship with munged itself (Debian's
`munge`), speak to it over its socket, and cost a fork and an exec per call. They are child
processes, so they live here with the agent's other children (only supervisor/ starts
processes).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from nodeagent.model.credential import (
    STATUS_OF_CODE,
    Decoded,
    MungeStatus,
    MungeUnavailable,
    is_munge_credential,
)

DEFAULT_SOCKET = "/run/munge/munge.socket.2"
CALL_TIMEOUT_S = 5.0
UNREACHABLE = frozenset({6, 7})  # EMUNGE_SOCKET, EMUNGE_TIMEOUT


@dataclass(frozen=True)
class MungeProgram:
    """`munge` and `unmunge` against the munged listening on `socket`."""

    socket: str = DEFAULT_SOCKET
    munge: str = "munge"
    unmunge: str = "unmunge"

    def encode(
        self, payload: str, ttl_s: int | None = None, restrict_uid: int | None = None
    ) -> str:
        argv = [self.munge, "-S", self.socket]
        if ttl_s is not None:
            argv += ["-t", str(ttl_s)]
        if restrict_uid is not None:
            argv += ["--restrict-uid", str(restrict_uid)]
        done = self._run(argv, payload)
        if done.returncode != 0:
            raise MungeUnavailable(self._why(done))
        return done.stdout.strip()

    def decode(self, credential: str) -> Decoded | MungeStatus:
        if not is_munge_credential(credential):
            return MungeStatus.MALFORMED
        done = self._run([self.unmunge, "-S", self.socket, "-N"], credential)
        if done.returncode in UNREACHABLE:
            raise MungeUnavailable(self._why(done))
        status = STATUS_OF_CODE.get(done.returncode)
        if status is None:
            return MungeStatus.MALFORMED
        if not status.signed:
            return status
        return parse_unmunge(done.stdout, status)

    def _run(self, argv: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=CALL_TIMEOUT_S,
                check=False,
            )
        except FileNotFoundError:
            raise MungeUnavailable(
                f"{argv[0]} not found: install MUNGE (Debian: apt-get install munge)"
            ) from None
        except subprocess.TimeoutExpired:
            raise MungeUnavailable(
                f"munged at {self.socket} did not answer within {CALL_TIMEOUT_S:g} s"
            ) from None

    def _why(self, done: subprocess.CompletedProcess[str]) -> str:
        said = done.stderr.strip().splitlines()
        return f"munged at {self.socket}: {said[-1] if said else f'exit {done.returncode}'}"


def parse_unmunge(text: str, status: MungeStatus) -> Decoded | MungeStatus:
    """unmunge -N's output (metadata lines `KEY: value`, a blank line, the payload). Pure."""
    head, blank, payload = text.partition("\n\n")
    fields = {}
    for line in head.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields[key.strip()] = value.strip()
    try:
        return Decoded(
            status=status,
            uid=int(fields["UID"]),
            gid=int(fields["GID"]),
            payload=payload if blank else "",
            encoded_s=int(fields["ENCODE_TIME"]),
            ttl_s=int(fields["TTL"]),
        )
    except (KeyError, ValueError):
        return MungeStatus.MALFORMED
