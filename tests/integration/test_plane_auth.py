"""Only agents speak on the checkpoint plane (issue 40; checkpoint/peerauth.py): real listeners on
loopback, a real munged, real files, and an outsider as another Unix uid (nobody) with the
system's Python, the `munge` program and no nodeagent code. Every attack here was served by
the listener before: a fetch claiming a member's name from its address, a forged push, a
listener at an address a share names that is not an agent."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from nodeagent.channel import manifests, tier
from nodeagent.checkpoint import peerauth, sender, wire
from nodeagent.checkpoint.peerauth import PAYLOAD_PREFIX, MungePlane, Unauthenticated
from nodeagent.checkpoint.replicas import Replicas
from nodeagent.checkpoint.transport import Offer
from nodeagent.checkpoint.wire import Hello, ReplicaError, Want
from nodeagent.config.load import load_config
from nodeagent.config.settings import Config
from nodeagent.coord.bounded import unbounded
from nodeagent.job.checkpoints.replicaduties import ReplicaDuties
from nodeagent.model.credential import bound
from nodeagent.model.job import Event
from nodeagent.model.tiers import TierReport
from nodeagent.runtime.jobrun import plane_auth
from nodeagent.telemetry.checkpoints import CheckpointMetrics
from tests.helpers.munge import MungeDaemon
from tests.helpers.runas import AS_TESTER
from tests.helpers.tiers import CopyState, fake_save, node_replicas, terms
from tests.helpers.users import User, reachable_dir

JOB = "j"
OUTSIDER = Path(__file__).parent.parent / "fixtures" / "outsider.py"
NOBODY = User("nobody", 65534, 65534)
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def plane(munged: MungeDaemon) -> MungePlane:
    return MungePlane(munged.program(), os.geteuid())


@pytest.fixture
def b(tmp_path: Path, plane: MungePlane) -> Iterator[Replicas]:
    """Node b, holding a's save of step 30 in its memory tier, serving its member a."""

    def accept(offer: Offer) -> str | None:
        return None if offer.node == "a" else f"{offer.node} is not a peer the leader named"

    with node_replicas(tmp_path / "b", "b", accept, JOB, auth=plane) as made:
        fake_save(tier.slots(made.memory, 0)[0], 30, size=50_000)
        yield made


@pytest.fixture
def outsider() -> Iterator[tuple[Path, User]]:
    """The outsider's script where nobody can read it."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("needs root, setpriv and the system's python3 to run as another uid")
    with reachable_dir("outsider-") as directory:
        script = directory / "outsider.py"
        shutil.copy(OUTSIDER, script)
        script.chmod(0o644)
        yield script, NOBODY


def run_as(who: tuple[Path, User], *argv: str) -> dict[str, object]:
    script, user = who
    done = user.run([SYSTEM_PYTHON, str(script), *argv], timeout=60)
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout)
    return found


def refusals(replicas: Replicas, count: int) -> list[str]:
    deadline = time.monotonic() + 10
    seen: list[str] = []
    while len(seen) < count and time.monotonic() < deadline:
        seen += [r.why for r in replicas.take_refused()]
        time.sleep(0.02)
    return seen


def test_agents_copy_and_fetch_with_credentials_both_ways(
    b: Replicas, plane: MungePlane, tmp_path: Path
) -> None:
    assert b.address is not None
    fake_save(tmp_path / "mine", 12, rank=1, size=80_000)
    sent = sender.send(b.address, Hello(JOB, "a", "b", 3), tmp_path / "mine", plane)
    assert sent == manifests.read_manifest(tmp_path / "mine").size
    got = sender.fetch(b.address, Hello(JOB, "a", "b", 3), Want(0, 30, 3), tmp_path / "got", plane)
    slot = tier.find_save(None, tmp_path, 0, 30, 3)
    assert slot is not None and manifests.verify(slot) == got


def test_an_outsider_on_a_member_node_is_told_nothing_and_given_nothing(
    b: Replicas, outsider: tuple[Path, User], munged: MungeDaemon, tmp_path: Path
) -> None:
    """Another uid on node a, connecting from a's address and claiming to be a: its credential
    is munged's (valid), but of uid 65534, not the agents'."""
    assert b.address is not None
    fetched = run_as(outsider, "fetch", b.address, JOB, "a", "b", munged.socket, "0", "30", "3")
    assert fetched == {"answer": "ERR refused", "bytes": 0}
    fake_save(tmp_path / "forged", 31)
    manifest = manifests.read_manifest(tmp_path / "forged").to_json()
    pushed = run_as(outsider, "push", b.address, JOB, "a", "b", munged.socket, manifest)
    assert pushed == {"answer": "ERR refused", "bytes": 0}
    assert not any((s / manifests.MANIFEST).exists() for s, _ in tier.area_saves(b.area))
    why = refusals(b, 2)
    assert len(why) == 2 and all("uid 65534, not of the agents' (0)" in w for w in why), why


def test_a_listener_that_is_not_an_agent_is_sent_nothing(
    outsider: tuple[Path, User], munged: MungeDaemon, plane: MungePlane, tmp_path: Path
) -> None:
    """A share naming a stranger's address (anyone holding the agents' Redis password can write
    one): the sender asks its credential first, and sends no byte of the save."""
    with reachable_dir("outsider-port-") as directory:
        directory.chmod(0o777)  # the outsider writes its port there
        port_file = directory / "port"
        result: dict[str, object] = {}
        thread = threading.Thread(
            target=lambda: result.update(run_as(outsider, "listen", str(port_file), munged.socket))
        )
        thread.start()
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        fake_save(tmp_path / "mine", 12, size=80_000)
        with pytest.raises(ReplicaError, match="is not an agent of this cluster: a credential of"):
            sender.send(
                f"127.0.0.1:{port_file.read_text()}",
                Hello(JOB, "a", "b", 3),
                tmp_path / "mine",
                plane,
            )
        thread.join(30)
    assert result == {"bytes": 0}


def test_a_request_replayed_or_signed_for_something_else_is_refused(
    b: Replicas, plane: MungePlane, munged: MungeDaemon, tmp_path: Path
) -> None:
    """A request seen on the wire, sent again, is refused (munged: replayed); so is a credential
    an agent made for another purpose (a pool request's)."""
    assert b.address is not None
    want = {"rank": 0, "step": 30, "generation": 3}
    line, _ = wire.request(Hello(JOB, "a", "b", 3), plane, want=want)
    assert _ask(b.address, line).startswith("GO MUNGE:")
    assert _ask(b.address, line) == "ERR refused"
    fields = json.loads(line)
    fields["nonce"] = "ff" * 16
    del fields["auth"]
    digest = peerauth.digest_of(fields)
    fields["auth"] = munged.program().encode(bound(digest))
    assert _ask(b.address, json.dumps(fields).encode() + b"\n") == "ERR refused"
    fields["auth"] = munged.program().encode(PAYLOAD_PREFIX + digest)
    assert _ask(b.address, json.dumps(fields).encode() + b"\n").startswith("GO MUNGE:")
    why = refusals(b, 2)
    assert any("replayed" in w for w in why) and any("another request" in w for w in why), why


def _ask(address: str, line: bytes) -> str:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(line)
        return conn.makefile("rb").readline().decode().strip()


def test_no_copies_without_munged_unless_the_config_says_auth_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node whose munged cannot be reached runs its job with no copies between nodes, never
    with an open plane; `auth: none` opens it, and says so."""

    def config(auth: str | None) -> Config:
        replication = {"auth": auth} if auth else {}
        checkpoint: dict[str, object] = {"memory_size": "16MiB", "memory_dir": str(tmp_path)}
        checkpoint["replication"] = replication
        return load_config(
            {
                "node": {"name": "a"},
                "redis": {"url": "redis://127.0.0.1:1/0"},
                "pool": {"munge_socket": str(tmp_path / "no-munged")},
                "job": {"id": JOB, "entrypoint": ["true"], **AS_TESTER, "checkpoint": checkpoint},
            }
        )

    with caplog.at_level(logging.INFO):
        assert plane_auth(config(None)) is None
        assert "no copies between nodes" in caplog.text and "auth: none" in caplog.text
        assert isinstance(plane_auth(config("none")), Unauthenticated)
        assert "any host that reaches" in caplog.text


def test_a_refusal_is_published_once_a_minute_per_address(
    b: Replicas, outsider: tuple[Path, User], munged: MungeDaemon
) -> None:
    """`checkpoint_plane_refused`, naming the address, what it claimed and why: once, not once
    per connection of a flood."""
    clock = [100.0]
    copies = ReplicaDuties(
        b,
        CopyState(),
        unbounded,
        terms("b"),
        CheckpointMetrics(JOB, CollectorRegistry()),
        clock=lambda: clock[0],
    )
    assert b.address is not None
    for _ in range(2):
        run_as(outsider, "fetch", b.address, JOB, "a", "b", munged.socket, "0", "30", "3")
    events = _wait_events(copies)
    assert [e.type for e in events] == ["checkpoint_plane_refused"], events
    assert events[0].data["from"] == "127.0.0.1" and events[0].data["claimed"] == "a"
    assert "uid 65534" in events[0].message
    clock[0] += 61
    run_as(outsider, "fetch", b.address, JOB, "a", "b", munged.socket, "0", "30", "3")
    assert [e.type for e in _wait_events(copies)] == ["checkpoint_plane_refused"]


def _wait_events(copies: ReplicaDuties) -> list[Event]:
    """What one pass of the loop publishes (the listener records a refusal before it answers)."""
    return copies.tick(None, TierReport())
