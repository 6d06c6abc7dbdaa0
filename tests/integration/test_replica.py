"""Copies of saves between agents (nodeagent/checkpoint/transport.py): a real server on loopback,
real files. What is sent is checked, what is refused leaves nothing, a cut copy spares the last
whole one, a sender keeps to its rate."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.channel import manifests, tier
from nodeagent.channel.manifests import Manifest
from nodeagent.checkpoint import sender, wire
from nodeagent.checkpoint import transport as replica
from nodeagent.checkpoint.peerauth import PlaneAuth, Unauthenticated
from nodeagent.checkpoint.transport import Listening, ReplicaServer
from nodeagent.checkpoint.wire import Hello, ReplicaError, Want
from tests.helpers.forge import force_crc32
from tests.helpers.tiers import fake_save

JOB = "j"
SERVER = "b"  # the node the server is
OPEN = Unauthenticated()  # the tests of the copies themselves; test_plane_auth.py: MUNGE's


def send(address: str, job: str, node: str, generation: int, slot: Path, **more: Any) -> int:
    auth: PlaneAuth = more.pop("auth", OPEN)
    return sender.send(address, Hello(job, node, SERVER, generation), slot, auth, **more)


def fetch(
    address: str, job: str, node: str, generation: int, want: Want, area: Path, digest: str = ""
) -> Manifest:
    hello = Hello(job, node, SERVER, generation)
    return sender.fetch(address, hello, want, area, OPEN, digest or None)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ReplicaServer]:
    refused: dict[str, str] = {}

    def accept(offer: replica.Offer) -> str | None:
        return refused.get(offer.node)

    received: list[replica.Received] = []
    srv = ReplicaServer(
        Listening(JOB, SERVER, OPEN),
        tmp_path / "replicas",
        accept,
        on_received=received.append,
        memory=tmp_path / "tier",
    )
    srv.refused = refused  # type: ignore[attr-defined]
    srv.received = received  # type: ignore[attr-defined]
    yield srv
    srv.close()


def test_a_save_sent_to_a_peer_arrives_whole_and_verified(
    server: ReplicaServer, tmp_path: Path
) -> None:
    fake_save(tmp_path / "mine", 40, rank=1, size=300_000)
    sent = send(server.address, JOB, "a", 3, tmp_path / "mine")
    assert sent == manifests.read_manifest(tmp_path / "mine").size
    [(node, slot)] = [(n, s) for n, s in replica.replicas_held(server.root) if s.exists()]
    assert node == "a" and manifests.verify(slot).step == 40
    wait = time.monotonic() + 5
    while not server.received and time.monotonic() < wait:  # type: ignore[attr-defined]
        time.sleep(0.01)
    [got] = server.received  # type: ignore[attr-defined]
    assert (got.node, got.generation, got.manifest.rank) == ("a", 3, 1)


def test_a_save_the_receiver_does_not_accept_leaves_nothing(
    server: ReplicaServer, tmp_path: Path
) -> None:
    fake_save(tmp_path / "mine", 40)
    server.refused["a"] = "no such manifest recorded for generation 3"  # type: ignore[attr-defined]
    with pytest.raises(ReplicaError, match="refused: no such manifest recorded"):
        send(server.address, JOB, "a", 3, tmp_path / "mine")
    with pytest.raises(ReplicaError, match="not a request to b of job j"):
        send(server.address, "other", "b", 3, tmp_path / "mine")
    assert not any(
        (slot / manifests.MANIFEST).exists() for _, slot in replica.replicas_held(server.root)
    )


def test_bytes_that_do_not_match_the_manifest_are_refused_and_the_last_copy_kept(
    server: ReplicaServer, tmp_path: Path
) -> None:
    fake_save(tmp_path / "mine", 10)
    send(server.address, JOB, "a", 3, tmp_path / "mine")
    fake_save(tmp_path / "mine", 12)
    data = bytearray((tmp_path / "mine" / "__0_0.distcp").read_bytes())
    data[5] ^= 0x40  # the sender's copy went bad after its manifest was written
    (tmp_path / "mine" / "__0_0.distcp").write_bytes(bytes(data))
    with pytest.raises(ReplicaError, match="checksum"):
        send(server.address, JOB, "a", 3, tmp_path / "mine")
    whole = [
        manifests.verify(s).step
        for _, s in replica.replicas_held(server.root)
        if (s / manifests.MANIFEST).exists()
    ]
    assert whole == [10]


def test_a_copy_cut_short_spares_the_last_whole_one(server: ReplicaServer, tmp_path: Path) -> None:
    fake_save(tmp_path / "mine", 10)
    send(server.address, JOB, "a", 3, tmp_path / "mine")
    fake_save(tmp_path / "mine", 12, size=200_000)
    manifest = manifests.read_manifest(tmp_path / "mine")
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(_header(manifest))
        assert conn.makefile("rb").readline() == b"GO -\n"
        conn.sendall(b"x" * 1000)  # then the sender dies
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        slots = [s for _, s in replica.replicas_held(server.root) if s.exists()]
        if len(slots) == 2:
            break
        time.sleep(0.01)
    whole = [
        manifests.verify(s).step
        for _, s in replica.replicas_held(server.root)
        if (s / manifests.MANIFEST).exists()
    ]
    assert whole == [10]


@pytest.mark.parametrize(
    ("header", "said"),
    [
        (b"not json\n", "ERR refused\n"),
        (b'{"v": 1, "job": "j", "node": "a", "generation": 1, "auth": "-"}\n', "ERR refused\n"),
        (b'{"v": 2, "job": "j", "node": "a", "to": "b", "generation": 1}\n', "ERR refused\n"),
        (
            b'{"v": 2, "job": "j", "node": "../x", "to": "b", "generation": 1, "auth": "-"}\n',
            "node '../x' is not a node name",
        ),
        (
            b'{"v": 2, "job": "j", "node": "a", "to": "c", "generation": 1, "auth": "-"}\n',
            "not a request to b of job j",
        ),
        (
            b'{"v": 2, "job": "j", "node": "a", "to": "b", "generation": 1, "auth": "-",'
            b' "manifest": {"format": 2, "step": 1, "generation": 1, "world_size": 1, "rank": 0,'
            b' "files": {"..": {"size": 1, "sha256": "' + b"0" * 64 + b'"}}}}\n',
            "not a plain file name",
        ),
    ],
    ids=["json", "version", "no credential", "node", "another node", "file name"],
)
def test_a_header_nodeagent_did_not_write_is_refused(
    server: ReplicaServer, header: bytes, said: str
) -> None:
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(header)
        answer = conn.makefile("rb").readline().decode()
    assert answer.startswith("ERR") and said in answer, answer
    assert said != "ERR refused\n" or answer == said  # a stranger is told nothing more


def test_a_sender_keeps_to_its_rate(server: ReplicaServer, tmp_path: Path) -> None:
    fake_save(tmp_path / "mine", 1, size=2_000_000)
    began = time.monotonic()
    sent = send(server.address, JOB, "a", 3, tmp_path / "mine", max_rate=4_000_000)
    assert time.monotonic() - began >= sent / 4_000_000 - 0.3  # a lower bound: sleeps only


def test_a_paced_send_spreads_its_bytes_over_the_second_not_one_burst(tmp_path: Path) -> None:
    """A peer that takes anything and notes when each byte came: at 1 MB/s, the first half of
    a 600 kB save cannot have come before a quarter of a second (a lower bound: sleeps only)."""
    fake_save(tmp_path / "mine", 1, size=600_000)
    total = manifests.read_manifest(tmp_path / "mine").size
    arrivals: list[tuple[float, int]] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def peer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.makefile("rb").readline()
                conn.sendall(b"GO\n")
                got = 0
                while got < total and (chunk := conn.recv(1 << 16)):
                    got += len(chunk)
                    arrivals.append((time.monotonic(), got))
                conn.sendall(b"OK\n")

        thread = threading.Thread(target=peer)
        thread.start()
        began = time.monotonic()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        send(address, JOB, "a", 3, tmp_path / "mine", max_rate=1_000_000)
        thread.join(timeout=10)
    half = next(t for t, got in arrivals if got >= total // 2)
    assert half - began >= 0.2, arrivals[:3]


def test_a_paced_send_cancelled_mid_file_stops_and_the_receiver_keeps_nothing_of_it(
    server: ReplicaServer, tmp_path: Path
) -> None:
    """A new generation needs the node: the copy under way (10 s at its rate) stops at its
    next slice, and the peer keeps only its last whole copy."""
    fake_save(tmp_path / "mine", 10)
    send(server.address, JOB, "a", 3, tmp_path / "mine")
    fake_save(tmp_path / "mine", 12, size=2_000_000)
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    with pytest.raises(wire.Cancelled, match="cancelled after") as raised:
        send(server.address, JOB, "a", 3, tmp_path / "mine", max_rate=200_000, cancel=cancel)
    assert server.address in str(raised.value)
    whole = [
        manifests.verify(s).step
        for _, s in replica.replicas_held(server.root)
        if (s / manifests.MANIFEST).exists()
    ]
    assert whole == [10]


def _connect(server: ReplicaServer) -> socket.socket:
    host, port = server.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _header(manifest: Manifest, node: str = "a") -> bytes:
    hello = Hello(JOB, node, SERVER, 3)
    return wire.request(hello, OPEN, manifest=json.loads(manifest.to_json()))[0]


def test_a_second_copy_of_the_same_rank_meanwhile_is_turned_away(
    server: ReplicaServer, tmp_path: Path
) -> None:
    """Two copies of a node's rank at once would write into one slot."""
    fake_save(tmp_path / "mine", 12, size=200_000)
    manifest = manifests.read_manifest(tmp_path / "mine")
    with _connect(server) as first:
        first.sendall(_header(manifest))
        assert first.makefile("rb").readline() == b"GO -\n"  # its body not sent yet
        with pytest.raises(ReplicaError, match="busy: a copy of a's rank 0 is under way"):
            send(server.address, JOB, "a", 3, tmp_path / "mine")
        fake_save(tmp_path / "other", 12, rank=1)  # another rank of the same node: taken
        send(server.address, JOB, "a", 3, tmp_path / "other")
    deadline = time.monotonic() + 5  # the first closed: rank 0 may be copied again
    while True:
        try:
            send(server.address, JOB, "a", 3, tmp_path / "mine")
            break
        except ReplicaError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert sorted(
        manifests.verify(s).rank
        for _, s in replica.replicas_held(server.root)
        if (s / manifests.MANIFEST).exists()
    ) == [0, 1]


def _from(server: ReplicaServer, address: str) -> socket.socket:
    host, port = server.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), 5, (address, 0))


def _held(server: ReplicaServer, tmp_path: Path, address: str, rank: int) -> socket.socket:
    """A transfer of an agent under way from `address`: its request answered GO, its body not
    sent yet (node a's rank `rank`: one copy of a rank at a time)."""
    save = tmp_path / f"held-{rank}"
    fake_save(save, 12, rank=rank, world=16)
    conn = _from(server, address)
    conn.sendall(_header(manifests.read_manifest(save)))
    assert conn.makefile("rb").readline() == b"GO -\n"
    return conn


def _ended(conn: socket.socket) -> bool:
    """The server closed `conn` (it reads its end); False while it keeps it waiting."""
    conn.settimeout(0.5)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_transfers_beyond_the_cap_are_turned_away_not_queued(
    server: ReplicaServer, tmp_path: Path
) -> None:
    held = [
        _held(server, tmp_path, f"127.0.0.{1 + i // 2}", i) for i in range(replica.MAX_RECEIVES)
    ]
    try:
        fake_save(tmp_path / "more", 12, rank=15, world=16)
        with _from(server, "127.0.0.9") as extra:
            extra.sendall(_header(manifests.read_manifest(tmp_path / "more")))
            answer = extra.makefile("rb").readline().decode()
        assert answer.startswith(f"ERR busy: {replica.MAX_RECEIVES} transfers under way"), answer
    finally:
        for conn in held:
            conn.close()


def test_connections_that_prove_nothing_never_turn_an_agent_away(
    server: ReplicaServer, tmp_path: Path
) -> None:
    """Issue 52: a local user opened 2 connections to the listener that sent nothing (and 8
    from 4 addresses), and every send of the genuine agent from its address was answered
    `busy`. Only transfers whose request proved an agent made it count against the limits;
    connections that prove nothing are bounded apart, the oldest dropped to let a new one in."""
    fake_save(tmp_path / "mine", 12)
    strangers = [_from(server, f"127.0.0.{1 + i // 2}") for i in range(8)]
    try:
        for _ in range(3):
            send(server.address, JOB, "a", 3, tmp_path / "mine")
        flood = [_from(server, "127.0.0.1") for _ in range(replica.MAX_UNPROVEN)]
        try:
            send(server.address, JOB, "a", 3, tmp_path / "mine")
            assert all(_ended(conn) for conn in strangers)  # the oldest: dropped for the new
            assert not _ended(flood[-1])  # the newest still waits for its header
        finally:
            for conn in flood:
                conn.close()
    finally:
        for conn in strangers:
            conn.close()
    assert [r.node for r in server.received] == ["a"] * 4  # type: ignore[attr-defined]


def test_a_header_that_trickles_in_is_given_up_on(
    server: ReplicaServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "HEADER_S", 0.3)
    with _connect(server) as conn:
        for byte in b'{"v": 2':
            try:
                conn.sendall(bytes([byte]))
            except OSError:  # the server gave up on it already
                break
            time.sleep(0.06)
        answer = conn.makefile("rb").readline().decode()
    assert answer == "ERR refused\n", answer  # the reason stays in this node's log


def test_a_sender_never_sends_what_a_link_in_the_slot_points_to(
    server: ReplicaServer, tmp_path: Path
) -> None:
    """The slot is the workers': a link there must not make root read another file."""
    fake_save(tmp_path / "mine", 5)
    secret = tmp_path / "secret"
    secret.write_bytes((tmp_path / "mine" / "__0_0.distcp").read_bytes())  # CRC matches
    (tmp_path / "mine" / "__0_0.distcp").unlink()
    (tmp_path / "mine" / "__0_0.distcp").symlink_to(secret)
    with pytest.raises(ReplicaError, match="a link, something else than a file"):
        send(server.address, JOB, "a", 3, tmp_path / "mine")
    assert not [
        s for _, s in replica.replicas_held(server.root) if (s / manifests.MANIFEST).exists()
    ]


def test_a_silent_connection_is_dropped_at_the_header_deadline(
    server: ReplicaServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not after TIMEOUT_S per recv: idle connections would hold every receive slot."""
    monkeypatch.setattr(wire, "HEADER_S", 0.3)
    began = time.monotonic()
    with _connect(server) as conn:
        answer = conn.makefile("rb").readline().decode()
    assert answer == "ERR refused\n", answer
    assert time.monotonic() - began < wire.TIMEOUT_S


def test_a_file_that_grows_after_its_manifest_is_not_sent_past_its_size(
    server: ReplicaServer, tmp_path: Path
) -> None:
    fake_save(tmp_path / "mine", 5)
    with open(tmp_path / "mine" / "__0_0.distcp", "ab") as f:
        f.write(b"appended by the worker")
    with pytest.raises(ReplicaError, match=r"not the .* bytes its manifest says"):
        send(server.address, JOB, "a", 3, tmp_path / "mine")


def test_closing_the_server_ends_the_copies_under_way(tmp_path: Path) -> None:
    srv = ReplicaServer(Listening(JOB, SERVER, OPEN), tmp_path / "replicas", lambda *_: None)
    fake_save(tmp_path / "mine", 12, size=200_000)
    conn = _connect(srv)
    conn.sendall(_header(manifests.read_manifest(tmp_path / "mine")))
    assert conn.makefile("rb").readline() == b"GO -\n"
    srv.close()
    conn.settimeout(5)
    assert conn.recv(100) == b""  # its receive was ended: the connection closed
    conn.close()
    assert not [s for _, s in replica.replicas_held(srv.root) if (s / manifests.MANIFEST).exists()]


def test_a_node_fetches_a_save_from_a_peers_memory_tier_or_replica_area(
    server: ReplicaServer, tmp_path: Path
) -> None:
    fake_save(tier.slots(tmp_path / "tier", 2)[0], 30, rank=2, world=4, size=200_000)
    fake_save(tmp_path / "mine", 30, rank=1)
    send(server.address, JOB, "a", 3, tmp_path / "mine")  # now in its replica area
    for rank in (2, 1):
        want = Want(rank, 30, 3)
        got = fetch(server.address, JOB, "c", 4, want, tmp_path / "fetched" / "b")
        slot = tier.find_save(None, tmp_path / "fetched", rank, 30, 3)
        assert slot is not None and manifests.verify(slot) == got and got.rank == rank


def test_a_fetch_refused_or_not_matching_leaves_nothing(
    server: ReplicaServer, tmp_path: Path
) -> None:
    held = tier.slots(tmp_path / "tier", 0)[0]
    fake_save(held, 30, rank=0, size=200_000)
    area = tmp_path / "fetched" / "b"
    with pytest.raises(ReplicaError, match="no save of rank 0, step 31"):
        fetch(server.address, JOB, "c", 4, Want(0, 31, 0), area)
    with pytest.raises(ReplicaError, match="not the save its holder reported"):
        fetch(server.address, JOB, "c", 4, Want(0, 30, 3), area, "0" * 16)
    data = bytearray((held / "__0_0.distcp").read_bytes())
    data[7] ^= 0x01  # a flipped bit in the holder's copy
    (held / "__0_0.distcp").write_bytes(bytes(data))
    with pytest.raises(ReplicaError, match="checksum"):
        fetch(server.address, JOB, "c", 4, Want(0, 30, 3), area)
    server.refused["c"] = "c is not a member of the job"  # type: ignore[attr-defined]
    with pytest.raises(ReplicaError, match="refused: c is not a member"):
        fetch(server.address, JOB, "c", 4, Want(0, 30, 3), area)
    assert tier.find_save(None, tmp_path / "fetched", 0, 30, None) is None


def test_a_forged_file_whose_crc32_was_forced_back_is_refused(
    server: ReplicaServer, tmp_path: Path
) -> None:
    """The forgery a CRC-32 cannot see (issue 40): the genuine manifest, whose digest its owner
    reported, with `.metadata` replaced by other bytes of the same size and CRC-32. The
    SHA-256 the manifest binds refuses it, and nothing of it stays."""
    fake_save(tmp_path / "mine", 40, size=4096)
    manifest = manifests.read_manifest(tmp_path / "mine")
    genuine = (tmp_path / "mine" / "__0_0.distcp").read_bytes()
    evil = b"cos\nsystem\n(S'touch pwned'\ntR." + genuine[30:]
    forged = force_crc32(evil, len(evil) - 8, zlib.crc32(genuine))
    assert len(forged) == len(genuine) and zlib.crc32(forged) == zlib.crc32(genuine)
    with _connect(server) as conn:
        conn.sendall(_header(manifest))
        reader = conn.makefile("rb")
        assert reader.readline() == b"GO -\n"
        conn.sendall((tmp_path / "mine" / ".metadata").read_bytes() + forged)
        answer = reader.readline().decode()
    assert answer.startswith("ERR __0_0.distcp: checksum SHA-256"), answer
    assert not any(
        (slot / manifests.MANIFEST).exists() for _, slot in replica.replicas_held(server.root)
    )


def test_a_save_of_the_crc32_format_is_read_here_but_never_crosses_the_wire(
    server: ReplicaServer, tmp_path: Path
) -> None:
    """Format 1 (a CRC-32 per file, written before SHA-256) is still restored from the node's
    own tier after an upgrade, never sent, fetched or taken."""
    fake_save(tmp_path / "mine", 40)
    current = manifests.read_manifest(tmp_path / "mine")
    old = {
        name: manifests.FileSum(s.size, crc32=zlib.crc32((tmp_path / "mine" / name).read_bytes()))
        for name, s in current.files.items()
    }
    legacy = dataclasses.replace(current, files=old)
    manifests.write_manifest(tmp_path / "mine", legacy)
    assert manifests.verify(tmp_path / "mine") == legacy and not legacy.cryptographic
    with pytest.raises(manifests.BadCopy, match="format 1"):
        send(server.address, JOB, "a", 3, tmp_path / "mine")
    with _connect(server) as conn:
        conn.sendall(_header(legacy))
        assert b"never taken" in conn.makefile("rb").readline()
    shutil.copytree(tmp_path / "mine", tier.slots(tmp_path / "tier", 0)[0])
    with pytest.raises(ReplicaError, match="predates SHA-256"):
        fetch(server.address, JOB, "c", 4, Want(0, 40, 3), tmp_path / "got")


def test_a_save_whose_manifest_is_long_is_fetched_whole(
    server: ReplicaServer, tmp_path: Path
) -> None:
    """A reply line is never cut: a manifest of 60 files (some 7,000 characters) arrives whole."""
    held = tier.slots(tmp_path / "tier", 0)[0]
    manifests.begin(held)
    for i in range(60):
        (held / f"__0_{i}.distcp").write_bytes(bytes([i]) * 100)
    manifest = Manifest(30, 3, 2, 0, manifests.summarize(held), job=JOB)
    manifests.write_manifest(held, manifest)
    assert len(manifest.to_json()) > 2000
    got = fetch(server.address, JOB, "c", 4, Want(0, 30, 3), tmp_path / "got")
    assert got == manifest


def test_one_address_holds_at_most_two_transfers_and_others_still_get_in(
    server: ReplicaServer, tmp_path: Path
) -> None:
    """One agent's transfers no longer take every slot (issue 40)."""
    held = [_held(server, tmp_path, "127.0.0.1", rank) for rank in range(replica.PER_ADDRESS)]
    try:
        with pytest.raises(ReplicaError, match="busy: 2 transfers from one address"):
            fake_save(tmp_path / "third", 12, rank=9, world=16)
            send(server.address, JOB, "a", 3, tmp_path / "third")
        fake_save(tmp_path / "mine", 12)
        with _from(server, "127.0.0.2") as other:
            other.sendall(_header(manifests.read_manifest(tmp_path / "mine"), node="c"))
            assert other.makefile("rb").readline() == b"GO -\n"
    finally:
        for conn in held:
            conn.close()


def test_a_copy_that_trickles_in_is_given_up_on_at_its_deadline(
    server: ReplicaServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A byte now and then, each within the per-read timeout, used to hold a slot without end:
    the whole transfer has a deadline that grows with its size."""
    monkeypatch.setattr(wire, "TRANSFER_S", 0.5)
    fake_save(tmp_path / "mine", 12, size=200_000)
    began = time.monotonic()
    with _connect(server) as conn:
        conn.sendall(_header(manifests.read_manifest(tmp_path / "mine")))
        reader = conn.makefile("rb")
        assert reader.readline() == b"GO -\n"
        answer = b""
        body = (tmp_path / "mine" / ".metadata").read_bytes()
        body += (tmp_path / "mine" / "__0_0.distcp").read_bytes()
        for byte in body[:100]:
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
            conn.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                answer = conn.recv(200)
            conn.setblocking(True)
            if answer:
                break
    assert b"took longer than its size allows" in answer, answer
    assert time.monotonic() - began < 5
    assert not [s for _, s in replica.replicas_held(server.root) if (s / "manifest.json").exists()]


def test_a_copy_larger_than_a_ranks_share_is_refused_before_a_byte(tmp_path: Path) -> None:
    srv = ReplicaServer(Listening(JOB, SERVER, OPEN, most=100_000), tmp_path / "r", lambda _: None)
    try:
        fake_save(tmp_path / "mine", 12, size=300_000)
        with pytest.raises(ReplicaError, match=r"more than the 100,000 one rank's copy may take"):
            send(srv.address, JOB, "a", 3, tmp_path / "mine")
    finally:
        srv.close()
