"""The verdict on a decoded credential (model/credential.py) and unmunge's output, as tables."""

from __future__ import annotations

import pytest

from nodeagent.model.credential import Decoded, MungeStatus, bound, check, credential_id
from nodeagent.supervisor.munge import parse_unmunge

DIGEST = "0f" * 32


def decoded(status: MungeStatus, payload: str = bound(DIGEST)) -> Decoded:
    return Decoded(status, 1000, 1000, payload, 1_700_000_000, 300)


@pytest.mark.parametrize(
    ("found", "stored", "verdict"),
    [
        (decoded(MungeStatus.SUCCESS), False, None),
        (decoded(MungeStatus.SUCCESS), True, None),
        (decoded(MungeStatus.REPLAYED), False, "credential replayed: it was used before"),
        (decoded(MungeStatus.REPLAYED), True, None),
        (
            decoded(MungeStatus.EXPIRED),
            False,
            "credential expired (time to live 300 s): sign the request again",
        ),
        (decoded(MungeStatus.EXPIRED), True, None),
        (
            decoded(MungeStatus.REWOUND),
            False,
            "credential made in the future (the clocks of the two hosts disagree)",
        ),
        (
            decoded(MungeStatus.SUCCESS, bound("11" * 32)),
            True,
            "credential signed for another request (its payload does not match this one)",
        ),
        (
            decoded(MungeStatus.SUCCESS, "anything"),
            False,
            "credential signed for another request (its payload does not match this one)",
        ),
        (
            MungeStatus.INVALID,
            True,
            "credential invalid: not made with this pool's munge key, or altered",
        ),
        (MungeStatus.MALFORMED, False, "not a munge credential"),
    ],
)
def test_check(found: Decoded | MungeStatus, stored: bool, verdict: str | None) -> None:
    result = check(found, DIGEST, stored=stored)
    assert result == (found if verdict is None else verdict)


UNMUNGE = (
    "STATUS:          Replayed credential (17)\n"
    "ENCODE_HOST:     localhost (127.0.0.1)\n"
    "ENCODE_TIME:     1795436880\n"
    "DECODE_TIME:     1795436880\n"
    "TTL:             300\n"
    "UID:             1001\n"
    "GID:             1002\n"
    "LENGTH:          25\n"
    "\n"
    "nodeagent-request-v1 a b\n"
)


def test_unmunge_output_is_read() -> None:
    found = parse_unmunge(UNMUNGE, MungeStatus.REPLAYED)
    assert found == Decoded(
        MungeStatus.REPLAYED, 1001, 1002, "nodeagent-request-v1 a b\n", 1795436880, 300
    )
    assert parse_unmunge(UNMUNGE.replace("UID:             1001\n", ""), MungeStatus.SUCCESS) is (
        MungeStatus.MALFORMED
    )
    assert parse_unmunge("UID: x\nGID: 1\n\n", MungeStatus.SUCCESS) is MungeStatus.MALFORMED


def test_a_credential_is_named_by_a_digest() -> None:
    assert credential_id("MUNGE:a:") != credential_id("MUNGE:b:")
    assert len(credential_id("MUNGE:a:")) == 32
