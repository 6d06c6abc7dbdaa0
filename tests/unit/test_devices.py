"""The device cgroup's pure parts (supervisor/devices.py): the BPF program, run here by a small
interpreter of the instructions it uses (the kernel runs it in tests/integration/
test_device_cgroup.py), and where the agent's own cgroup v2 directory is."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from nodeagent.supervisor.devices import DeviceCgroupError, own_cgroup, program

CHAR, BLOCK = 2, 1
READ, WRITE, MKNOD = 2, 4, 1


def run(code: bytes, kind: int, major: int, minor: int, access: int = READ | WRITE) -> int:
    """What the program returns for a device (1: allow), read as the kernel would."""
    ctx = {0: (access << 16) | kind, 4: major, 8: minor}
    regs = [0] * 11
    pc = 0
    while True:
        op, regs_byte, off, imm = struct.unpack_from("<BBhi", code, pc * 8)
        dst, src = regs_byte & 0xF, regs_byte >> 4
        pc += 1
        if op == 0x61:  # dst = *(u32 *)(src + off): src is always the context
            assert src == 1
            regs[dst] = ctx[off]
        elif op == 0x54:  # w_dst &= imm
            regs[dst] &= imm
        elif op == 0xB7:  # dst = imm
            regs[dst] = imm
        elif op == 0x55:  # if dst != imm: jump
            pc += off if regs[dst] != imm else 0
        elif op == 0x15:  # if dst == imm: jump
            pc += off if regs[dst] == imm else 0
        elif op == 0x95:
            return regs[0]
        else:
            raise AssertionError(f"instruction {op:#x} at {pc - 1}")


def test_the_program_allows_the_jobs_gpus_and_nvidiactl_and_refuses_every_other_gpu() -> None:
    code = program([3, 5, 254, 255])
    assert [run(code, CHAR, 195, minor) for minor in range(8)] == [0, 0, 0, 1, 0, 1, 0, 0]
    assert run(code, CHAR, 195, 255) == run(code, CHAR, 195, 254) == 1
    assert run(code, CHAR, 195, 3, MKNOD) == 1 and run(code, CHAR, 195, 4, READ) == 0


def test_the_program_leaves_every_other_device_to_the_programs_above_it() -> None:
    code = program([255])
    assert run(code, CHAR, 1, 3) == 1  # /dev/null
    assert run(code, CHAR, 508, 0) == 1  # nvidia-uvm's major is dynamic
    assert run(code, BLOCK, 195, 0) == 1  # a block device of that major is not a GPU
    assert run(code, CHAR, 195, 0) == 0


def test_no_gpu_allowed_is_a_program_too() -> None:
    code = program([])
    assert [run(code, CHAR, 195, minor) for minor in (0, 254, 255)] == [0, 0, 0]


def proc(tmp_path: Path, cgroup: str, *mounts: str) -> Path:
    (tmp_path / "cgroup").write_text(cgroup)
    (tmp_path / "mountinfo").write_text("".join(f"{line}\n" for line in mounts))
    return tmp_path


HYBRID = [
    "30 25 0:26 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,name=systemd",
    "31 25 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate",
    "32 25 0:28 / /sys/fs/cgroup/devices rw,nosuid - cgroup cgroup rw,devices",
]
UNIFIED = ["29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate"]
UNIT = "0::/system.slice/nodeagent.service\n"


def test_the_agents_cgroup_is_found_on_a_hybrid_and_on_cgroup_v2(tmp_path: Path) -> None:
    v1 = "5:devices:/system.slice\n1:name=systemd:/system.slice\n"
    found = own_cgroup(proc(tmp_path, v1 + UNIT, *HYBRID))
    assert found == Path("/sys/fs/cgroup/unified/system.slice/nodeagent.service")
    assert own_cgroup(proc(tmp_path, UNIT, *UNIFIED)) == Path(
        "/sys/fs/cgroup/system.slice/nodeagent.service"
    )
    assert own_cgroup(proc(tmp_path, "0::/\n", *UNIFIED)) == Path("/sys/fs/cgroup")


@pytest.mark.parametrize(
    ("cgroup", "mounts"),
    [
        ("4:memory:/x\n1:name=systemd:/x\n", HYBRID),  # cgroup v1 only: no 0:: line
        (UNIT, HYBRID[:1] + HYBRID[2:]),  # no cgroup2 mounted
    ],
)
def test_no_cgroup_v2_is_said(tmp_path: Path, cgroup: str, mounts: list[str]) -> None:
    with pytest.raises(DeviceCgroupError, match="no cgroup v2 hierarchy holds this process"):
        own_cgroup(proc(tmp_path, cgroup, *mounts))
