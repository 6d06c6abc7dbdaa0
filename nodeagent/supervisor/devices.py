"""The device cgroup: a job's bare workers may open only its own GPUs' device nodes.

`CUDA_VISIBLE_DEVICES` is a convention CUDA keeps, not a wall: a worker that opens
/dev/nvidia3 itself (NVML, a second CUDA context with the variable unset) reaches a GPU another
job on the node holds. With `health.constrain_devices` (Slurm's ConstrainDevices), the cgroup
each job's workers on a node run in (supervisor/jobcgroup.py, `job-<node>.<job>`) has a
BPF device program attached (cgroup v2's device control) that refuses the NVIDIA GPUs' device
nodes, character major 195, except the job's GPUs' minors (NVML's minor number), nvidiactl
(255) and nvidia-modeset (254). Every other device is left to the programs above it: the
kernel opens a device only if every program from the root down to the worker's cgroup allows
it (BPF_F_ALLOW_MULTI), so this one can only take away, never give what the unit's
`DevicePolicy=closed` refused.

The set is the job's, not each rank's: NCCL's peer-to-peer transport between the job's ranks on
the node opens each other's GPUs, as Slurm constrains a step's GPUs, not a task's.

A worker enters its cgroup before its first line of code runs (supervisor/jobcgroup.py), so
none of it runs unconfined.

What the node must allow, checked once at start-up (`probe`): cgroup v2, or a hybrid's unified
hierarchy, with the agent's own cgroup writable (under systemd `Delegate=yes` and
`ProtectControlGroups=no`), and CAP_BPF with CAP_NET_ADMIN (the kernel wants both to load a
BPF_PROG_TYPE_CGROUP_DEVICE program). The role's `nodeagent_constrain_devices` installs that
drop-in (docs/gpu.md, "What keeps a job off the other jobs' GPUs").
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

from nodeagent.supervisor.jobcgroup import JobCgroup, JobCgroupError, Layout, read_layout

NVIDIA_MAJOR = 195
NVIDIA_CTL, NVIDIA_MODESET = 255, 254  # every CUDA process opens nvidiactl
_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "ppc64le": 361}
_PROG_LOAD, _PROG_ATTACH, _PROG_DETACH = 5, 8, 9
_PROG_TYPE_CGROUP_DEVICE, _CGROUP_DEVICE = 15, 6  # program type, attach type
_F_ALLOW_MULTI = 2
_DEVCG_DEV_CHAR = 2  # bpf_cgroup_dev_ctx.access_type's low 16 bits
_LOG_SIZE = 1 << 16


class DeviceCgroupError(OSError):
    """The device cgroup cannot be made, or a worker cannot be put in it."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(minors: Iterable[int]) -> bytes:
    """A BPF_PROG_TYPE_CGROUP_DEVICE program, as bytes of eBPF instructions: it allows every
    device but character major 195, and of those only `minors`.

    r1 points at `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }`; the
    program returns 1 to allow, 0 to refuse (EPERM)."""
    allowed = sorted(set(minors))
    checks = [
        _insn(0x61, dst=2, src=1, off=0),  # r2 = ctx->access_type
        _insn(0x54, dst=2, imm=0xFFFF),  # w2 &= 0xffff: the device's type
        _insn(0x61, dst=3, src=1, off=4),  # r3 = ctx->major
        _insn(0x61, dst=4, src=1, off=8),  # r4 = ctx->minor
    ]
    allow_at = len(checks) + 2 + len(allowed) + 2
    jumps = [(0x55, 2, _DEVCG_DEV_CHAR), (0x55, 3, NVIDIA_MAJOR)]  # not a char 195: allow
    jumps += [(0x15, 4, minor) for minor in allowed]  # one of them: allow
    for code, register, value in jumps:
        checks.append(_insn(code, dst=register, off=allow_at - len(checks) - 1, imm=value))
    refuse = [_insn(0xB7, dst=0, imm=0), _insn(0x95)]  # r0 = 0; exit
    allow = [_insn(0xB7, dst=0, imm=1), _insn(0x95)]  # r0 = 1; exit
    return b"".join(checks + refuse + allow)


class _Bpf:
    """The three bpf(2) commands this needs, through libc's syscall()."""

    def __init__(self) -> None:
        number = _BPF_SYSCALL.get(platform.machine())
        if number is None:
            raise DeviceCgroupError(f"bpf(2)'s number on {platform.machine()} is not known here")
        self._number = number
        self._libc = ctypes.CDLL(None, use_errno=True)

    def _call(self, command: int, attr: bytes) -> int:
        buffer = ctypes.create_string_buffer(attr, len(attr))
        done = int(
            self._libc.syscall(
                ctypes.c_long(self._number),
                ctypes.c_long(command),
                buffer,
                ctypes.c_uint(len(attr)),
            )
        )
        if done < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return done

    def load(self, code: bytes) -> int:
        """The new program's file descriptor.

        Raises:
            DeviceCgroupError: the kernel refused it (why, with the verifier's log).
        """
        insns = ctypes.create_string_buffer(code, len(code))
        license_ = ctypes.create_string_buffer(b"GPL")
        log = ctypes.create_string_buffer(_LOG_SIZE)
        attr = struct.pack(
            "<IIQQIIQII16sII",
            _PROG_TYPE_CGROUP_DEVICE,
            len(code) // 8,
            ctypes.addressof(insns),
            ctypes.addressof(license_),
            1,
            _LOG_SIZE,
            ctypes.addressof(log),
            0,
            0,
            b"nodeagent_gpus",
            0,
            _CGROUP_DEVICE,
        )
        try:
            return self._call(_PROG_LOAD, attr)
        except OSError as exc:
            said = log.value.decode("utf-8", "replace").strip()
            needs = " (it needs CAP_BPF and CAP_NET_ADMIN)" if exc.errno == errno.EPERM else ""
            raise DeviceCgroupError(
                exc.errno, f"cannot load a BPF device program: {exc.strerror}{needs} {said}"
            ) from None

    def attach(self, cgroup: int, prog: int) -> None:
        attr = struct.pack("<IIIII", cgroup, prog, _CGROUP_DEVICE, _F_ALLOW_MULTI, 0)
        self._call(_PROG_ATTACH, attr)

    def detach(self, cgroup: int, prog: int) -> None:
        self._call(_PROG_DETACH, struct.pack("<IIII", cgroup, prog, _CGROUP_DEVICE, 0))


def own_cgroup(proc: Path = Path("/proc/self")) -> Path:
    """This process's cgroup v2 directory (a hybrid's unified hierarchy too).

    Raises:
        DeviceCgroupError: no cgroup v2 is mounted, or this process is not in it.
    """
    try:
        found = read_layout((), proc).unified
    except JobCgroupError:
        found = None
    if found is None:
        raise DeviceCgroupError(
            errno.ENOENT, "no cgroup v2 hierarchy holds this process (/proc/self/cgroup, mountinfo)"
        )
    return found


class JobDevices:
    """One job's device program on this node, attached to the job's cgroup (`cgroup`'s v2
    directory): its workers may open the GPUs the job holds here (`held`: NVML indices; the
    node's grant to the job, or a whole node's usable GPUs), as last `refresh`ed."""

    def __init__(
        self,
        cgroup: JobCgroup,
        minor_of: Callable[[int], int | None],
        held: Callable[[], Iterable[int]],
        bpf: _Bpf | None = None,
    ) -> None:
        self.cgroup = cgroup
        self._minor_of = minor_of
        self._held = held
        self._bpf = bpf
        self._prog = -1
        self._minors: frozenset[int] | None = None

    def refresh(self) -> None:
        """Confine the job to what it holds now (nothing changes when that did not).

        Raises:
            DeviceCgroupError: as `confine`.
        """
        self.confine(self._held())

    def confine(self, gpus: Iterable[int]) -> None:
        """From now on the job's workers may open only these GPUs (and nvidiactl, modeset).

        Raises:
            DeviceCgroupError: NVML gave no minor number for one of them, or the kernel refused
                the cgroup or the program.
        """
        minors = set()
        for index in gpus:
            minor = self._minor_of(index)
            if minor is None:
                raise DeviceCgroupError(
                    errno.ENODEV, f"NVML gave no minor number for GPU {index}: cannot allow it"
                )
            minors.add(minor)
        wanted = frozenset(minors | {NVIDIA_CTL, NVIDIA_MODESET})
        if wanted == self._minors:
            return
        try:
            self.cgroup.make()
            directory = self.cgroup.unified_fd()
        except JobCgroupError as exc:
            raise DeviceCgroupError(exc.errno, exc.strerror) from None
        bpf = self._bpf or _Bpf()
        self._bpf = bpf
        prog = bpf.load(program(wanted))
        try:
            bpf.attach(directory, prog)
        except OSError as exc:
            os.close(prog)
            raise DeviceCgroupError(
                exc.errno,
                f"cannot attach a device program to {self.cgroup.unified}: {exc.strerror}",
            ) from None
        if self._prog >= 0:  # both hold for a moment: the stricter of the two
            with contextlib.suppress(OSError):
                bpf.detach(directory, self._prog)
            os.close(self._prog)
        self._prog, self._minors = prog, wanted

    def close(self) -> None:
        """Let go of the program (the cgroup is its owner's to end)."""
        if self._prog >= 0:
            os.close(self._prog)
        self._prog = -1
        self._minors = None


def probe(parent: Path, node: str) -> None:
    """Whether this node lets the agent confine devices: a cgroup made below `parent`, a
    program loaded and attached to it, both gone again.

    Raises:
        DeviceCgroupError: naming what the node does not allow.
    """
    trial = JobCgroup(Layout(parent, {parent: frozenset()}), node, f"probe-{os.getpid()}", None)
    devices = JobDevices(trial, lambda index: index, tuple)
    try:
        devices.confine(())
    finally:
        devices.close()
        trial.close()
