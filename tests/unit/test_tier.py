"""The checkpoint tiers' format (nodeagent/channel/tier.py, manifests.py, restore.py):
manifests, verification, slots, verified copies, the restore order. Files in a temporary
directory; no torch."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from nodeagent.channel import manifests, restore, tier
from nodeagent.channel.manifests import BadCopy, Manifest
from nodeagent.channel.restore import Source
from nodeagent.checkpoint import scan, space
from nodeagent.checkpoint.space import check_room
from nodeagent.config.settings import CheckpointConfig
from nodeagent.errors import ConfigError
from nodeagent.model.tiers import Held
from tests.helpers.tiers import fake_save


def test_a_manifest_round_trips_and_verifies(tmp_path: Path) -> None:
    fake_save(tmp_path, 40)
    manifest = manifests.verify(tmp_path)
    assert (manifest.step, manifest.generation, manifest.world_size, manifest.rank) == (40, 3, 2, 0)
    assert set(manifest.files) == {"__0_0.distcp", ".metadata"}
    assert manifest.size == (tmp_path / "__0_0.distcp").stat().st_size + 6
    assert Manifest.from_json(manifest.to_json(), "x") == manifest


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda d: _flip(d / "__0_0.distcp", 517), "checksum"),
        (lambda d: (d / "__0_0.distcp").write_bytes(b"short"), "5 bytes, the manifest says"),
        (lambda d: (d / ".metadata").unlink(), "missing"),
        (lambda d: (d / manifests.MANIFEST).unlink(), "no manifest.json"),
        (lambda d: (d / manifests.MANIFEST).write_text("{"), "not JSON"),
    ],
    ids=["flipped bit", "truncated", "missing file", "no manifest", "torn manifest"],
)
def test_a_damaged_save_is_refused_naming_what_is_wrong(tmp_path: Path, damage, said) -> None:  # type: ignore[no-untyped-def]
    fake_save(tmp_path, 7)
    damage(tmp_path)
    with pytest.raises(BadCopy, match=said):
        manifests.verify(tmp_path)


def _flip(path: Path, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


def test_a_manifest_says_how_long_the_save_held_the_step() -> None:
    manifest = Manifest(3, 1, 1, 0, {"a": manifests.FileSum(1, "ab" * 32)}, blocked_s=0.0123)
    assert Manifest.from_json(manifest.to_json(), "x").blocked_s == 0.0123
    with pytest.raises(BadCopy, match="'blocked_s' must be a number of seconds"):
        Manifest.from_json(manifest.to_json().replace("0.0123", '"x"'), "x")


@pytest.mark.parametrize(
    "body",
    [
        {"format": 3},
        {"format": 1, "step": -1, "generation": 0, "world_size": 1, "rank": 0, "files": {"a": {}}},
        {"format": 1, "step": 1, "generation": 0, "world_size": 1, "rank": 1, "files": {}},
        {"format": 1, "step": True, "generation": 0, "world_size": 1, "rank": 0},
        {
            "format": 1,
            "step": 1,
            "generation": 0,
            "world_size": 1,
            "rank": 0,
            "files": {"../etc/passwd": {"size": 1, "crc32": 1}},
        },
        {
            "format": 1,
            "step": 1,
            "generation": 0,
            "world_size": 1,
            "rank": 0,
            "files": {"a": {"size": 1.5, "crc32": 1}},
        },
        {
            "format": 2,
            "step": 1,
            "generation": 0,
            "world_size": 1,
            "rank": 0,
            "files": {"a": {"size": 1, "sha256": "AB" * 32}},
        },
        {
            "format": 2,
            "step": 1,
            "generation": 0,
            "world_size": 1,
            "rank": 0,
            "files": {"a": {"size": 1, "crc32": 1}},
        },
    ],
    ids=[
        "format",
        "negative step",
        "rank beyond world",
        "boolean",
        "path",
        "fraction",
        "digest",
        "crc as sha256",
    ],
)
def test_a_manifest_nodeagent_did_not_write_is_refused(body: dict[str, object]) -> None:
    with pytest.raises(BadCopy, match="where"):
        Manifest.from_json(json.dumps(body), "where")


def test_a_link_in_place_of_a_file_is_refused(tmp_path: Path) -> None:
    fake_save(tmp_path / "save", 1)
    target = tmp_path / "save" / "__0_0.distcp"
    (tmp_path / "elsewhere").write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BadCopy, match="symbolic link"):
        manifests.verify(tmp_path / "save")


def test_saves_alternate_between_slots_and_a_cut_save_spares_the_newest(tmp_path: Path) -> None:
    first = tier.slot_for_save(tmp_path, 1)
    fake_save(first, 10, rank=1)
    second = tier.slot_for_save(tmp_path, 1)
    assert second != first
    fake_save(second, 20, rank=1)
    assert tier.newest_in_memory(tmp_path, 1) == second
    # The next save goes to the older slot; killed half way it leaves step 20 whole.
    cut = tier.slot_for_save(tmp_path, 1)
    assert cut == first
    manifests.begin(cut)
    (cut / "__0_0.distcp").write_bytes(b"half")
    assert tier.newest_in_memory(tmp_path, 1) == second
    assert manifests.verify(second).step == 20
    assert tier.slot_for_save(tmp_path, 1) == first  # and the one after goes there again
    assert tier.newest_in_memory(tmp_path, 1, step=10) is None
    assert sorted(rank for _, rank in tier.memory_saves(tmp_path)) == [1, 1]


def test_a_verified_copy_refuses_a_source_that_changed_and_leaves_no_manifest(
    tmp_path: Path,
) -> None:
    fake_save(tmp_path / "memory", 5)
    copied = manifests.copy_verified(tmp_path / "memory", tmp_path / "disk" / "rank-0")
    assert manifests.verify(tmp_path / "disk" / "rank-0") == copied
    _flip(tmp_path / "memory" / "__0_0.distcp", 3)
    with pytest.raises(BadCopy, match="checksum"):
        manifests.copy_verified(tmp_path / "memory", tmp_path / "disk2" / "rank-0")
    assert not (tmp_path / "disk2" / "rank-0" / manifests.MANIFEST).exists()


def test_steps_of_a_directory_newest_first(tmp_path: Path) -> None:
    for step in (5, 100, 20):
        tier.step_dir(tmp_path, step).mkdir()
    (tmp_path / "step-x").mkdir()
    assert tier.steps(tmp_path) == [100, 20, 5]
    assert tier.steps(tmp_path / "none") == []


def test_the_restore_order_round_trips_through_the_environment() -> None:
    order = (Source("memory", 120), Source("persistent", 100), Source("script"), Source("start"))
    assert restore.order_to_env(order) == "memory:120 persistent:100 script start"
    assert restore.order_from_env(restore.order_to_env(order)) == order
    with pytest.raises(ValueError, match="'disk:1' is not one of"):
        restore.order_from_env("memory:1 disk:1")


def test_a_node_without_room_for_the_memory_tier_is_refused_naming_the_numbers(
    tmp_path: Path,
) -> None:
    free = shutil.disk_usage(tmp_path).free
    config = CheckpointConfig(memory_size=free * 4, memory_dir=str(tmp_path / "shm"))
    with pytest.raises(ConfigError, match=r"job.checkpoint.memory_size: .* GiB wanted .* free"):
        check_room(config, "n0", "j")
    check_room(CheckpointConfig(memory_size=1 << 20, memory_dir=str(tmp_path / "shm")), "n0", "j")


def test_room_is_wanted_for_the_peers_copies_too(tmp_path: Path) -> None:
    half = shutil.disk_usage(tmp_path).free * 6 // 10  # room for one, not for two
    shm = str(tmp_path / "shm")
    check_room(CheckpointConfig(memory_size=half, memory_dir=shm, replicas=0), "n0", "j")
    with pytest.raises(ConfigError, match=r"memory tier and 1 peers' copies.*or lower replicas"):
        check_room(CheckpointConfig(memory_size=half, memory_dir=shm, replicas=1), "n0", "j")


def test_jobs_sharing_a_node_share_its_memory_tier_space_by_what_each_asked_for(
    tmp_path: Path,
) -> None:
    """Two jobs on one node: each is promised what it asked for. A third that would not fit
    beside what the others asked for (and have not filled yet) is refused, naming them; what
    a job already holds is not counted twice."""
    shm = tmp_path / "shm"
    part = shutil.disk_usage(tmp_path).free * 4 // 10  # room for two, not three
    a = CheckpointConfig(memory_size=part, memory_dir=str(shm), replicas=0)
    check_room(a, "n0", "c", {"a": a})  # one beside: room for both
    with pytest.raises(ConfigError, match=r"beside the .* GiB promised to a, b \(total"):
        check_room(a, "n0", "c", {"a": a, "b": a})
    fake_save(shm / "n0.a" / "rank-0" / "slot-0", step=1)  # a's tier holds a little already
    with pytest.raises(ConfigError, match="promised to a, b"):
        check_room(a, "n0", "c", {"a": a, "b": a})
    elsewhere = CheckpointConfig(memory_size=part, memory_dir=str(tmp_path / "other"))
    check_room(a, "n0", "c", {"a": elsewhere, "b": elsewhere})  # another memory_dir: not this


def _tier(memory: Path, node: str, job: str, marked: bool = True) -> Path:
    path = memory / f"{node}.{job}"
    fake_save(path / "rank-0" / "slot-0", step=3)
    if marked:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            space.mark(fd, node, job)
        finally:
            os.close(fd)
    return path


def test_a_sweep_removes_this_nodes_tiers_of_jobs_it_does_not_serve(tmp_path: Path) -> None:
    memory = tmp_path / "nodeagent"
    memory.mkdir(mode=0o700)
    served = _tier(memory, "a", "served")
    left = _tier(memory, "a", "left-while-down")
    others = [
        _tier(memory, "b", "other-node"),
        _tier(memory, "a.b", "c"),  # node a.b's: its name starts with "a." too
        _tier(memory, "a", "unmarked", marked=False),  # not one this version made: left
    ]
    (memory / "a.file").write_text("not a tier")
    (tmp_path / "elsewhere").mkdir()
    (memory / "a.link").symlink_to(tmp_path / "elsewhere")
    removed = space.sweep([str(memory), str(tmp_path / "absent")], "a", ("served",))
    assert removed == [left]
    assert all(p.exists() for p in [served, *others, tmp_path / "elsewhere", memory / "a.file"])
    assert space.sweep([str(memory)], "a", ()) == [served]  # serving nothing


def test_a_sweep_leaves_a_memory_dir_someone_else_may_write_alone(tmp_path: Path) -> None:
    memory = tmp_path / "nodeagent"
    memory.mkdir()
    memory.chmod(0o777)
    tier_path = _tier(memory, "a", "job")
    assert space.sweep([str(memory)], "a", ()) == []
    assert tier_path.exists()


@pytest.mark.parametrize("made", ["fifo", "link", "huge"])
def test_a_manifest_a_worker_replaced_is_refused_without_blocking_or_following(
    tmp_path: Path, made: str
) -> None:
    """The agent reads the workers' slots as root on every tick of its loop: a FIFO must not
    block it, a link must not make it read another file, a huge file must not be read whole."""
    slot = tmp_path / "slot-0"
    fake_save(slot, 4)
    manifest = slot / manifests.MANIFEST
    manifest.unlink()
    if made == "fifo":
        os.mkfifo(manifest)
    elif made == "link":
        manifest.symlink_to("/dev/zero")
    else:
        manifest.write_bytes(b" " * (manifests.MANIFEST_MAX + 1))
    said = {"fifo": "not a regular file", "link": "link", "huge": "more than"}[made]
    with pytest.raises(BadCopy, match=said) as refused:
        manifests.read_manifest(slot)
    assert not isinstance(refused.value, manifests.NoSave)  # something is there, and wrong
    assert manifests.manifest_in(slot) is None
    manifest.unlink()
    with pytest.raises(manifests.NoSave, match=r"no manifest\.json"):  # nothing there: absent
        manifests.read_manifest(slot)


@pytest.mark.parametrize(
    ("held_ranks", "got", "whole"),
    [
        ((2,), 2, False),  # rank 3 of that node is not here yet
        ((2, 3), 3, True),
        ((0, 1, 2), 2, False),  # ranks of another node do not make this one whole
        ((4,), 4, True),  # the last node of world 5 runs one rank
    ],
)
def test_a_copy_completes_the_save_of_the_node_that_made_it(
    held_ranks: tuple[int, ...], got: int, whole: bool
) -> None:
    held = (Held(10, 5, held_ranks, 2),)
    assert scan.completes_node(held, Manifest(10, 2, 5, got), per_node=2) is whole


def test_copies_of_another_generation_or_world_do_not_complete_a_save() -> None:
    got = Manifest(10, 2, 4, 3)
    assert not scan.completes_node((Held(10, 4, (2, 3), 1),), got, per_node=2)
    assert not scan.completes_node((Held(10, 6, (2, 3), 2),), got, per_node=2)
    assert scan.completes_node((Held(10, 4, (2, 3), 2),), got, per_node=2)
